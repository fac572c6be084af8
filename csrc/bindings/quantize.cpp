// nvfp4_gemm::quantize: schema, input checks and the CPU implementation. The arithmetic is
// csrc/quant/recipe.h, the same code the CUDA kernel runs, so both backends agree bit for bit.
#include "bindings/quantize.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/problem.h"
#include "quant/recipe.h"

namespace nvfp4_gemm {

QuantShape check_quantize_inputs(const at::Tensor& x, const std::optional<at::Tensor>& global_scale) {
  TORCH_CHECK(x.dim() == 2, "nvfp4_gemm.quantize: x must be 2-D [rows, K], got shape ", x.sizes(),
              " (flatten leading dims first: x.reshape(-1, K))");
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16,
              "nvfp4_gemm.quantize: x must be float32, float16 or bfloat16, got ", dt);
  const int64_t k = x.size(1);
  TORCH_CHECK(k > 0 && k % kSfVecSize == 0, "nvfp4_gemm.quantize: K = x.shape[1] must be a positive multiple of ",
              kSfVecSize, " (one e4m3 scale per 16 elements), got ", k);
  if (global_scale.has_value()) {
    const at::Tensor& g = *global_scale;
    TORCH_CHECK(g.numel() == 1, "nvfp4_gemm.quantize: global_scale must hold exactly 1 element, got shape ",
                g.sizes());
    TORCH_CHECK(g.scalar_type() == at::kFloat, "nvfp4_gemm.quantize: global_scale must be float32, got ",
                g.scalar_type());
    TORCH_CHECK(g.device() == x.device(), "nvfp4_gemm.quantize: global_scale must be on x's device ", x.device(),
                " (read there, without a host sync), got ", g.device());
  }
  return QuantShape{x.size(0), k};
}

std::tuple<at::Tensor, at::Tensor> empty_quantize_outputs(const at::Tensor& x, const QuantShape& s) {
  const int64_t sf_bytes = round_up(s.rows, kSfAtomRows) * round_up(s.k / kSfVecSize, kSfAtomCols);
  return {at::empty({s.rows, s.k / 2}, x.options().dtype(at::kByte)),
          at::empty({sf_bytes}, x.options().dtype(at::kFloat8_e4m3fn))};
}

namespace {

template <typename Raw, typename ToBits>
void quantize_rows(const Raw* x, int64_t rows, int64_t k, float gs, uint8_t* packed, uint8_t* sf, ToBits to_bits) {
  const int64_t sf_cols = k / kSfVecSize;
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    uint32_t abs_bits[kSfVecSize], neg[kSfVecSize];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t s = 0; s < sf_cols; ++s) {
        const Raw* in = x + r * k + s * kSfVecSize;
        uint32_t amax_bits = 0;
        for (int i = 0; i < kSfVecSize; ++i) {
          const uint32_t b = to_bits(in[i]);
          neg[i] = sizeof(Raw) == 4 ? b >> 31 : (static_cast<uint32_t>(in[i]) >> 15) & 1u;
          abs_bits[i] = b & 0x7FFFFFFFu;
          amax_bits = std::max(amax_bits, abs_bits[i]);
        }
        const uint8_t s8 = quant::block_scale(quant::bits_float(amax_bits), gs);
        sf[blocked_sf_offset(r, s, sf_cols)] = s8;
        const float inv = quant::value_multiplier(s8, gs);
        uint8_t* out = packed + r * (k / 2) + s * (kSfVecSize / 2);
        for (int i = 0; i < kSfVecSize / 2; ++i) {
          out[i] = static_cast<uint8_t>(quant::e2m1_code(abs_bits[2 * i], neg[2 * i], inv) |
                                        (quant::e2m1_code(abs_bits[2 * i + 1], neg[2 * i + 1], inv) << 4));
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& global_scale) {
  const QuantShape s = check_quantize_inputs(x_in, global_scale);
  auto [packed, sf] = empty_quantize_outputs(x_in, s);
  sf.view(at::kByte).zero_();  // the padding of the blocked layout
  if (s.rows == 0) return {packed, sf};
  const at::Tensor x = x_in.contiguous();
  const float gs = global_scale.has_value() ? global_scale->item<float>() : 1.0f;
  TORCH_CHECK(quant::usable_encode_scale(gs), "nvfp4_gemm.quantize: global_scale must be positive and finite (the "
              "ENCODE scale, 2688 / amax for the usual per-tensor amax), got ", gs);
  uint8_t* p = packed.data_ptr<uint8_t>();
  uint8_t* f = static_cast<uint8_t*>(sf.data_ptr());
  switch (x.scalar_type()) {
    case at::kFloat:
      quantize_rows(static_cast<const uint32_t*>(x.data_ptr()), s.rows, s.k, gs, p, f, [](uint32_t v) { return v; });
      break;
    case at::kHalf:
      quantize_rows(static_cast<const uint16_t*>(x.data_ptr()), s.rows, s.k, gs, p, f, quant::f16_to_f32_bits);
      break;
    default:
      quantize_rows(static_cast<const uint16_t*>(x.data_ptr()), s.rows, s.k, gs, p, f, quant::bf16_to_f32_bits);
      break;
  }
  return {packed, sf};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) { m.def("quantize(Tensor x, Tensor? global_scale=None) -> (Tensor, Tensor)"); }

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) { m.impl("quantize", &nvfp4_gemm::quantize_cpu); }
