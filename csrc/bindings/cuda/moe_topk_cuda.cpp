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

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) { m.impl("_moe_topk", &nvfp4_gemm::moe_topk_cuda); }
