#include "bindings/checks.h"

#include <sstream>
#include <string>

namespace nvfp4_gemm {
namespace {

std::string shape_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

std::string stride_str(const at::Tensor& t) {
  std::ostringstream os;
  os << t.strides();
  return os.str();
}

bool is_packed_fp4_dtype(at::ScalarType t) {
  return t == at::kByte || t == at::kFloat4_e2m1fn_x2;
}

bool is_scale_dtype(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kByte; }

void check_packed(const at::Tensor& t, const char* name, const char* rows_name) {
  TORCH_CHECK(is_packed_fp4_dtype(t.scalar_type()), "nvfp4_gemm.mm: ", name,
              " must be packed e2m1 data of dtype torch.uint8 or torch.float4_e2m1fn_x2, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == 2, "nvfp4_gemm.mm: ", name, " must be 2-D [", rows_name,
              ", K/2] (two e2m1 values per byte, K-major), got ", t.dim(), "-D tensor of shape ",
              shape_str(t));
}

// The three accepted views of the blocked layout (SPEC.md); anything else is an error, never a guess.
void check_blocked_scales(const at::Tensor& sf, const char* name, const char* rows_name, int64_t rows,
                          int64_t k) {
  TORCH_CHECK(is_scale_dtype(sf.scalar_type()), "nvfp4_gemm.mm: ", name,
              " must hold e4m3 scales of dtype torch.float8_e4m3fn or torch.uint8, got ",
              sf.scalar_type());
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t pad_rows = round_up(rows, kSfAtomRows);
  const int64_t pad_cols = round_up(sf_cols, kSfAtomCols);
  const int64_t need = pad_rows * pad_cols;
  TORCH_CHECK(sf.numel() == need, "nvfp4_gemm.mm: ", name, " must hold round_up(", rows_name,
              ",128)*round_up(K/16,4) = ", pad_rows, "*", pad_cols, " = ", need,
              " e4m3 values in the 128x4 blocked layout (", rows_name, "=", rows, ", K=", k, "), got ",
              sf.numel(), " (shape ", shape_str(sf), ")");
  if (sf.dim() == 1 || sf.dim() == 2) {
    if (sf.dim() == 2) {
      TORCH_CHECK(sf.size(0) == pad_rows && sf.size(1) == pad_cols, "nvfp4_gemm.mm: 2-D ", name,
                  " must be the padded blocked matrix [round_up(", rows_name, ",128), round_up(K/16,4)] = [",
                  pad_rows, ", ", pad_cols, "], got ", shape_str(sf));
    }
    TORCH_CHECK(sf.is_contiguous(), "nvfp4_gemm.mm: ", name,
                " must be contiguous in the 128x4 blocked layout, got strides ", stride_str(sf),
                " for shape ", shape_str(sf), "; pass nvfp4_gemm.to_blocked(...) output as is");
    return;
  }
  if (sf.dim() == 6) {
    // (32, 4, ceil(R/128), 4, ceil(S/4), L=1): the permuted view whose memory is the blocked layout.
    const int64_t rb = pad_rows / kSfAtomRows, sb = pad_cols / kSfAtomCols;
    const int64_t want_size[6] = {32, 4, rb, 4, sb, 1};
    const int64_t want_stride[6] = {16, 4, sb * kSfAtomBytes, 1, kSfAtomBytes, need};
    for (int d = 0; d < 6; ++d) {
      TORCH_CHECK(sf.size(d) == want_size[d], "nvfp4_gemm.mm: 6-D ", name,
                  " must have shape (32, 4, ceil(", rows_name, "/128), 4, ceil(K/64), 1) = (32, 4, ", rb,
                  ", 4, ", sb, ", 1), got ", shape_str(sf));
    }
    for (int d = 0; d < 6; ++d) {
      TORCH_CHECK(want_size[d] == 1 || sf.stride(d) == want_stride[d], "nvfp4_gemm.mm: 6-D ", name,
                  " must be the permuted view of a blocked-layout buffer, strides (16, 4, ", want_stride[2],
                  ", 1, 512, *); got strides ", stride_str(sf));
    }
    return;
  }
  TORCH_CHECK(false, "nvfp4_gemm.mm: ", name,
              " must be a view of the 128x4 blocked layout: 1-D flat, 2-D [round_up(", rows_name,
              ",128), round_up(K/16,4)] or 6-D (32, 4, ceil(", rows_name, "/128), 4, ceil(K/64), 1); got ",
              sf.dim(), "-D tensor of shape ", shape_str(sf));
}

void check_gpu_readable(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) <= 1, "nvfp4_gemm.mm: ", name,
              " must be K-major (stride 1 along its last dim) for the GPU kernels, got strides ",
              stride_str(t), "; call .contiguous() first");
  TORCH_CHECK(t.size(0) <= 1 || t.stride(0) % 16 == 0, "nvfp4_gemm.mm: ", name,
              " rows must start 16 bytes apart (row stride a multiple of 16 bytes), got row stride ",
              t.stride(0), "; call .contiguous() first");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "nvfp4_gemm.mm: ", name,
              " data must be 16-byte aligned, got address ", t.data_ptr(), "; call .clone() first");
}

}  // namespace

OutDtype to_out_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return OutDtype::kFloat16;
    case at::kBFloat16: return OutDtype::kBFloat16;
    case at::kFloat: return OutDtype::kFloat32;
    default:
      TORCH_CHECK(false, "nvfp4_gemm.mm: out_dtype must be torch.float16, torch.bfloat16 or torch.float32, got ",
                  t);
  }
}

MmShape check_mm_inputs(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sfa,
                        const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                        std::optional<at::ScalarType> out_dtype, bool gpu_rules) {
  const at::ScalarType odt = out_dtype.value_or(at::kHalf);
  to_out_dtype(odt);

  const at::Device dev = a.device();
  auto same_device = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == dev, "nvfp4_gemm.mm: ", name, " must be on the same device as a (", dev,
                "), got ", t.device());
  };
  same_device(b, "b");
  same_device(sfa, "sfa");
  same_device(sfb, "sfb");

  check_packed(a, "a", "M");
  check_packed(b, "b", "N");
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1) * 2;
  TORCH_CHECK(b.size(1) == a.size(1), "nvfp4_gemm.mm: a and b must have the same K: a is [M, K/2] = ",
              shape_str(a), " (K=", k, "), b is [N, K/2] = ", shape_str(b), " (K=", b.size(1) * 2, ")");
  TORCH_CHECK(k > 0, "nvfp4_gemm.mm: K must be positive, got a of shape ", shape_str(a));
  TORCH_CHECK(k % 32 == 0, "nvfp4_gemm.mm: K must be a multiple of 32 (16-byte rows of packed data), got K=",
              k, " (a.shape[1]=", a.size(1), ")");
  TORCH_CHECK(n % 8 == 0, "nvfp4_gemm.mm: N must be a multiple of 8 (16-byte output rows), got N=", n);

  check_blocked_scales(sfa, "sfa", "M", m, k);
  check_blocked_scales(sfb, "sfb", "N", n, k);

  if (alpha.has_value()) {
    const at::Tensor& al = *alpha;
    TORCH_CHECK(al.scalar_type() == at::kFloat, "nvfp4_gemm.mm: alpha must be a float32 tensor, got ",
                al.scalar_type());
    TORCH_CHECK(al.numel() == 1 && al.dim() <= 1, "nvfp4_gemm.mm: alpha must hold exactly one value "
                "(shape [] or [1]), got shape ", shape_str(al));
    TORCH_CHECK(al.device() == dev, "nvfp4_gemm.mm: alpha must be on the inputs' device (", dev,
                ") so that no host sync is needed, got ", al.device());
  }

  if (gpu_rules && m > 0 && n > 0) {
    check_gpu_readable(a, "a");
    check_gpu_readable(b, "b");
    for (auto [t, name] : {std::pair<const at::Tensor*, const char*>{&sfa, "sfa"}, {&sfb, "sfb"}}) {
      TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "nvfp4_gemm.mm: ", name,
                  " data must be 16-byte aligned for the GPU kernels, got address ", t->data_ptr(),
                  "; call .clone() first");
    }
  }
  return MmShape{m, n, k, odt};
}

}  // namespace nvfp4_gemm
