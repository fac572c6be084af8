// Torch-free entry point of the grouped quantization (csrc/quant/quantize_grouped.cu): tokens sorted by group,
// each group quantized with its own per-tensor scale by recipe.h's arithmetic (the bits of nvfp4_gemm::quantize
// of that group alone), its scales written straight into the grouped blocked layout that grouped_mm reads.
// The binding (csrc/bindings/cuda/grouped_cuda.cpp) validates and allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"
#include "quant/quantize.h"

namespace nvfp4_gemm::quant {

// Device workspace of quantize_grouped_cuda for `rows` rows of k elements in g groups (bytes).
size_t quantize_grouped_workspace_bytes(int64_t rows, int64_t k, int64_t g);

// x [rows, k] in `dtype` (16-byte aligned, rows ld_x elements apart, ld_x * element size a multiple of 16;
// k % 16 == 0), offs int32 [g] (device; clamped to [0, rows], a decrease read as an empty group) ->
//   packed [rows, k/2] e2m1 (contiguous; rows that no group owns within the sfa capacity are not written),
//   sf: the grouped blocked layout of sfa_rows padded rows (a multiple of 128): group j's rows blocked on their
//       own from padded row sum_{i<j} round_up(m_i, 128); every byte written (zero where no scale lands),
//   scale_out [g]: each group's GEMM alpha fl(decode_j * weight_scale_2[j]) (recipe.h InputScales::alpha), or its
//       DECODE scale where weight_scale_2 is nullptr.
// input_scale [g] (device): each group's static DECODE input scale (encode = recipe.h static_encode_scale); nullptr:
// dynamic, each group's finite amax of its own rows (recipe.h dynamic_input_scales), or with one_scale one scale for
// every group from the finite amax of all `rows` rows (a dynamic per-tensor scale). weight_scale_2 [g] (device) or
// nullptr. One launch on `stream` (two with dynamic scales unless all the rows are 16 CTAs' work: the per-group amax
// first), each a programmatic dependent of the kernel ahead; no host sync. Each group gets CTAs for its own work
// (its rows read from offs on the device), so a skewed routing's popular groups are spread over as many CTAs.
// Returns false with `err` filled on a launch failure.
bool quantize_grouped_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const int32_t* offs,
                           int64_t g, const float* input_scale, bool one_scale, const float* weight_scale_2,
                           int64_t sfa_rows, void* workspace, uint8_t* packed, uint8_t* sf, float* scale_out,
                           cudaStream_t stream, char* err, size_t err_len);

}  // namespace nvfp4_gemm::quant
