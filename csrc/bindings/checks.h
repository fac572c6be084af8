// Input validation for nvfp4_gemm::mm, done once at the boundary for every backend.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <utility>

#include "common/problem.h"

namespace nvfp4_gemm {

struct MmShape {
  int64_t m, n, k;
  at::ScalarType out_dtype;
  bool weight_only;  // a holds float activations [M, K] and sfa is absent (W4A16)
};

// Checks every argument against docs/CONTRACT.md; throws c10::Error naming the argument, expected vs actual.
// `gpu_rules` adds the rules a GPU kernel reads and writes the data under (unit stride along K, 16-byte
// aligned rows and base pointers, dimensions below 2^31). `out`, when given, must be [M, N] of the
// result dtype on a's device (out_dtype None: out's dtype).
MmShape check_mm_inputs(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                        const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                        std::optional<at::ScalarType> out_dtype, const at::Tensor* out, bool gpu_rules);

// sf must be e4m3 scales of `rows` x `k / 16` in one of the three views of the blocked layout that mm
// accepts; errors name `op` and the argument `name` (linear checks its weight_scale in its own terms).
void check_blocked_scales(const char* op, const at::Tensor& sf, const char* name, const char* rows_name, int64_t rows,
                          int64_t k);

// The rules the GPU kernels read a 2-D operand under (unit stride along its last dim, rows 16 bytes apart,
// 16-byte aligned data), with errors naming `op` and `name`.
void check_gpu_readable(const char* op, const at::Tensor& t, const char* name);

// Checks of nvfp4_gemm::_decode (packed [N, K/2] e2m1 of any strides, K a positive multiple of 16; sf its
// blocked scales in a view mm accepts, on packed's device; dtype float16 / bfloat16 / float32); throws
// c10::Error naming the argument, expected vs actual. Returns {N, K}.
std::pair<int64_t, int64_t> check_decode_inputs(const at::Tensor& packed, const at::Tensor& sf, at::ScalarType dtype);

// Bytes of the blocked scale layout for `rows` x `k / 16` scales.
inline int64_t blocked_sf_bytes(int64_t rows, int64_t k) {
  return round_up(rows, kSfAtomRows) * round_up(k / kSfVecSize, kSfAtomCols);
}

OutDtype to_out_dtype(at::ScalarType t);

}  // namespace nvfp4_gemm
