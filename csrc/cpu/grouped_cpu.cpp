// CPU backend of the grouped GEMM and of the grouped quantization: for each non-empty group, exact decode of
// its rows of A and of its weight to float32, an fp32 matmul, alpha[g], one rounding to the output dtype (the
// numbers of mm's CPU backend, group by group). offs and alpha are host memory here, so unlike the CUDA
// backends this one checks the routing itself: offs non-decreasing, ending at T, and sfa large enough for it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "bindings/grouped.h"
#include "common/e2m1.h"
#include "quant/recipe.h"

namespace nvfp4_gemm {
namespace {

constexpr const char* kOp = "nvfp4_gemm.grouped_mm";

// rows x k packed e2m1 (rows `ld` bytes apart) whose logical scale (r, s) is sf[blocked_sf_offset(r0 + r, s, k/16)]
// -> [rows, k] float32, exact (an e2m1 value times an e4m3 scale).
void decode_rows(const uint8_t* src, int64_t ld, const uint8_t* sf, int64_t r0, int64_t rows, int64_t k, float* dst) {
  const int64_t sf_cols = k / kSfVecSize;
  float lut[16];
  for (int c = 0; c < 16; ++c) lut[c] = e2m1_to_float(static_cast<uint8_t>(c));
  at::parallel_for(0, rows, 16, [&](int64_t q0, int64_t q1) {
    for (int64_t r = q0; r < q1; ++r) {
      for (int64_t s = 0; s < sf_cols; ++s) {
        const float scale = e4m3_to_float(sf[blocked_sf_offset(r0 + r, s, sf_cols)]);
        const uint8_t* in = src + r * ld + s * (kSfVecSize / 2);
        float* o = dst + r * k + s * kSfVecSize;
        for (int i = 0; i < kSfVecSize / 2; ++i) {
          o[2 * i] = lut[in[i] & 0xF] * scale;
          o[2 * i + 1] = lut[in[i] >> 4] * scale;
        }
      }
    }
  });
}

// A packed [rows, k/2] view as contiguous bytes (a copy only when its rows are not K/2 bytes apart with unit
// stride).
at::Tensor packed_rows(const at::Tensor& t) { return t.view(at::kByte).contiguous(); }

// Group row ranges from offs (host memory), after checking the routing: non-decreasing from 0, ending at T.
std::vector<int64_t> group_ends(const at::Tensor& offs, int64_t t) {
  const int32_t* o = offs.data_ptr<int32_t>();
  const int64_t g = offs.numel();
  std::vector<int64_t> ends(g);
  int64_t prev = 0;
  for (int64_t i = 0; i < g; ++i) {
    TORCH_CHECK(o[i] >= prev, kOp, ": offs must be non-decreasing cumulative row ends starting from 0, got offs[", i,
                "] = ", o[i], (i ? " after offs[" + std::to_string(i - 1) + "] = " + std::to_string(prev)
                                 : std::string(" (below 0)")));
    ends[i] = o[i];
    prev = o[i];
  }
  TORCH_CHECK(prev == t, kOp, ": offs[G-1] must equal T = a.shape[0] = ", t, " (every row belongs to a group), got ",
              prev);
  return ends;
}

void grouped_into(const GroupedShape& s, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                  const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                  const at::Tensor& out) {
  const std::vector<int64_t> ends = group_ends(offs, s.t);
  const int64_t sf_cols = s.k / kSfVecSize;
  const int64_t sp = round_up(sf_cols, kSfAtomCols);
  // Padded row where each group's scales start in sfa, and the total the routing needs.
  std::vector<int64_t> pad_start(s.g);
  int64_t padded = 0, start = 0;
  for (int64_t i = 0; i < s.g; ++i) {
    pad_start[i] = padded;
    padded += round_up(ends[i] - start, kSfAtomRows);
    start = ends[i];
  }
  TORCH_CHECK(s.weight_only || padded <= s.sfa_rows, kOp, ": sfa holds ", s.sfa_rows, " padded rows, but this "
              "routing needs sum_g round_up(m_g,128) = ", padded, " (", padded * sp, " e4m3 values); size it with "
              "nvfp4_gemm.grouped_sfa_rows(T, G) = ", grouped_sfa_rows_worst(s.t, s.g), " rows");
  if (s.t == 0 || s.n == 0) return;

  const at::Tensor a_bytes = s.weight_only ? at::Tensor() : packed_rows(a);
  const at::Tensor alpha_host = alpha.has_value() ? alpha->contiguous() : at::Tensor();
  const float* al = alpha.has_value() ? alpha_host.data_ptr<float>() : nullptr;
  const uint8_t* sfa_bytes = s.weight_only ? nullptr : static_cast<const uint8_t*>(sfa->data_ptr());
  const uint8_t* sfb_bytes = static_cast<const uint8_t*>(sfb.data_ptr());
  const int64_t sfb_group = round_up(s.n, kSfAtomRows) * sp;
  const auto f32 = a.options().dtype(at::kFloat);

  start = 0;
  for (int64_t gi = 0; gi < s.g; ++gi) {
    const int64_t m = ends[gi] - start;
    const int64_t row0 = start;
    start = ends[gi];
    if (m == 0) continue;
    at::Tensor a_dq;
    if (s.weight_only) {
      a_dq = a.narrow(0, row0, m).to(at::kFloat);  // fp16 / bf16 / fp32 activations are exact in fp32
    } else {
      a_dq = at::empty({m, s.k}, f32);
      decode_rows(a_bytes.data_ptr<uint8_t>() + row0 * (s.k / 2), s.k / 2, sfa_bytes, pad_start[gi], m, s.k,
                  a_dq.data_ptr<float>());
    }
    const at::Tensor b_g = packed_rows(b.select(0, gi));
    at::Tensor b_dq = at::empty({s.n, s.k}, f32);
    decode_rows(b_g.data_ptr<uint8_t>(), s.k / 2, sfb_bytes + gi * sfb_group, 0, s.n, s.k, b_dq.data_ptr<float>());
    at::Tensor acc = at::mm(a_dq, b_dq.t());
    if (al != nullptr) acc.mul_(al[gi]);  // fp32 times fp32, rounded once; the copy below is the one output rounding
    out.narrow(0, row0, m).copy_(acc);
  }
}

at::Tensor grouped_mm_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                          const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                          std::optional<at::ScalarType> out_dtype) {
  const GroupedShape s = check_grouped_inputs(a, b, sfa, sfb, offs, alpha, out_dtype, nullptr, /*gpu_rules=*/false);
  at::Tensor out = at::empty({s.t, s.n}, a.options().dtype(s.out_dtype));
  grouped_into(s, a, b, sfa, sfb, offs, alpha, out);
  return out;
}

void grouped_mm_out_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                        const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                        std::optional<at::ScalarType> out_dtype, const at::Tensor& out) {
  const GroupedShape s = check_grouped_inputs(a, b, sfa, sfb, offs, alpha, out_dtype, &out, /*gpu_rules=*/false);
  grouped_into(s, a, b, sfa, sfb, offs, alpha, out);
}

// ---------------------------------------------------------------------------------------------------
// Grouped quantization: the rows of group j quantized with group j's encode scale, recipe.h's arithmetic (the
// code nvfp4_gemm::quantize runs), so their bits are those of quantizing the group alone with its own scale;
// the scales go straight to the grouped blocked layout. The routing follows the CUDA kernels' rules (offsets
// clamped to [0, T], a decrease read as an empty group, scales past sfa_rows dropped), so both devices agree on
// any offs.

template <typename Raw, typename ToBits>
void quantize_group(const Raw* x, int64_t row0, int64_t m, int64_t pad0, int64_t sfa_rows, int64_t k, float gs,
                    uint8_t* packed, uint8_t* sf, ToBits to_bits) {
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t live = std::min(m, sfa_rows - pad0);  // rows whose scales fit the buffer
  at::parallel_for(0, live, 16, [&](int64_t r0, int64_t r1) {
    uint32_t abs_bits[kSfVecSize], neg[kSfVecSize];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t row = row0 + r;
      for (int64_t s = 0; s < sf_cols; ++s) {
        const Raw* in = x + row * k + s * kSfVecSize;
        uint32_t amax_bits = 0;
        for (int i = 0; i < kSfVecSize; ++i) {
          const uint32_t bits = to_bits(in[i]);
          neg[i] = sizeof(Raw) == 4 ? bits >> 31 : (static_cast<uint32_t>(in[i]) >> 15) & 1u;
          abs_bits[i] = bits & 0x7FFFFFFFu;
          amax_bits = std::max(amax_bits, abs_bits[i]);
        }
        const uint8_t s8 = quant::block_scale(quant::bits_float(amax_bits), gs);
        sf[blocked_sf_offset(pad0 + r, s, sf_cols)] = s8;
        const float inv = quant::value_multiplier(s8, gs);
        uint8_t* o = packed + row * (k / 2) + s * (kSfVecSize / 2);
        for (int i = 0; i < kSfVecSize / 2; ++i) {
          o[i] = static_cast<uint8_t>(quant::e2m1_code(abs_bits[2 * i], neg[2 * i], inv) |
                                      (quant::e2m1_code(abs_bits[2 * i + 1], neg[2 * i + 1], inv) << 4));
        }
      }
    }
  });
}

// Finite amax of rows [row0, row0 + m) as fp32 bits (0 when nothing is finite).
template <typename Raw, typename ToBits>
uint32_t finite_amax_bits(const Raw* x, int64_t row0, int64_t m, int64_t k, ToBits to_bits) {
  uint32_t amax = 0;
  for (int64_t i = row0 * k; i < (row0 + m) * k; ++i) {
    const uint32_t bits = to_bits(x[i]) & 0x7FFFFFFFu;
    if (bits < 0x7F800000u) amax = std::max(amax, bits);
  }
  return amax;
}

template <typename Raw, typename ToBits>
void quantize_grouped_typed(const Raw* x, int64_t t, int64_t k, const int32_t* offs, int64_t g, const float* input_scale,
                            bool one_scale, const float* weight_scale_2, int64_t sfa_rows, uint8_t* packed,
                            uint8_t* sf, float* scale_out, ToBits to_bits) {
  const auto clamp = [t](int64_t v) { return v < 0 ? int64_t{0} : v > t ? t : v; };
  const uint32_t all_amax = one_scale ? finite_amax_bits(x, 0, t, k, to_bits) : 0;  // (without input_scale: checked)
  int64_t pad = 0;
  for (int64_t j = 0; j < g; ++j) {
    const int64_t lo = j == 0 ? 0 : clamp(offs[j - 1]), hi = clamp(offs[j]);
    const int64_t m = hi > lo ? hi - lo : 0;
    const float ws2 = weight_scale_2 != nullptr ? weight_scale_2[j] : 1.0f;  // alpha = fl(decode * 1) = decode
    const quant::InputScales sc =
        input_scale != nullptr ? quant::static_input_scales(input_scale[j], ws2)
        : one_scale            ? quant::dynamic_input_scales(quant::bits_float(all_amax), ws2)
                               : quant::dynamic_input_scales(quant::bits_float(finite_amax_bits(x, lo, m, k, to_bits)),
                                                             ws2);
    scale_out[j] = sc.alpha;
    if (m > 0) {
      TORCH_CHECK(quant::usable_encode_scale(sc.encode), "nvfp4_gemm.quantize_grouped: group ", j,
                  "'s input scale must be positive and finite (its encode scale 1 / input_scale is ", sc.encode,
                  "), got ", input_scale != nullptr ? input_scale[j] : sc.decode);
      if (pad < sfa_rows) quantize_group(x, lo, m, pad, sfa_rows, k, sc.encode, packed, sf, to_bits);
    }
    pad += round_up(m, kSfAtomRows);
  }
}

}  // namespace

void check_quantize_grouped(const at::Tensor& x, const at::Tensor& offs, const std::optional<at::Tensor>& input_scale,
                            const std::optional<at::Tensor>& weight_scale_2, int64_t sfa_rows, bool one_scale) {
  constexpr const char* op = "nvfp4_gemm.quantize_grouped";
  TORCH_CHECK(!(one_scale && input_scale.has_value()), op, ": one_input_scale=True forms one dynamic scale from all of "
              "x; input_scale must then be None, got a tensor of shape ", input_scale.has_value() ? input_scale->sizes()
              : at::IntArrayRef{});
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D [T, K] (tokens sorted by group), got shape ", x.sizes());
  const auto dt = x.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16, op,
              ": x must be float32, float16 or bfloat16, got ", dt);
  const int64_t t = x.size(0), k = x.size(1);
  TORCH_CHECK(k > 0 && k % kSfVecSize == 0, op, ": K = x.shape[1] must be a positive multiple of 16 (one e4m3 scale "
              "per 16 elements), got ", k);
  TORCH_CHECK(t <= INT32_MAX, op, ": T = x.shape[0] must be at most 2^31 - 1 (offs is int32), got ", t);
  TORCH_CHECK(offs.scalar_type() == at::kInt && offs.dim() == 1 && offs.numel() >= 1 && offs.is_contiguous(), op,
              ": offs must be a contiguous 1-D int32 [G] tensor of cumulative row ends (G >= 1), got ",
              offs.scalar_type(), " of shape ", offs.sizes());
  TORCH_CHECK(offs.device() == x.device(), op, ": offs must be on x's device (", x.device(), "), got ", offs.device());
  const int64_t g = offs.numel();
  // A per-group float32 argument: None, or a contiguous [G] tensor on x's device.
  const auto check_per_group = [&](const std::optional<at::Tensor>& v, const char* name, const char* what) {
    if (!v.has_value()) return;
    TORCH_CHECK(v->scalar_type() == at::kFloat && v->dim() == 1 && v->size(0) == g && v->is_contiguous(), op, ": ",
                name, " must be a contiguous float32 [G] = [", g, "] tensor (", what, "), got ", v->scalar_type(),
                " of shape ", v->sizes());
    TORCH_CHECK(v->device() == x.device(), op, ": ", name, " must be on x's device (", x.device(), "), got ",
                v->device());
  };
  check_per_group(input_scale, "input_scale", "each group's DECODE input scale");
  check_per_group(weight_scale_2, "weight_scale_2", "each group's per-tensor weight scale");
  TORCH_CHECK(sfa_rows % kSfAtomRows == 0 && sfa_rows >= round_up(t, kSfAtomRows), op,
              ": sfa_rows must be a multiple of 128 and at least round_up(T,128) = ", round_up(t, kSfAtomRows),
              " (grouped_sfa_rows(T, G) = ", grouped_sfa_rows_worst(t, g), " fits every routing), got ", sfa_rows);
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_grouped_cpu(const at::Tensor& x_in, const at::Tensor& offs,
                                                                    const std::optional<at::Tensor>& input_scale,
                                                                    const std::optional<at::Tensor>& weight_scale_2,
                                                                    int64_t sfa_rows, bool one_scale) {
  check_quantize_grouped(x_in, offs, input_scale, weight_scale_2, sfa_rows, one_scale);
  const int64_t t = x_in.size(0), k = x_in.size(1), g = offs.numel();
  // Rows no group owns within sfa (garbage routing, or sfa_rows too small for it) stay zero here.
  at::Tensor packed = at::zeros({t, k / 2}, x_in.options().dtype(at::kByte));
  at::Tensor sf = at::zeros({sfa_rows * round_up(k / kSfVecSize, kSfAtomCols)}, x_in.options().dtype(at::kByte));
  at::Tensor scale = at::empty({g}, x_in.options().dtype(at::kFloat));
  const at::Tensor x = x_in.contiguous();
  const float* in_scale = input_scale.has_value() ? input_scale->data_ptr<float>() : nullptr;
  const float* ws2 = weight_scale_2.has_value() ? weight_scale_2->data_ptr<float>() : nullptr;
  const int32_t* o = offs.data_ptr<int32_t>();
  uint8_t* p = packed.data_ptr<uint8_t>();
  uint8_t* f = sf.data_ptr<uint8_t>();
  float* d = scale.data_ptr<float>();
  switch (x.scalar_type()) {
    case at::kFloat:
      quantize_grouped_typed(static_cast<const uint32_t*>(x.data_ptr()), t, k, o, g, in_scale, one_scale, ws2, sfa_rows,
                             p, f, d, [](uint32_t v) { return v; });
      break;
    case at::kHalf:
      quantize_grouped_typed(static_cast<const uint16_t*>(x.data_ptr()), t, k, o, g, in_scale, one_scale, ws2, sfa_rows,
                             p, f, d, quant::f16_to_f32_bits);
      break;
    default:
      quantize_grouped_typed(static_cast<const uint16_t*>(x.data_ptr()), t, k, o, g, in_scale, one_scale, ws2, sfa_rows,
                             p, f, d, quant::bf16_to_f32_bits);
      break;
  }
  return {packed, sf.view(at::kFloat8_e4m3fn), scale};
}

// nvfp4_gemm::_grouped_linear: quantize_grouped(x, offs, input_scale, weight_scale_2, one_scale) and then grouped_mm of
// its NVFP4 rows with its alpha (what the CUDA form equals bit for bit); every argument checked before any work.
at::Tensor grouped_linear_cpu(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb, const at::Tensor& offs,
                              const std::optional<at::Tensor>& input_scale, const at::Tensor& weight_scale_2,
                              std::optional<at::ScalarType> out_dtype, bool one_scale) {
  const int64_t rows = grouped_sfa_rows_worst(x.dim() == 2 ? x.size(0) : 0, offs.numel());
  check_quantize_grouped(x, offs, input_scale, weight_scale_2, rows, one_scale);
  const GroupedShape s = check_grouped_inputs(x, b, std::nullopt, sfb, offs, std::nullopt, out_dtype, nullptr,
                                              /*gpu_rules=*/false);
  const auto [packed, sfa, alpha] = quantize_grouped_cpu(x, offs, input_scale, weight_scale_2, rows, one_scale);
  return grouped_mm_cpu(packed, b, sfa, sfb, offs, alpha, s.out_dtype);
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) {
  m.impl("grouped_mm", &nvfp4_gemm::grouped_mm_cpu);
  m.impl("grouped_mm_out", &nvfp4_gemm::grouped_mm_out_cpu);
  m.impl("_quantize_grouped", &nvfp4_gemm::quantize_grouped_cpu);
  m.impl("_grouped_linear", &nvfp4_gemm::grouped_linear_cpu);
}
