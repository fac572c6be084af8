// Input validation shared by the CPU and CUDA implementations of nvfp4_gemm::quantize.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace nvfp4_gemm {

struct QuantShape {
  int64_t rows, k;
};

// Checks x ([rows, K], float32 / float16 / bfloat16, K a positive multiple of 16) and global_scale (one
// float32 element on x's device); throws c10::Error naming the argument, expected vs actual.
QuantShape check_quantize_inputs(const at::Tensor& x, const std::optional<at::Tensor>& global_scale);

// The outputs: packed [rows, K/2] uint8 and the flat blocked scales (float8_e4m3fn), uninitialized.
std::tuple<at::Tensor, at::Tensor> empty_quantize_outputs(const at::Tensor& x, const QuantShape& s);

// x [rows, K] as the GPU kernels read it, 16 bytes at a time: unit stride along K, rows a multiple of 16
// bytes apart and a 16-byte aligned base. Anything else is copied once (a fresh allocation is aligned).
inline at::Tensor with_16_byte_rows(const at::Tensor& x) {
  const int64_t esize = static_cast<int64_t>(x.element_size());
  const auto fits = [&](const at::Tensor& t) {
    return t.stride(1) == 1 && (t.size(0) <= 1 || (t.stride(0) * esize) % 16 == 0) &&
           reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  if (fits(x)) return x;
  const at::Tensor c = x.contiguous();
  return fits(c) ? c : c.clone(at::MemoryFormat::Contiguous);
}

}  // namespace nvfp4_gemm
