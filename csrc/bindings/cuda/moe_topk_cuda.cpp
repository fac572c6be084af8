// CUDA implementation of nvfp4_gemm::_moe_topk: validate, allocate the outputs through torch, launch the top-k
// kernel (csrc/cuda/moe_topk.cu) on the current stream. The logits are read on the device only: no host sync,
// so the call can be captured in a CUDA graph.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings/moe_topk.h"
#include "cuda/moe_topk.h"

namespace nvfp4_gemm {
namespace {

std::tuple<at::Tensor, at::Tensor> moe_topk_cuda(const at::Tensor& logits_in, int64_t k, bool normalize) {
  const MoeTopkShape s = check_moe_topk_inputs(logits_in, k);
  const c10::cuda::CUDAGuard guard(logits_in.device());
  auto [weights, ids] = empty_moe_topk_outputs(logits_in, s);
  if (s.t == 0) return {weights, ids};
  const at::Tensor logits = logits_in.contiguous();
  const OutDtype dt = logits.scalar_type() == at::kFloat  ? OutDtype::kFloat32
                      : logits.scalar_type() == at::kHalf ? OutDtype::kFloat16
                                                          : OutDtype::kBFloat16;
  char err[512] = {0};
  const bool ok = generic::moe_topk(logits.data_ptr(), dt, s.t, s.e, s.k, normalize, weights.data_ptr(),
                                    ids.data_ptr<int64_t>(), at::cuda::getCurrentCUDAStream(), err, sizeof(err));
  TORCH_CHECK(ok, "nvfp4_gemm._moe_topk (CUDA): ", err);
  return {weights, ids};
}

// The fused kernel where it applies (moe_router_fits, float16 / bfloat16), else F.linear's GEMM and the top-k kernel.
std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_router_cuda(const at::Tensor& x_in, const at::Tensor& weight_in,
                                                               int64_t k, bool normalize) {
  const MoeTopkShape s = check_moe_router_inputs(x_in, weight_in, k);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const auto dt = x.scalar_type();
  const int major = at::cuda::getCurrentDeviceProperties()->major;
  if (dt == at::kFloat || !generic::moe_router_fits(major, s.t, x.size(1), s.e, x.data_ptr(), weight.data_ptr())) {
    at::Tensor logits = at::linear(x, weight);
    auto [weights, ids] = moe_topk_cuda(logits, k, normalize);
    return {logits, weights, ids};
  }
  at::Tensor logits = at::empty({s.t, s.e}, x.options());
  auto [weights, ids] = empty_moe_topk_outputs(logits, s);
  char err[512] = {0};
  const bool ok = generic::moe_router(x.data_ptr(), weight.data_ptr(),
                                      dt == at::kHalf ? OutDtype::kFloat16 : OutDtype::kBFloat16, s.t, x.size(1),
                                      s.e, s.k, normalize, logits.data_ptr(), weights.data_ptr(),
                                      ids.data_ptr<int64_t>(), at::cuda::getCurrentCUDAStream(), err, sizeof(err));
  TORCH_CHECK(ok, "nvfp4_gemm._moe_router (CUDA): ", err);
  return {logits, weights, ids};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) {
  m.impl("_moe_topk", &nvfp4_gemm::moe_topk_cuda);
  m.impl("_moe_router", &nvfp4_gemm::moe_router_cuda);
}
