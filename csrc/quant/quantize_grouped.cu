// Grouped NVFP4 quantization for any SM >= 8.0. The routing comes from the generic grouped GEMM's prologue
// (csrc/cuda/grouped.h); one thread per slot of the grouped blocked scale layout (a padded row and a 16-element
// block), so every byte of sfa is written in the same pass (zero padding included) and a warp reads a contiguous
// stretch of one token row, as the dense kernel (quantize.cu) does. Dynamic scales take one more pass: a block per
// token row reduces its finite amax and folds it into its group's with an atomic max on the float's bits.
#include "quant/quantize_grouped.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda/grouped.h"
#include "quant/elem.cuh"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kAmaxThreads = 128;

__device__ __forceinline__ InputScales group_scales(const float* input_scale, const uint32_t* amax, int64_t grp) {
  return input_scale != nullptr ? static_input_scales(input_scale[grp], 1.0f)
                                : dynamic_input_scales(__uint_as_float(amax[grp]), 1.0f);
}

// One block per token row: the finite amax of |x| (as fp32 bits; 0 when nothing is finite) into its group's slot.
template <InDtype D>
__global__ void __launch_bounds__(kAmaxThreads) group_amax_kernel(const uint8_t* __restrict__ x, int64_t ld_x_bytes,
                                                                  int64_t rows, int64_t k,
                                                                  const int32_t* __restrict__ offs, int64_t g,
                                                                  uint32_t* __restrict__ amax) {
  constexpr int kPerChunk = 16 / Elem<D>::kBytes;  // elements per 16-byte load
  const int64_t r = blockIdx.x;
  const uint4* row = reinterpret_cast<const uint4*>(x + r * ld_x_bytes);
  const int64_t chunks = k / kPerChunk;
  uint32_t m = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += kAmaxThreads) {
    const uint4 v = __ldg(row + c);
#pragma unroll
    for (int i = 0; i < kPerChunk; ++i) {
      const uint32_t bits = Elem<D>::bits(&v, i) & 0x7FFFFFFFu;
      if (bits < 0x7F800000u) m = max(m, bits);  // finite only: inf and NaN do not set the scale
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  __shared__ uint32_t warp_max[kAmaxThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int w = 1; w < kAmaxThreads / 32; ++w) m = max(m, warp_max[w]);
  // The row's group: the first whose (clamped) end lies past it.
  int64_t lo = 0, hi = g - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    int64_t end = offs[mid];
    end = end < 0 ? 0 : end > rows ? rows : end;
    if (end > r) hi = mid; else lo = mid + 1;
  }
  if (m != 0) atomicMax(amax + lo, m);
}

template <InDtype D>
__global__ void __launch_bounds__(kThreads) quantize_grouped_kernel(
    const uint8_t* __restrict__ x, int64_t ld_x_bytes, int64_t k, int64_t g, generic::GroupedRouting rt,
    const float* __restrict__ input_scale, const uint32_t* __restrict__ amax, int64_t sfa_rows,
    uint8_t* __restrict__ packed, uint8_t* __restrict__ sf, float* __restrict__ decode) {
  constexpr int kLoads = kSfVecSize * Elem<D>::kBytes / 16;  // 16-byte loads per block
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t padded_cols = round_up(sf_cols, kSfAtomCols);
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (item < g) decode[item] = group_scales(input_scale, amax, item).decode;
  if (item >= sfa_rows * padded_cols) return;
  const int64_t prow = item / padded_cols, s = item % padded_cols;
  // The group whose padded rows hold prow: the last with pad_start <= prow (an empty group shares its
  // successor's start).
  int64_t lo = 0, hi = g - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (rt.pad_start[mid] <= prow) lo = mid; else hi = mid - 1;
  }
  const int64_t r = prow - rt.pad_start[lo];
  const int64_t offset = blocked_sf_offset(prow, s, sf_cols);
  if (s >= sf_cols || r >= rt.row_count[lo]) {  // padding of the layout, or past the routing's last group
    sf[offset] = 0;
    return;
  }
  const int64_t row = rt.row_start[lo] + r;
  const float gs = group_scales(input_scale, amax, lo).encode;
  uint4 raw[kLoads];
  const uint4* src = reinterpret_cast<const uint4*>(x + row * ld_x_bytes + s * (kLoads * 16));
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
  sf[offset] = s8;
  const float inv = value_multiplier(s8, gs);
  uint32_t words[2] = {0, 0};  // element 2i in the low nibble of byte i
#pragma unroll
  for (int i = 0; i < kSfVecSize; ++i) words[i / 8] |= e2m1_code(abs_bits[i], Elem<D>::sign(raw, i), inv) << (4 * (i % 8));
  *reinterpret_cast<uint2*>(packed + row * (k / 2) + s * (kSfVecSize / 2)) = make_uint2(words[0], words[1]);
}

template <InDtype D>
bool launch(const void* x, int64_t rows, int64_t k, int64_t ld_x, const int32_t* offs, int64_t g,
            const float* input_scale, int64_t sfa_rows, void* workspace, uint8_t* packed, uint8_t* sf, float* decode,
            cudaStream_t stream, char* err, size_t err_len) {
  if (!generic::grouped_routing(offs, g, rows, workspace, stream, err, err_len)) return false;
  uint32_t* amax = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(workspace) + generic::grouped_workspace_bytes(g));
  const auto* src = static_cast<const uint8_t*>(x);
  const int64_t ld_bytes = ld_x * Elem<D>::kBytes;
  if (input_scale == nullptr) {
    cudaError_t e = cudaMemsetAsync(amax, 0, static_cast<size_t>(g) * sizeof(uint32_t), stream);
    if (e == cudaSuccess && rows > 0) {
      group_amax_kernel<D><<<static_cast<unsigned>(rows), kAmaxThreads, 0, stream>>>(src, ld_bytes, rows, k, offs, g,
                                                                                     amax);
      e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
      std::snprintf(err, err_len, "quantize_grouped amax launch failed: %s", cudaGetErrorString(e));
      return false;
    }
  }
  const int64_t slots = sfa_rows * round_up(k / kSfVecSize, kSfAtomCols);
  const int64_t blocks = ceil_div(slots > g ? slots : g, kThreads);
  quantize_grouped_kernel<D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      src, ld_bytes, k, g, generic::grouped_routing_view(workspace, g), input_scale, amax, sfa_rows, packed, sf,
      decode);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "quantize_grouped kernel launch failed: %s (was the generic module compiled for this "
                  "GPU? rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)", cudaGetErrorString(e));
    return false;
  }
  return true;
}

}  // namespace

size_t quantize_grouped_workspace_bytes(int64_t g) {
  return generic::grouped_workspace_bytes(g) + static_cast<size_t>(round_up(g * 4, 16));
}

bool quantize_grouped_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const int32_t* offs,
                           int64_t g, const float* input_scale, int64_t sfa_rows, void* workspace, uint8_t* packed,
                           uint8_t* sf, float* decode, cudaStream_t stream, char* err, size_t err_len) {
  const int64_t slots = sfa_rows * round_up(k / kSfVecSize, kSfAtomCols);
  if (ceil_div(slots > g ? slots : g, kThreads) > 0x7FFFFFFF || rows > 0x7FFFFFFF) {
    std::snprintf(err, err_len, "quantize_grouped: rows=%lld k=%lld sfa_rows=%lld past the grid limit",
                  static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(sfa_rows));
    return false;
  }
  switch (dtype) {
    case InDtype::kFloat32:
      return launch<InDtype::kFloat32>(x, rows, k, ld_x, offs, g, input_scale, sfa_rows, workspace, packed, sf, decode,
                                       stream, err, err_len);
    case InDtype::kFloat16:
      return launch<InDtype::kFloat16>(x, rows, k, ld_x, offs, g, input_scale, sfa_rows, workspace, packed, sf, decode,
                                       stream, err, err_len);
    case InDtype::kBFloat16:
      return launch<InDtype::kBFloat16>(x, rows, k, ld_x, offs, g, input_scale, sfa_rows, workspace, packed, sf,
                                        decode, stream, err, err_len);
  }
  std::snprintf(err, err_len, "quantize_grouped: unknown input dtype code %d", static_cast<int>(dtype));
  return false;
}

}  // namespace nvfp4_gemm::quant
