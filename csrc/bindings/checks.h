// Input validation for nvfp4_gemm::mm, done once at the boundary for every backend.
#pragma once

#include <ATen/ATen.h>

#include "common/problem.h"

namespace nvfp4_gemm {

struct MmShape {
  int64_t m, n, k;
  at::ScalarType out_dtype;
};

// Checks every argument against SPEC.md; throws c10::Error naming the argument, expected vs actual.
// `gpu_rules` adds the rules a GPU kernel reads the data under (unit stride along K, 16-byte aligned
// rows and base pointers).
MmShape check_mm_inputs(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sfa,
                        const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                        std::optional<at::ScalarType> out_dtype, bool gpu_rules);

// Bytes of the blocked scale layout for `rows` x `k / 16` scales.
inline int64_t blocked_sf_bytes(int64_t rows, int64_t k) {
  return round_up(rows, kSfAtomRows) * round_up(k / kSfVecSize, kSfAtomCols);
}

OutDtype to_out_dtype(at::ScalarType t);

}  // namespace nvfp4_gemm
