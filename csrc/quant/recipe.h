// The NVFP4 quantization recipe, one definition for the CPU backend and the CUDA kernel.
//
// Every function here is compiled by both g++ (csrc/bindings/quantize.cpp) and nvcc
// (csrc/quant/quantize.cu), and spells out each fp32 operation with an explicit round-to-nearest
// intrinsic on the device, so the two paths agree bit for bit by construction (nvcc would otherwise be
// free to contract a multiply into an FMA; g++ in ISO C++ mode does not contract).
//
// For one 16-element block x[0..15] of a row and the per-tensor ENCODE scale gs (fp32; 1 when absent;
// the usual choice is gs = 448 * 6 / amax(tensor), whose reciprocal is the DECODE scale that goes into
// mm's alpha):
//   amax  = max_i |x_i|                       exact; NaN if any x_i is NaN (abs bits compared as integers)
//   s     = fl(fl(amax / 6) * gs)             IEEE fp32 divide, then multiply
//   s8    = e4m3_rn_sat(s)                    round to nearest even; >= 448 (incl. inf) -> 448; NaN -> 0x7F
//   inv   = s8 > 0 ? fl(gs / float(s8)) : 0   a zero (or NaN) scale sends its block to +-0 (NaNs to +-6)
//   q_i   = fl(|x_i| * inv)                   reciprocal-multiply, as torchao's nvfp4_quantize and the
//                                             MSLK Triton kernel do (not a per-element divide)
//   c_i   = signbit(x_i) << 3 | e2m1_rne(q_i) ties to even; q >= 6 (incl. inf and NaN) -> 6
// Dequantized value: e2m1(c_i) * float(s8) / gs.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NVFP4_HD __host__ __device__ __forceinline__
#else
#define NVFP4_HD inline
#endif

namespace nvfp4_gemm::quant {

NVFP4_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

NVFP4_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

NVFP4_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

NVFP4_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

NVFP4_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

NVFP4_HD float rcp_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(a);
#else
  return 1.0f / a;
#endif
}

// The per-tensor scales of an input that nvfp4_gemm::linear quantizes: the ENCODE scale gs given to the
// block recipe below, its reciprocal the DECODE scale, and the GEMM's alpha = decode * weight_scale_2.
// Each step is one IEEE fp32 operation, the one the ATen op it stands for performs (torch's reciprocal is
// 1 / x; Python's `2688.0 / t` is reciprocal(t) * 2688), so these are nvfp4_gemm.quantize's
// global_encode_scale and the products formed from it, bit for bit.
struct InputScales {
  float encode, decode, alpha;
};

// Dynamic: from the finite amax of the input (>= 0, never NaN): encode = 2688 / amax, clamped to the
// largest finite float (a tiny amax), or 1 when amax = 0 (all zeros, or nothing finite).
NVFP4_HD InputScales dynamic_input_scales(float amax, float weight_scale_2) {
  constexpr float kMaxFinite = 3.40282346638528859812e+38f;
  float encode = 1.0f;
  if (amax > 0.0f) {
    encode = mul_rn(rcp_rn(amax), 6.0f * 448.0f);
    encode = encode > kMaxFinite ? kMaxFinite : encode;
  }
  const float decode = rcp_rn(encode);
  return {encode, decode, mul_rn(decode, weight_scale_2)};
}

// Static: from a calibrated DECODE scale.
NVFP4_HD float static_encode_scale(float input_scale) { return rcp_rn(input_scale); }

NVFP4_HD InputScales static_input_scales(float input_scale, float weight_scale_2) {
  return {static_encode_scale(input_scale), input_scale, mul_rn(input_scale, weight_scale_2)};
}

// fp32 -> float8_e4m3fn bits: round to nearest even, saturating at +-448 (inf included), NaN -> 0x7F.
NVFP4_HD uint8_t e4m3_rn_sat(float v) {
  const uint32_t bits = float_bits(v);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7F;
  if (mag >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7E);  // 448.0f
  if (mag < 0x3C800000u) {                                            // below 2^-6: subnormal e4m3 (m * 2^-9)
    // |v| * 2^9 is exact; rounding it to an integer 0..8 is the subnormal rounding (8 = 2^-6 = 0x08).
    const float scaled = mul_rn(bits_float(mag), 512.0f);
    const uint32_t m = static_cast<uint32_t>(scaled);  // truncation, then round half to even by hand
    const float frac = scaled - static_cast<float>(m);  // exact: scaled < 16
    const uint32_t up = (frac > 0.5f || (frac == 0.5f && (m & 1u))) ? 1u : 0u;
    return static_cast<uint8_t>(sign | (m + up));
  }
  // Normal: exponent 2^-6..2^8 -> biased 1..15; keep 3 of the 23 mantissa bits, round half to even.
  const uint32_t exp = (mag >> 23) - 127u + 7u;
  const uint32_t man = mag & 0x7FFFFFu;
  uint32_t out = (exp << 3) | (man >> 20);
  const uint32_t rest = man & 0xFFFFFu;
  if (rest > 0x80000u || (rest == 0x80000u && (out & 1u))) ++out;  // a carry into the exponent is correct
  return static_cast<uint8_t>(sign | out);  // out <= 0x7E: mag < 448 never rounds past 448
}

// float8_e4m3fn bits -> fp32 (exact).
NVFP4_HD float e4m3_value(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xFu, man = b & 7u;
  if (exp == 0xFu && man == 7u) return bits_float(sign | 0x7FC00000u);
  if (exp == 0u) return bits_float(sign | float_bits(mul_rn(static_cast<float>(man), 0.001953125f)));  // 2^-9
  return bits_float(sign | ((exp - 7u + 127u) << 23) | (man << 20));
}

// The block's e4m3 scale from its amax (>= 0 or NaN) and the encode scale.
//
// A usable encode scale is positive and finite. Any other (0, -0, negative, inf, NaN: a caller's bad value,
// or the reciprocal of a zero or NaN static input scale) gives every block the NaN scale 0x7F, so that every
// value decoded from it, and every mm output that uses it, is NaN: loud, never silently zero or sign-flipped.
// (The CPU entry points refuse such a scale with an error first; a CUDA scale tensor is read on the device,
// without a host sync, so there this is what the caller sees.)
NVFP4_HD bool usable_encode_scale(float gs) { return gs > 0.0f && gs <= 3.40282346638528859812e+38f; }

NVFP4_HD uint8_t block_scale(float amax, float gs) {
  return usable_encode_scale(gs) ? e4m3_rn_sat(mul_rn(div_rn(amax, 6.0f), gs)) : uint8_t{0x7F};
}

// What each |x| of the block is multiplied by before rounding to e2m1.
NVFP4_HD float value_multiplier(uint8_t s8, float gs) {
  const float sf = e4m3_value(s8);
  return sf > 0.0f ? div_rn(gs, sf) : 0.0f;  // false for 0 and NaN scales
}

// e2m1 magnitude code (0..7) of q >= 0: round to nearest, ties to the even code, saturating at 6 (code
// 7); NaN -> 7 as well (a NaN element's block has a NaN scale, so its code never reaches a result).
// Same function as counting midpoints (q > 0.25) + (q >= 0.75) + (q > 1.25) + (q >= 1.75) + (q > 2.5) +
// (q >= 3.5) + (q > 5) (reference_quantize does that) for every fp32 bit pattern
// (tests/quant_host/e2m1_exhaustive.cpp); this form is
// ~10 instructions instead of ~21, which the kernel's bandwidth target needs (3 per midpoint was the
// compiled cost).
//   q < 1:  e2m1 steps by 0.5 there, and fl(q + 2^22) rounds q to a multiple of 0.5 (ulp of 2^22), ties
//           to even; its low mantissa bits are then q / 0.5 = the code (0, 1, 2).
//   q >= 1: round the fp32 mantissa to 1 bit (ties to even via the kept bit), then exponent and that bit
//           are the code: 1.0 -> 2, 1.5 -> 3, 2 -> 4, 3 -> 5, 4 -> 6, 6 -> 7; larger ones clamp to 7.
NVFP4_HD uint32_t e2m1_magnitude(float q) {
  const uint32_t bits = float_bits(q);
  const uint32_t small = float_bits(add_rn(q, 4194304.0f)) - 0x4A800000u;
  const uint32_t large = ((bits + 0x1FFFFFu + ((bits >> 22) & 1u)) >> 22) - 252u;
  const uint32_t code = q < 1.0f ? small : large;
  return code < 7u ? code : 7u;
}

// 4-bit code of one element: `abs_bits` = fp32 bits of |x|, `sign` = 1 for a negative input.
NVFP4_HD uint32_t e2m1_code(uint32_t abs_bits, uint32_t sign, float inv) {
  return (sign << 3) | e2m1_magnitude(mul_rn(bits_float(abs_bits), inv));
}

// Raw 16-bit storage -> fp32 bits (exact; NaN stays NaN, its payload does not matter to the recipe).
NVFP4_HD uint32_t bf16_to_f32_bits(uint16_t h) { return static_cast<uint32_t>(h) << 16; }

NVFP4_HD uint32_t f16_to_f32_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0x1Fu) return sign | 0x7F800000u | (man << 13);
  if (exp != 0u) return sign | ((exp - 15u + 127u) << 23) | (man << 13);
  // Subnormal (or zero): man * 2^-24, exact in fp32.
  return sign | float_bits(mul_rn(static_cast<float>(man), 5.9604644775390625e-8f));
}

}  // namespace nvfp4_gemm::quant
