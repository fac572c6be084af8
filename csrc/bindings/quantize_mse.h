// Input validation and outputs shared by the CPU and CUDA implementations of nvfp4_gemm::quantize_mse.
#pragma once

#include <ATen/ATen.h>

#include "bindings/quantize.h"

namespace nvfp4_gemm {

// Candidates lie within [0, 0x7E]: more neighbours than that add nothing.
inline constexpr int64_t kMaxNeighbours = 126;

// Checks x and global_scale as nvfp4_gemm::quantize does (global_scale required here), neighbours, and
// column_weight (float32 [K] on x's device); throws c10::Error naming the argument, expected vs actual.
QuantShape check_quantize_mse_inputs(const at::Tensor& x, const at::Tensor& global_scale, int64_t neighbours,
                                     const std::optional<at::Tensor>& column_weight);

// packed [rows, K/2] uint8, scale bytes [rows, K/16] uint8 (linear), error [rows, K/16] float64 (or [0, 0]
// without with_error); uninitialized.
std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_quantize_mse_outputs(const at::Tensor& x, const QuantShape& s,
                                                                          bool with_error);

}  // namespace nvfp4_gemm
