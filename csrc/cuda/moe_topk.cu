// The kernel of nvfp4_gemm::_moe_topk (the design in cuda/moe_topk.h, the semantics in bindings/moe_topk.h).
#include "cuda/moe_topk.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "common/convert_out.cuh"

namespace nvfp4_gemm::generic {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 4;  // tokens per CTA: decode has a handful, so small CTAs spread them over more SMs
constexpr uint32_t kNanKey = 0x7fc00000u;  // above +inf's bits: NaN first, as torch.topk has it

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// The selection key of probability p (>= +0 or NaN) of expert `id`: p's bits order as its values, NaN above
// them; the low word ranks the lower id higher. Every real candidate's key is nonzero (id < 2^32 - 1).
__device__ __forceinline__ uint64_t key_of(float p, int id) {
  const uint32_t bits = p != p ? kNanKey : (__float_as_uint(p) & 0x7fffffffu);
  return (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// One warp per row; kVpl >= ceil(e / 32) logits per lane (lane l: experts l, l + 32, ...).
template <typename T, int kVpl>
__global__ void __launch_bounds__(kWarps * 32)
    topk_rows(const T* __restrict__ logits, int64_t t, int e, int k, bool normalize, T* __restrict__ weights,
              int64_t* __restrict__ ids) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= t) return;  // whole warps
  const T* x = logits + row * e;

  float v[kVpl];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kVpl; ++j) {
    const int c = lane + 32 * j;
    v[j] = c < e ? to_float(x[c]) : -INFINITY;
    m = m > v[j] ? m : v[j];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(kFullMask, m, o);
    m = m < other ? other : m;
  }
  // torch's softmax order: each lane from 0 over its experts in order, then the butterfly; expf, not __expf,
  // and an IEEE divide (nvcc's defaults), as torch's kernel
  float s = 0.f;
  uint32_t taken = 0;  // bit j: expert lane + 32 j is selected, or does not exist
#pragma unroll
  for (int j = 0; j < kVpl; ++j) {
    if (lane + 32 * j < e) {
      v[j] = expf(v[j] - m);
      s += v[j];
    } else {
      taken |= 1u << j;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);
#pragma unroll
  for (int j = 0; j < kVpl; ++j) v[j] = v[j] / s;

  float mine = 0.f;  // the p and id of slot `lane` (lanes < k)
  int mine_id = 0;
  for (int r = 0; r < k; ++r) {
    uint64_t best = 0;
#pragma unroll
    for (int j = 0; j < kVpl; ++j) {
      const uint64_t key = key_of(v[j], lane + 32 * j);
      if (!((taken >> j) & 1u) && key > best) best = key;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t other = __shfl_xor_sync(kFullMask, best, o);
      best = other > best ? other : best;
    }
    const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
    const float p = __uint_as_float(static_cast<uint32_t>(best >> 32));  // p itself (a NaN stays a NaN)
    if ((id & 31) == lane) taken |= 1u << (id >> 5);
    if (lane == r) {
      mine = p;
      mine_id = id;
    }
  }
  // the renormalization's sum as a butterfly over the slots (a tree, as the softmax's; the lanes >= k add 0)
  float total = lane < k ? mine : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(kFullMask, total, o);
  if (lane < k) {
    weights[row * k + lane] = convert_out<T>(normalize ? mine / total : mine);
    ids[row * k + lane] = mine_id;
  }
}

template <typename T, int kVpl>
void launch_vpl(const void* logits, int64_t t, int64_t e, int64_t k, bool normalize, void* weights, int64_t* ids,
                cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(ceil_div(t, kWarps));
  topk_rows<T, kVpl><<<grid, kWarps * 32, 0, stream>>>(static_cast<const T*>(logits), t, static_cast<int>(e),
                                                       static_cast<int>(k), normalize, static_cast<T*>(weights),
                                                       ids);
}

// Logits per lane rounded up to a power of two: five instantiations per dtype, at most 2x the registers needed.
template <typename T>
void launch(const void* logits, int64_t t, int64_t e, int64_t k, bool normalize, void* weights, int64_t* ids,
            cudaStream_t stream) {
  const int64_t per_lane = ceil_div(e, 32);
  if (per_lane <= 1) {
    launch_vpl<T, 1>(logits, t, e, k, normalize, weights, ids, stream);
  } else if (per_lane <= 2) {
    launch_vpl<T, 2>(logits, t, e, k, normalize, weights, ids, stream);
  } else if (per_lane <= 4) {
    launch_vpl<T, 4>(logits, t, e, k, normalize, weights, ids, stream);
  } else if (per_lane <= 8) {
    launch_vpl<T, 8>(logits, t, e, k, normalize, weights, ids, stream);
  } else {
    launch_vpl<T, 16>(logits, t, e, k, normalize, weights, ids, stream);
  }
}

}  // namespace

bool moe_topk(const void* logits, OutDtype dtype, int64_t t, int64_t e, int64_t k, bool normalize, void* weights,
              int64_t* ids, cudaStream_t stream, char* err, size_t err_len) {
  switch (dtype) {
    case OutDtype::kFloat32:
      launch<float>(logits, t, e, k, normalize, weights, ids, stream);
      break;
    case OutDtype::kFloat16:
      launch<__half>(logits, t, e, k, normalize, weights, ids, stream);
      break;
    case OutDtype::kBFloat16:
      launch<__nv_bfloat16>(logits, t, e, k, normalize, weights, ids, stream);
      break;
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    std::snprintf(err, err_len, "moe_topk launch failed (T=%lld, E=%lld, k=%lld): %s", static_cast<long long>(t),
                  static_cast<long long>(e), static_cast<long long>(k), cudaGetErrorString(status));
    return false;
  }
  return true;
}

}  // namespace nvfp4_gemm::generic
