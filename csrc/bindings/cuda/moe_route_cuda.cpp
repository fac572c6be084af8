// CUDA implementation of nvfp4_gemm::_moe_route: validate, allocate the outputs (and the workspace of the
// three-launch form) through torch, launch the routing kernels (csrc/cuda/moe_route.cu) on the current stream.
// The ids are read on the device only: no host sync, so the call can be captured in a CUDA graph whose routing
// changes between replays.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings/moe_route.h"
#include "cuda/moe_route.h"

namespace nvfp4_gemm {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_route_cuda(const at::Tensor& top_k_index, int64_t num_experts) {
  const MoeRouteShape s = check_moe_route_inputs(top_k_index, num_experts);
  const c10::cuda::CUDAGuard guard(top_k_index.device());
  auto [offs, row_token, inverse] = empty_moe_route_outputs(top_k_index, s);
  if (s.s == 0) {
    offs.zero_();
    return {offs, row_token, inverse};
  }
  const at::Tensor ids = top_k_index.contiguous();
  const size_t ws_bytes = generic::moe_route_workspace_bytes(s.s, s.e);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, ids.options().dtype(at::kByte));
  char err[512] = {0};
  const bool ok = generic::moe_route(ids.data_ptr(), ids.scalar_type() == at::kLong, s.s, s.k, s.e,
                                     offs.data_ptr<int32_t>(), row_token.data_ptr<int64_t>(),
                                     inverse.data_ptr<int64_t>(), ws_bytes > 0 ? workspace.data_ptr() : nullptr,
                                     at::cuda::getCurrentCUDAStream(), err, sizeof(err));
  TORCH_CHECK(ok, "nvfp4_gemm._moe_route (CUDA): ", err);
  return {offs, row_token, inverse};
}

}  // namespace
}  // namespace nvfp4_gemm

// Whether the CUDA routing of s pairs into e experts is one launch (else three): for the tests.
TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_moe_route_one_launch(int s, int e) -> bool",
        [](int64_t s, int64_t e) { return nvfp4_gemm::generic::moe_route_one_launch(s, e); });
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) { m.impl("_moe_route", &nvfp4_gemm::moe_route_cuda); }
