// The generic CUDA backend (any SM >= 8.0): decode NVFP4 operands to exact fp16 / bf16 / fp32, then one
// cuBLAS GEMM with fp32 accumulation and alpha read on the device. Torch-free: the binding layer supplies
// the cuBLAS handle (bound to the current stream) and the decode buffers, and composes the two steps for
// W4A4 (decode A and B) and the weight-only form (decode B only).
#pragma once

#include <cublas_v2.h>

#include "common/problem.h"

namespace nvfp4_gemm::generic {

// Element type of decoded (or weight-only activation) GEMM operands. Each holds every e2m1 * e4m3
// product exactly.
enum class Operand : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

// W4A4 decodes to bf16 for bf16 output (cuBLAS pairs bf16 operands with bf16 / fp32 output), fp16 otherwise.
inline Operand w4a4_operand(OutDtype out) { return out == OutDtype::kBFloat16 ? Operand::kBFloat16 : Operand::kFloat16; }

// Whether cublasGemmEx takes operands of type `t` with output `out` directly (fp32 compute). Otherwise
// the caller GEMMs into an fp32 buffer and rounds once from there.
bool gemm_writes(Operand t, OutDtype out);

// [rows, k] packed e2m1 (rows ld_bytes apart; base and ld_bytes multiples of 8: each 16-value group is read
// as 8 bytes) with blocked scales -> [rows, k] of `t`, contiguous, 16-byte aligned. k % 16 == 0, rows >= 1,
// rows * k / 16 < 2^31 * 256. Returns false with `err` filled on a launch failure.
bool decode(const uint8_t* packed, int64_t ld_bytes, const uint8_t* sf, int64_t rows, int64_t k, Operand t,
            void* out, cudaStream_t stream, char* err, size_t err_len);

// C[m, n] = alpha * A[m, k] @ B[n, k]^T, row-major, leading dimensions in elements, A and B of type `t`,
// fp32 accumulation (no reduced-precision reductions, no TF32). alpha: one float on the device or
// nullptr for 1. Requires gemm_writes(t, out) and m, n, k, ld* < 2^31.
bool gemm(cublasHandle_t handle, Operand t, const void* a, int64_t lda, const void* b, int64_t ldb, int64_t m,
          int64_t n, int64_t k, const float* alpha, void* c, int64_t ldc, OutDtype out, char* err, size_t err_len);

}  // namespace nvfp4_gemm::generic
