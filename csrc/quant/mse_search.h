// The "mse" block-scale search of nvfp4_gemm.methods, one definition for the CPU backend
// (csrc/bindings/quantize_mse.cpp) and the CUDA kernel (csrc/quant/mse.cu), compiled by g++ and nvcc alike.
// It gives the bits of the plain-PyTorch definition (methods.reference_mse_search) for every input; the
// tests hold both native paths to it.
//
// For one 16-element block, a = |x_i| (fp32), the encode scale gs, `neighbours` n, `clip`, and optional
// column weights h_i (fp32, >= 0):
//   b6 = e4m3_rn_sat(fl(fl(amax / 6) * gs))   rtn's byte (recipe.h's block_scale)
//   b4 = e4m3_rn_sat(fl(fl(amax / 4) * gs))   the byte mapping amax to 4
//   candidates, in this order: b6; b6-1, b6+1, ..., b6-n, b6+n; b4; b4-1, b4+1, ..., b4-n, b4+n; each
//     but the first clamped to [0, 0x7E], and with clip = false raised to at least b6
//   error(c) = sum_i e_i, e_i = fl64(d_i * d_i) (times h_i, fl64, with weights), summed as a pairwise tree
//     (e0+e1, e2+e3, ...; then pairs of those), with
//       d_i = fl64(r_i - v_i),  r_i = a_i * gs in double (exact),  v_i = e2m1_round_value(q_i) * scale(c)
//       (exact), q_i = fl(a_i * fl(gs / scale(c))) (recipe.h's reciprocal-multiply; 0 for a zero scale)
//   the block keeps the first candidate with the smallest error (a later one must be strictly smaller), so
//   ties keep rtn's byte and a NaN or inf error (a non-finite block) never replaces it.
// Every step is one IEEE-754 operation with round to nearest even on both compilers (explicit intrinsics on
// the device, so nvcc contracts nothing; g++ in ISO C++ mode contracts nothing), so the search makes the
// same choice on both; the only fused operation, r - v as one FMA on the device, equals the host's
// multiply-then-subtract because the product is exact.
#pragma once

#include "quant/recipe.h"

namespace nvfp4_gemm::quant {

NVFP4_HD double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

NVFP4_HD double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// fl64(r - a * b) where a * b is exact in double: one FMA on the device (the exact product makes it equal
// to the separate multiply and subtract that the host does).
NVFP4_HD double sub_exact_product(double r, double a, double b) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(-a, b, r);
#else
  return r - a * b;
#endif
}

// The e2m1 grid value (0, 0.5, 1, 1.5, 2, 3, 4 or 6) that e2m1_magnitude(q) encodes, for q >= 0, inf or
// NaN: nearest, ties to the even code, >= 6 (inf and NaN too) gives 6. The grid's step is 0.5 below 2, 1 in
// [2, 4) and 2 from 4; adding m = 2^22 * max(2^floor(log2 q), 1) puts q where the fp32 ulp is that step, so
// the add rounds q onto the grid (an even multiple of the step is an even code) and subtracting m back is
// exact. m is built from q's exponent bits as a signed integer: where the exponent + 22 passes 255 (q >=
// 2^106, inf, NaN) the bits wrap negative and the max picks 2^22, which leaves q (or NaN) alone, and the
// final comparison sends those to 6. Checked against e2m1_magnitude for every non-negative fp32 bit pattern
// (tests/quant_host/e2m1_exhaustive.cpp).
NVFP4_HD float e2m1_round_value(float q) {
  const int32_t pm = static_cast<int32_t>((float_bits(q) & 0x7F800000u) + 0x0B000000u);  // 2^floor(log2 q) * 2^22
  const float m = bits_float(static_cast<uint32_t>(pm > 0x4A800000 ? pm : 0x4A800000));  // at least 2^22
  const float t = add_rn(add_rn(q, m), -m);
  return t < 6.0f ? t : 6.0f;
}

// An e2m1 value v and a candidate scale s become two doubles whose product is v * s (exact: 2 + 4
// significant bits). The host converts each. The device shifts 896 binades from v to s: v * 2^-896 is the
// fp32 bit pattern moved right by 3 (the exponent fields' bias difference, 1023 - 127, left out), one shift
// with zero staying zero, where a conversion would issue at a quarter of the fp64 rate once per element and
// candidate; s * 2^896 is made once per candidate scale. v * 2^-896 >= 2^-897 and s * 2^896 <= 2^905 stay
// normal doubles. tests/quant_host/e2m1_exhaustive.cpp checks every pair's product.
NVFP4_HD double e2m1_value_shifted_bits(float v) {
  const uint64_t u = static_cast<uint64_t>(float_bits(v) >> 3) << 32;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  std::memcpy(&d, &u, sizeof(d));
  return d;
#endif
}

NVFP4_HD double e2m1_value_f64(float v) {
#if defined(__CUDA_ARCH__)
  return e2m1_value_shifted_bits(v);
#else
  return static_cast<double>(v);
#endif
}

NVFP4_HD double candidate_scale_f64(float s) {
#if defined(__CUDA_ARCH__)
  return dmul_rn(static_cast<double>(s), 0x1p896);
#else
  return static_cast<double>(s);
#endif
}

// What the search needs of each candidate scale byte c (0 .. 0x7F), made once per encode scale gs and
// looked up per candidate: the value multiplier (recipe.h: fl(gs / scale), 0 for a zero or NaN scale) and
// the scale as candidate_scale_f64 gives it.
struct CandidateScale {
  float inv;
  double scale;
};

NVFP4_HD CandidateScale candidate_scale(uint32_t c, float gs) {
  const uint8_t byte = static_cast<uint8_t>(c);
  return CandidateScale{value_multiplier(byte, gs), candidate_scale_f64(e4m3_value(byte))};
}

inline constexpr int kCandidateBytes = 128;  // 0 .. 0x7E, and 0x7F (NaN) for a NaN block's rtn byte

// error(c) of the header comment. `h` holds the 16 column weights as doubles (read only when kWeighted).
template <bool kWeighted>
NVFP4_HD double mse_candidate_error(const float (&a)[16], const double (&r)[16], const double (&h)[16],
                                    CandidateScale cs) {
  double e[16];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 16; ++i) {
    const double d = sub_exact_product(r[i], e2m1_value_f64(e2m1_round_value(mul_rn(a[i], cs.inv))), cs.scale);
    e[i] = dmul_rn(d, d);
    if (kWeighted) e[i] = dmul_rn(e[i], h[i]);
  }
  // The tree level by level, each level written out: the device keeps e[] in registers only when every
  // index is a compile-time constant.
#define NVFP4_MSE_TREE_LEVEL(W) \
  for (int i = 0; i < (W); ++i) e[i] = dadd_rn(e[2 * i], e[2 * i + 1]);
  NVFP4_MSE_TREE_LEVEL(8)
  NVFP4_MSE_TREE_LEVEL(4)
  NVFP4_MSE_TREE_LEVEL(2)
  NVFP4_MSE_TREE_LEVEL(1)
#undef NVFP4_MSE_TREE_LEVEL
  return e[0];
}

struct MseChoice {
  uint32_t byte;  // the chosen e4m3 scale byte
  double err;     // its error, in units of gs^2 (NaN or inf for a non-finite block)
};

// The search of the header comment for one block: a = |x_i| (fp32), amax = max_i a_i (NaN if any is).
// `table(c)` returns candidate_scale(c, gs) for c < kCandidateBytes (a precomputed table on both devices).
template <bool kWeighted, typename Table>
NVFP4_HD MseChoice mse_search(const float (&a)[16], float amax, float gs, int neighbours, bool clip,
                              const double (&h)[16], const Table& table) {
  double r[16];
  const double gs64 = static_cast<double>(gs);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 16; ++i) r[i] = dmul_rn(static_cast<double>(a[i]), gs64);
  // For gs > 0 (the bindings refuse anything else) both bytes are in 0 .. 0x7F already; the mask keeps every
  // table index below kCandidateBytes whatever gs is (a negative one would set the e4m3 sign bit).
  const int b6 = block_scale(amax, gs) & (kCandidateBytes - 1);
  const int b4 = e4m3_rn_sat(mul_rn(div_rn(amax, 4.0f), gs)) & (kCandidateBytes - 1);
  MseChoice best{static_cast<uint32_t>(b6), mse_candidate_error<kWeighted>(a, r, h, table(b6))};
  const int per_base = 2 * neighbours + 1;
  for (int j = 1; j < 2 * per_base; ++j) {
    const int i = j < per_base ? j : j - per_base;
    const int step = (i + 1) / 2;
    int c = (j < per_base ? b6 : b4) + ((i & 1) ? -step : step);
    c = c < 0 ? 0 : (c > 0x7E ? 0x7E : c);
    if (!clip && c < b6) c = b6;  // a scale below rtn's would clip the block's largest values
    const double err = mse_candidate_error<kWeighted>(a, r, h, table(c));
    if (err < best.err) best = MseChoice{static_cast<uint32_t>(c), err};
  }
  return best;
}

}  // namespace nvfp4_gemm::quant
