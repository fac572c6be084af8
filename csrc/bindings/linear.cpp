// nvfp4_gemm::linear: one op per NVFP4Linear forward (weight-only, static W4A4, dynamic W4A4).
//
// One implementation for every device, registered for CPU and CUDA: it forms the per-tensor scales with
// tensor ops on x's device (no host sync, CUDA-graph safe), then calls nvfp4_gemm::quantize and
// nvfp4_gemm::mm through the dispatcher, so each device runs its own kernels. On CUDA, where an arch kernel
// quantizes x on the fly (mm_quantized_a_cuda; sm90), one GEMM call replaces quantize + mm, with the same bits. The scale arithmetic is
// written operation for operation as nvfp4_gemm.quantize.global_encode_scale and the Python layer did it,
// so W4A4 results are bit for bit those of quantize() followed by mm() with the same scales.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cfloat>
#include <optional>

#ifdef NVFP4_GEMM_WITH_CUDA
#include "bindings/cuda/mm_cuda.h"
#endif

namespace nvfp4_gemm {
namespace {

constexpr double kE2m1Max = 6.0;
constexpr double kE4m3Max = 448.0;

at::Tensor call_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                   const at::Tensor& sfb, const std::optional<at::Tensor>& alpha, at::ScalarType out_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("nvfp4_gemm::mm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                               const at::Tensor&, const std::optional<at::Tensor>&,
                                               std::optional<at::ScalarType>)>();
  return op.call(a, b, sfa, sfb, alpha, out_dtype);
}

std::tuple<at::Tensor, at::Tensor> call_quantize(const at::Tensor& x, const at::Tensor& global_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("nvfp4_gemm::quantize", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                       const std::optional<at::Tensor>&)>();
  return op.call(x, global_scale);
}

// max |x| over the finite elements, 0 if none, as a one-element float32 tensor on x's device.
at::Tensor finite_amax(const at::Tensor& x) {
  if (x.numel() == 0) return at::zeros({1}, x.options().dtype(at::kFloat));
  const at::Tensor a = x.abs();
  return at::where(at::isfinite(a), a, at::zeros_like(a)).amax().to(at::kFloat).reshape({1});
}

// 448 * 6 / amax (amax = 0 -> 1, overflow clamped), formed as Python's `2688.0 / t` forms it
// (reciprocal, then multiply): nvfp4_gemm.quantize.global_encode_scale.
at::Tensor global_encode_scale(const at::Tensor& amax) {
  const at::Tensor gs = at::reciprocal(amax) * (kE2m1Max * kE4m3Max);
  return at::clamp_max(at::where(amax > 0, gs, at::ones_like(gs)), FLT_MAX);
}

void check_scalar_arg(const at::Tensor& t, const char* name, const at::Device& dev) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "nvfp4_gemm.linear: ", name, " must be float32, got ",
              t.scalar_type());
  TORCH_CHECK(t.numel() == 1, "nvfp4_gemm.linear: ", name, " must hold exactly one value, got shape ", t.sizes());
  TORCH_CHECK(t.device() == dev, "nvfp4_gemm.linear: ", name, " must be on x's device (", dev, "), got ",
              t.device());
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                  const at::Tensor& weight_scale_2, const std::optional<at::Tensor>& input_scale,
                  const std::optional<at::Tensor>& bias, bool weight_only) {
  TORCH_CHECK(x.dim() >= 2, "nvfp4_gemm.linear: x must be [..., K] with at least 2 dims (a batch of rows), got ",
              x.dim(), "-D tensor of shape ", x.sizes(), "; use x.unsqueeze(0) for a single row");
  const at::ScalarType xdt = x.scalar_type();
  TORCH_CHECK(xdt == at::kHalf || xdt == at::kBFloat16 || xdt == at::kFloat,
              "nvfp4_gemm.linear: x must be float16, bfloat16 or float32, got ", xdt);
  TORCH_CHECK(weight.dim() == 2, "nvfp4_gemm.linear: weight must be 2-D packed e2m1 [N, K/2], got shape ",
              weight.sizes());
  const int64_t n = weight.size(0), k = weight.size(1) * 2;
  TORCH_CHECK(x.size(-1) == k, "nvfp4_gemm.linear: x.shape[-1] must be in_features K = ", k,
              " (weight is [N, K/2] = ", weight.sizes(), "), got ", x.size(-1));
  const at::Device dev = x.device();
  TORCH_CHECK(weight.device() == dev, "nvfp4_gemm.linear: weight must be on x's device (", dev, "), got ",
              weight.device());
  check_scalar_arg(weight_scale_2, "weight_scale_2", dev);
  if (input_scale.has_value()) check_scalar_arg(*input_scale, "input_scale", dev);
  TORCH_CHECK(!(weight_only && input_scale.has_value()), "nvfp4_gemm.linear: weight_only=True takes no "
              "input_scale (activations are not quantized), got one");
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "nvfp4_gemm.linear: bias must be [N] = [", n, "], got ",
                bias->sizes());
    TORCH_CHECK(bias->device() == dev, "nvfp4_gemm.linear: bias must be on x's device (", dev, "), got ",
                bias->device());
    TORCH_CHECK(at::isFloatingType(bias->scalar_type()), "nvfp4_gemm.linear: bias must be floating point, got ",
                bias->scalar_type());
  }

  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  at::Tensor x2 = x.reshape({-1, k});
  // The GPU kernels read 16-byte rows with unit stride along K; anything else is copied once.
  if (!x2.is_contiguous() || reinterpret_cast<uintptr_t>(x2.data_ptr()) % 16 != 0) {
    x2 = x2.clone(at::MemoryFormat::Contiguous);
  }
  // With a bias the GEMM stays in fp32 so that the bias joins before the one rounding to x's dtype.
  const at::ScalarType mm_dtype = bias.has_value() ? at::kFloat : xdt;

  at::Tensor y;
  if (weight_only) {
    y = call_mm(x2, weight, std::nullopt, weight_scale, weight_scale_2, mm_dtype);
  } else {
    at::Tensor encode, decode;
    std::optional<at::Tensor> fused;
    if (input_scale.has_value()) {
      decode = input_scale->reshape({1});
#ifdef NVFP4_GEMM_WITH_CUDA
      // One GEMM call that quantizes x itself (encode = 1 / decode and alpha = decode * weight_scale_2
      // formed in the kernel), where an arch kernel takes it; bit for bit the calls below.
      if (x2.is_cuda())
        fused = mm_quantized_a_cuda(x2, weight, weight_scale, decode, /*a_scale_is_decode=*/true, decode,
                                    weight_scale_2, mm_dtype);
#endif
      if (!fused) encode = at::reciprocal(decode);
    } else {
      encode = global_encode_scale(finite_amax(x2));
      decode = at::reciprocal(encode);
#ifdef NVFP4_GEMM_WITH_CUDA
      if (x2.is_cuda())
        fused = mm_quantized_a_cuda(x2, weight, weight_scale, encode, /*a_scale_is_decode=*/false, decode,
                                    weight_scale_2, mm_dtype);
#endif
    }
    if (fused) {
      y = *fused;
    } else {
      auto [packed, sf] = call_quantize(x2, encode);
      y = call_mm(packed, weight, sf, weight_scale, decode * weight_scale_2.reshape({1}), mm_dtype);
    }
  }
  if (bias.has_value()) y = y.add_(bias->to(at::kFloat)).to(xdt);
  return y.view(out_shape);
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def(
      "linear(Tensor x, Tensor weight, Tensor weight_scale, Tensor weight_scale_2, Tensor? input_scale=None, "
      "Tensor? bias=None, bool weight_only=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) { m.impl("linear", &nvfp4_gemm::linear); }
#ifdef NVFP4_GEMM_WITH_CUDA
TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) { m.impl("linear", &nvfp4_gemm::linear); }
#endif
