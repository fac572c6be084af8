#include "bindings/checks.h"

#include <climits>
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

// The three accepted views of the blocked layout (docs/CONTRACT.md); anything else is an error, never a guess.
void check_blocked_scales_impl(const char* op, const at::Tensor& sf, const char* name, const char* rows_name,
                               int64_t rows, int64_t k) {
  TORCH_CHECK(is_scale_dtype(sf.scalar_type()), op, ": ", name,
              " must hold e4m3 scales of dtype torch.float8_e4m3fn or torch.uint8, got ",
              sf.scalar_type());
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t pad_rows = round_up(rows, kSfAtomRows);
  const int64_t pad_cols = round_up(sf_cols, kSfAtomCols);
  const int64_t need = pad_rows * pad_cols;
  TORCH_CHECK(sf.numel() == need, op, ": ", name, " must hold round_up(", rows_name,
              ",128)*round_up(K/16,4) = ", pad_rows, "*", pad_cols, " = ", need,
              " e4m3 values in the 128x4 blocked layout (", rows_name, "=", rows, ", K=", k, "), got ",
              sf.numel(), " (shape ", shape_str(sf), ")");
  if (sf.dim() == 1 || sf.dim() == 2) {
    if (sf.dim() == 2) {
      TORCH_CHECK(sf.size(0) == pad_rows && sf.size(1) == pad_cols, op, ": 2-D ", name,
                  " must be the padded blocked matrix [round_up(", rows_name, ",128), round_up(K/16,4)] = [",
                  pad_rows, ", ", pad_cols, "], got ", shape_str(sf));
    }
    TORCH_CHECK(sf.is_contiguous(), op, ": ", name,
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
      TORCH_CHECK(sf.size(d) == want_size[d], op, ": 6-D ", name,
                  " must have shape (32, 4, ceil(", rows_name, "/128), 4, ceil(K/64), 1) = (32, 4, ", rb,
                  ", 4, ", sb, ", 1), got ", shape_str(sf));
    }
    for (int d = 0; d < 6; ++d) {
      TORCH_CHECK(want_size[d] == 1 || sf.stride(d) == want_stride[d], op, ": 6-D ", name,
                  " must be the permuted view of a blocked-layout buffer, strides (16, 4, ", want_stride[2],
                  ", 1, 512, *); got strides ", stride_str(sf));
    }
    return;
  }
  TORCH_CHECK(false, op, ": ", name,
              " must be a view of the 128x4 blocked layout: 1-D flat, 2-D [round_up(", rows_name,
              ",128), round_up(K/16,4)] or 6-D (32, 4, ceil(", rows_name, "/128), 4, ceil(K/64), 1); got ",
              sf.dim(), "-D tensor of shape ", shape_str(sf));
}

bool is_activation_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

// The rules the GPU kernels read an operand under: unit stride along its last dim, rows 16 bytes apart,
// 16-byte aligned data.
void check_gpu_readable_impl(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) <= 1, op, ": ", name,
              " must be K-major (stride 1 along its last dim) for the GPU kernels, got strides ",
              stride_str(t), "; call .contiguous() first");
  TORCH_CHECK(t.size(0) <= 1 || (t.stride(0) * static_cast<int64_t>(t.element_size())) % 16 == 0,
              op, ": ", name, " rows must start 16 bytes apart (row stride a multiple of ",
              16 / t.element_size(), " elements), got row stride ", t.stride(0), "; call .contiguous() first");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, ": ", name,
              " data must be 16-byte aligned, got address ", t.data_ptr(), "; call .clone() first");
}

void check_out(const at::Tensor& out, int64_t m, int64_t n, at::ScalarType dtype, const at::Device& dev,
               bool gpu_rules) {
  TORCH_CHECK(out.device() == dev, "nvfp4_gemm.mm: out must be on a's device (", dev, "), got ", out.device());
  TORCH_CHECK(out.scalar_type() == dtype, "nvfp4_gemm.mm: out must have the result dtype ", dtype, ", got ",
              out.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == m && out.size(1) == n, "nvfp4_gemm.mm: out must have shape [M, N] = [",
              m, ", ", n, "], got ", shape_str(out));
  if (!gpu_rules || m == 0 || n == 0) return;
  TORCH_CHECK(out.stride(1) == 1 && (m == 1 || (out.stride(0) >= n && (out.stride(0) * out.element_size()) % 16 == 0)),
              "nvfp4_gemm.mm: out must have unit stride along N and rows a multiple of 16 bytes apart for the GPU "
              "kernels, got strides ", stride_str(out), " for shape ", shape_str(out),
              "; pass a contiguous tensor");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0, "nvfp4_gemm.mm: out data must be 16-byte "
              "aligned for the GPU kernels, got address ", out.data_ptr());
}

}  // namespace

void check_blocked_scales(const char* op, const at::Tensor& sf, const char* name, const char* rows_name, int64_t rows,
                          int64_t k) {
  check_blocked_scales_impl(op, sf, name, rows_name, rows, k);
}

void check_gpu_readable(const char* op, const at::Tensor& t, const char* name) { check_gpu_readable_impl(op, t, name); }

std::pair<int64_t, int64_t> check_decode_inputs(const at::Tensor& packed, const at::Tensor& sf, at::ScalarType dtype) {
  constexpr const char* op = "nvfp4_gemm._decode";
  TORCH_CHECK(is_activation_dtype(dtype), op, ": dtype must be torch.float16, torch.bfloat16 or torch.float32 "
              "(each holds every e2m1 * e4m3 product exactly), got ", dtype);
  TORCH_CHECK(is_packed_fp4_dtype(packed.scalar_type()), op, ": packed must be packed e2m1 data of dtype "
              "torch.uint8 or torch.float4_e2m1fn_x2, got ", packed.scalar_type());
  TORCH_CHECK(packed.dim() == 2, op, ": packed must be 2-D [N, K/2] (two e2m1 values per byte, K-major), got ",
              packed.dim(), "-D tensor of shape ", shape_str(packed));
  const int64_t n = packed.size(0), k = packed.size(1) * 2;
  TORCH_CHECK(k > 0 && k % kSfVecSize == 0, op, ": K = 2 * packed.shape[1] must be a positive multiple of 16 "
              "(one e4m3 scale per 16 values), got K=", k, " (packed of shape ", shape_str(packed), ")");
  TORCH_CHECK(sf.device() == packed.device(), op, ": sf must be on packed's device (", packed.device(), "), got ",
              sf.device());
  check_blocked_scales_impl(op, sf, "sf", "N", n, k);
  return {n, k};
}

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

MmShape check_mm_inputs(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                        const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                        std::optional<at::ScalarType> out_dtype, const at::Tensor* out, bool gpu_rules) {
  const bool weight_only = is_activation_dtype(a.scalar_type());
  const at::ScalarType odt =
      out_dtype.has_value() ? *out_dtype : out != nullptr ? out->scalar_type() : weight_only ? a.scalar_type() : at::kHalf;
  to_out_dtype(odt);

  const at::Device dev = a.device();
  auto same_device = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == dev, "nvfp4_gemm.mm: ", name, " must be on the same device as a (", dev,
                "), got ", t.device());
  };
  same_device(b, "b");
  same_device(sfb, "sfb");

  int64_t k = 0;
  if (weight_only) {
    TORCH_CHECK(!sfa.has_value(), "nvfp4_gemm.mm: sfa must be None when a holds ", a.scalar_type(),
                " activations (the weight-only form multiplies them as they are); pass packed e2m1 a "
                "(torch.uint8 / torch.float4_e2m1fn_x2) to use sfa");
    TORCH_CHECK(a.dim() == 2, "nvfp4_gemm.mm: weight-only a must be 2-D [M, K] activations, got ", a.dim(),
                "-D tensor of shape ", shape_str(a));
    k = a.size(1);
    check_packed(b, "b", "N");
    TORCH_CHECK(b.size(1) * 2 == k, "nvfp4_gemm.mm: b must be [N, K/2] packed e2m1 with K = a.shape[1] = ", k,
                " (weight-only form), got b of shape ", shape_str(b));
  } else {
    TORCH_CHECK(is_packed_fp4_dtype(a.scalar_type()), "nvfp4_gemm.mm: a must be packed e2m1 data of dtype "
                "torch.uint8 or torch.float4_e2m1fn_x2, or float16 / bfloat16 / float32 activations for the "
                "weight-only form (with sfa=None), got ", a.scalar_type());
    TORCH_CHECK(sfa.has_value(), "nvfp4_gemm.mm: sfa is None, but a holds packed e2m1 data (", a.scalar_type(),
                "): pass a's blocked scales, or float16 / bfloat16 / float32 activations for the weight-only form");
    same_device(*sfa, "sfa");
    check_packed(a, "a", "M");
    k = a.size(1) * 2;
    check_packed(b, "b", "N");
    TORCH_CHECK(b.size(1) == a.size(1), "nvfp4_gemm.mm: a and b must have the same K: a is [M, K/2] = ",
                shape_str(a), " (K=", k, "), b is [N, K/2] = ", shape_str(b), " (K=", b.size(1) * 2, ")");
  }
  const int64_t m = a.size(0), n = b.size(0);
  TORCH_CHECK(k > 0, "nvfp4_gemm.mm: K must be positive, got a of shape ", shape_str(a));
  TORCH_CHECK(k % 32 == 0, "nvfp4_gemm.mm: K must be a multiple of 32 (16-byte rows of packed data), got K=",
              k, " (a.shape[1]=", a.size(1), ")");
  TORCH_CHECK(n % 8 == 0, "nvfp4_gemm.mm: N must be a multiple of 8 (16-byte output rows), got N=", n);

  if (!weight_only) check_blocked_scales_impl("nvfp4_gemm.mm", *sfa, "sfa", "M", m, k);
  check_blocked_scales_impl("nvfp4_gemm.mm", sfb, "sfb", "N", n, k);

  if (alpha.has_value()) {
    const at::Tensor& al = *alpha;
    TORCH_CHECK(al.scalar_type() == at::kFloat, "nvfp4_gemm.mm: alpha must be a float32 tensor, got ",
                al.scalar_type());
    TORCH_CHECK(al.numel() == 1 && al.dim() <= 1, "nvfp4_gemm.mm: alpha must hold exactly one value "
                "(shape [] or [1]), got shape ", shape_str(al));
    TORCH_CHECK(al.device() == dev, "nvfp4_gemm.mm: alpha must be on the inputs' device (", dev,
                ") so that no host sync is needed, got ", al.device());
  }
  if (out != nullptr) check_out(*out, m, n, odt, dev, gpu_rules);

  if (gpu_rules) {
    // The CUDA kernels and cuBLAS index rows and columns with 32-bit integers.
    constexpr int64_t kMaxDim = INT32_MAX;
    TORCH_CHECK(m <= kMaxDim, "nvfp4_gemm.mm: M must be at most 2^31 - 1 = ", kMaxDim, " on CUDA, got M=", m);
    TORCH_CHECK(n <= kMaxDim, "nvfp4_gemm.mm: N must be at most 2^31 - 1 = ", kMaxDim, " on CUDA, got N=", n);
    TORCH_CHECK(k <= kMaxDim, "nvfp4_gemm.mm: K must be at most 2^31 - 1 = ", kMaxDim, " on CUDA, got K=", k);
  }
  if (gpu_rules && m > 0 && n > 0) {
    // cuBLAS reads weight-only A with a leading dimension of at least K.
    TORCH_CHECK(!weight_only || m <= 1 || a.stride(0) >= k, "nvfp4_gemm.mm: weight-only a rows must not overlap "
                "(row stride >= K = ", k, "), got row stride ", a.stride(0), "; call .contiguous() first");
    check_gpu_readable_impl("nvfp4_gemm.mm", a, "a");
    check_gpu_readable_impl("nvfp4_gemm.mm", b, "b");
    for (auto [t, name] : {std::pair<const at::Tensor*, const char*>{weight_only ? nullptr : &*sfa, "sfa"},
                           {&sfb, "sfb"}}) {
      if (t == nullptr) continue;
      TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "nvfp4_gemm.mm: ", name,
                  " data must be 16-byte aligned for the GPU kernels, got address ", t->data_ptr(),
                  "; call .clone() first");
    }
  }
  return MmShape{m, n, k, odt, weight_only};
}

}  // namespace nvfp4_gemm
