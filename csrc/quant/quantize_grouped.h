// Torch-free entry point of the grouped quantization kernel (csrc/quant/quantize_grouped.cu): each row of x
// quantized with its own group's per-tensor scale, recipe.h's arithmetic (the bits of nvfp4_gemm::quantize of
// that group alone). The binding (csrc/bindings/cuda/grouped_cuda.cpp) validates and allocates; the Python
// layer (nvfp4_gemm/grouped.py) routes the rows and places the scales in the grouped blocked layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"
#include "quant/quantize.h"

namespace nvfp4_gemm::quant {

// x [rows, k] in `dtype` (16-byte aligned, rows ld_x elements apart, ld_x * element size a multiple of 16;
// k % 16 == 0) -> packed [rows, k/2] e2m1 and LINEAR e4m3 scales sf [rows, k/16], both contiguous. Row r uses
// group row_group[r] (in [0, g); device memory). group_scale [g] (device) holds each group's static DECODE
// input scale, or with `dynamic` its finite amax; the encode scale is recipe.h's static_input_scales /
// dynamic_input_scales of it, and decode [g] receives the matching decode scale. rows may be 0 (then only
// decode is written). Returns false with `err` filled on a launch failure.
bool quantize_grouped_rows_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x,
                                const float* group_scale, int64_t g, const int32_t* row_group, bool dynamic,
                                uint8_t* packed, uint8_t* sf, float* decode, cudaStream_t stream, char* err,
                                size_t err_len);

}  // namespace nvfp4_gemm::quant
