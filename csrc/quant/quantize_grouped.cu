// Grouped NVFP4 quantization for any SM >= 8.0: one thread per 16-element block, as the dense kernel
// (quantize.cu) maps them, with the encode scale of the block's row's group. Linear scales out: the grouped
// blocked placement depends on the routing and is a small second pass over the scales (nvfp4_gemm/grouped.py).
#include "quant/quantize_grouped.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "quant/elem.cuh"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ InputScales group_scales(const float* group_scale, int64_t grp, bool dynamic) {
  const float v = group_scale[grp];
  return dynamic ? dynamic_input_scales(v, 1.0f) : static_input_scales(v, 1.0f);
}

template <InDtype D>
__global__ void __launch_bounds__(kThreads) quantize_grouped_kernel(const uint8_t* __restrict__ x, int64_t ld_x_bytes,
                                                                    int64_t rows, int64_t k,
                                                                    const float* __restrict__ group_scale, int64_t g,
                                                                    const int32_t* __restrict__ row_group, bool dynamic,
                                                                    uint8_t* __restrict__ packed,
                                                                    uint8_t* __restrict__ sf, float* __restrict__ decode) {
  constexpr int kLoads = kSfVecSize * Elem<D>::kBytes / 16;
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (item < g) decode[item] = group_scales(group_scale, item, dynamic).decode;
  if (item >= rows * sf_cols) return;
  const int64_t r = item / sf_cols, s = item % sf_cols;
  int64_t grp = row_group[r];
  grp = grp < 0 ? 0 : grp >= g ? g - 1 : grp;  // the caller routes in range; never read outside group_scale
  const float gs = group_scales(group_scale, grp, dynamic).encode;
  uint4 raw[kLoads];
  const uint4* src = reinterpret_cast<const uint4*>(x + r * ld_x_bytes + s * (kLoads * 16));
#pragma unroll
  for (int l = 0; l < kLoads; ++l) raw[l] = __ldg(src + l);
  uint32_t abs_bits[kSfVecSize];
  uint32_t amax_bits = 0;  // |x| bits compared as integers: NaN bits exceed inf's, so a NaN wins
#pragma unroll
  for (int i = 0; i < kSfVecSize; ++i) {
    abs_bits[i] = Elem<D>::bits(raw, i) & 0x7FFFFFFFu;
    amax_bits = max(amax_bits, abs_bits[i]);
  }
  const uint8_t s8 = block_scale(bits_float(amax_bits), gs);
  sf[r * sf_cols + s] = s8;
  const float inv = value_multiplier(s8, gs);
  uint32_t words[2] = {0, 0};  // element 2i in the low nibble of byte i
#pragma unroll
  for (int i = 0; i < kSfVecSize; ++i) words[i / 8] |= e2m1_code(abs_bits[i], Elem<D>::sign(raw, i), inv) << (4 * (i % 8));
  *reinterpret_cast<uint2*>(packed + r * (k / 2) + s * (kSfVecSize / 2)) = make_uint2(words[0], words[1]);
}

}  // namespace

bool quantize_grouped_rows_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x,
                                const float* group_scale, int64_t g, const int32_t* row_group, bool dynamic,
                                uint8_t* packed, uint8_t* sf, float* decode, cudaStream_t stream, char* err,
                                size_t err_len) {
  const int64_t items = rows * (k / kSfVecSize);
  const int64_t blocks = ceil_div(items > g ? items : g, kThreads);
  if (blocks > 0x7FFFFFFF) {
    std::snprintf(err, err_len, "quantize_grouped: rows=%lld k=%lld need %lld thread blocks, past the grid limit",
                  static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(blocks));
    return false;
  }
  const auto* src = static_cast<const uint8_t*>(x);
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (dtype) {
    case InDtype::kFloat32:
      quantize_grouped_kernel<InDtype::kFloat32><<<grid, kThreads, 0, stream>>>(
          src, ld_x * 4, rows, k, group_scale, g, row_group, dynamic, packed, sf, decode);
      break;
    case InDtype::kFloat16:
      quantize_grouped_kernel<InDtype::kFloat16><<<grid, kThreads, 0, stream>>>(
          src, ld_x * 2, rows, k, group_scale, g, row_group, dynamic, packed, sf, decode);
      break;
    case InDtype::kBFloat16:
      quantize_grouped_kernel<InDtype::kBFloat16><<<grid, kThreads, 0, stream>>>(
          src, ld_x * 2, rows, k, group_scale, g, row_group, dynamic, packed, sf, decode);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "quantize_grouped kernel launch failed: %s (was the generic module compiled for "
                  "this GPU? rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)", cudaGetErrorString(e));
    return false;
  }
  return true;
}

}  // namespace nvfp4_gemm::quant
