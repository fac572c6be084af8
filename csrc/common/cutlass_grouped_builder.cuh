// The device half of common/cutlass_grouped.h: one small launch that turns offs into the argument arrays of
// CUTLASS's grouped GEMM (problem shapes, pointers, strides, scale-factor layouts, alpha pointers), so the host
// reads nothing back and a captured graph follows each replay's routing.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include "common/cutlass_grouped.h"

namespace nvfp4_gemm::grouped {

inline constexpr int kBuildThreads = 256;

// Block 0 writes every group's arguments; every block computes the same prefix sums (padded rows of the
// groups before each chunk of kBuildThreads groups) and, where a group's scales run past sfa, helps fill its
// uncomputed rows of C with NaN (grid-stride). Launched with one block unless sfa may be too small for some
// routing (launch_builder).
template <bool SwapAB>
__global__ void __launch_bounds__(kBuildThreads)
    build_group_arguments(GroupedProblem p, ArgArrays<SwapAB> arrays, const float* one) {
  using Scan = cub::BlockScan<long long, kBuildThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ long long carry;
  __shared__ long long nan_begin[kBuildThreads], nan_end[kBuildThreads];
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < p.g; base += kBuildThreads) {
    const int64_t i = base + threadIdx.x;
    GroupRows r{0, 0};
    if (i < p.g) r = group_rows(p.offs, i, p.t);
    long long before = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(static_cast<long long>(padded_rows(r.m)), before, total);
    nan_begin[threadIdx.x] = nan_end[threadIdx.x] = 0;
    if (i < p.g) {
      const GroupOperands<SwapAB> o = describe_group<SwapAB>(p, i, r, carry + before, one);
      if (blockIdx.x == 0) arrays.store(i, o);
      nan_begin[threadIdx.x] = o.nan_begin;
      nan_end[threadIdx.x] = o.nan_end;
    }
    if (__syncthreads_or(i < p.g && nan_end[threadIdx.x] > nan_begin[threadIdx.x])) {
      const int64_t esize = out_bytes(p.out_dtype);
      const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
      for (int j = 0; j < kBuildThreads; ++j) {
        const int64_t lo = nan_begin[j], count = (nan_end[j] - lo) * p.n;
        for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += step) {
          uint8_t* dst = static_cast<uint8_t*>(p.c) + ((lo + e / p.n) * p.ldc + e % p.n) * esize;
          if (esize == 4) {
            *reinterpret_cast<uint32_t*>(dst) = 0x7FC00000u;
          } else {
            *reinterpret_cast<uint16_t*>(dst) = p.out_dtype == OutDtype::kBFloat16 ? 0x7FC0 : 0x7E00;
          }
        }
      }
    }
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

// One block when every valid routing fits sfa (the NaN fill then never runs but for garbage offs); otherwise a
// wave of blocks to share the fill.
inline int builder_blocks(const GroupedProblem& p, int num_sms) {
  return p.sfa_rows >= worst_sfa_rows(p.t, p.g) ? 1 : (num_sms > 1 ? num_sms : 1);
}

template <bool SwapAB>
cudaError_t launch_builder(const GroupedProblem& p, const ArgArrays<SwapAB>& arrays, const float* one, int blocks,
                           cudaStream_t stream) {
  build_group_arguments<SwapAB><<<blocks, kBuildThreads, 0, stream>>>(p, arrays, one);
  return cudaGetLastError();
}

}  // namespace nvfp4_gemm::grouped
