// Torch-free entry point of the NVFP4 quantization kernel (csrc/quant/quantize.cu). The binding layer
// (csrc/bindings/cuda/quantize_cuda.cpp) validates the tensors and allocates the outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace nvfp4_gemm::quant {

enum class InDtype : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Where the per-tensor ENCODE scale gs comes from (all device pointers):
//   * `encode`: one float, gs itself; nullptr (and no `decode`) means gs = 1.
//   * `decode` (instead): one float d, a DECODE scale (nvfp4_gemm::linear's static input_scale); every
//     thread forms gs = recipe.h's static_encode_scale(d), and the launch also writes
//     alpha_out[0] = static_input_scales(d, weight_scale_2[0]).alpha, the GEMM's alpha: static W4A4 then
//     needs no launch of its own for its scales.
struct GlobalScale {
  const float* encode = nullptr;
  const float* decode = nullptr;
  const float* weight_scale_2 = nullptr;  // with `decode` only
  float* alpha_out = nullptr;             // with `decode` only
};

// x [rows, k] in `dtype` -> packed [rows, k/2] e2m1 + e4m3 scales in the 128x4 blocked layout, padding
// written as zeros (recipe.h). Guaranteed by the caller: rows >= 1, k % 16 == 0, x 16-byte aligned with
// rows `ld_x` elements apart (ld_x * element size a multiple of 16), packed contiguous, sf holding
// round_up(rows,128) * round_up(k/16,4) bytes. Enqueues on `stream`; returns false with `err` filled on a
// launch failure.
bool quantize_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const GlobalScale& scale,
                   uint8_t* packed, uint8_t* sf, cudaStream_t stream, char* err, size_t err_len);

}  // namespace nvfp4_gemm::quant
