// CUDA implementation of nvfp4_gemm::quantize_mse: validate, lay x out for 16-byte loads, launch the
// torch-free kernel (csrc/quant/mse.cu) on the current stream. global_scale is read on the device.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings/quantize_mse.h"
#include "quant/mse.h"

namespace nvfp4_gemm {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_mse_cuda(const at::Tensor& x_in, const at::Tensor& global_scale,
                                                                 int64_t neighbours, bool clip,
                                                                 const std::optional<at::Tensor>& column_weight,
                                                                 bool with_error) {
  const QuantShape s = check_quantize_mse_inputs(x_in, global_scale, neighbours, column_weight);
  const c10::cuda::CUDAGuard guard(x_in.device());
  auto [packed, scale, error] = empty_quantize_mse_outputs(x_in, s, with_error);
  if (s.rows == 0) return {packed, scale, error};
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
  // The kernel reads the weights of a block's 16 columns as four 16-byte loads.
  at::Tensor w;
  if (column_weight.has_value()) {
    w = column_weight->contiguous();
    if (reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 != 0) w = w.clone(at::MemoryFormat::Contiguous);
  }
  const quant::InDtype dt = x.scalar_type() == at::kFloat  ? quant::InDtype::kFloat32
                            : x.scalar_type() == at::kHalf ? quant::InDtype::kFloat16
                                                           : quant::InDtype::kBFloat16;
  char err[512] = {0};
  const bool ok = quant::quantize_mse_cuda(
      x.data_ptr(), dt, s.rows, s.k, s.rows > 1 ? x.stride(0) : s.k, global_scale.data_ptr<float>(),
      static_cast<int>(neighbours), clip, w.defined() ? w.data_ptr<float>() : nullptr, packed.data_ptr<uint8_t>(),
      scale.data_ptr<uint8_t>(), with_error ? error.data_ptr<double>() : nullptr, at::cuda::getCurrentCUDAStream(),
      err, sizeof(err));
  TORCH_CHECK(ok, "nvfp4_gemm.quantize_mse (CUDA): ", err);
  return {packed, scale, error};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) { m.impl("quantize_mse", &nvfp4_gemm::quantize_mse_cuda); }
