// Torch-free entry point of the "mse" quantization kernel (csrc/quant/mse.cu). The binding layer
// (csrc/bindings/cuda/quantize_mse_cuda.cpp) validates the tensors and allocates the outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"
#include "quant/quantize.h"

namespace nvfp4_gemm::quant {

// x [rows, k] in `dtype` -> for every 16-element block, the scale byte of mse_search.h's search, the
// block's codes by recipe.h's rounding for that scale, and optionally the search's error:
//   packed [rows, k/2] (element 2i in the low nibble), scale [rows, k/16] (linear, row-major),
//   error [rows, k/16] float64 (nullptr: not written).
// Guaranteed by the caller: rows >= 1, k % 16 == 0, x 16-byte aligned with rows `ld_x` elements apart
// (ld_x * element size a multiple of 16), outputs contiguous, 0 <= neighbours <= 126. `global_scale`: one
// device float (the encode scale). `column_weight`: k device floats (the search's h), or nullptr for none.
// Enqueues on `stream`; returns false with `err` filled on a launch failure.
bool quantize_mse_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const float* global_scale,
                       int neighbours, bool clip, const float* column_weight, uint8_t* packed, uint8_t* scale,
                       double* error, cudaStream_t stream, char* err, size_t err_len);

}  // namespace nvfp4_gemm::quant
