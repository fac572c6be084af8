// CUDA implementation of nvfp4_gemm::linear and nvfp4_gemm::_input_scales. Launches per forward, besides
// the GEMM's own:
//   * dynamic W4A4: 1, the input scales kernel (csrc/quant/input_scales.cu: finite amax, then encode /
//     decode / alpha into a small device buffer); none where the GEMM call forms them itself (mm_dynamic_a_cuda:
//     sm90's K-sliced path at M <= 16);
//   * static W4A4: none;
//   * weight-only: none;
//   * a bias: 1 more (finish_linear).
// The GEMM quantizes x itself where an arch kernel can (mm_quantized_a_cuda: sm90, whose K-sliced path at
// M <= 16 runs its own quantization kernel ahead of the GEMM inside the one call). Elsewhere (sm100, the
// generic path, M >= 2048 on sm90) quantize runs first (csrc/quant/quantize.cu, called directly, not through
// the dispatcher): one more launch, reading the buffer's encode scale (dynamic) or forming it from
// input_scale and writing alpha (static); mm then reads alpha from the buffer. No host sync anywhere.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "bindings/cuda/mm_cuda.h"
#include "bindings/linear.h"
#include "bindings/quantize.h"
#include "quant/input_scales.h"
#include "quant/quantize.h"

namespace nvfp4_gemm {
namespace {

quant::InDtype in_dtype(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat:
      return quant::InDtype::kFloat32;
    case at::kHalf:
      return quant::InDtype::kFloat16;
    default:
      return quant::InDtype::kBFloat16;
  }
}

// Writes [encode, decode, alpha] into `out` (float32 [3] on x's device) with one launch on `stream`.
// x: [rows, K] with 16-byte aligned rows of unit stride (K % 16 == 0 checked by the caller).
void launch_input_scales(const at::Tensor& x, const at::Tensor& weight_scale_2,
                         const std::optional<at::Tensor>& input_scale, at::Tensor& out, cudaStream_t stream) {
  quant::ReductionSlot slot;
  at::Tensor own_words;  // freed to the caching allocator after the launch is enqueued: stream-ordered reuse
  if (!input_scale.has_value()) {
    slot = quant::reduction_slot(stream);
    if (slot.index < 0) {
      own_words = at::zeros({2}, x.options().dtype(at::kInt));
      slot.words = reinterpret_cast<uint32_t*>(own_words.data_ptr<int32_t>());
    }
  }
  const int64_t rows = x.size(0), k = x.size(1);
  char err[512] = {0};
  const bool ok = quant::input_scales_cuda(
      x.data_ptr(), in_dtype(x), rows, k, rows > 1 ? x.stride(0) : k,
      input_scale.has_value() ? input_scale->data_ptr<float>() : nullptr, weight_scale_2.data_ptr<float>(),
      out.data_ptr<float>(), slot, stream, err, sizeof(err));
  TORCH_CHECK(ok, "nvfp4_gemm.linear (CUDA): ", err);
}

at::Tensor input_scales_op_cuda(const at::Tensor& x_in, const at::Tensor& weight_scale_2,
                                const std::optional<at::Tensor>& input_scale) {
  check_input_scales_inputs(x_in, weight_scale_2, input_scale);
  const c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in;
  const int64_t esize = static_cast<int64_t>(x.element_size());
  const bool aligned = x.stride(1) == 1 && (x.size(0) <= 1 || (x.stride(0) * esize) % 16 == 0) &&
                       reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  if (!aligned) x = x.clone(at::MemoryFormat::Contiguous);
  at::Tensor out = at::empty({quant::kNumInputScales}, x.options().dtype(at::kFloat));
  launch_input_scales(x, weight_scale_2, input_scale, out, at::cuda::getCurrentCUDAStream());
  return out;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                       const at::Tensor& weight_scale_2, const std::optional<at::Tensor>& input_scale,
                       const std::optional<at::Tensor>& bias, bool weight_only) {
  const LinearShape s = check_linear_inputs(x, weight, weight_scale, weight_scale_2, input_scale, bias, weight_only);
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x2 = rows_for_kernels(x, s.k);
  if (weight_only) {
    return finish_linear(call_mm(x2, weight, std::nullopt, weight_scale, weight_scale_2, mm_dtype_for(s, bias)),
                         bias, s);
  }
  const at::ScalarType mm_dtype = mm_dtype_for(s, bias);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool rows = x2.size(0) > 0;  // an empty batch: nothing to scale or quantize; mm returns the empty result
  // Where an arch kernel quantizes x itself (sm90), one GEMM call does the rest: static takes the decode
  // scale and weight_scale_2 as they are (encode = 1 / decode and alpha = decode * weight_scale_2 formed in
  // the kernel; no scale buffer is needed), dynamic the buffer's encode scale and alpha. Bit for bit the
  // path below.
  if (rows && input_scale.has_value()) {
    if (std::optional<at::Tensor> fused = mm_quantized_a_cuda(x2, weight, weight_scale, *input_scale,
                                                              /*a_scale_is_decode=*/true, *input_scale,
                                                              weight_scale_2, mm_dtype))
      return finish_linear(std::move(*fused), bias, s);
  }
  at::Tensor scales = at::empty({quant::kNumInputScales}, x.options().dtype(at::kFloat));
  if (rows && !input_scale.has_value()) {
    // Where an arch kernel also forms the input scales itself (sm90's K-sliced path at decode M), one call.
    if (std::optional<at::Tensor> fused = mm_dynamic_a_cuda(x2, weight, weight_scale, weight_scale_2, scales, mm_dtype))
      return finish_linear(std::move(*fused), bias, s);
    launch_input_scales(x2, weight_scale_2, input_scale, scales, stream);
    if (std::optional<at::Tensor> fused = mm_quantized_a_cuda(
            x2, weight, weight_scale, scales.narrow(0, quant::kEncode, 1), /*a_scale_is_decode=*/false,
            scales.narrow(0, quant::kAlpha, 1), std::nullopt, mm_dtype))
      return finish_linear(std::move(*fused), bias, s);
  }
  const QuantShape q = check_quantize_inputs(x2, std::nullopt);
  auto [packed, sf] = empty_quantize_outputs(x2, q);
  if (q.rows > 0) {
    float* buf = scales.data_ptr<float>();
    quant::GlobalScale gs;
    if (input_scale.has_value()) {
      gs.decode = input_scale->data_ptr<float>();
      gs.weight_scale_2 = weight_scale_2.data_ptr<float>();
      gs.alpha_out = buf + quant::kAlpha;
    } else {
      gs.encode = buf + quant::kEncode;
    }
    char err[512] = {0};
    const bool ok = quant::quantize_cuda(x2.data_ptr(), in_dtype(x2), q.rows, q.k, q.k, gs, packed.data_ptr<uint8_t>(),
                                         static_cast<uint8_t*>(sf.data_ptr()), stream, err, sizeof(err));
    TORCH_CHECK(ok, "nvfp4_gemm.linear (CUDA): ", err);
  }
  return finish_linear(call_mm(packed, weight, sf, weight_scale, scales.narrow(0, quant::kAlpha, 1), mm_dtype),
                       bias, s);
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) {
  m.impl("linear", &nvfp4_gemm::linear_cuda);
  m.impl("_input_scales", &nvfp4_gemm::input_scales_op_cuda);
}
