// float -> output element (fp16 / bf16 round to nearest even, fp32 as is): the one conversion the CUDA
// kernels use when they write C (sm90) or decoded operands (the generic path).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace nvfp4_gemm {

template <typename T>
__device__ __forceinline__ T convert_out(float v);
template <>
__device__ __forceinline__ __half convert_out<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 convert_out<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ float convert_out<float>(float v) { return v; }

}  // namespace nvfp4_gemm
