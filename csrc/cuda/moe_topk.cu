// The kernel of nvfp4_gemm::_moe_topk (the design in cuda/moe_topk.h, the semantics in bindings/moe_topk.h).
#include "cuda/moe_topk.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>

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

// The top-k of one row of e logits (x: global or shared memory) by one warp, lane `lane`; kVpl >= ceil(e / 32)
// logits per lane (lane l: experts l, l + 32, ...). Writes the row's k weights and ids.
template <typename T, int kVpl>
__device__ __forceinline__ void topk_row(const T* x, int e, int k, bool normalize, T* __restrict__ weights,
                                         int64_t* __restrict__ ids, int lane) {
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
    weights[lane] = convert_out<T>(normalize ? mine / total : mine);
    ids[lane] = mine_id;
  }
}

// One warp per row.
template <typename T, int kVpl>
__global__ void __launch_bounds__(kWarps * 32)
    topk_rows(const T* __restrict__ logits, int64_t t, int e, int k, bool normalize, T* __restrict__ weights,
              int64_t* __restrict__ ids) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= t) return;  // whole warps
  topk_row<T, kVpl>(logits + row * e, e, k, normalize, weights + row * k, ids + row * k, threadIdx.x & 31);
}

// The router's logits GEMM and the top-k in one launch: one cluster of kRouterCtas CTAs (moe_topk.h). Warp w of
// CTA c takes experts c * kRouterWarps + w + i * kRouterCtas * kRouterWarps; for each, lane l multiplies the 16-byte
// vectors l, l + 32, ... of the expert's weight row with the same vectors of every token's row (8 products added
// in order into one float32 sum a token), the 32 lane sums meet in a butterfly, and the logit, rounded once to T,
// goes to C and to CTA 0's shared memory (distributed shared memory). After the cluster barrier CTA 0's warps run
// the top-k of the rows from there.
template <typename T, int kVpl>
__global__ void __launch_bounds__(kRouterThreads)
    router_topk(const T* __restrict__ x, const T* __restrict__ w, int t, int h, int e, int k, bool normalize,
                T* __restrict__ logits, T* __restrict__ weights, int64_t* __restrict__ ids) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kRouterChunk = 4;  // 16-byte weight vectors a lane loads at once
  __shared__ __align__(16) T rows[kRouterMaxTokens * kRouterMaxExperts];  // CTA 0's: every logit of the call
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  T* const rows0 = cluster.map_shared_rank(rows, 0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int vecs = h / 8;  // 16-byte vectors a row
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  // CTA 0's shared memory may be written only once CTA 0 runs: arrive now, wait before the first write
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  bool started = false;
  for (int r = rank * kRouterWarps + warp; r < e; r += kRouterCtas * kRouterWarps) {
    const uint4* wv = reinterpret_cast<const uint4*>(w) + static_cast<int64_t>(r) * vecs;
    float acc[kRouterMaxTokens];
#pragma unroll
    for (int i = 0; i < kRouterMaxTokens; ++i) acc[i] = 0.f;
    // kRouterChunk vectors a lane in flight at once (their loads issued together), taken in order of j
    for (int j0 = lane; j0 < vecs; j0 += 32 * kRouterChunk) {
      uint4 wq[kRouterChunk];
#pragma unroll
      for (int c = 0; c < kRouterChunk; ++c)
        wq[c] = j0 + 32 * c < vecs ? __ldg(wv + j0 + 32 * c) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int i = 0; i < kRouterMaxTokens; ++i) {
        if (i < t) {
          uint4 xq[kRouterChunk];
          const uint4* xi = xv + static_cast<int64_t>(i) * vecs;
#pragma unroll
          for (int c = 0; c < kRouterChunk; ++c)
            xq[c] = j0 + 32 * c < vecs ? __ldg(xi + j0 + 32 * c) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
          for (int c = 0; c < kRouterChunk; ++c) {
            if (j0 + 32 * c < vecs) {
              const T* wt = reinterpret_cast<const T*>(&wq[c]);
              const T* xt = reinterpret_cast<const T*>(&xq[c]);
#pragma unroll
              for (int q = 0; q < 8; ++q) acc[i] = fmaf(to_float(xt[q]), to_float(wt[q]), acc[i]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRouterMaxTokens; ++i) {
      if (i < t) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(kFullMask, acc[i], o);
        if (!started) {
          asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
          started = true;
        }
        if (lane == 0) {
          const T v = convert_out<T>(acc[i]);
          rows0[i * e + r] = v;
          logits[static_cast<int64_t>(i) * e + r] = v;
        }
      }
    }
  }
  if (!started) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // a warp without experts
  cluster.sync();  // every logit is in CTA 0's shared memory
  if (rank == 0) {
    for (int i = warp; i < t; i += kRouterWarps)
      topk_row<T, kVpl>(rows + i * e, e, k, normalize, weights + static_cast<int64_t>(i) * k,
                        ids + static_cast<int64_t>(i) * k, lane);
  }
#endif
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

template <typename T, int kVpl>
cudaError_t launch_router_vpl(const void* x, const void* w, int64_t t, int64_t h, int64_t e, int64_t k,
                              bool normalize, void* logits, void* weights, int64_t* ids, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kRouterCtas);
  cfg.blockDim = dim3(kRouterThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kRouterCtas;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, router_topk<T, kVpl>, static_cast<const T*>(x), static_cast<const T*>(w),
                            static_cast<int>(t), static_cast<int>(h), static_cast<int>(e), static_cast<int>(k),
                            normalize, static_cast<T*>(logits), static_cast<T*>(weights), ids);
}

template <typename T>
cudaError_t launch_router(const void* x, const void* w, int64_t t, int64_t h, int64_t e, int64_t k, bool normalize,
                          void* logits, void* weights, int64_t* ids, cudaStream_t stream) {
  const int64_t per_lane = ceil_div(e, 32);
  if (per_lane <= 1) return launch_router_vpl<T, 1>(x, w, t, h, e, k, normalize, logits, weights, ids, stream);
  if (per_lane <= 2) return launch_router_vpl<T, 2>(x, w, t, h, e, k, normalize, logits, weights, ids, stream);
  if (per_lane <= 4) return launch_router_vpl<T, 4>(x, w, t, h, e, k, normalize, logits, weights, ids, stream);
  return launch_router_vpl<T, 8>(x, w, t, h, e, k, normalize, logits, weights, ids, stream);
}

}  // namespace

bool moe_router_fits(int device_major, int64_t t, int64_t h, int64_t e, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return device_major >= 9 && t >= 1 && t <= kRouterMaxTokens && e <= kRouterMaxExperts && h % 8 == 0 &&
         h <= (int64_t{1} << 30) && aligned(x) && aligned(w);
}

bool moe_router(const void* x, const void* w, OutDtype dtype, int64_t t, int64_t h, int64_t e, int64_t k,
                bool normalize, void* logits, void* weights, int64_t* ids, cudaStream_t stream, char* err,
                size_t err_len) {
  const cudaError_t status =
      dtype == OutDtype::kFloat16
          ? launch_router<__half>(x, w, t, h, e, k, normalize, logits, weights, ids, stream)
          : launch_router<__nv_bfloat16>(x, w, t, h, e, k, normalize, logits, weights, ids, stream);
  if (status != cudaSuccess) {
    std::snprintf(err, err_len, "moe_router launch failed (T=%lld, H=%lld, E=%lld, k=%lld): %s",
                  static_cast<long long>(t), static_cast<long long>(h), static_cast<long long>(e),
                  static_cast<long long>(k), cudaGetErrorString(status));
    return false;
  }
  return true;
}

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
