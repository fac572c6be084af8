// nvfp4_gemm._C_sm90's grouped GEMM: registers the GroupedBackendApi table (common/grouped_module.h), and two
// private ops for the sm90 grouped kernels' own tests and benchmarks:
//  - _sm90_grouped_test(a, b, sfa, sfb, offs, alpha, out, config, sfa_rows): one launch of config (-1: what
//    select picks) on the current stream, workspace from torch's allocator; argument checks only as deep as a
//    test needs (the public op is nvfp4_gemm.grouped_mm, whose binding validates everything);
//  - _sm90_grouped_force_splits(n): the split count of every following grouped launch (0: automatic).
//  - _sm90_grouped_workspace_counters(on): split launches count on workspace counters (the no-free-slot path).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "common/grouped_module.h"
#include "sm90/grouped.h"

NVFP4_GEMM_GROUPED_API(sm90, nvfp4_gemm::sm90::grouped_api())

namespace {

using nvfp4_gemm::AType;
using nvfp4_gemm::OutDtype;

bool packed(const at::Tensor& t) {
  return t.scalar_type() == at::kByte || t.scalar_type() == at::ScalarType::Float4_e2m1fn_x2;
}

void grouped_test(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa, const at::Tensor& sfb,
                  const at::Tensor& offs, const std::optional<at::Tensor>& alpha, const at::Tensor& out, int64_t config,
                  int64_t sfa_rows) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && sfb.is_cuda() && offs.is_cuda() && out.is_cuda(),
              "_sm90_grouped_test: every tensor on the GPU");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 3 && out.dim() == 2, "_sm90_grouped_test: a [T, *], b [G, N, K/2], out [T, N]");
  TORCH_CHECK(packed(b) && b.is_contiguous() && sfb.is_contiguous() && offs.is_contiguous() &&
                  offs.scalar_type() == at::kInt && a.stride(1) == 1 && out.stride(1) == 1,
              "_sm90_grouped_test: packed contiguous b, contiguous sfb, int32 offs, row-major a and out");
  const int64_t g = b.size(0), n = b.size(1), k = b.size(2) * 2, t = a.size(0);
  TORCH_CHECK(offs.numel() == g && out.size(0) == t && out.size(1) == n, "_sm90_grouped_test: offs [G], out [T, N]");
  nvfp4_gemm::GroupedProblem p{};
  if (packed(a)) {
    TORCH_CHECK(a.size(1) * 2 == k && sfa.has_value() && sfa->is_contiguous() &&
                    sfa->numel() >= sfa_rows * nvfp4_gemm::round_up(k / 16, 4),
                "_sm90_grouped_test: packed A needs [T, K/2] and sfa of sfa_rows blocked rows");
    p.a_type = AType::kE2m1;
    p.sfa = static_cast<const uint8_t*>(sfa->data_ptr());
  } else {
    TORCH_CHECK(a.size(1) == k && (a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16 ||
                                   a.scalar_type() == at::kFloat),
                "_sm90_grouped_test: 16-bit A [T, K]");
    p.a_type = a.scalar_type() == at::kHalf ? AType::kFloat16
               : a.scalar_type() == at::kBFloat16 ? AType::kBFloat16 : AType::kFloat32;
  }
  TORCH_CHECK(sfb.numel() == g * nvfp4_gemm::round_up(n, 128) * nvfp4_gemm::round_up(k / 16, 4),
              "_sm90_grouped_test: sfb holds G blocked N x K/16 scales");
  if (alpha.has_value())
    TORCH_CHECK(alpha->is_cuda() && alpha->scalar_type() == at::kFloat && alpha->numel() == g && alpha->is_contiguous(),
                "_sm90_grouped_test: alpha float32 [G]");
  p.a = static_cast<const uint8_t*>(a.data_ptr());
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.sfb = static_cast<const uint8_t*>(sfb.data_ptr());
  p.offs = offs.data_ptr<int32_t>();
  p.alpha = alpha.has_value() ? alpha->data_ptr<float>() : nullptr;
  p.c = out.data_ptr();
  p.t = t, p.n = n, p.k = k, p.g = g;
  p.lda = a.stride(0) * a.element_size();
  p.ldb = b.stride(1) * b.element_size();
  p.b_group_bytes = b.stride(0) * b.element_size();
  p.ldc = out.stride(0);
  p.sfa_rows = sfa_rows;
  p.out_dtype = out.scalar_type() == at::kHalf       ? OutDtype::kFloat16
                : out.scalar_type() == at::kBFloat16 ? OutDtype::kBFloat16
                                                     : OutDtype::kFloat32;
  TORCH_CHECK(out.scalar_type() == at::kHalf || out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat,
              "_sm90_grouped_test: out float16, bfloat16 or float32");

  const c10::cuda::CUDAGuard guard(a.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  const nvfp4_gemm::DeviceInfo dev{prop->major * 10 + prop->minor, prop->multiProcessorCount,
                                   static_cast<int64_t>(prop->sharedMemPerBlockOptin)};
  const nvfp4_gemm::GroupedBackendApi& api = nvfp4_gemm::sm90::grouped_api();
  char why[512] = {0};
  int32_t cfg = static_cast<int32_t>(config);
  if (cfg < 0) {
    cfg = api.select(&p, &dev, why, sizeof(why));
    TORCH_CHECK(cfg >= 0, "_sm90_grouped_test: ", why);
  } else {
    TORCH_CHECK(api.can_run(&p, cfg, &dev, why, sizeof(why)), "_sm90_grouped_test: ", why);
  }
  const size_t ws_bytes = api.workspace_bytes(&p, cfg, &dev);
  const at::Tensor ws = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
  TORCH_CHECK(api.run(&p, cfg, &dev, ws.data_ptr(), ws_bytes, at::cuda::getCurrentCUDAStream(), why, sizeof(why)),
              "_sm90_grouped_test: ", why);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_sm90_grouped_test(Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor offs, Tensor? alpha, Tensor(a!) out, "
        "int config, int sfa_rows) -> ()");
  m.def("_sm90_grouped_force_splits(int splits) -> int", [](int64_t splits) -> int64_t {
    TORCH_CHECK(splits >= 0 && splits <= 1024, "nvfp4_gemm._sm90_grouped_force_splits: splits must be in [0, 1024] "
                "(0: automatic), got ", splits);
    return nvfp4_gemm::sm90::set_forced_grouped_splits(static_cast<int>(splits));
  });
  m.def("_sm90_grouped_workspace_counters(bool on) -> bool",
        [](bool on) -> bool { return nvfp4_gemm::sm90::set_workspace_counters_forced(on); });
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) { m.impl("_sm90_grouped_test", &grouped_test); }
