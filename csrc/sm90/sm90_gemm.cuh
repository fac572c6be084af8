// Hopper fused NVFP4 GEMM: B (weights) decoded in registers and fed to register-sourced fp16 / bf16 wgmma,
// A (activations) read by TMA as 16-bit values that a prepass wrote once per call: NVFP4 A decoded to
// fp16 (W4A4), or fp16 / bf16 activations put in the kernel's K order (the weight-only form, W4A16).
// Torch-free.
//
// Roles are swapped against the usual GEMM: wgmma's M side is 64 rows of B per consumer warpgroup, its
// N side is TOKENS rows of A, so C^T tiles come out of the accumulators. At M = 128 this keeps the MMA
// shape m64n128 instead of wasting a 128-row A tile, and B (the large operand) never leaves registers
// after decode.
//
// Numerics (exact up to fp32 accumulation):
//  - Both operands are decoded to e2m1 * e4m3 * 2^-14 in fp16 (decode_word): the nibble's three
//    magnitude bits land on fp16 exponent/mantissa bits 11..9, which reads as value * 2^-14 (code 1 = 0.5
//    becomes the subnormal 2^-15), then one HMUL2 by the scale. Every such product is a multiple of 2^-24
//    with at most 6 significant bits and at most 6 * 448 * 2^-14 = 0.164, so it is exact in fp16. The
//    products of two are >= 2^-48, far above fp32's normal range, so the fp32 sums round exactly as the
//    unscaled ones would; the epilogue multiplies the power of two back out together with alpha.
//    A power of two is folded into the scales (B: 2^7 into the e4m3 scale, exact since 448 * 2^7 <
//    65504, a constant of BDecode; A: 2^14 in the prepass, so A_dec = e2m1 * e4m3 exactly) and most
//    decoded values are normal fp16. Measured: the same speed as the plain 2^-14 decode, where most
//    values are subnormal.
//  - Weight-only (E = kBf16 for bf16 activations, kHalf for fp16): A is the caller's values, unscaled; B
//    decodes to e2m1 * e4m3 * 2^-7 in A's type (BDecode, fp4_decode.cuh; exact in both), the products are
//    exact in fp32 and the epilogue multiplies 2^7 back together with alpha.
//  - K order inside each 64-wide K block is permuted (the same way for A and B; a sum does not care):
//    each thread owns a whole 16-element scale group of its B row, so it loads 8 bytes and one scale
//    byte per row per 64 K. The prepass writes A_dec in the matching order (permuted_k below, and
//    decode_a_kernel, which builds it from the same decode_word outputs).
//
// K splits (split_plan.h choose_split): where the tiles do not fill the SMs, or fill more than one wave, each tile's
// K is split. Either the grid is cut into equal contiguous ranges of (tile, K tile) units whose partial sums meet in
// the workspace (the last arriver of a tile reads them all; with more tiles than SMs, one wave of CTAs whose ranges
// hold whole tiles between a partial first and last one), or a tile's K slices run on the CTAs of one or more
// thread-block clusters and meet in distributed shared memory (GemmParams::cluster, cluster_groups). All sum in a
// fixed order: bitwise the same on every call.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cooperative_groups.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>
#include <utility>

#include "common/pdl.h"
#include "common/problem.h"
#include "sm90/fp4_decode.cuh"
#include "sm90/grouped_scan.cuh"
#include "sm90/per_device.h"
#include "sm90/split_plan.h"
#include "sm90/trace.cuh"

namespace nvfp4_gemm::sm90 {

// A CTA is one producer warpgroup and CONS consumer warpgroups, each of which decodes 64 rows of B and runs wgmma
// (M = 64) on them: a weight tile of 64 x CONS rows. CONS = 2 (128 rows) or 4 (256 rows: four math warps a scheduler
// instead of two to hide the decode chain's latency, and half the A traffic per weight row; docs/NOTES.md section 8,
// item 2), per config (KernelConfig::rows, generate.py).
constexpr int tile_rows(int cons) { return 64 * cons; }
constexpr int cta_threads(int cons) { return 128 * (cons + 1); }

// One pipeline stage: decoded A [KT/64 blocks][TOKENS][64] fp16 (SW128), packed B [64 CONS][KT/2] bytes (SW64
// for KT = 128, SW128 for KT = 256), and KT/64 scale atoms of B (512 bytes each) per 128 rows of B.
constexpr int stage_a_bytes(int tokens, int kt) { return tokens * kt * 2; }
constexpr int stage_b_bytes(int kt, int cons) { return tile_rows(cons) * kt / 2; }
constexpr int stage_sf_bytes(int kt, int cons) {
  return tile_rows(cons) / static_cast<int>(kSfAtomRows) * (kt / 64) * static_cast<int>(kSfAtomBytes);
}
constexpr int stage_bytes(int tokens, int kt, int cons = 2) {
  return stage_a_bytes(tokens, kt) + stage_b_bytes(kt, cons) + stage_sf_bytes(kt, cons);
}
constexpr int smem_bytes(int tokens, int kt, int stages, int cons = 2) {
  return stages * stage_bytes(tokens, kt, cons) + 2 * stages * 8 + 1024;
}

// Logical K offset (0..63) inside a 64-K block of the element that wgmma step s (0..3) reads at
// column j (0..15). Thread quad lane q holds scale group q; its two fp16x2 registers per row hold group
// elements (s, s+4) and (8+s, 12+s) (see decode_word).
__host__ __device__ constexpr int permuted_k(int s, int j) {
  return 16 * ((j % 8) / 2) + s + 4 * (j % 2) + 8 * (j / 8);
}

// The largest divisor of n that is at most cap (n, cap >= 1).
constexpr int divisor_upto(int n, int cap) {
  int d = cap < n ? cap : n;
  while (n % d != 0) --d;
  return d;
}

struct GemmParams {
  CUtensorMap tmap_a;     // A_dec [rows][kp] fp16, box {64, TOKENS}, SWIZZLE_128B
  CUtensorMap tmap_b;     // B [n][k/2] bytes, box {KT/2, 64 CONS}, SWIZZLE_64B (KT 128) or 128B (KT 256)
  CUtensorMap tmap_sf;    // blocked scales of B as [half atoms][256] bytes, box {256, 2 * KT/64}
  const uint8_t* sfb;     // blocked scales of B
  const float* alpha;     // nullptr: 1
  const float* alpha2;    // nullptr, or a second factor of alpha (Problem::alpha2)
  void* c;                // output rows of this M chunk
  float4* partial;        // [grid][2 segments][TOKENS/8][128 CONS consumer threads] partial sums, when grid != tiles;
                          // [tiles][G][TOKENS/8][128 CONS] for the cluster split of G > 1 clusters a tile
  uint32_t* counters;     // [tiles] arrivals per tile, zeroed by the prepass
  int64_t ldc;
  int m, n, k;
  int sf_atoms_per_row;   // ceil(K/16 / 4)
  int ktiles;             // ceil(K / 128)
  int tiles_w, tiles;     // B-row tiles (of 64 CONS rows), all (B-row x token) tiles
  int grid;               // CTAs; CTA c runs global K tiles [c * total / grid, (c+1) * total / grid)
  int cluster;            // 1: that balanced split; S > 1: a tile's K is cut into S x G slices (G = cluster_groups),
                          // CTA c runs slice c % (S G) of tile c / (S G), and each S consecutive CTAs are one
                          // cluster that sums through distributed shared memory
  int cluster_groups;     // G: clusters per tile (1: the cluster's sums are the tile's); G > 1: each cluster CTA
                          // publishes its 1/S of the tile's rows to `partial` and counts on counters[tile S + rank];
                          // the G-th arrival sums the G clusters' rows in cluster order
  int64_t total;          // tiles * ktiles
  uint64_t hint_a, hint_b;  // L2 cache policies of the TMA loads (decoded A is re-read by every CTA)
  float out_mult;         // what the epilogue multiplies back: 2^7, the power of two B's decode leaves
  OutDtype out_dtype;
  int staged_c;           // 1: c and ldc allow 16-byte stores: the staged tile is copied out 16 bytes a store
  uint64_t* trace;        // diagnostics builds: nullptr, or kTraceSlots timestamps per CTA after kTraceHeader
  // The grouped form (gemm_kernel<..., GROUPED = true>, grouped_backend.cu): rows [offs[g-1], offs[g]) of A_dec
  // (all T rows, m = T) times group g of B, alpha[g] per group. tmap_b is 3-D [g][n][k/2] then, tmap_sf's rows
  // of each group start sf_group_rows apart, and the tiles come from offs on the device (GroupedTiles).
  const int32_t* offs;    // [groups], nullptr in the dense form
  int groups;
  int sf_group_rows;      // 256-byte scale rows per group: ceil(n / 128) * sf_atoms_per_row * 2, whatever the tile
};

// Groups the grouped form takes: its per-group table lives in static shared memory beside the pipeline.
inline constexpr int kWgmmaMaxGroups = 512;

// The grouped form's work list, built by every CTA from offs at its start: group g owns tiles
// [first[g], first[g + 1]) (its token tiles times the B-row tiles, token tile major) and rows
// [end[g - 1], end[g]) (end[-1] = 0; build_grouped_tiles). Two arrays, not three (a group's first row is the
// previous group's end), so that the 256-token pipeline and the list fit the 227 KB a CTA may hold.
struct GroupedTiles {
  int first[kWgmmaMaxGroups + 1];
  int end[kWgmmaMaxGroups];
};

// A tile of the grouped form: its group, B-row tile, first A row and the group's end row.
struct GroupedTile {
  int g, tile_w, m_base, m_end;
};

// Timeline trace of this kernel (NVFP4_GEMM_SM90_TRACE=<file>, backend.cu; sm90/trace.cuh).
// Header: [0] prepass start, [1] start of its last block. Per CTA: [0] entry, [1] producer past the
// grid dependency, [2] consumer past it, then per segment s (two at most): [3 + 3s] first stage full,
// [4 + 3s] MMA done, [5 + 3s] epilogue done; [9] segment count | last-arriver bits << 8 | n_kt0 << 16 |
// n_kt1 << 32; [10] SM id.
__device__ __forceinline__ uint64_t* trace_of(const GemmParams& p) { return kDiagnostics ? p.trace : nullptr; }

// Balanced split ("stream-K" without waiting): the tiles x ktiles units are cut into `grid` equal
// contiguous ranges. A tile whose units span several CTAs is summed by whichever of them arrives last,
// reading the others' partials in CTA order, so the result is the same whatever the timing. Only the first
// and the last tile of a range can be partial (grid > tiles: a range touches at most two tiles; grid < tiles,
// one wave over more tiles than SMs: the tiles between are whole), so each CTA has two partial slots.
__host__ __device__ __forceinline__ int64_t range_start(int64_t c, int64_t total, int64_t grid) {
  return c * total / grid;
}
__host__ __device__ __forceinline__ int64_t cta_of_unit(int64_t u, int64_t total, int64_t grid) {
  return ((u + 1) * grid - 1) / total;
}

// ---------------------------------------------------------------------------------------------------
template <int TOKENS, Elem E>
struct Wgmma;
#define NVFP4_SM90_WGMMA(N)                                                                        \
  template <>                                                                                      \
  struct Wgmma<N, Elem::kHalf> {                                                                   \
    using Op = cute::SM90::GMMA::MMA_64x##N##x16_F32F16F16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>; \
  };                                                                                               \
  template <>                                                                                      \
  struct Wgmma<N, Elem::kBf16> {                                                                   \
    using Op = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>; \
  };
NVFP4_SM90_WGMMA(8)
NVFP4_SM90_WGMMA(16)
NVFP4_SM90_WGMMA(32)
NVFP4_SM90_WGMMA(64)
NVFP4_SM90_WGMMA(80)
NVFP4_SM90_WGMMA(128)
NVFP4_SM90_WGMMA(160)  // the grouped form's tile for groups of ~128 + 2 sqrt(128) rows (m64n160: an extended shape)
NVFP4_SM90_WGMMA(256)
#undef NVFP4_SM90_WGMMA

template <int TOKENS, Elem E, size_t... I>
__device__ __forceinline__ void wgmma_call(const uint32_t (&a)[4], uint64_t desc, float (&d)[TOKENS / 2],
                                           std::index_sequence<I...>) {
  Wgmma<TOKENS, E>::Op::fma(a[0], a[1], a[2], a[3], desc, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}

// K-major SWIZZLE_128B descriptor of a [TOKENS][64] fp16 tile at a 1024-aligned address: 8-row groups
// 1024 bytes apart; each 16-wide K step moves the start address by 32 bytes.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((smem_addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 1;  // SWIZZLE_128B
  return d.desc_;
}

// Output scale: the power of two the decodes left in the sums (GemmParams::out_mult), times alpha.
__device__ __forceinline__ float out_scale(const float* alpha, const float* alpha2, float out_mult) {
  return alpha ? out_mult * alpha_of(alpha, alpha2) : out_mult;
}

template <typename T>
__device__ __forceinline__ void store_c(void* c, int64_t ldc, int m, int n, int rows_m, int cols_n, float v) {
  if (m < rows_m && n < cols_n) reinterpret_cast<T*>(c)[static_cast<int64_t>(m) * ldc + n] = convert_out<T>(v);
}

// Writes one thread's accumulator quad (rows n0, n0+8 of the weight tile; tokens m0, m0+1) as T.
// Rows from m_end on are not C's (p.m, or the end of the tile's group in the grouped form).
template <typename T>
__device__ __forceinline__ void store_quad_as(const GemmParams& p, int n0, int m0, float4 v, float scale, int m_end) {
  store_c<T>(p.c, p.ldc, m0, n0, m_end, p.n, v.x * scale);
  store_c<T>(p.c, p.ldc, m0 + 1, n0, m_end, p.n, v.y * scale);
  store_c<T>(p.c, p.ldc, m0, n0 + 8, m_end, p.n, v.z * scale);
  store_c<T>(p.c, p.ldc, m0 + 1, n0 + 8, m_end, p.n, v.w * scale);
}

__device__ __forceinline__ void store_quad(const GemmParams& p, int n0, int m0, float4 v, float scale) {
  switch (p.out_dtype) {
    case OutDtype::kFloat16: store_quad_as<__half>(p, n0, m0, v, scale, p.m); break;
    case OutDtype::kBFloat16: store_quad_as<__nv_bfloat16>(p, n0, m0, v, scale, p.m); break;
    default: store_quad_as<float>(p, n0, m0, v, scale, p.m); break;
  }
}

// A tile of C staged in shared memory (the segment's last pipeline stage, released only after it): TOKENS rows of
// COLS values of T (the weight tile's rows), each row padded by 16 bytes so that the quads of a warp's stores fall in
// distinct banks.
template <typename T, int COLS>
__host__ __device__ constexpr int staged_row_bytes() { return COLS * static_cast<int>(sizeof(T)) + 16; }

// Writes one thread's accumulator quad (rows n0, n0+8 of the weight tile, tile-local; tokens m0, m0+1) into the
// staged tile.
template <typename T, int COLS>
__device__ __forceinline__ void stage_quad(uint8_t* tile, int n0, int m0, float4 v, float scale) {
  constexpr int kRow = staged_row_bytes<T, COLS>();
  T* r0 = reinterpret_cast<T*>(tile + m0 * kRow);
  T* r1 = reinterpret_cast<T*>(tile + (m0 + 1) * kRow);
  r0[n0] = convert_out<T>(v.x * scale);
  r1[n0] = convert_out<T>(v.y * scale);
  r0[n0 + 8] = convert_out<T>(v.z * scale);
  r1[n0 + 8] = convert_out<T>(v.w * scale);
}

// Copies `rows` staged rows to C rows m_base.. (below m_end) and columns n_base.. (the consumers' threads, t of
// `consumers`): 16-byte stores where C allows them (GemmParams::staged_c), element by element where it does not or
// where a 16-byte chunk crosses C's edge.
template <typename T, int COLS>
__device__ __forceinline__ void store_staged(const GemmParams& p, const uint8_t* tile, int rows, int m_base, int n_base,
                                             int m_end, int t, int consumers) {
  constexpr int kRow = staged_row_bytes<T, COLS>();
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));  // values per chunk
  constexpr int kChunks = COLS / kPer;                    // chunks per row
  for (int c = t; c < rows * kChunks; c += consumers) {
    const int m = c / kChunks, k = c % kChunks;
    const int gm = m_base + m, gn = n_base + k * kPer;
    if (gm >= m_end || gn >= p.n) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + m * kRow + k * 16);
    T* dst = reinterpret_cast<T*>(p.c) + static_cast<int64_t>(gm) * p.ldc + gn;
    if (p.staged_c && gn + kPer <= p.n) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const T* src = reinterpret_cast<const T*>(&v);
      for (int e = 0; e < kPer && gn + e < p.n; ++e) dst[e] = src[e];
    }
  }
}

// After the CONSUMERS consumer threads have published partial sums: whether this CTA is the last of `others` + 1 to
// count on `counter` (the one that sums them). Each thread fences its own stores before the count, and the last
// arriver fences again before it reads the others' (the pattern of CUTLASS's split-K semaphore). `flag` is a
// shared word; every consumer thread calls this.
template <int CONSUMERS>
__device__ __forceinline__ bool last_to_arrive(uint32_t* counter, uint32_t others, int t, int& flag) {
  __threadfence();
  cutlass::arch::NamedBarrier::arrive_and_wait(CONSUMERS, 0);
  if (t == 0) flag = atomicAdd(counter, 1u) == others;
  cutlass::arch::NamedBarrier::arrive_and_wait(CONSUMERS, 0);
  if (flag) __threadfence();
  return flag;
}

// The sum of load(0) .. load(n - 1), n <= kMaxGemmCluster, added in index order (the same bits on every call),
// with every load issued before the first add.
template <typename Load>
__device__ __forceinline__ float4 sum_in_order(int n, Load load) {
  float4 v[kMaxGemmCluster];
#pragma unroll
  for (int k = 0; k < kMaxGemmCluster; ++k)
    if (k < n) v[k] = load(k);
  float4 sum = v[0];
#pragma unroll
  for (int k = 1; k < kMaxGemmCluster; ++k)
    if (k < n) {
      sum.x += v[k].x; sum.y += v[k].y; sum.z += v[k].z; sum.w += v[k].w;
    }
  return sum;
}

// The grouped form's work list from offs (GroupedTiles); every thread of the CTA (THREADS) calls it. Returns the tile
// count. Group g's rows are [end_{g-1}, end_g) with end the running max of offs clamped to [0, T] (as the K-sliced
// kernel reads them, grouped_schedule.h): a decreasing offset makes an empty group and groups never overlap.
template <int TOKENS, int THREADS>
__device__ __forceinline__ int build_grouped_tiles(const GemmParams& p, GroupedTiles& gt) {
  const int groups = p.groups, t = p.m;
  for (int g = threadIdx.x; g < groups; g += THREADS) gt.end[g] = min(max(p.offs[g], 0), t);
  __syncthreads();
  if (threadIdx.x < 32) {
    scan_groups<int>(
        gt.end, groups, [&](int start, int end) { return (end - start + TOKENS - 1) / TOKENS * p.tiles_w; },
        [&](int g, int, int end, int before, int n) {
          gt.end[g] = end;  // the running max, in place
          gt.first[g + 1] = before + n;
        });
    if (threadIdx.x == 0) gt.first[0] = 0;
  }
  __syncthreads();
  return gt.first[groups];
}

// The group of a tile (< the tile count): the last g with first[g] <= tile, which is never an empty group.
template <int TOKENS>
__device__ __forceinline__ GroupedTile grouped_tile(const GroupedTiles& gt, int groups, int tiles_w, int tile) {
  int lo = 0, hi = groups;  // first[lo] <= tile < first[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (gt.first[mid] <= tile) lo = mid; else hi = mid;
  }
  const int local = tile - gt.first[lo];
  const int row0 = lo > 0 ? gt.end[lo - 1] : 0;
  return {lo, local % tiles_w, row0 + local / tiles_w * TOKENS, gt.end[lo]};
}

// ---------------------------------------------------------------------------------------------------
// The main kernel. grid = params.grid CTAs of 128 (CONS + 1) threads: warpgroup 0 produces (one thread issues TMA),
// warpgroups 1 .. CONS decode B and run wgmma on 64 B rows each.
// CTAS_PER_SM = 2 (small token tiles only): two CTAs share an SM, twice the consumer warps to hide the
// decode's latency, at 80 registers a thread and without setmaxnreg (the pool is split between CTAs).
// E: the 16-bit type of the MMA (A's type in the weight-only form; fp16 for W4A4).
// GROUPED: the grouped (mixture-of-experts) form. The grid is one wave; CTA c runs the whole tiles
// [c * tiles / grid, (c + 1) * tiles / grid) of the work list built from offs (GroupedTiles), so a tile never
// splits, and each tile reads its group's B and its rows of A_dec and stores the rows of its group only.
// CONS: consumer warpgroups, 2 or 4. With 4 a CTA is 640 threads over a 256-row weight tile: each scheduler holds four
// math warps, and a consumer thread gets 112 registers (setmaxnreg below), which hold one accumulator set (kAcc = 1)
// of at most 104 tokens beside the two fragment sets (at 112 tokens ptxas spills fragments and serializes the
// wgmmas), or of up to 128 beside one set (kFragSets). The split paths (partial slots, the last arriver's fix-up, the
// cluster's staged sums) are laid out per consumer thread, kConsumers of them, so they serve either width.
template <int TOKENS, int KT, int STAGES, int CTAS_PER_SM, Elem E, bool GROUPED = false, int CONS = 2>
__global__ void __launch_bounds__(cta_threads(CONS), CTAS_PER_SM) gemm_kernel(const __grid_constant__ GemmParams p) {
  static_assert(CONS == 2 || (CONS == 4 && CTAS_PER_SM == 1 && TOKENS >= 64 && TOKENS <= 128),
                "four consumer warpgroups: one CTA an SM, one accumulator set of 64..128 tokens");
  static_assert(CTAS_PER_SM * (smem_bytes(TOKENS, KT, STAGES, CONS) + 1024) <= 233472,
                "pipeline does not fit in 227 KB of shared memory per CTA / 228 KB per SM");
  static_assert(CTAS_PER_SM == 1 || TOKENS <= 16, "80 registers a thread hold the accumulators of <= 16 tokens");
  static_assert(KT == 128 || KT == 256, "B rows of 64 or 128 bytes per stage (SW64 / SW128)");
  static_assert(TOKENS % 8 == 0 && TOKENS <= 256,
                "wgmma N, A's TMA box of TOKENS rows (at most 256) and whole 8-row SW128 atoms and accumulator quads");
  static_assert(TOKENS * 2 * 128 * CONS <= STAGES * stage_bytes(TOKENS, KT, CONS),
                "a cluster stages its consumer threads' sums (TOKENS / 8 float4s each) in the stages");
  constexpr int kRows = tile_rows(CONS);    // B rows of a tile
  constexpr int kConsumers = 128 * CONS;    // consumer threads
  constexpr int kNB = KT / 64;              // 64-K blocks per stage; even, so block b uses register set b % 2
  constexpr int kABytes = TOKENS * 64 * 2;  // one 64-K block of A_dec
  constexpr int kBOff = kNB * kABytes;      // packed B inside a stage
  constexpr int kSfOff = kBOff + stage_b_bytes(KT, CONS);
  // B's scales in a stage: one box of kNB atoms per 128-row block of the tile, the blocks one after another.
  constexpr int kSfBoxes = kRows / static_cast<int>(kSfAtomRows);
  constexpr int kSfBoxBytes = kNB * static_cast<int>(kSfAtomBytes);
  constexpr int kStage = stage_bytes(TOKENS, KT, CONS);
  static_assert(kABytes % 1024 == 0 && kStage % 1024 == 0, "A blocks and stages start on SW128's 1024-byte period");
  // Small token tiles make each wgmma short, so a chain of them on one accumulator waits on latency;
  // independent accumulators per K step let the four of a block overlap (summed in a fixed order). Four consumer
  // warpgroups hold one set: 112 registers a thread have no room for a second (64 tokens: 2 x 32 accumulators beside
  // 32 fragment registers, ptxas spilled 288 bytes), and four warpgroups' chains interleave on each scheduler instead.
  constexpr int kAcc = CONS == 4 ? 1 : CTAS_PER_SM == 2 ? 2 : (TOKENS <= 16 ? 4 : (TOKENS <= 64 ? 2 : 1));
  // setmaxnreg: the producer warpgroup hands registers to the consumers through the CTA's pool, which holds what the
  // CTA launched with: __launch_bounds__ gives each thread 65536 / threads rounded down to 8, 168 of 384 threads
  // (128 x 40 + 256 x 232) or 96 of 640 (128 x 32 + 512 x 112; an increase past the pool would wait forever).
  constexpr int kLaunchRegs = 65536 / cta_threads(CONS) / 8 * 8;
  constexpr int kProducerRegs = CONS == 2 ? 40 : 32, kConsumerRegs = CONS == 2 ? 232 : 112;
  static_assert(CTAS_PER_SM > 1 ||
                    128 * kProducerRegs + kConsumers * kConsumerRegs <= cta_threads(CONS) * kLaunchRegs,
                "setmaxnreg within the registers the CTA launched with");
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Rounded up to 1024 bytes (the 128-byte swizzle's period) by adding to smem_raw, not through an integer
  // round trip, so the compiler still knows every access is to shared memory: LDS for the B fragments and
  // scales instead of generic LD (an integer round trip compiled to generic loads; docs/SM90_NOTES.md).
  uint8_t* smem = smem_raw + ((1024u - (cute::cast_smem_ptr_to_uint(smem_raw) & 1023u)) & 1023u);
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + STAGES * kStage);
  uint64_t* empty_bar = full_bar + STAGES;
  __shared__ int last_flag;
  __shared__ std::conditional_t<GROUPED, GroupedTiles, char> gtiles;

  const int wg = threadIdx.x / 128;
  const int cta = blockIdx.x;
  int u_begin, u_end;
  if constexpr (GROUPED) {
    const int tiles = build_grouped_tiles<TOKENS, cta_threads(CONS)>(p, gtiles);
    u_begin = static_cast<int>(range_start(cta, tiles, p.grid)) * p.ktiles;
    u_end = static_cast<int>(range_start(cta + 1, tiles, p.grid)) * p.ktiles;
  } else if (p.cluster > 1) {  // K slice cta % (S G) of tile cta / (S G): one segment
    const int slices = p.cluster * p.cluster_groups;
    const int tile = cta / slices, j = cta % slices;
    u_begin = tile * p.ktiles + j * p.ktiles / slices;
    u_end = tile * p.ktiles + (j + 1) * p.ktiles / slices;
  } else {
    u_begin = static_cast<int>(range_start(cta, p.total, p.grid));
    u_end = static_cast<int>(range_start(cta + 1, p.total, p.grid));
  }

  if (threadIdx.x == 0) {
    if (uint64_t* const trace = trace_of(p)) {
      trace_at(trace, cta, 0, global_ns());
      trace_at(trace, cta, 10, sm_id());
    }
    for (int s = 0; s < STAGES; ++s) {
      Barrier::init(&full_bar[s], 1);
      EmptyBarrier::init(&empty_bar[s], kConsumers / 32);  // one arrive per consumer warp
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    if constexpr (CTAS_PER_SM == 1) cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (threadIdx.x == 0 && u_end > u_begin) {
      cute::prefetch_tma_descriptor(&p.tmap_a);
      cute::prefetch_tma_descriptor(&p.tmap_b);
      cute::prefetch_tma_descriptor(&p.tmap_sf);
      // Loads of B and its scales come from the caller's buffers, ready before this grid started; decoded
      // A comes from the prepass, which this grid may overlap (programmatic dependent launch). So the
      // first stages get their B loads, then the producer waits for the prepass, then issues their A.
      // The grouped form's tile of unit u, looked up (a binary search over the groups) once per tile, not per stage.
      GroupedTile cur_gt{};
      int cur_tile = -1;
      auto tile_of = [&](int tile) {
        if constexpr (GROUPED) {
          if (tile != cur_tile) cur_gt = grouped_tile<TOKENS>(gtiles, p.groups, p.tiles_w, tile), cur_tile = tile;
        }
        return cur_gt;
      };
      auto load_b = [&](int u, int s) {
        const int tile = u / p.ktiles, kt = u % p.ktiles;
        const int tile_w = tile % p.tiles_w;
        // The scale box always spans kNB atoms; past K's end it holds the next row block's atoms (or TMA's
        // zero fill after the last), which are never read: their blocks are skipped.
        const int a_blocks = min(kNB, (p.k - kt * KT + 63) / 64);
        uint8_t* st = smem + s * kStage;
        Barrier::arrive_and_expect_tx(&full_bar[s],
                                      a_blocks * kABytes + stage_b_bytes(KT, CONS) + kSfBoxes * kSfBoxBytes);
        // The B-row tile, and the first 256-byte scale row of its group (the grouped form's groups lie one after
        // another in tmap_sf; the dense form has one).
        int tw = tile_w, sf_row0 = 0;
        GroupedTile gt{};
        if constexpr (GROUPED) {
          gt = tile_of(tile);
          tw = gt.tile_w;
          sf_row0 = gt.g * p.sf_group_rows;
        }
        // Box h holds the atoms of the tile's 128-row block h. The scales hold ceil(n / 128) blocks (the blocked
        // layout pads N to 128 rows), so where a 256-row tile's second block starts at or past N, its box is the
        // last block again: the load stays inside the (group's) scales, and the rows it serves are past N, where B's
        // map reads zeros and nothing is stored.
#pragma unroll
        for (int h = 0; h < kSfBoxes; ++h) {
          const int blk = kSfBoxes == 1 ? tw : min(tw * kSfBoxes + h, (p.n - 1) / 128);
          cute::SM90_TMA_LOAD_2D::copy(&p.tmap_sf, &full_bar[s], p.hint_b, st + kSfOff + h * kSfBoxBytes, 0,
                                       sf_row0 + (blk * p.sf_atoms_per_row + kNB * kt) * 2);
        }
        if constexpr (GROUPED)
          cute::SM90_TMA_LOAD_3D::copy(&p.tmap_b, &full_bar[s], p.hint_b, st + kBOff, kt * (KT / 2), tw * kRows, gt.g);
        else
          cute::SM90_TMA_LOAD_2D::copy(&p.tmap_b, &full_bar[s], p.hint_b, st + kBOff, kt * (KT / 2), tw * kRows);
      };
      auto load_a = [&](int u, int s) {
        const int tile = u / p.ktiles, kt = u % p.ktiles;
        int row;
        if constexpr (GROUPED)
          row = tile_of(tile).m_base;
        else
          row = tile / p.tiles_w * TOKENS;
        const int a_blocks = min(kNB, (p.k - kt * KT + 63) / 64);
        uint8_t* st = smem + s * kStage;
        for (int b = 0; b < a_blocks; ++b)
          cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &full_bar[s], p.hint_a, st + b * kABytes, kt * KT + 64 * b, row);
      };
      const int pre = min(STAGES, u_end - u_begin);
      for (int x = 0; x < pre; ++x) load_b(u_begin + x, x);
      cudaGridDependencySynchronize();
      if (uint64_t* const trace = trace_of(p)) trace_at(trace, cta, 1, global_ns());
      for (int x = 0; x < pre; ++x) load_a(u_begin + x, x);
      int s = pre % STAGES, phase = pre == STAGES ? 1 : 0;
      for (int u = u_begin + pre; u < u_end; ++u) {
        EmptyBarrier::wait(&empty_bar[s], phase ^ 1);
        load_b(u, s);
        load_a(u, s);
        if (++s == STAGES) s = 0, phase ^= 1;
      }
    }
    if (!GROUPED && p.cluster > 1) {  // the consumers' two cluster barriers (cluster_reduce) count every thread
      __syncwarp();
      cooperative_groups::this_cluster().sync();
      cooperative_groups::this_cluster().sync();
    }
    return;
  }

  if constexpr (CTAS_PER_SM == 1) cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
  cudaGridDependencySynchronize();  // the split counters are zeroed by the prepass
  const int t = threadIdx.x - 128;        // 0 .. kConsumers - 1 over the consumer warpgroups
  uint64_t* const trace = t == 0 ? trace_of(p) : nullptr;
  uint64_t trace_info = 0;
  if (trace) trace_at(trace, cta, 2, global_ns());
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int row0 = (t / 32) * 16 + g;      // CTA-local B row; row0 + 8 is the other
  const int row1 = row0 + 8;
  // Packed-B byte offsets inside a stage for this thread's 8-byte group, undoing TMA's swizzle: the
  // 16-byte chunk index XORs with address bits 7..8 (SW64, 64-byte rows) or 7..9 (SW128, 128-byte rows).
  const uint32_t brow0 = kBOff + row0 * (KT / 2) + (q & 1) * 8, brow1 = kBOff + row1 * (KT / 2) + (q & 1) * 8;
  const int bx0 = (KT == 128 ? ((row0 >> 1) & 3) : (row0 & 7)) ^ (q / 2);
  const int bx1 = (KT == 128 ? ((row1 >> 1) & 3) : (row1 & 7)) ^ (q / 2);
  // Row r's scale byte of group q inside a stage: its 128-row block's box, then the atom's 32 x 4 x 4 blocked place of
  // row r % 128 (with one box, r < 128).
  auto sf_off = [&](int r) {
    const int box = kSfBoxes == 1 ? 0 : r / 128, rb = kSfBoxes == 1 ? r : r % 128;
    return static_cast<uint32_t>(kSfOff + box * kSfBoxBytes + (rb % 32) * 16 + (rb / 32) * 4 + q);
  };
  const uint32_t sfoff0 = sf_off(row0), sfoff1 = sf_off(row1);
  // The byte offsets of block j's 8-byte groups inside a stage, once: 16-byte chunk 2 j + q / 2 = (2 j) ^ (q / 2)
  // of the row, XORed with the swizzle bits (bx holds both). Kept in registers so that the first block of each
  // stage does not rebuild them from the thread index (the compiler did, ~20 instructions a stage). Four consumer
  // warpgroups have no registers to spare for them: there the compiler rebuilds them, and row1's are row0's plus 8
  // rows (both swizzles repeat every 8 rows, so bx1 == bx0), an immediate offset of the load.
  uint32_t boff0[kNB], boff1[kNB];
#pragma unroll
  for (int j = 0; j < kNB; ++j) {
    boff0[j] = brow0 + (((2 * j) ^ bx0) << 4);
    boff1[j] = brow1 + (((2 * j) ^ bx1) << 4);
    // Opaque to the compiler, so kept in registers rather than rebuilt.
    if constexpr (CONS == 2) asm volatile("" : "+r"(boff0[j]), "+r"(boff1[j]));
  }
  const uint32_t smem_base = cute::cast_smem_ptr_to_uint(smem);
  using Dec = BDecode<E>;

  float acc[kAcc][TOKENS / 2];
  // Decoded B for the two 64-K blocks in flight: block b + 1 decoded while block b's wgmmas run. Four consumer
  // warpgroups past 104 tokens hold one set: each decodes block b + 1 once block b's wgmmas are done, and the other
  // three warpgroups' wgmmas run meanwhile.
  constexpr int kFragSets = CONS == 4 && TOKENS > 104 ? 1 : 2;
  uint32_t fr0[16], fr1[16];

  // Decodes 64-K block j of stage s into fr: [0..3] row0 elems 0..7, [4..7] row1 elems 0..7,
  // [8..11] row0 elems 8..15, [12..15] row1 elems 8..15 (as pairs (e, e+4), see decode_word).
  auto decode = [&](uint32_t(&fr)[16], int s, int j) {
    const uint8_t* st = smem + s * kStage;
    const uint2 w0 = *reinterpret_cast<const uint2*>(st + boff0[j]);
    const uint2 w1 = *reinterpret_cast<const uint2*>(st + (CONS == 2 ? boff1[j] : boff0[j] + 8 * (KT / 2)));
    const uint16_t sc = static_cast<uint16_t>(st[sfoff0 + j * kSfAtomBytes]) |
                        static_cast<uint16_t>(static_cast<uint16_t>(st[sfoff1 + j * kSfAtomBytes]) << 8);
    const uint32_t s2 = Dec::scales(sc);
    const uint32_t s0 = low_pair(s2), s1 = high_pair(s2);
    fr[0] = Dec::mul(Dec::template word<0>(w0.x), s0);
    fr[1] = Dec::mul(Dec::template word<1>(w0.x), s0);
    fr[2] = Dec::mul(Dec::template word<2>(w0.x), s0);
    fr[3] = Dec::mul(Dec::template word<3>(w0.x), s0);
    fr[4] = Dec::mul(Dec::template word<0>(w1.x), s1);
    fr[5] = Dec::mul(Dec::template word<1>(w1.x), s1);
    fr[6] = Dec::mul(Dec::template word<2>(w1.x), s1);
    fr[7] = Dec::mul(Dec::template word<3>(w1.x), s1);
    fr[8] = Dec::mul(Dec::template word<0>(w0.y), s0);
    fr[9] = Dec::mul(Dec::template word<1>(w0.y), s0);
    fr[10] = Dec::mul(Dec::template word<2>(w0.y), s0);
    fr[11] = Dec::mul(Dec::template word<3>(w0.y), s0);
    fr[12] = Dec::mul(Dec::template word<0>(w1.y), s1);
    fr[13] = Dec::mul(Dec::template word<1>(w1.y), s1);
    fr[14] = Dec::mul(Dec::template word<2>(w1.y), s1);
    fr[15] = Dec::mul(Dec::template word<3>(w1.y), s1);
  };
  auto fence_acc = [&]() {
#pragma unroll
    for (int a = 0; a < kAcc; ++a)
#pragma unroll
      for (int i = 0; i < TOKENS / 2; ++i) cute::warpgroup_fence_operand(acc[a][i]);
  };
  auto issue = [&](uint32_t(&fr)[16], int s, int j) {
#pragma unroll
    for (int i = 0; i < 16; ++i) cute::warpgroup_fence_operand(fr[i]);
    fence_acc();
    cute::warpgroup_arrive();
    const uint64_t desc = sw128_desc(smem_base + s * kStage + j * kABytes);
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      const uint32_t a[4] = {fr[step], fr[4 + step], fr[8 + step], fr[12 + step]};
      wgmma_call<TOKENS, E>(a, desc + 2 * step, acc[step % kAcc], std::make_index_sequence<TOKENS / 2>{});
    }
    cute::warpgroup_commit_batch();
    fence_acc();
  };
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) EmptyBarrier::arrive(&empty_bar[s]);
  };

  float scale = out_scale(p.alpha, p.alpha2, p.out_mult);  // per tile in the grouped form (alpha[g])
  int i = 0;  // pipeline position, continuous over this CTA's segments
  int seg = 0;
  for (int u = u_begin; u < u_end; ++seg) {
    const int tile = u / p.ktiles;
    const int kt0 = u % p.ktiles;
    const int n_kt = min(p.ktiles - kt0, u_end - u);
#pragma unroll
    for (int a = 0; a < kAcc; ++a)
#pragma unroll
      for (int x = 0; x < TOKENS / 2; ++x) acc[a][x] = 0.0f;

    int s = i % STAGES, phase = (i / STAGES) & 1;
    Barrier::wait(&full_bar[s], phase);
    if (trace && seg < 2) trace_at(trace, cta, 3 + 3 * seg, global_ns());
    decode(fr0, s, 0);
    for (int j = 0; j < n_kt; ++j) {
      // Blocks of this stage that hold K < p.k (only the tile's last stage has fewer than kNB). The grouped form's K
      // is a multiple of 256, so with four consumer warpgroups there every stage is whole and the count's registers
      // are spared; the dense form takes any K.
      const int nblk = CONS == 4 && GROUPED ? kNB : min(kNB, (p.k - (kt0 + j) * KT + 63) / 64);
      const int s_next = s + 1 == STAGES ? 0 : s + 1;
      const int phase_next = s + 1 == STAGES ? phase ^ 1 : phase;
#pragma unroll
      for (int blk = 0; blk < kNB; ++blk) {
        if (blk < nblk) {
          uint32_t(&cur)[16] = (kFragSets == 1 || blk % 2 == 0) ? fr0 : fr1;
          uint32_t(&nxt)[16] = (kFragSets == 2 && blk % 2 == 0) ? fr1 : fr0;
          issue(cur, s, blk);
          // Block blk - 1 is done: its registers and (blk 0) its stage are free; with one set, block blk too.
          cute::warpgroup_wait<kFragSets - 1>();
#pragma unroll
          for (int x = 0; x < 16; ++x) cute::warpgroup_fence_operand(nxt[x]);
          if (blk == 0 && j > 0) release(s == 0 ? STAGES - 1 : s - 1);
          if (blk + 1 < kNB && blk + 1 < nblk) {
            decode(nxt, s, blk + 1);
          } else if (j + 1 < n_kt) {
            Barrier::wait(&full_bar[s_next], phase_next);
            decode(nxt, s_next, 0);
          }
        }
      }
      s = s_next;
      phase = phase_next;
    }
    cute::warpgroup_wait<0>();
    fence_acc();
    // The segment's last stage: released once the epilogue no longer needs it (it may stage the output tile
    // there); the producer meanwhile fills the others.
    const int s_last = s == 0 ? STAGES - 1 : s - 1;
    if (trace && seg < 2) {
      trace_at(trace, cta, 4 + 3 * seg, global_ns());
      trace_info = (trace_info & ~uint64_t{0xFF}) | static_cast<uint64_t>(seg + 1);
      trace_info |= static_cast<uint64_t>(n_kt) << (16 * (seg + 1));
      trace_at(trace, cta, 9, trace_info);
    }
    i += n_kt;
    u += n_kt;
#pragma unroll
    for (int a = 1; a < kAcc; ++a)
#pragma unroll
      for (int x = 0; x < TOKENS / 2; ++x) acc[0][x] += acc[a][x];
    if (!GROUPED && p.cluster > 1) {
      release(s_last);
      // The S CTAs of this cluster ran S consecutive K slices of the tile. Each stages its sums in its own (now
      // idle) pipeline stages in accumulator order, then CTA r sums token rows [r X / S, (r + 1) X / S) of the
      // tile, X = TOKENS / 8 float4 rows, over the S CTAs in rank order (the same result on every call). With one
      // cluster per tile (G = 1) it stores them: no workspace, no counter, the fix-up spread over the cluster.
      // With G clusters per tile it publishes them (1/S of the tile, not the whole tile) and counts; the last of
      // the G CTAs of rank r sums the G clusters' rows in cluster order and stores them.
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      // Every consumer warpgroup's last wgmma has read its stage.
      cutlass::arch::NamedBarrier::arrive_and_wait(kConsumers, 0);
      float4* mine = reinterpret_cast<float4*>(smem) + t;
#pragma unroll
      for (int x = 0; x < TOKENS / 8; ++x)
        mine[x * kConsumers] = make_float4(acc[0][4 * x], acc[0][4 * x + 1], acc[0][4 * x + 2], acc[0][4 * x + 3]);
      cluster.sync();
      const int S = p.cluster, G = p.cluster_groups, r = static_cast<int>(cluster.block_rank());
      const int group = cta % (S * G) / S;
      const int tile = cta / (S * G), tile_w = tile % p.tiles_w, tile_t = tile / p.tiles_w;
      const int n0 = tile_w * kRows + row0;
      constexpr int X = TOKENS / 8;
      const int x_lo = r * X / S, x_hi = (r + 1) * X / S;
      // This cluster's rows of the tile in the workspace: [tile][group][X][kConsumers] float4s (G > 1).
      float4* const part =
          G > 1 ? p.partial + (static_cast<int64_t>(tile) * G + group) * X * kConsumers + t : nullptr;
      for (int x = x_lo; x < x_hi; ++x) {
        const float4 sum = sum_in_order(S, [&](int k) { return cluster.map_shared_rank(mine, k)[x * kConsumers]; });
        if (G == 1)
          store_quad(p, n0, tile_t * TOKENS + 8 * x + 2 * q, sum, scale);
        else
          __stcg(part + x * kConsumers, sum);
      }
      cluster.sync();  // the peers' shared memory stays alive until every slice is read
      if (G > 1 &&
          last_to_arrive<kConsumers>(&p.counters[tile * S + r], static_cast<uint32_t>(G - 1), t, last_flag)) {
        const float4* const first = p.partial + static_cast<int64_t>(tile) * G * X * kConsumers + t;
        for (int x = x_lo; x < x_hi; ++x) {
          const float4 sum = sum_in_order(
              G, [&](int k) { return __ldcg(first + (static_cast<int64_t>(k) * X + x) * kConsumers); });
          store_quad(p, n0, tile_t * TOKENS + 8 * x + 2 * q, sum, scale);
        }
      }
      if (trace) trace_at(trace, cta, 5, global_ns());
      break;  // one segment
    }

    int n_base, m_base, m_end;  // the tile's first column and row of C, and the end of its rows
    if constexpr (GROUPED) {
      const GroupedTile gt = grouped_tile<TOKENS>(gtiles, p.groups, p.tiles_w, tile);
      n_base = gt.tile_w * kRows;
      m_base = gt.m_base;
      m_end = gt.m_end;
      scale = p.alpha ? p.out_mult * p.alpha[gt.g] : p.out_mult;
    } else {
      n_base = tile % p.tiles_w * kRows;
      m_base = tile / p.tiles_w * TOKENS;
      m_end = p.m;
    }
    // The output of a tile, as `quads(put)` hands it over (put(x, quad x of this thread), token rows 8x .. 8x + 7):
    // staged in the segment's last stage kRound token rows at a time (the whole tile where it fits: with two consumer
    // warpgroups always in fp16 and bf16, up to 80 tokens in float32, rounds of 72 of 128, 88 of 160 and 136 of 256
    // float32 rows; with four, whose staged rows are twice as wide, rounds of 96 / 48 fp16 / float32 rows of 128 and
    // 72 / 32 of 80), each round copied out by rows (store_staged). One store path for every tile,
    // output type and C alignment: the bounds-checked quad stores it replaces, unrolled per quad and output type, were
    // most of the kernel's instructions.
    // `synced`: every consumer warpgroup has passed a consumer barrier since its last wgmma (the split paths have),
    // so the stage may be written without another one.
    auto output_as = [&](auto tag, bool synced, auto&& quads) {
      using T = decltype(tag);
      constexpr int kFit = kStage / staged_row_bytes<T, kRows>() / 8 * 8;
      constexpr int kRound = TOKENS < kFit ? TOKENS : kFit;
      static_assert(kRound >= 8, "a stage holds at least 8 staged token rows");
      uint8_t* const staged = smem + s_last * kStage;
      // Every consumer warpgroup's last wgmma has read the stage before any writes into it.
      if (!synced) cutlass::arch::NamedBarrier::arrive_and_wait(kConsumers, 0);
#pragma unroll
      for (int r0 = 0; r0 < TOKENS; r0 += kRound) {
        quads([&](int x, float4 v) {
          const int m = 8 * x + 2 * q - r0;  // the quad's first row in this round
          if (kRound == TOKENS || (m >= 0 && m < kRound)) stage_quad<T, kRows>(staged, row0, m, v, scale);
        });
        cutlass::arch::NamedBarrier::arrive_and_wait(kConsumers, 0);  // the round is staged
        store_staged<T, kRows>(p, staged, TOKENS - r0 < kRound ? TOKENS - r0 : kRound, m_base + r0, n_base, m_end, t,
                               kConsumers);
        // The producer's TMA will write this stage next (async proxy) after these generic-proxy writes and reads.
        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::arrive_and_wait(kConsumers, 0);  // and read, before the next round or the release
      }
    };
    auto output = [&](bool synced, auto&& quads) {
      switch (p.out_dtype) {
        case OutDtype::kFloat16: output_as(__half{}, synced, quads); break;
        case OutDtype::kBFloat16: output_as(__nv_bfloat16{}, synced, quads); break;
        default: output_as(float{}, synced, quads); break;
      }
    };
    auto own_quad = [&](int x) {
      return make_float4(acc[0][4 * x], acc[0][4 * x + 1], acc[0][4 * x + 2], acc[0][4 * x + 3]);
    };
    if (GROUPED || (kt0 == 0 && n_kt == p.ktiles)) {  // the whole tile is ours (always, in the grouped form)
      output(false, [&](auto&& put) {
#pragma unroll
        for (int x = 0; x < TOKENS / 8; ++x) put(x, own_quad(x));
      });
      release(s_last);
      if (trace && seg < 2) trace_at(trace, cta, 5 + 3 * seg, global_ns());
      continue;
    }
    const int64_t first_u = static_cast<int64_t>(tile) * p.ktiles;
    const int c_first = static_cast<int>(cta_of_unit(first_u, p.total, p.grid));
    const int c_last = static_cast<int>(cta_of_unit(first_u + p.ktiles - 1, p.total, p.grid));
    const uint32_t others = static_cast<uint32_t>(c_last - c_first);
    // Publish this segment's partial sums (accumulator order, coalesced float4), then count arrivals. A partial
    // segment is the range's first (slot 0) or its last (slot 1); those between are whole tiles, stored above.
    float4* mine = p.partial + (static_cast<int64_t>(cta) * 2 + min(seg, 1)) * (TOKENS / 8) * kConsumers + t;
#pragma unroll
    for (int x = 0; x < TOKENS / 8; ++x) __stcg(mine + x * kConsumers, own_quad(x));
    if (!last_to_arrive<kConsumers>(&p.counters[tile], others, t, last_flag)) {
      release(s_last);
      if (trace && seg < 2) trace_at(trace, cta, 5 + 3 * seg, global_ns());
      continue;
    }
    if (trace && seg < 2) trace_at(trace, cta, 9, trace_info |= uint64_t{1} << (8 + seg));
    const int64_t slot_stride = 2 * (TOKENS / 8) * kConsumers;  // float4s between CTAs' slots
    // CTA c_first holds the tile's first units in its second slot (the tile ends its range) unless its range
    // starts inside the tile (then its first); every later CTA of the tile starts inside it, so uses its first.
    const int first_slot = tile > static_cast<int>(range_start(c_first, p.total, p.grid) / p.ktiles) ? 1 : 0;
    // The tile's sums in CTA order, kChunk quads a round with every contributor's loads of a round in flight (waiting
    // one L2 round trip per quad and contributor: ~20 us at 128 tokens). Every part is read back, this
    // CTA's own included, which frees the accumulators' registers for the loads. Whole rounds: at most 16 quads, a
    // divisor of the tile's (8 at 64 tokens, 10 at 80 and 160, 16 at 128 and 256); 4 with four consumer warpgroups,
    // whose 112 registers a thread do not hold a round of 8 beside its loads (ptxas spilled 84 and 508 bytes at 64 and
    // 128 tokens): 2 and 4 rounds a contributor where two consumer warpgroups take 1.
    constexpr int kChunk = divisor_upto(TOKENS / 8, CONS == 2 ? 16 : 4);
    auto partial = [&](int c, int x) {
      return __ldcg(p.partial + static_cast<int64_t>(c) * slot_stride +
                    (c == c_first ? first_slot : 0) * (TOKENS / 8) * kConsumers + t + x * kConsumers);
    };
    output(true, [&](auto&& put) {
#pragma unroll
      for (int x0 = 0; x0 < TOKENS / 8; x0 += kChunk) {
        float4 sum[kChunk];
#pragma unroll
        for (int x = 0; x < kChunk; ++x) sum[x] = partial(c_first, x0 + x);
        for (int c = c_first + 1; c <= c_last; ++c) {
          float4 v[kChunk];
#pragma unroll
          for (int x = 0; x < kChunk; ++x) v[x] = partial(c, x0 + x);
#pragma unroll
          for (int x = 0; x < kChunk; ++x) {
            sum[x].x += v[x].x; sum[x].y += v[x].y; sum[x].z += v[x].z; sum[x].w += v[x].w;
          }
        }
#pragma unroll
        for (int x = 0; x < kChunk; ++x) put(x0 + x, sum[x]);
      }
    });
    release(s_last);
    if (trace && seg < 2) trace_at(trace, cta, 5 + 3 * seg, global_ns());
  }
}

// The A prepasses (backend.cu): A_dec [rows][kp] 16-bit in the order the B fragments use, from NVFP4 A
// (decode_a_kernel) or from fp16 / bf16 A (order_a16_kernel); both zero `counters`.
__global__ void __launch_bounds__(256) decode_a_kernel(const uint8_t* __restrict__ a, int64_t lda,
                                                       const uint8_t* __restrict__ sfa, int row_begin, int rows,
                                                       int k, int sf_atoms_per_row, __half* __restrict__ out,
                                                       int kp, uint32_t* counters, int n_counters, uint32_t a_fold,
                                                       uint32_t a_post, uint64_t* trace);
__global__ void __launch_bounds__(256) order_a16_kernel(const uint8_t* __restrict__ a, int64_t lda, int rows, int k,
                                                        uint16_t* __restrict__ out, int kp, uint32_t* counters,
                                                        int n_counters);
// Float A quantized on the fly (Problem::a_scale), then decoded as decode_a_kernel decodes packed A.
__global__ void __launch_bounds__(256) quant_a_kernel(const uint8_t* __restrict__ x, int64_t ldx, AType xt, int rows,
                                                      int k, const float* __restrict__ a_scale, bool is_decode,
                                                      __half* __restrict__ out, int kp, uint32_t* counters,
                                                      int n_counters, uint32_t a_fold, uint32_t a_post);
// The same with dynamic scales (Problem::a_dynamic_ws2) formed over all of A first: a persistent grid of at most
// one CTA per SM that meets at a grid-wide barrier (words: the stream's slot, or three zeroed workspace words).
__global__ void __launch_bounds__(256) quant_a_dynamic_kernel(
    const uint8_t* __restrict__ x, int64_t ldx, AType xt, int rows, int k, const float* __restrict__ ws2,
    float* __restrict__ out, int slot, uint32_t* ws_words, __half* __restrict__ a_dec, int kp, uint32_t* counters,
    int n_counters, uint32_t a_fold, uint32_t a_post);

struct LaunchArgs {
  GemmParams params;
  cudaStream_t stream;
};

template <int TOKENS, int KT, int STAGES, int CTAS_PER_SM, Elem E, bool GROUPED = false, int CONS = 2>
cudaError_t allow_gemm_smem() {
  static OncePerDevice smem_limit;  // the attribute is per device (per_device.h)
  return smem_limit.run([] {
    return cudaFuncSetAttribute(gemm_kernel<TOKENS, KT, STAGES, CTAS_PER_SM, E, GROUPED, CONS>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(TOKENS, KT, STAGES, CONS));
  });
}

template <int TOKENS, int KT, int STAGES, int CTAS_PER_SM, Elem E, bool GROUPED = false, int CONS = 2>
cudaError_t launch_gemm(const LaunchArgs& args) {
  constexpr int smem = smem_bytes(TOKENS, KT, STAGES, CONS);
  static_assert(!GROUPED || (CTAS_PER_SM == 1 && smem + round_up(int{sizeof(GroupedTiles)} + 16, 1024) <= 232448),
                "the grouped form's work list beside the pipeline, within a CTA's 227 KB of shared memory");
  if (const cudaError_t err = allow_gemm_smem<TOKENS, KT, STAGES, CTAS_PER_SM, E, GROUPED, CONS>(); err != cudaSuccess)
    return err;
  // Programmatic dependent launch: this grid starts while the prepass drains (it triggers at its start),
  // so barrier setup, descriptor prefetch and the first B loads overlap it.
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg =
      launch_config(dim3(args.params.grid), dim3(cta_threads(CONS)), smem, args.stream, /*pdl=*/true, attr);
  if (args.params.cluster > 1)  // a tile's K slices form one cluster
    add_cluster_dim(cfg, dim3(static_cast<unsigned>(args.params.cluster), 1, 1));
  return cudaLaunchKernelEx(&cfg, gemm_kernel<TOKENS, KT, STAGES, CTAS_PER_SM, E, GROUPED, CONS>, args.params);
}

// Clusters of `size` CTAs of this kernel that the current device holds at once (0 where it holds none, or the
// query failed); asked once per device and size, so the plan may call it on every launch, and a failure is kept
// too, so that workspace_bytes() and run() of one process always plan the same split.
template <int TOKENS, int KT, int STAGES, int CTAS_PER_SM, Elem E, int CONS = 2>
int max_active_clusters(int size) {
  static std::atomic<int> known[OncePerDevice::kMaxDevices][kMaxGemmCluster + 1] = {};  // count + 1; 0: not asked
  int dev = 0;
  if (size < 1 || size > kMaxGemmCluster || cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const bool cached = dev >= 0 && dev < OncePerDevice::kMaxDevices;
  if (cached) {
    if (const int v = known[dev][size].load(std::memory_order_relaxed)) return v - 1;
  }
  int n = 0;
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t cfg = launch_config(dim3(size), dim3(cta_threads(CONS)), smem_bytes(TOKENS, KT, STAGES, CONS),
                                         nullptr, /*pdl=*/false, attr);
  add_cluster_dim(cfg, dim3(static_cast<unsigned>(size), 1, 1));
  if (allow_gemm_smem<TOKENS, KT, STAGES, CTAS_PER_SM, E, false, CONS>() != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&n, gemm_kernel<TOKENS, KT, STAGES, CTAS_PER_SM, E, false, CONS>, &cfg) !=
          cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (cached) known[dev][size].store(n + 1, std::memory_order_relaxed);
  return n;
}

}  // namespace nvfp4_gemm::sm90
