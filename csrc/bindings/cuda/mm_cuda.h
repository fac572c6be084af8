// What the CUDA mm implementation offers the rest of the core module besides the registered ops.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common/problem.h"

namespace nvfp4_gemm {

// SM version, SM count, shared memory and index of CUDA device `device`, queried once per process.
const DeviceInfo& device_info(int device);

// quantize(x, encode) followed by mm(..., alpha * alpha2) in one GEMM call, where an arch kernel quantizes
// x on the fly (Problem::a_scale): x [M, K] fp16 / bf16 / fp32 with 16-byte rows, b / sfb the NVFP4 weight,
// a_scale the encode scale (its reciprocal when a_scale_is_decode), alpha and the optional alpha2 device
// scalars. The numbers are bit for bit those of the two calls. nullopt (nothing launched) when no arch
// kernel takes the fused problem on this device; the caller then makes the two calls.
std::optional<at::Tensor> mm_quantized_a_cuda(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                              const at::Tensor& a_scale, bool a_scale_is_decode,
                                              const at::Tensor& alpha, const std::optional<at::Tensor>& alpha2,
                                              at::ScalarType out_dtype);

// The dynamic form of the above: the arch kernel forms the per-tensor input scales from x itself, exactly as
// the input-scales kernel does (Problem::a_dynamic_ws2), writing {encode, decode, alpha} into `scales` (three
// float32 values on x's device, quant::InputScale order) on its way: one call instead of the input-scales
// launch + the fused GEMM, the same numbers. nullopt (nothing launched) where no arch kernel takes it.
std::optional<at::Tensor> mm_dynamic_a_cuda(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                            const at::Tensor& weight_scale_2, const at::Tensor& scales,
                                            at::ScalarType out_dtype);

}  // namespace nvfp4_gemm
