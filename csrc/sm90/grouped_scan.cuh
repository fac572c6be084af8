// The group bounds of a grouped GEMM as the SM90 grouped kernels read offs (grouped_schedule.h): group g's rows are
// [end_{g-1}, end_g) with end the running max of offs clamped to [0, T], so a decreasing offset makes an empty group
// and groups never overlap. One warp walks them 32 a round with warp scans (the wgmma grouped form's work list,
// sm90_gemm.cuh build_grouped_tiles, and its NVFP4 A prepass, grouped_wgmma.cu). Torch-free.
#pragma once

#include <cuda_runtime.h>

namespace nvfp4_gemm::sm90 {

// Called by all 32 lanes of one warp. ends[g] (g < groups) holds offs[g] clamped to [0, T]. For every group, in
// rounds of 32: count(start, end) -> Sum, then put(g, start, end, before, count) with `before` the sum of the counts
// of the groups ahead of g. Each round reads ends[] before any put of that round, so put may overwrite ends[g].
template <typename Sum, typename Count, typename Put>
__device__ __forceinline__ void scan_groups(const int* ends, int groups, Count count, Put put) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = static_cast<int>(threadIdx.x % 32);
  int run = 0;
  Sum carry = 0;
  for (int base = 0; base < groups; base += 32) {
    const int g = base + lane;
    const bool live = g < groups;
    int end = live ? ends[g] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {  // running max of the ends
      const int x = __shfl_up_sync(kAll, end, d);
      if (lane >= d) end = max(end, x);
    }
    end = max(end, run);
    int start = __shfl_up_sync(kAll, end, 1);
    if (lane == 0) start = run;
    const Sum n = live ? count(start, end) : Sum{0};
    Sum incl = n;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {  // inclusive sum of the counts
      const Sum x = __shfl_up_sync(kAll, incl, d);
      if (lane >= d) incl += x;
    }
    __syncwarp();
    if (live) put(g, start, end, carry + incl - n, n);
    carry += __shfl_sync(kAll, incl, 31);
    run = __shfl_sync(kAll, end, 31);
  }
}

}  // namespace nvfp4_gemm::sm90
