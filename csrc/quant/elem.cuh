// Reading one 16-element block of fp32 / fp16 / bf16 input from 16-byte loads, for the quantization
// kernels (csrc/quant/quantize.cu, quantize_grouped.cu, mse.cu): the element's fp32 bits (exact) and its sign bit;
// and a block's codes at a chosen scale (block_codes), which the three share (sm90/quant_a.cuh keeps its own form,
// which recomputes |x| rather than keep it: 16 fewer live registers in the GEMM kernels).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "quant/quantize.h"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {

template <InDtype D>
struct Elem;
template <>
struct Elem<InDtype::kFloat32> {
  static constexpr int kBytes = 4;
  __device__ static uint32_t word(const uint4* v, int i) { return (&v[i / 4].x)[i % 4]; }
  __device__ static uint32_t bits(const uint4* v, int i) { return word(v, i); }
  __device__ static uint32_t sign(const uint4* v, int i) { return word(v, i) >> 31; }
};
template <>
struct Elem<InDtype::kBFloat16> {
  static constexpr int kBytes = 2;
  __device__ static uint32_t half(const uint4* v, int i) { return ((&v[i / 8].x)[(i % 8) / 2] >> (16 * (i % 2))) & 0xFFFFu; }
  __device__ static uint32_t bits(const uint4* v, int i) { return bf16_to_f32_bits(static_cast<uint16_t>(half(v, i))); }
  __device__ static uint32_t sign(const uint4* v, int i) { return half(v, i) >> 15; }
};
template <>
struct Elem<InDtype::kFloat16> {
  static constexpr int kBytes = 2;
  __device__ static uint32_t half(const uint4* v, int i) { return ((&v[i / 8].x)[(i % 8) / 2] >> (16 * (i % 2))) & 0xFFFFu; }
  // The hardware conversion (exact; the host uses recipe.h's bit version): only a NaN's payload can
  // differ, and nothing in the recipe depends on it.
  __device__ static uint32_t bits(const uint4* v, int i) {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(half(v, i)))));
  }
  __device__ static uint32_t sign(const uint4* v, int i) { return half(v, i) >> 15; }
};

// The codes of one 16-element block at value multiplier inv (recipe.h), element 2i in the low nibble of byte i:
// abs_bits(i) gives element i's |x| as fp32 bits, sign(i) its sign bit.
template <typename AbsBits, typename Sign>
__device__ __forceinline__ uint2 block_codes(AbsBits abs_bits, Sign sign, float inv) {
  uint32_t words[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < kSfVecSize; ++i) words[i / 8] |= e2m1_code(abs_bits(i), sign(i), inv) << (4 * (i % 8));
  return make_uint2(words[0], words[1]);
}

}  // namespace nvfp4_gemm::quant
