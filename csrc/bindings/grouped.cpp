// Input checks of nvfp4_gemm::grouped_mm (shared by the CPU and CUDA implementations) and the lookup of the
// arch modules' grouped tables.
#include "bindings/grouped.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <climits>
#include <mutex>
#include <sstream>

#include "bindings/checks.h"
#include "bindings/registry.h"
#include "bindings/resolve.h"

namespace nvfp4_gemm {
namespace {

constexpr const char* kOp = "nvfp4_gemm.grouped_mm";

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

bool is_packed_dtype(at::ScalarType t) { return t == at::kByte || t == at::kFloat4_e2m1fn_x2; }
bool is_scale_dtype(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kByte; }
bool is_activation_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

void check_aligned(const at::Tensor& t, const char* name) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, kOp, ": ", name,
              " data must be 16-byte aligned for the GPU kernels, got address ", t.data_ptr(), "; call .clone() first");
}

// sfb: each group's blocked N x K/16 scales, groups in order, as [G, Np, Sp] or [G, Np * Sp], contiguous.
void check_sfb(const at::Tensor& sfb, int64_t g, int64_t n, int64_t k) {
  TORCH_CHECK(is_scale_dtype(sfb.scalar_type()), kOp, ": sfb must hold e4m3 scales of dtype torch.float8_e4m3fn or "
              "torch.uint8, got ", sfb.scalar_type());
  const int64_t np = round_up(n, kSfAtomRows), sp = round_up(k / kSfVecSize, kSfAtomCols);
  const int64_t need = g * np * sp;
  TORCH_CHECK(sfb.numel() == need, kOp, ": sfb must hold G*round_up(N,128)*round_up(K/16,4) = ", g, "*", np, "*", sp,
              " = ", need, " e4m3 values (each group's scales in the 128x4 blocked layout; G=", g, ", N=", n, ", K=",
              k, "), got ", sfb.numel(), " (shape ", shape_str(sfb), ")");
  const bool shape_ok = (sfb.dim() == 3 && sfb.size(0) == g && sfb.size(1) == np && sfb.size(2) == sp) ||
                        (sfb.dim() == 2 && sfb.size(0) == g && sfb.size(1) == np * sp);
  TORCH_CHECK(shape_ok, kOp, ": sfb must be [G, round_up(N,128), round_up(K/16,4)] = [", g, ", ", np, ", ", sp,
              "] or [G, round_up(N,128)*round_up(K/16,4)] = [", g, ", ", np * sp, "], got shape ", shape_str(sfb));
  TORCH_CHECK(sfb.is_contiguous(), kOp, ": sfb must be contiguous (the groups' blocked scales back to back), got "
              "strides ", stride_str(sfb), " for shape ", shape_str(sfb), "; call .contiguous() first");
}

// sfa: the grouped blocked layout, a whole number of 128-row atoms, at least round_up(T, 128) rows.
int64_t check_sfa(const at::Tensor& sfa, int64_t t, int64_t g, int64_t k) {
  TORCH_CHECK(is_scale_dtype(sfa.scalar_type()), kOp, ": sfa must hold e4m3 scales of dtype torch.float8_e4m3fn or "
              "torch.uint8, got ", sfa.scalar_type());
  const int64_t sp = round_up(k / kSfVecSize, kSfAtomCols);
  const int64_t row_block = kSfAtomRows * sp;  // bytes of one 128-row slab of the layout
  TORCH_CHECK(sfa.dim() == 1 || (sfa.dim() == 2 && sfa.size(1) == sp), kOp, ": sfa must be the grouped blocked "
              "layout of A's scales, flat 1-D or 2-D [rows, round_up(K/16,4)] = [rows, ", sp, "] (K=", k,
              "), got shape ", shape_str(sfa));
  TORCH_CHECK(sfa.numel() % row_block == 0, kOp, ": sfa must hold a whole number of 128-row blocks of "
              "128*round_up(K/16,4) = ", row_block, " e4m3 values (each group starts at a 128-row atom; K=", k,
              "), got ", sfa.numel(), " (shape ", shape_str(sfa), ")");
  const int64_t rows = sfa.numel() / sp;
  const int64_t least = round_up(t, kSfAtomRows);
  TORCH_CHECK(rows >= least, kOp, ": sfa must hold at least round_up(T,128) = ", least, " padded rows (",
              least * sp, " e4m3 values; T=", t, ", K=", k, "), got ", rows, " rows (", sfa.numel(),
              " values). Routing-independent size: nvfp4_gemm.grouped_sfa_rows(T, G) = ",
              grouped_sfa_rows_worst(t, g), " rows");
  TORCH_CHECK(sfa.is_contiguous(), kOp, ": sfa must be contiguous in the grouped blocked layout, got strides ",
              stride_str(sfa), " for shape ", shape_str(sfa));
  return rows;
}

void check_out(const at::Tensor& out, int64_t t, int64_t n, at::ScalarType dtype, const at::Device& dev,
               bool gpu_rules) {
  TORCH_CHECK(out.device() == dev, kOp, ": out must be on a's device (", dev, "), got ", out.device());
  TORCH_CHECK(out.scalar_type() == dtype, kOp, ": out must have the result dtype ", dtype, ", got ", out.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == t && out.size(1) == n, kOp, ": out must have shape [T, N] = [", t,
              ", ", n, "], got ", shape_str(out));
  if (!gpu_rules || t == 0 || n == 0) return;
  TORCH_CHECK(out.stride(1) == 1 && (t == 1 || (out.stride(0) >= n && (out.stride(0) * out.element_size()) % 16 == 0)),
              kOp, ": out must have unit stride along N and rows a multiple of 16 bytes apart for the GPU kernels, got "
              "strides ", stride_str(out), " for shape ", shape_str(out), "; pass a contiguous tensor");
  check_aligned(out, "out");
}

}  // namespace

GroupedShape check_grouped_inputs(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                                  const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                                  std::optional<at::ScalarType> out_dtype, const at::Tensor* out, bool gpu_rules) {
  const bool weight_only = is_activation_dtype(a.scalar_type());
  const at::ScalarType odt = out_dtype.has_value() ? *out_dtype
                             : out != nullptr      ? out->scalar_type()
                             : weight_only         ? a.scalar_type()
                                                   : at::kHalf;
  TORCH_CHECK(odt == at::kHalf || odt == at::kBFloat16 || odt == at::kFloat, kOp,
              ": out_dtype must be torch.float16, torch.bfloat16 or torch.float32, got ", odt);

  const at::Device dev = a.device();
  auto same_device = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == dev, kOp, ": ", name, " must be on the same device as a (", dev, "), got ", t.device());
  };
  same_device(b, "b");
  same_device(sfb, "sfb");
  same_device(offs, "offs");

  // b: [G, N, K/2] packed e2m1, one weight per group.
  TORCH_CHECK(is_packed_dtype(b.scalar_type()), kOp, ": b must be packed e2m1 data of dtype torch.uint8 or "
              "torch.float4_e2m1fn_x2, got ", b.scalar_type());
  TORCH_CHECK(b.dim() == 3, kOp, ": b must be 3-D [G, N, K/2] (one packed weight per group, two e2m1 values per "
              "byte, K-major), got ", b.dim(), "-D tensor of shape ", shape_str(b));
  const int64_t g = b.size(0), n = b.size(1);

  int64_t k = 0;
  if (weight_only) {
    TORCH_CHECK(!sfa.has_value(), kOp, ": sfa must be None when a holds ", a.scalar_type(),
                " activations (the weight-only form multiplies them as they are); pass packed e2m1 a "
                "(torch.uint8 / torch.float4_e2m1fn_x2) to use sfa");
    TORCH_CHECK(a.dim() == 2, kOp, ": weight-only a must be 2-D [T, K] activations, got ", a.dim(),
                "-D tensor of shape ", shape_str(a));
    k = a.size(1);
    TORCH_CHECK(b.size(2) * 2 == k, kOp, ": b must be [G, N, K/2] with K = a.shape[1] = ", k,
                " (weight-only form), got b of shape ", shape_str(b));
  } else {
    TORCH_CHECK(is_packed_dtype(a.scalar_type()), kOp, ": a must be packed e2m1 data of dtype torch.uint8 or "
                "torch.float4_e2m1fn_x2, or float16 / bfloat16 / float32 activations for the weight-only form (with "
                "sfa=None), got ", a.scalar_type());
    TORCH_CHECK(sfa.has_value(), kOp, ": sfa is None, but a holds packed e2m1 data (", a.scalar_type(),
                "): pass a's grouped blocked scales, or float16 / bfloat16 / float32 activations for the "
                "weight-only form");
    same_device(*sfa, "sfa");
    TORCH_CHECK(a.dim() == 2, kOp, ": a must be 2-D [T, K/2] (two e2m1 values per byte, K-major), got ", a.dim(),
                "-D tensor of shape ", shape_str(a));
    k = a.size(1) * 2;
    TORCH_CHECK(b.size(2) == a.size(1), kOp, ": a and b must have the same K: a is [T, K/2] = ", shape_str(a),
                " (K=", k, "), b is [G, N, K/2] = ", shape_str(b), " (K=", b.size(2) * 2, ")");
  }
  const int64_t t = a.size(0);
  TORCH_CHECK(k > 0, kOp, ": K must be positive, got a of shape ", shape_str(a));
  TORCH_CHECK(k % 32 == 0, kOp, ": K must be a multiple of 32 (16-byte rows of packed data), got K=", k);
  TORCH_CHECK(n % 8 == 0, kOp, ": N must be a multiple of 8 (16-byte output rows), got N=", n, " (b of shape ",
              shape_str(b), ")");
  TORCH_CHECK(g >= 1, kOp, ": b must hold at least one group (G = b.shape[0] >= 1), got shape ", shape_str(b));

  // offs: int32 [G], the groups' cumulative row ends (torch.nn.functional.grouped_mm's convention).
  TORCH_CHECK(offs.scalar_type() == at::kInt, kOp, ": offs must be int32 (cumulative row ends of the groups, as "
              "torch.nn.functional.grouped_mm takes them), got ", offs.scalar_type());
  TORCH_CHECK(offs.dim() == 1 && offs.size(0) == g, kOp, ": offs must be 1-D [G] = [", g,
              "] (one row end per group of b), got shape ", shape_str(offs));
  TORCH_CHECK(offs.is_contiguous(), kOp, ": offs must be contiguous, got strides ", stride_str(offs));
  // offs holds int32 row ends: T must fit.
  TORCH_CHECK(t <= INT32_MAX, kOp, ": T = a.shape[0] must be at most 2^31 - 1 (offs is int32), got T=", t);

  check_sfb(sfb, g, n, k);
  const int64_t sfa_rows = weight_only ? 0 : check_sfa(*sfa, t, g, k);

  if (alpha.has_value()) {
    const at::Tensor& al = *alpha;
    TORCH_CHECK(al.scalar_type() == at::kFloat, kOp, ": alpha must be a float32 tensor (one value per group), got ",
                al.scalar_type());
    TORCH_CHECK(al.dim() == 1 && al.size(0) == g, kOp, ": alpha must be 1-D [G] = [", g,
                "] (group g's product of global decode scales), got shape ", shape_str(al));
    TORCH_CHECK(al.device() == dev, kOp, ": alpha must be on the inputs' device (", dev,
                ") so that no host sync is needed, got ", al.device());
    TORCH_CHECK(al.is_contiguous(), kOp, ": alpha must be contiguous, got strides ", stride_str(al));
  }
  if (out != nullptr) check_out(*out, t, n, odt, dev, gpu_rules);

  if (gpu_rules) {
    constexpr int64_t kMaxDim = INT32_MAX;
    TORCH_CHECK(n <= kMaxDim, kOp, ": N must be at most 2^31 - 1 on CUDA, got N=", n);
    TORCH_CHECK(k <= kMaxDim, kOp, ": K must be at most 2^31 - 1 on CUDA, got K=", k);
    TORCH_CHECK(g <= kMaxDim, kOp, ": G must be at most 2^31 - 1 on CUDA, got G=", g);
  }
  if (gpu_rules && t > 0 && n > 0) {
    TORCH_CHECK(!weight_only || t <= 1 || a.stride(0) >= k, kOp, ": weight-only a rows must not overlap (row stride "
                ">= K = ", k, "), got row stride ", a.stride(0), "; call .contiguous() first");
    check_gpu_readable("nvfp4_gemm.grouped_mm", a, "a");
    TORCH_CHECK(b.stride(2) == 1 || b.size(2) <= 1, kOp, ": b must be K-major (stride 1 along its last dim) for the "
                "GPU kernels, got strides ", stride_str(b), "; call .contiguous() first");
    TORCH_CHECK((n <= 1 || b.stride(1) % 16 == 0) && (g <= 1 || b.stride(0) % 16 == 0), kOp,
                ": b rows and groups must start 16 bytes apart (strides multiples of 16 bytes), got strides ",
                stride_str(b), "; call .contiguous() first");
    check_aligned(b, "b");
    if (!weight_only) check_aligned(*sfa, "sfa");
    check_aligned(sfb, "sfb");
  }
  return GroupedShape{t, n, k, g, odt, weight_only, sfa_rows};
}

// ---------------------------------------------------------------------------------------------------

namespace {
std::mutex g_grouped_mutex;
std::vector<const GroupedBackendApi*> g_grouped;
}  // namespace

std::vector<std::string> register_grouped_backends() {
  std::lock_guard<std::mutex> lock(g_grouped_mutex);
  std::vector<const GroupedBackendApi*> found;
  std::vector<std::string> names;
  for (const auto& backend : kArchBackends) {
    const char* name = backend.name;
    const std::string op = std::string("nvfp4_gemm::_grouped_api_") + name;
    auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
    if (!handle.has_value()) continue;
    const int64_t addr = handle->typed<int64_t()>().call();
    const auto* api = reinterpret_cast<const GroupedBackendApi*>(static_cast<intptr_t>(addr));
    TORCH_CHECK(api != nullptr && api->abi_version == kGroupedAbiVersion, "nvfp4_gemm: arch module '", name,
                "' was built against grouped ABI ", api ? api->abi_version : -1, ", this core expects ",
                kGroupedAbiVersion, "; rebuild the package");
    found.push_back(api);
    names.emplace_back(name);
  }
  g_grouped = std::move(found);
  return names;
}

const std::vector<const GroupedBackendApi*>& grouped_backends() { return g_grouped; }

}  // namespace nvfp4_gemm
