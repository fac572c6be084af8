// The grouped (mixture-of-experts) GEMM at the torch boundary: input validation shared by the CPU and CUDA
// implementations of nvfp4_gemm::grouped_mm / grouped_mm_out, and the arch modules' grouped tables
// (csrc/common/grouped.h) that Python has imported.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "common/grouped.h"

namespace nvfp4_gemm {

struct GroupedShape {
  int64_t t, n, k, g;
  at::ScalarType out_dtype;
  bool weight_only;   // a holds float activations [T, K] and sfa is absent (W4A16)
  int64_t sfa_rows;   // padded rows the sfa buffer holds (W4A4 only; a multiple of 128)
};

// Checks every argument against docs/CONTRACT.md's "Grouped GEMM"; throws c10::Error naming the argument, expected vs
// actual, before anything is written. Values on the device (offs, alpha) are not read: `gpu_rules` adds the
// rules the CUDA kernels read and write under (unit stride along K, 16-byte aligned rows and bases,
// dimensions below 2^31). `out`, when given, must be [T, N] of the result dtype on a's device.
GroupedShape check_grouped_inputs(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                                  const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                                  std::optional<at::ScalarType> out_dtype, const at::Tensor* out, bool gpu_rules);

// Worst case over every routing of t rows into g groups of sum_j round_up(m_j, 128): the padded rows of the
// grouped blocked layout of A's scales that no routing exceeds (each of the at most min(g, t) non-empty groups
// pads by at most 127 rows; the sum is a multiple of 128).
inline int64_t grouped_sfa_rows_worst(int64_t t, int64_t g) {
  const int64_t groups = t < g ? t : g;
  return (t + groups * (kSfAtomRows - 1)) / kSfAtomRows * kSfAtomRows;
}

// Checks of nvfp4_gemm::_quantize_grouped (x [T, K] float with K % 16 == 0; offs int32 [G >= 1]; input_scale and
// weight_scale_2 each None or contiguous float32 [G]; sfa_rows a multiple of 128, >= round_up(T, 128); all on x's
// device; one_scale only without input_scale), shared by its CPU and CUDA implementations; throws c10::Error naming
// the argument, expected vs actual.
void check_quantize_grouped(const at::Tensor& x, const at::Tensor& offs, const std::optional<at::Tensor>& input_scale,
                            const std::optional<at::Tensor>& weight_scale_2, int64_t sfa_rows, bool one_scale = false);

// Looks up `nvfp4_gemm::_grouped_api_<name>` for every known arch backend name (registry.h's order) and keeps
// the tables found. Called by Python after importing the arch modules; returns the names found.
std::vector<std::string> register_grouped_backends();

// Registered grouped tables, in preference order.
const std::vector<const GroupedBackendApi*>& grouped_backends();

}  // namespace nvfp4_gemm
