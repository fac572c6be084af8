// CUDA implementation of nvfp4_gemm::quantize: validate, lay x out for 16-byte loads, launch the
// torch-free kernel (csrc/quant/quantize.cu) on the current stream. global_scale is read on the device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings/quantize.h"
#include "quant/quantize.h"

namespace nvfp4_gemm {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_cuda(const at::Tensor& x_in, const std::optional<at::Tensor>& global_scale) {
  const QuantShape s = check_quantize_inputs(x_in, global_scale);
  const c10::cuda::CUDAGuard guard(x_in.device());
  auto [packed, sf] = empty_quantize_outputs(x_in, s);
  if (s.rows == 0) return {packed, sf};
  // The kernel reads 16-byte chunks: unit stride along K, 16-byte aligned rows and base. Anything else is
  // copied once (a fresh allocation is 16-byte aligned).
  at::Tensor x = x_in;
  const int64_t esize = static_cast<int64_t>(x.element_size());
  const auto aligned = [&](const at::Tensor& t) {
    return t.stride(1) == 1 && (s.rows == 1 || (t.stride(0) * esize) % 16 == 0) &&
           reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  if (!aligned(x)) x = x.contiguous();
  if (!aligned(x)) x = x.clone(at::MemoryFormat::Contiguous);
  const quant::InDtype dt = x.scalar_type() == at::kFloat  ? quant::InDtype::kFloat32
                            : x.scalar_type() == at::kHalf ? quant::InDtype::kFloat16
                                                           : quant::InDtype::kBFloat16;
  quant::GlobalScale gs;
  gs.encode = global_scale.has_value() ? global_scale->data_ptr<float>() : nullptr;
  char err[512] = {0};
  const bool ok = quant::quantize_cuda(x.data_ptr(), dt, s.rows, s.k, s.rows > 1 ? x.stride(0) : s.k, gs,
                                       packed.data_ptr<uint8_t>(), static_cast<uint8_t*>(sf.data_ptr()),
                                       at::cuda::getCurrentCUDAStream(), err, sizeof(err));
  TORCH_CHECK(ok, "nvfp4_gemm.quantize (CUDA): ", err);
  return {packed, sf};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) { m.impl("quantize", &nvfp4_gemm::quantize_cuda); }
