// The FP4 decode shared by the sm90 kernels (the wgmma kernel in sm90_gemm.cuh
// and the small-M streaming kernel in sm90_small_m.cuh): the one place where e2m1 bits become fp16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/convert_out.cuh"

namespace nvfp4_gemm::sm90 {

// FP4 decode: 8 packed e2m1 (one 32-bit word) -> four fp16x2 holding value * 2^-14. Output r holds
// nibbles r (low half) and r + 4 (high half): both sit at the same place in their 16-bit half, so one
// shift and two masks place magnitude (bits 11..9) and sign (bit 15) of both.
template <int R>
__device__ __forceinline__ uint32_t decode_word(uint32_t w) {
  static_assert(R >= 0 && R < 4, "four outputs per word");
  const uint32_t mag = (R < 3 ? (w << (9 - 4 * R)) : (w >> 3)) & 0x0E000E00u;
  const uint32_t sgn = (w << (12 - 4 * R)) & 0x80008000u;
  return mag | sgn;
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t x, __half2 s) {
  __half2 h = __hmul2(*reinterpret_cast<__half2*>(&x), s);
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace nvfp4_gemm::sm90
