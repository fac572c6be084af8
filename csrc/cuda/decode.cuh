// Device-side decoding of single NVFP4 values for the generic CUDA paths (dense and grouped): exact, one value at a
// time (the arch kernels decode whole words in registers, csrc/sm90/fp4_decode.cuh).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace nvfp4_gemm {

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  // Magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} as (code & 7) -> 0.5 * {0,1,2,3,4,6,8,12}.
  constexpr uint32_t kHalfUnits = 0xC8643210u;  // nibble i = 2 * magnitude(i), for i in 0..7
  const float mag = 0.5f * static_cast<float>((kHalfUnits >> (4 * (code & 7))) & 0xF);
  return (code & 8) ? -mag : mag;
}

__device__ __forceinline__ float e4m3_value(uint8_t bits) {
  __nv_fp8_e4m3 v;
  v.__x = bits;
  return static_cast<float>(v);
}

}  // namespace nvfp4_gemm
