// nvfp4_gemm::quantize_mse: schema, input checks and the CPU implementation of the "mse" weight
// quantization's search (nvfp4_gemm.methods). The search is csrc/quant/mse_search.h, the same code the
// CUDA kernel (csrc/quant/mse.cu) runs, so both backends agree bit for bit.
#include "bindings/quantize_mse.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <cmath>

#include "bindings/quantize.h"
#include "common/problem.h"
#include "quant/mse_search.h"
#include "quant/recipe.h"

namespace nvfp4_gemm {

QuantShape check_quantize_mse_inputs(const at::Tensor& x, const at::Tensor& global_scale, int64_t neighbours,
                                     const std::optional<at::Tensor>& column_weight) {
  const QuantShape s = check_quantize_inputs(x, global_scale);
  // The search indexes its table of candidate scales with e4m3 bytes; a negative (or -0) encode scale makes
  // sign-bit bytes and a non-finite one scales that decode to nothing, so both are refused here. Reading the
  // value costs a host sync on CUDA, once per weight tensor quantized offline.
  const float gs = global_scale.item<float>();
  TORCH_CHECK(std::isfinite(gs) && gs > 0.0f, "nvfp4_gemm.quantize_mse: global_scale must be positive and finite "
              "(the encode scale 2688 / amax), got ", gs);
  TORCH_CHECK(neighbours >= 0 && neighbours <= kMaxNeighbours, "nvfp4_gemm.quantize_mse: neighbours must be in [0, ",
              kMaxNeighbours, "] (e4m3 has 127 finite scales), got ", neighbours);
  if (column_weight.has_value()) {
    const at::Tensor& w = *column_weight;
    TORCH_CHECK(w.dim() == 1 && w.size(0) == s.k, "nvfp4_gemm.quantize_mse: column_weight must be 1-D [K] = [", s.k,
                "], got shape ", w.sizes());
    TORCH_CHECK(w.scalar_type() == at::kFloat, "nvfp4_gemm.quantize_mse: column_weight must be float32, got ",
                w.scalar_type());
    TORCH_CHECK(w.device() == x.device(), "nvfp4_gemm.quantize_mse: column_weight must be on x's device ", x.device(),
                ", got ", w.device());
  }
  return s;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_quantize_mse_outputs(const at::Tensor& x, const QuantShape& s,
                                                                          bool with_error) {
  const int64_t sf_cols = s.k / kSfVecSize;
  return {at::empty({s.rows, s.k / 2}, x.options().dtype(at::kByte)),
          at::empty({s.rows, sf_cols}, x.options().dtype(at::kByte)),
          at::empty({with_error ? s.rows : 0, with_error ? sf_cols : 0}, x.options().dtype(at::kDouble))};
}

namespace {

struct HostTable {
  std::array<quant::CandidateScale, quant::kCandidateBytes> entries;
  quant::CandidateScale operator()(int c) const { return entries[c]; }
};

template <bool kWeighted, typename Raw, typename ToBits>
void search_rows(const Raw* x, int64_t rows, int64_t k, float gs, int neighbours, bool clip, const float* column_weight,
                 uint8_t* packed, uint8_t* scale, double* error, ToBits to_bits) {
  const int64_t sf_cols = k / kSfVecSize;
  HostTable table;
  for (int c = 0; c < quant::kCandidateBytes; ++c) table.entries[c] = quant::candidate_scale(c, gs);
  at::parallel_for(0, rows * sf_cols, 64, [&](int64_t b0, int64_t b1) {
    uint32_t abs_bits[kSfVecSize], neg[kSfVecSize];
    float a[kSfVecSize];
    double h[kSfVecSize] = {};
    for (int64_t t = b0; t < b1; ++t) {
      const int64_t s = t % sf_cols;
      const Raw* in = x + t * kSfVecSize;  // x is contiguous: block t starts at element 16 t
      uint32_t amax_bits = 0;
      for (int i = 0; i < kSfVecSize; ++i) {
        const uint32_t b = to_bits(in[i]);
        neg[i] = sizeof(Raw) == 4 ? b >> 31 : (static_cast<uint32_t>(in[i]) >> 15) & 1u;
        abs_bits[i] = b & 0x7FFFFFFFu;
        a[i] = quant::bits_float(abs_bits[i]);
        amax_bits = std::max(amax_bits, abs_bits[i]);
      }
      if (kWeighted) {
        for (int i = 0; i < kSfVecSize; ++i) h[i] = column_weight[s * kSfVecSize + i];
      }
      const quant::MseChoice best =
          quant::mse_search<kWeighted>(a, quant::bits_float(amax_bits), gs, neighbours, clip, h, table);
      scale[t] = static_cast<uint8_t>(best.byte);
      if (error != nullptr) error[t] = best.err;
      const float inv = table(best.byte).inv;
      uint8_t* out = packed + t * (kSfVecSize / 2);
      for (int i = 0; i < kSfVecSize / 2; ++i) {
        out[i] = static_cast<uint8_t>(quant::e2m1_code(abs_bits[2 * i], neg[2 * i], inv) |
                                      (quant::e2m1_code(abs_bits[2 * i + 1], neg[2 * i + 1], inv) << 4));
      }
    }
  });
}

template <typename Raw, typename ToBits>
void search_dispatch(const Raw* x, int64_t rows, int64_t k, float gs, int neighbours, bool clip,
                     const float* column_weight, uint8_t* packed, uint8_t* scale, double* error, ToBits to_bits) {
  if (column_weight != nullptr) {
    search_rows<true>(x, rows, k, gs, neighbours, clip, column_weight, packed, scale, error, to_bits);
  } else {
    search_rows<false>(x, rows, k, gs, neighbours, clip, column_weight, packed, scale, error, to_bits);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_mse_cpu(const at::Tensor& x_in, const at::Tensor& global_scale,
                                                                int64_t neighbours, bool clip,
                                                                const std::optional<at::Tensor>& column_weight,
                                                                bool with_error) {
  const QuantShape s = check_quantize_mse_inputs(x_in, global_scale, neighbours, column_weight);
  auto [packed, scale, error] = empty_quantize_mse_outputs(x_in, s, with_error);
  if (s.rows == 0) return {packed, scale, error};
  const at::Tensor x = x_in.contiguous();
  const at::Tensor w = column_weight.has_value() ? column_weight->contiguous() : at::Tensor();
  const float gs = global_scale.item<float>();
  const float* cw = w.defined() ? w.data_ptr<float>() : nullptr;
  uint8_t* p = packed.data_ptr<uint8_t>();
  uint8_t* f = scale.data_ptr<uint8_t>();
  double* e = with_error ? error.data_ptr<double>() : nullptr;
  const int n = static_cast<int>(neighbours);
  switch (x.scalar_type()) {
    case at::kFloat:
      search_dispatch(static_cast<const uint32_t*>(x.data_ptr()), s.rows, s.k, gs, n, clip, cw, p, f, e,
                      [](uint32_t v) { return v; });
      break;
    case at::kHalf:
      search_dispatch(static_cast<const uint16_t*>(x.data_ptr()), s.rows, s.k, gs, n, clip, cw, p, f, e,
                      quant::f16_to_f32_bits);
      break;
    default:
      search_dispatch(static_cast<const uint16_t*>(x.data_ptr()), s.rows, s.k, gs, n, clip, cw, p, f, e,
                      quant::bf16_to_f32_bits);
      break;
  }
  return {packed, scale, error};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("quantize_mse(Tensor x, Tensor global_scale, int neighbours=2, bool clip=True, Tensor? column_weight=None, "
        "bool with_error=False) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) { m.impl("quantize_mse", &nvfp4_gemm::quantize_mse_cpu); }
