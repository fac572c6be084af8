#include "cuda/grouped.h"

#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdio>

#include "common/convert_out.cuh"
#include "cuda/decode.cuh"

namespace nvfp4_gemm::generic {
namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 64;
constexpr int kThreads = 256;     // 16 x 16 threads, 4 x 4 outputs each
constexpr int kPrepThreads = 512;

// One block: every group's rows [lo, lo + m) (offsets clamped to [0, t], a decrease read as an empty group),
// its first padded row in the grouped blocked sfa and its first row tile, by prefix sums over chunks of groups.
__global__ void __launch_bounds__(kPrepThreads) grouped_prologue(const int32_t* __restrict__ offs, int64_t g,
                                                                 int64_t t, int64_t* __restrict__ ws) {
  using Scan = cub::BlockScan<long long, kPrepThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ long long carry[2];
  int64_t* tile_start = ws;
  int64_t* pad_start = ws + g + 1;
  int64_t* row_start = ws + 2 * g + 1;
  int64_t* row_count = ws + 3 * g + 1;
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  const auto clamp = [t](int64_t v) { return v < 0 ? int64_t{0} : v > t ? t : v; };
  for (int64_t base = 0; base < g; base += kPrepThreads) {
    const int64_t i = base + threadIdx.x;
    long long tiles = 0, pad = 0;
    int64_t lo = 0, m = 0;
    if (i < g) {
      lo = i == 0 ? 0 : clamp(offs[i - 1]);
      const int64_t hi = clamp(offs[i]);
      m = hi > lo ? hi - lo : 0;
      tiles = (m + kTileM - 1) / kTileM;
      pad = (m + kSfAtomRows - 1) / kSfAtomRows * kSfAtomRows;
    }
    long long tiles_before, pad_before, tiles_total, pad_total;
    Scan(scan_storage).ExclusiveSum(tiles, tiles_before, tiles_total);
    __syncthreads();
    Scan(scan_storage).ExclusiveSum(pad, pad_before, pad_total);
    if (i < g) {
      tile_start[i] = carry[0] + tiles_before;
      pad_start[i] = carry[1] + pad_before;
      row_start[i] = lo;
      row_count[i] = m;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      carry[0] += tiles_total;
      carry[1] += pad_total;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) tile_start[g] = carry[0];
}


// 8 e2m1 values (4 bytes, element 2i in the low nibble of byte i) times their scale, into column `row` of
// rows kk0 .. kk0 + 7 of a [kTileK][ld] fp32 tile.
__device__ __forceinline__ void put8(float (*tile)[kTileM + 1], int kk0, int row, uint32_t word, float scale) {
#pragma unroll
  for (int j = 0; j < 8; ++j) tile[kk0 + j][row] = e2m1_value((word >> (4 * j)) & 0xF) * scale;
}

template <AType A> struct ActType;
template <> struct ActType<AType::kFloat16> { using T = __half; };
template <> struct ActType<AType::kBFloat16> { using T = __nv_bfloat16; };
template <> struct ActType<AType::kFloat32> { using T = float; };

template <typename T> __device__ __forceinline__ float to_float(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename OutT, AType A>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemm_kernel(GroupedProblem p, GroupedRouting rt) {
  __shared__ float as[kTileK][kTileM + 1];  // A tile, transposed: as[k][row]
  __shared__ float bs[kTileK][kTileN + 1];  // B tile, transposed: bs[k][col]
  const int64_t total_tiles = rt.tile_start[p.g];
  const int64_t sf_cols = p.k / kSfVecSize;
  const int64_t sfb_group = round_up(p.n, kSfAtomRows) * round_up(sf_cols, kSfAtomCols);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;

  for (int64_t tile = blockIdx.x; tile < total_tiles; tile += gridDim.x) {
    // The group whose tiles hold `tile`: the last g with tile_start[g] <= tile (empty groups share their
    // successor's start and are passed over).
    int64_t lo = 0, hi = p.g - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (rt.tile_start[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    const int64_t grp = lo;
    const int64_t row0 = (tile - rt.tile_start[grp]) * kTileM;  // within the group
    const int64_t m = rt.row_count[grp], first_row = rt.row_start[grp], pad0 = rt.pad_start[grp];
    const uint8_t* b = p.b + grp * p.b_group_bytes;
    const uint8_t* sfb = p.sfb + grp * sfb_group;

    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < p.k; k0 += kTileK) {
      // A: 64 rows x 64 values.
      if constexpr (A == AType::kE2m1) {
#pragma unroll
        for (int it = 0; it < 2; ++it) {
          const int c = tid + it * kThreads, r = c / 8, q = c % 8;
          const int64_t k = k0 + q * 8, row = row0 + r;
          uint32_t word = 0;
          float scale = 0.0f;
          if (row < m && k < p.k) {
            word = *reinterpret_cast<const uint32_t*>(p.a + (first_row + row) * p.lda + k / 2);
            const int64_t prow = pad0 + row;
            // A scale outside the caller's buffer (sfa too small for this routing) reads as NaN: loud, in bounds.
            scale = prow < p.sfa_rows ? e4m3_value(p.sfa[blocked_sf_offset(prow, k / kSfVecSize, sf_cols)])
                                      : __int_as_float(0x7FC00000);
          }
          put8(as, q * 8, r, word, scale);
        }
      } else {
        using T = typename ActType<A>::T;
        // Thread (r0 = tid / 64, kk = tid % 64) loads column kk of rows r0, r0 + 4, ...: a warp reads 32
        // consecutive values of one row.
        const int kk = tid % kTileK, r_first = tid / kTileK;
        const int64_t k = k0 + kk;
        const uint8_t* a_row = p.a + (first_row + row0 + r_first) * p.lda;
        const int64_t a_step = (kThreads / kTileK) * p.lda;
#pragma unroll 4
        for (int r = r_first; r < kTileM; r += kThreads / kTileK, a_row += a_step) {
          float v = 0.0f;
          if (row0 + r < m && k < p.k) v = to_float(reinterpret_cast<const T*>(a_row)[k]);
          as[kk][r] = v;
        }
      }
      // B: 64 weight rows (output columns) x 64 values of this group.
#pragma unroll
      for (int it = 0; it < 2; ++it) {
        const int c = tid + it * kThreads, r = c / 8, q = c % 8;
        const int64_t k = k0 + q * 8, col = n0 + r;
        uint32_t word = 0;
        float scale = 0.0f;
        if (col < p.n && k < p.k) {
          word = *reinterpret_cast<const uint32_t*>(b + col * p.ldb + k / 2);
          scale = e4m3_value(sfb[blocked_sf_offset(col, k / kSfVecSize, sf_cols)]);
        }
        put8(bs, q * 8, r, word, scale);
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kTileK; ++kk) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
    const float alpha = p.alpha != nullptr ? p.alpha[grp] : 1.0f;
    OutT* c = static_cast<OutT*>(p.c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row0 + ty + 16 * i;
      if (row >= m) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t col = n0 + tx + 16 * j;
        if (col < p.n) c[(first_row + row) * p.ldc + col] = convert_out<OutT>(__fmul_rn(acc[i][j], alpha));
      }
    }
  }
}

template <typename OutT>
void launch_main(const GroupedProblem& p, const GroupedRouting& rt, dim3 grid, cudaStream_t stream) {
  switch (p.a_type) {
    case AType::kE2m1: grouped_gemm_kernel<OutT, AType::kE2m1><<<grid, kThreads, 0, stream>>>(p, rt); break;
    case AType::kFloat16: grouped_gemm_kernel<OutT, AType::kFloat16><<<grid, kThreads, 0, stream>>>(p, rt); break;
    case AType::kBFloat16: grouped_gemm_kernel<OutT, AType::kBFloat16><<<grid, kThreads, 0, stream>>>(p, rt); break;
    case AType::kFloat32: grouped_gemm_kernel<OutT, AType::kFloat32><<<grid, kThreads, 0, stream>>>(p, rt); break;
  }
}

}  // namespace

size_t grouped_workspace_bytes(int64_t g) {
  return static_cast<size_t>(round_up((4 * g + 1) * static_cast<int64_t>(sizeof(int64_t)), 16));
}

bool grouped_routing(const int32_t* offs, int64_t g, int64_t t, void* workspace, cudaStream_t stream, char* err,
                     size_t err_len) {
  grouped_prologue<<<1, kPrepThreads, 0, stream>>>(offs, g, t, static_cast<int64_t*>(workspace));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "grouped routing prologue launch failed: %s", cudaGetErrorString(e));
    return false;
  }
  return true;
}

bool grouped_run(const GroupedProblem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream, char* err,
                 size_t err_len) {
  if (workspace_bytes < grouped_workspace_bytes(p.g)) {
    std::snprintf(err, err_len, "internal: grouped workspace of %zu bytes, %zu needed", workspace_bytes,
                  grouped_workspace_bytes(p.g));
    return false;
  }
  const int64_t n_tiles = ceil_div(p.n, kTileN);
  if (n_tiles > 65535) {
    std::snprintf(err, err_len, "the generic grouped kernel takes N up to 65535 * %d = %d, got N=%lld", kTileN,
                  65535 * kTileN, static_cast<long long>(p.n));
    return false;
  }
  int64_t* ws = static_cast<int64_t*>(workspace);
  grouped_prologue<<<1, kPrepThreads, 0, stream>>>(p.offs, p.g, p.t, ws);
  // Upper bound of the routing's row tiles: each of at most min(g, t) non-empty groups adds < one tile of
  // padding. Blocks loop over tiles, so the grid may be capped.
  const int64_t groups = p.g < p.t ? p.g : p.t;
  int64_t max_tiles = (p.t + groups * (kTileM - 1)) / kTileM;
  if (max_tiles < 1) max_tiles = 1;
  constexpr int64_t kMaxGridX = int64_t{1} << 20;
  const dim3 grid(static_cast<unsigned>(max_tiles < kMaxGridX ? max_tiles : kMaxGridX),
                  static_cast<unsigned>(n_tiles));
  const GroupedRouting rt = grouped_routing_view(ws, p.g);
  switch (p.out_dtype) {
    case OutDtype::kFloat16: launch_main<__half>(p, rt, grid, stream); break;
    case OutDtype::kBFloat16: launch_main<__nv_bfloat16>(p, rt, grid, stream); break;
    case OutDtype::kFloat32: launch_main<float>(p, rt, grid, stream); break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "grouped kernel launch failed: %s (was the generic path compiled for this GPU? "
                  "rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)", cudaGetErrorString(e));
    return false;
  }
  return true;
}

}  // namespace nvfp4_gemm::generic
