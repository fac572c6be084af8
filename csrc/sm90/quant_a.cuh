// Quantize-on-the-fly for the sm90 kernels (Problem::a_scale): float activations become NVFP4 codes and
// block scales inside the A staging, by the shared recipe (csrc/quant/recipe.h), so the packed words and
// scale bytes are bit for bit what nvfp4_gemm::quantize writes. The kernels then decode them with the same
// code as packed NVFP4 A: a fused call gives exactly the numbers of quantize followed by mm.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/problem.h"
#include "quant/recipe.h"

namespace nvfp4_gemm::sm90 {

// The encode scale: *a_scale, or 1 / *a_scale (IEEE division, as torch.reciprocal) when it is the decode scale.
__device__ __forceinline__ float encode_scale_of(const float* a_scale, bool is_decode) {
  const float v = __ldg(a_scale);
  return is_decode ? __fdiv_rn(1.0f, v) : v;
}

// fp32 bits of element i of 16 raw values (8 words of 16-bit values, or 16 words of fp32).
__device__ __forceinline__ uint32_t x_bits(AType t, const uint32_t* w, int i) {
  if (t == AType::kFloat32) return w[i];
  const uint32_t h = (w[i / 2] >> (16 * (i % 2))) & 0xFFFFu;
  if (t == AType::kBFloat16) return quant::bf16_to_f32_bits(static_cast<uint16_t>(h));
  return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));  // exact
}

// The 16 raw values of a scale group at src (8 words of 16-bit values, or 16 words of fp32).
__device__ __forceinline__ void load_group(AType t, const uint8_t* src, uint32_t (&raw)[16]) {
  const int loads = t == AType::kFloat32 ? 4 : 2;
#pragma unroll
  for (int l = 0; l < 4; ++l) {
    if (l < loads) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(src) + l);
      raw[4 * l] = v.x, raw[4 * l + 1] = v.y, raw[4 * l + 2] = v.z, raw[4 * l + 3] = v.w;
    }
  }
}

// Quantizes one 16-element scale group (raw values of type t, load_group) with encode scale gs: the
// group's e4m3 scale byte and its codes as two words (element 2i in the low nibble of byte i), exactly as
// csrc/quant/quantize.cu's kernel does for a live block.
__device__ __forceinline__ void quantize_loaded(AType t, const uint32_t (&raw)[16], float gs, uint8_t& s8,
                                                uint32_t& w0, uint32_t& w1) {
  uint32_t amax_bits = 0;  // |x| bits compared as integers: a NaN wins, as in quantize
#pragma unroll
  for (int i = 0; i < 16; ++i) amax_bits = max(amax_bits, x_bits(t, raw, i) & 0x7FFFFFFFu);
  s8 = quant::block_scale(__uint_as_float(amax_bits), gs);
  const float inv = quant::value_multiplier(s8, gs);
  w0 = w1 = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {  // |x| recomputed rather than kept: 16 fewer live registers
    const uint32_t sign = t == AType::kFloat32 ? raw[i] >> 31 : (raw[i / 2] >> (16 * (i % 2) + 15)) & 1u;
    const uint32_t code = quant::e2m1_code(x_bits(t, raw, i) & 0x7FFFFFFFu, sign, inv);
    if (i < 8) w0 |= code << (4 * i);
    else w1 |= code << (4 * (i - 8));
  }
}

__device__ __forceinline__ void quantize_group(AType t, const uint8_t* src, float gs, uint8_t& s8, uint32_t& w0,
                                               uint32_t& w1) {
  uint32_t raw[16];
  load_group(t, src, raw);
  quantize_loaded(t, raw, gs, s8, w0, w1);
}

inline constexpr int elem_bytes(AType t) { return t == AType::kFloat32 ? 4 : 2; }

}  // namespace nvfp4_gemm::sm90
