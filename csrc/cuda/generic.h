// The generic CUDA backend (any SM >= 8.0): decode both operands to exact fp16 / bf16, then one cuBLAS
// GEMM with fp32 accumulation and alpha read on the device. Torch-free: the binding layer supplies the
// cuBLAS handle (bound to the current stream) and the two decode buffers.
#pragma once

#include <cublas_v2.h>

#include "common/problem.h"

namespace nvfp4_gemm::generic {

// The dtype the operands are decoded to for this output: bf16 for bf16 output (cuBLAS pairs bf16
// operands with bf16 / fp32 output), fp16 otherwise. Both hold every e2m1 * e4m3 product exactly.
inline bool decode_to_bf16(OutDtype out) { return out == OutDtype::kBFloat16; }

// a_dq: [m, k] and b_dq: [n, k] 2-byte elements, 16-byte aligned. Returns false with `err` filled on a
// launch or cuBLAS failure.
bool run(const Problem& p, cublasHandle_t handle, void* a_dq, void* b_dq, cudaStream_t stream, char* err,
         size_t err_len);

}  // namespace nvfp4_gemm::generic
