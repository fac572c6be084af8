// Reading one 16-element block of fp32 / fp16 / bf16 input from 16-byte loads, for the quantization
// kernels (csrc/quant/quantize.cu, csrc/quant/mse.cu): the element's fp32 bits (exact) and its sign bit.
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

}  // namespace nvfp4_gemm::quant
