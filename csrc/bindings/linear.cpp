// nvfp4_gemm::linear: one op per NVFP4Linear forward (weight-only, static W4A4, dynamic W4A4). Schema, the
// checks and steps every device shares, and the CPU implementation; the CUDA one is
// csrc/bindings/cuda/linear_cuda.cpp.
//
// W4A4 on every device: the input's per-tensor scales [encode, decode, alpha] (nvfp4_gemm::_input_scales,
// csrc/quant/recipe.h's dynamic_input_scales / static_input_scales, on x's device, no host sync), then
// quantize(x, encode) and mm(..., alpha). The scale arithmetic is operation for operation that of
// nvfp4_gemm.quantize.global_encode_scale and the products the Python layer formed, so W4A4 results are
// bit for bit those of quantize() followed by mm() with the same scales.
#include "bindings/linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>

#include "bindings/checks.h"
#include "bindings/quantize.h"
#include "quant/recipe.h"

namespace nvfp4_gemm {
namespace {

void check_scalar_arg(const char* op, const at::Tensor& t, const char* name, const at::Device& dev) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.numel() == 1, op, ": ", name, " must hold exactly one value, got shape ", t.sizes());
  TORCH_CHECK(t.device() == dev, op, ": ", name, " must be on x's device (", dev, "), got ", t.device());
}

std::tuple<at::Tensor, at::Tensor> call_quantize(const at::Tensor& x, const at::Tensor& global_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("nvfp4_gemm::quantize", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                       const std::optional<at::Tensor>&)>();
  return op.call(x, global_scale);
}

// max |x| over the finite elements of a contiguous tensor, 0 if none: integer compares of the abs bits
// (non-negative floats order as their bits do), so the order of the parallel chunks does not matter.
template <typename Raw, uint32_t kInfBits, typename ToF32Bits>
float finite_amax(const at::Tensor& x, ToF32Bits to_f32_bits) {
  const Raw* p = static_cast<const Raw*>(x.data_ptr());
  constexpr Raw kAbsMask = static_cast<Raw>(sizeof(Raw) == 4 ? 0x7FFFFFFFu : 0x7FFFu);
  const uint32_t m = at::parallel_reduce(
      int64_t{0}, x.numel(), int64_t{1} << 15, uint32_t{0},
      [&](int64_t b, int64_t e, uint32_t acc) {
        for (int64_t i = b; i < e; ++i) {
          const uint32_t a = p[i] & kAbsMask;
          acc = std::max(acc, a < kInfBits ? a : 0u);
        }
        return acc;
      },
      [](uint32_t a, uint32_t b) { return std::max(a, b); });
  return quant::bits_float(to_f32_bits(static_cast<Raw>(m)));
}

float finite_amax_cpu(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat:
      return finite_amax<uint32_t, 0x7F800000u>(x, [](uint32_t v) { return v; });
    case at::kHalf:
      return finite_amax<uint16_t, 0x7C00u>(x, quant::f16_to_f32_bits);
    default:
      return finite_amax<uint16_t, 0x7F80u>(x, quant::bf16_to_f32_bits);
  }
}

// A per-tensor DECODE scale on the CPU is read for free: one that is not positive and finite is refused by
// name. (On CUDA the scales stay on the device, unread by the host: there a bad input_scale gives NaN outputs,
// recipe.h's block_scale; the loaders and NVFP4Linear's constructors refuse bad scales before any call.)
void check_decode_scale_cpu(const char* op, const at::Tensor& t, const char* name) {
  const float v = *t.data_ptr<float>();
  TORCH_CHECK(quant::usable_encode_scale(v), op, ": ", name, " must be positive and finite (a per-tensor DECODE "
              "scale), got ", v);
}

// [encode, decode, alpha] of x (contiguous) on the CPU.
at::Tensor input_scales_cpu(const at::Tensor& x, const at::Tensor& weight_scale_2,
                            const std::optional<at::Tensor>& input_scale) {
  const float ws2 = *weight_scale_2.data_ptr<float>();
  const quant::InputScales s = input_scale.has_value()
                                   ? quant::static_input_scales(*input_scale->data_ptr<float>(), ws2)
                                   : quant::dynamic_input_scales(finite_amax_cpu(x), ws2);
  at::Tensor out = at::empty({3}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  o[0] = s.encode;
  o[1] = s.decode;
  o[2] = s.alpha;
  return out;
}

at::Tensor input_scales_op_cpu(const at::Tensor& x, const at::Tensor& weight_scale_2,
                               const std::optional<at::Tensor>& input_scale) {
  check_input_scales_inputs(x, weight_scale_2, input_scale);
  check_decode_scale_cpu("nvfp4_gemm._input_scales", weight_scale_2, "weight_scale_2");
  if (input_scale.has_value()) check_decode_scale_cpu("nvfp4_gemm._input_scales", *input_scale, "input_scale");
  return input_scales_cpu(x.contiguous(), weight_scale_2, input_scale);
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                      const at::Tensor& weight_scale_2, const std::optional<at::Tensor>& input_scale,
                      const std::optional<at::Tensor>& bias, bool weight_only) {
  const LinearShape s = check_linear_inputs(x, weight, weight_scale, weight_scale_2, input_scale, bias, weight_only);
  check_decode_scale_cpu("nvfp4_gemm.linear", weight_scale_2, "weight_scale_2");
  if (input_scale.has_value()) check_decode_scale_cpu("nvfp4_gemm.linear", *input_scale, "input_scale");
  const at::Tensor x2 = rows_for_kernels(x, s.k);
  at::Tensor y;
  if (weight_only) {
    y = call_mm(x2, weight, std::nullopt, weight_scale, weight_scale_2, mm_dtype_for(s, bias));
  } else {
    const at::Tensor scales = input_scales_cpu(x2, weight_scale_2, input_scale);
    auto [packed, sf] = call_quantize(x2, scales.narrow(0, 0, 1));
    y = call_mm(packed, weight, sf, weight_scale, scales.narrow(0, 2, 1), mm_dtype_for(s, bias));
  }
  return finish_linear(std::move(y), bias, s);
}

}  // namespace

LinearShape check_linear_inputs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                                const at::Tensor& weight_scale_2, const std::optional<at::Tensor>& input_scale,
                                const std::optional<at::Tensor>& bias, bool weight_only) {
  constexpr const char* kOp = "nvfp4_gemm.linear";
  TORCH_CHECK(x.dim() >= 2, kOp, ": x must be [..., K] with at least 2 dims (a batch of rows), got ", x.dim(),
              "-D tensor of shape ", x.sizes(), "; use x.unsqueeze(0) for a single row");
  const at::ScalarType xdt = x.scalar_type();
  TORCH_CHECK(xdt == at::kHalf || xdt == at::kBFloat16 || xdt == at::kFloat, kOp,
              ": x must be float16, bfloat16 or float32, got ", xdt);
  TORCH_CHECK(weight.scalar_type() == at::kByte || weight.scalar_type() == at::kFloat4_e2m1fn_x2, kOp,
              ": weight must be packed e2m1 of dtype torch.uint8 or torch.float4_e2m1fn_x2, got ",
              weight.scalar_type());
  TORCH_CHECK(weight.dim() == 2, kOp, ": weight must be 2-D packed e2m1 [N, K/2], got shape ", weight.sizes());
  const int64_t n = weight.size(0), k = weight.size(1) * 2;
  TORCH_CHECK(x.size(-1) == k, kOp, ": x.shape[-1] must be in_features K = ", k, " (weight is [N, K/2] = ",
              weight.sizes(), "), got ", x.size(-1));
  const at::Device dev = x.device();
  TORCH_CHECK(weight.device() == dev, kOp, ": weight must be on x's device (", dev, "), got ", weight.device());
  TORCH_CHECK(weight_scale.device() == dev, kOp, ": weight_scale must be on x's device (", dev, "), got ",
              weight_scale.device());
  check_blocked_scales(kOp, weight_scale, "weight_scale", "N", n, k);
  if (dev.is_cuda() && n > 0 && k > 0) {
    check_gpu_readable(kOp, weight, "weight");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(weight_scale.data_ptr()) % 16 == 0, kOp,
                ": weight_scale data must be 16-byte aligned for the GPU kernels, got address ",
                weight_scale.data_ptr(), "; call .clone() first");
  }
  check_scalar_arg(kOp, weight_scale_2, "weight_scale_2", dev);
  if (input_scale.has_value()) check_scalar_arg(kOp, *input_scale, "input_scale", dev);
  TORCH_CHECK(!(weight_only && input_scale.has_value()), kOp, ": weight_only=True takes no input_scale "
              "(activations are not quantized), got one");
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, kOp, ": bias must be [N] = [", n, "], got ", bias->sizes());
    TORCH_CHECK(bias->device() == dev, kOp, ": bias must be on x's device (", dev, "), got ", bias->device());
    TORCH_CHECK(at::isFloatingType(bias->scalar_type()), kOp, ": bias must be floating point, got ",
                bias->scalar_type());
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  return LinearShape{n, k, xdt, std::move(out_shape)};
}

int64_t check_input_scales_inputs(const at::Tensor& x, const at::Tensor& weight_scale_2,
                                  const std::optional<at::Tensor>& input_scale) {
  constexpr const char* kOp = "nvfp4_gemm._input_scales";
  TORCH_CHECK(x.dim() == 2, kOp, ": x must be 2-D [rows, K], got shape ", x.sizes());
  const at::ScalarType xdt = x.scalar_type();
  TORCH_CHECK(xdt == at::kHalf || xdt == at::kBFloat16 || xdt == at::kFloat, kOp,
              ": x must be float16, bfloat16 or float32, got ", xdt);
  TORCH_CHECK(x.size(1) % 16 == 0, kOp, ": K = x.shape[1] must be a multiple of 16, got ", x.size(1));
  check_scalar_arg(kOp, weight_scale_2, "weight_scale_2", x.device());
  if (input_scale.has_value()) check_scalar_arg(kOp, *input_scale, "input_scale", x.device());
  return x.size(1);
}

at::Tensor rows_for_kernels(const at::Tensor& x, int64_t k) {
  at::Tensor x2 = x.reshape({-1, k});
  // The GPU kernels read 16-byte rows with unit stride along K; anything else is copied once.
  if (!x2.is_contiguous() || reinterpret_cast<uintptr_t>(x2.data_ptr()) % 16 != 0) {
    x2 = x2.clone(at::MemoryFormat::Contiguous);
  }
  return x2;
}

at::Tensor call_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                   const at::Tensor& sfb, const std::optional<at::Tensor>& alpha, at::ScalarType out_dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("nvfp4_gemm::mm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                               const at::Tensor&, const std::optional<at::Tensor>&,
                                               std::optional<at::ScalarType>)>();
  return op.call(a, b, sfa, sfb, alpha, out_dtype);
}

at::Tensor finish_linear(at::Tensor y, const std::optional<at::Tensor>& bias, const LinearShape& s) {
  if (bias.has_value()) {
    // The add promotes to float32 (y's dtype) and computes there; a bias wider than float32 (or one that
    // does not promote, float8) is rounded to float32 first, as the sum is formed in float32.
    const at::ScalarType bdt = bias->scalar_type();
    const at::Tensor b = bdt == at::kFloat || bdt == at::kHalf || bdt == at::kBFloat16 ? *bias : bias->to(at::kFloat);
    if (s.x_dtype == at::kFloat) {
      y.add_(b);
    } else {
      at::Tensor out = at::empty(y.sizes(), y.options().dtype(s.x_dtype));
      at::add_out(out, y, b);
      y = std::move(out);
    }
  }
  return y.view(s.out_shape);
}

}  // namespace nvfp4_gemm

TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def(
      "linear(Tensor x, Tensor weight, Tensor weight_scale, Tensor weight_scale_2, Tensor? input_scale=None, "
      "Tensor? bias=None, bool weight_only=False) -> Tensor");
  // [encode, decode, alpha] (float32 [3]) of x [rows, K]: what linear forms before it quantizes x (static
  // when input_scale, the input's decode scale, is given; dynamic from x's finite amax otherwise).
  // Exposed for tests, which hold it bit for bit to the composite of ATen ops it replaces.
  m.def("_input_scales(Tensor x, Tensor weight_scale_2, Tensor? input_scale=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) {
  m.impl("linear", &nvfp4_gemm::linear_cpu);
  m.impl("_input_scales", &nvfp4_gemm::input_scales_op_cpu);
}
