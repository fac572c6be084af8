// Input validation shared by the CPU and CUDA implementations of nvfp4_gemm::quantize.
#pragma once

#include <ATen/ATen.h>

namespace nvfp4_gemm {

struct QuantShape {
  int64_t rows, k;
};

// Checks x ([rows, K], float32 / float16 / bfloat16, K a positive multiple of 16) and global_scale (one
// float32 element on x's device); throws c10::Error naming the argument, expected vs actual.
QuantShape check_quantize_inputs(const at::Tensor& x, const std::optional<at::Tensor>& global_scale);

// The outputs: packed [rows, K/2] uint8 and the flat blocked scales (float8_e4m3fn), uninitialized.
std::tuple<at::Tensor, at::Tensor> empty_quantize_outputs(const at::Tensor& x, const QuantShape& s);

}  // namespace nvfp4_gemm
