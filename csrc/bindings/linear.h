// What the CPU and CUDA implementations of nvfp4_gemm::linear (and of its helper op _input_scales) share:
// the input checks, the row layout the kernels read, the mm call and the bias epilogue.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace nvfp4_gemm {

struct LinearShape {
  int64_t n, k;
  at::ScalarType x_dtype;
  std::vector<int64_t> out_shape;  // x's leading dims, then N
};

// Checks every argument of nvfp4_gemm::linear; throws c10::Error naming the argument (linear's own names,
// so that nothing reaches mm's checks, which would name b / sfb), expected vs actual.
LinearShape check_linear_inputs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& weight_scale,
                                const at::Tensor& weight_scale_2, const std::optional<at::Tensor>& input_scale,
                                const std::optional<at::Tensor>& bias, bool weight_only);

// Checks of nvfp4_gemm::_input_scales: x 2-D [rows, K] float16 / bfloat16 / float32 with K % 16 == 0, the
// scales one float32 value each on x's device. Returns K.
int64_t check_input_scales_inputs(const at::Tensor& x, const at::Tensor& weight_scale_2,
                                  const std::optional<at::Tensor>& input_scale);

// x as [rows, K] with unit stride along K, rows K apart and a 16-byte aligned base (copied once otherwise).
at::Tensor rows_for_kernels(const at::Tensor& x, int64_t k);

// The dtype mm writes: x's, or float32 when a bias is to join before the one rounding.
inline at::ScalarType mm_dtype_for(const LinearShape& s, const std::optional<at::Tensor>& bias) {
  return bias.has_value() ? at::kFloat : s.x_dtype;
}

// nvfp4_gemm::mm through the dispatcher (each device runs its own backends).
at::Tensor call_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                   const at::Tensor& sfb, const std::optional<at::Tensor>& alpha, at::ScalarType out_dtype);

// y (mm's float32 result when there is a bias, else already in x's dtype) plus the bias, rounded once to
// x's dtype, reshaped to s.out_shape. One elementwise kernel: the add reads the bias in its own dtype,
// sums in fp32 and casts on store, which is y.add_(bias.float()).to(x_dtype) bit for bit.
at::Tensor finish_linear(at::Tensor y, const std::optional<at::Tensor>& bias, const LinearShape& s);

}  // namespace nvfp4_gemm
