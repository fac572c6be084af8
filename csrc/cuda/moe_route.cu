// The routing kernels of nvfp4_gemm::_moe_route (the design in cuda/moe_route.h, the semantics in
// bindings/moe_route.h). Keys: the expert id where it lies in [0, e), else e (one key after every expert).
// Key x's rows start at key_start[x] (exclusive scan of the key counts); within key x, chunk c's rows start at
// hist[c][x] (exclusive scan over the chunks before c); within a chunk, the walk in pair order hands out rows.
#include "cuda/moe_route.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

namespace nvfp4_gemm::generic {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kOneLaunchMaxWarps = 32;
constexpr size_t kSmemBytes = 48 * 1024;  // shared memory a launch takes without an opt-in
constexpr int kPassWarps = 8;             // warps per CTA of the count and place grids
constexpr int kScanThreads = 1024;
constexpr int64_t kMinChunk = 256;   // pairs per warp chunk of the three-launch form ...
constexpr int64_t kMaxChunks = 1024;  // ... grown so that there are at most this many chunks

// The plan of one call: chunks of `chunk` pairs (a multiple of 32), chunk c being pairs [c * chunk, ...).
struct Plan {
  bool one_launch;
  int64_t chunk, chunks;
};

size_t one_launch_smem(int64_t warps, int64_t e) {
  return static_cast<size_t>((warps + 1) * (e + 1) + 32) * sizeof(int);  // hist, key_start, warp sums
}

Plan make_plan(int64_t s, int64_t e) {
  // One warp per 32 pairs up to 32 warps, fewer where their counts would not fit (E in the thousands).
  const int64_t fit = static_cast<int64_t>(kSmemBytes / sizeof(int) - 32) / (e + 1) - 1;
  const int64_t warps = std::min<int64_t>({kOneLaunchMaxWarps, ceil_div(s, 32), fit});
  if (s <= kMoeRouteOneLaunchPairs && warps >= 1) {
    return Plan{true, round_up(ceil_div(s, warps), 32), warps};
  }
  const int64_t chunk = std::max<int64_t>(kMinChunk, round_up(ceil_div(s, kMaxChunks), 32));
  return Plan{false, chunk, ceil_div(s, chunk)};
}

template <typename Id>
__device__ __forceinline__ int key_of(const Id* __restrict__ ids, int64_t p, int e) {
  const Id v = ids[p];
  return v >= 0 && v < static_cast<Id>(e) ? static_cast<int>(v) : e;
}

// One warp: row[x] = the number of pairs of key x in [lo, hi). Within a 32-pair step the lanes of one key elect
// their lowest lane to add the group's size, so each address has one writer per step; __syncwarp orders steps.
template <typename Id>
__device__ void count_chunk(const Id* __restrict__ ids, int64_t lo, int64_t hi, int e, int* row) {
  const int lane = threadIdx.x & 31;
  for (int x = lane; x <= e; x += 32) row[x] = 0;
  __syncwarp();
  for (int64_t base = lo; base < hi; base += 32) {  // warp-uniform bounds: every lane takes each step
    const int64_t p = base + lane;
    const int key = p < hi ? key_of(ids, p, e) : -1;
    const unsigned same = __match_any_sync(kFullMask, key);
    if (p < hi && lane == __ffs(same) - 1) row[key] += __popc(same);
    __syncwarp();
  }
}

// One warp, after the scan: pair p of [lo, hi) with key x gets row key_start[x] + row[x] + (its rank among the
// lanes of key x in this step), then row[x] advances by the step's count of key x. Pair order, so stable.
template <typename Id>
__device__ void place_chunk(const Id* __restrict__ ids, int64_t lo, int64_t hi, int e, int k, int* row,
                            const int* key_start, int64_t* __restrict__ row_token, int64_t* __restrict__ inverse) {
  const int lane = threadIdx.x & 31;
  const unsigned lower = (1u << lane) - 1u;
  for (int64_t base = lo; base < hi; base += 32) {
    const int64_t p = base + lane;
    const int key = p < hi ? key_of(ids, p, e) : -1;
    const unsigned same = __match_any_sync(kFullMask, key);
    if (p < hi) {
      const int r = key_start[key] + row[key] + __popc(same & lower);
      inverse[p] = r;
      row_token[r] = static_cast<int>(p) / k;
    }
    __syncwarp();
    if (p < hi && lane == __ffs(same) - 1) row[key] += __popc(same);
    __syncwarp();
  }
}

// The exclusive prefix sum of v over the CTA's threads (blockDim.x a multiple of 32, at most 1024).
// warp_sums: 32 ints of shared memory.
__device__ int cta_exclusive_sum(int v, int* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int inclusive = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int o = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += o;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < warps ? warp_sums[lane] : 0;
    int before = w;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int o = __shfl_up_sync(kFullMask, before, d);
      if (lane >= d) before += o;
    }
    if (lane < warps) warp_sums[lane] = before - w;
  }
  __syncthreads();
  return warp_sums[warp] + inclusive - v;
}

// The whole CTA: hist [chunks][e + 1] counts -> each chunk's first row within each key (exclusive over the
// chunks); key_start [e + 1] = each key's first row (exclusive over the keys); offs[x] = rows of keys <= x for
// x < e - 1, and offs[e - 1] = every row: the pairs of the key after the experts (ids outside [0, e)) close the
// last expert's group, so every row belongs to a group (grouped_mm's rule); the caller drops their results.
// Ends with a __syncthreads.
__device__ void scan_counts(int* hist, int64_t chunks, int e, int* key_start, int32_t* __restrict__ offs,
                            int* warp_sums) {
  const int keys = e + 1;
  for (int x = threadIdx.x; x < keys; x += blockDim.x) {
    int run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      int* h = hist + c * keys + x;
      const int n = *h;
      *h = run;
      run += n;
    }
    key_start[x] = run;  // the key's count, until the scan below
  }
  __syncthreads();
  // Thread i takes keys [i * per, i * per + per): its sum, the CTA's exclusive scan of those sums, then the keys.
  const int per = (keys + blockDim.x - 1) / blockDim.x;
  const int first = min(static_cast<int>(threadIdx.x) * per, keys), last = min(first + per, keys);
  int sum = 0;
  for (int x = first; x < last; ++x) sum += key_start[x];
  int before = cta_exclusive_sum(sum, warp_sums);
  for (int x = first; x < last; ++x) {
    const int n = key_start[x];
    key_start[x] = before;
    before += n;
    if (x < e - 1) offs[x] = before;
    else if (x == e) offs[e - 1] = before;  // the key after the experts is the last: before = every row
  }
  __syncthreads();
}

// The one-launch form: blockDim.x / 32 warps, warp w owning chunk w; shared memory as one_launch_smem.
template <typename Id>
__global__ void route_one_launch(const Id* __restrict__ ids, int64_t s, int k, int e, int64_t chunk,
                                 int32_t* __restrict__ offs, int64_t* __restrict__ row_token,
                                 int64_t* __restrict__ inverse) {
  extern __shared__ int smem[];
  const int keys = e + 1, warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
  int* hist = smem;                       // [warps][keys]
  int* key_start = hist + warps * keys;   // [keys]
  int* warp_sums = key_start + keys;      // [32]
  const int64_t lo = min(warp * chunk, s), hi = min(lo + chunk, s);
  int* row = hist + warp * keys;
  count_chunk(ids, lo, hi, e, row);
  __syncthreads();
  scan_counts(hist, warps, e, key_start, offs, warp_sums);
  place_chunk(ids, lo, hi, e, k, row, key_start, row_token, inverse);
}

// The three-launch form, in the workspace: hist [chunks][e + 1], key_start [e + 1].
template <typename Id>
__global__ void route_count(const Id* __restrict__ ids, int64_t s, int e, int64_t chunk, int64_t chunks, int* hist) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kPassWarps + (threadIdx.x >> 5);
  if (c >= chunks) return;  // whole warps
  const int64_t lo = c * chunk, hi = min(lo + chunk, s);
  count_chunk(ids, lo, hi, e, hist + c * (e + 1));
}

__global__ void route_scan(int* hist, int64_t chunks, int e, int* key_start, int32_t* __restrict__ offs) {
  __shared__ int warp_sums[32];
  scan_counts(hist, chunks, e, key_start, offs, warp_sums);
}

template <typename Id>
__global__ void route_place(const Id* __restrict__ ids, int64_t s, int k, int e, int64_t chunk, int64_t chunks,
                            int* hist, const int* key_start, int64_t* __restrict__ row_token,
                            int64_t* __restrict__ inverse) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kPassWarps + (threadIdx.x >> 5);
  if (c >= chunks) return;
  const int64_t lo = c * chunk, hi = min(lo + chunk, s);
  place_chunk(ids, lo, hi, e, k, hist + c * (e + 1), key_start, row_token, inverse);
}

template <typename Id>
void launch(const Id* ids, int64_t s, int64_t k, int64_t e, int32_t* offs, int64_t* row_token, int64_t* inverse,
            void* workspace, cudaStream_t stream) {
  const Plan plan = make_plan(s, e);
  if (plan.one_launch) {
    const int threads = static_cast<int>(plan.chunks) * 32;
    route_one_launch<Id><<<1, threads, one_launch_smem(plan.chunks, e), stream>>>(
        ids, s, static_cast<int>(k), static_cast<int>(e), plan.chunk, offs, row_token, inverse);
    return;
  }
  int* hist = static_cast<int*>(workspace);
  int* key_start = hist + plan.chunks * (e + 1);
  const unsigned grid = static_cast<unsigned>(ceil_div(plan.chunks, kPassWarps));
  route_count<Id><<<grid, kPassWarps * 32, 0, stream>>>(ids, s, static_cast<int>(e), plan.chunk, plan.chunks, hist);
  route_scan<<<1, kScanThreads, 0, stream>>>(hist, plan.chunks, static_cast<int>(e), key_start, offs);
  route_place<Id><<<grid, kPassWarps * 32, 0, stream>>>(ids, s, static_cast<int>(k), static_cast<int>(e),
                                                       plan.chunk, plan.chunks, hist, key_start, row_token, inverse);
}

}  // namespace

bool moe_route_one_launch(int64_t s, int64_t e) { return make_plan(s, e).one_launch; }

size_t moe_route_workspace_bytes(int64_t s, int64_t e) {
  const Plan plan = make_plan(s, e);
  if (plan.one_launch) return 0;
  return static_cast<size_t>(round_up((plan.chunks + 1) * (e + 1) * static_cast<int64_t>(sizeof(int)), 16));
}

bool moe_route(const void* ids, bool ids_int64, int64_t s, int64_t k, int64_t e, int32_t* offs, int64_t* row_token,
               int64_t* inverse, void* workspace, cudaStream_t stream, char* err, size_t err_len) {
  if (ids_int64) {
    launch(static_cast<const int64_t*>(ids), s, k, e, offs, row_token, inverse, workspace, stream);
  } else {
    launch(static_cast<const int32_t*>(ids), s, k, e, offs, row_token, inverse, workspace, stream);
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    std::snprintf(err, err_len, "moe_route launch failed (S=%lld, E=%lld): %s", static_cast<long long>(s),
                  static_cast<long long>(e), cudaGetErrorString(status));
    return false;
  }
  return true;
}

}  // namespace nvfp4_gemm::generic
