// Hopper NVFP4 GEMM for decode-size M (NVFP4 x NVFP4, and the weight-only form: fp16 / bf16 activations x NVFP4
// weights), with the K of each pipeline stage split across the CTA's warps. Torch-free.
//
// Why another small-M kernel (docs/NOTES.md): the streaming kernel of sm90_small_m.cuh gives each
// warp whole K blocks of 16 weight rows, so at 16 tokens each warp waits on its own decode -> MMA chain with
// the CTA's A staged for its whole K range (latency-bound: 0.36 instructions issued per scheduler and cycle).
// Here a CTA owns 128 weight rows and walks K in 256-wide stages; warp (row group rg, K slice ks) takes 64
// rows x 64 K of every stage, so one activation fragment feeds 4 MMA row tiles, A and B move together
// through one pipeline (A's shared memory no longer grows with the K range), and the 4 K slices are summed
// in shared memory at the end, in slice order.
//
// Data movement: one producer warp (one elected thread) issues, per stage, one TMA box of B (128 rows x 128
// bytes, SWIZZLE_128B), one 2 KB bulk copy of the stage's four scale atoms (the blocked layout keeps them
// contiguous) and A: four TMA boxes of 16-bit activations (TOKENS rows x 64 K each, SWIZZLE_128B), or for
// NVFP4 A one box of its packed bytes (TOKENS rows x 128 bytes, SWIZZLE_128B) and a 2 KB bulk copy of the
// stage's four scale atoms of A's 128-row block; all complete on the stage's full barrier; the 8 consumer warps release a stage through its empty barrier. B's TMA map reads the
// row-major [N, K/2] bytes (a 2-D map). Measured (docs/NOTES.md): a 3-D map over weights stored as 128 x
// 128-byte tiles, which lands in shared memory the same, ran within 2% of the row-major weights, so no prepared
// weight layout is needed.
//
// Fragments (mma.sync m16n8k16; B rows are the MMA's M side, tokens its N side): lane (g, tig) of warp
// (rg, ks) owns scale group ks*4 + tig of the stage, i.e. bytes [32 ks + 8 tig, +8) of a row: 16 elements
// e0..e15 in one 8-byte shared load. decode_word turns a 32-bit word into the pairs {e0,e4} {e1,e5} {e2,e6}
// {e3,e7}; MMA step s (0..3) of the stage takes pairs 2(s%2), 2(s%2)+1 of word s/2 as its k = 2tig.. and
// k = 2tig+8.. fragments. The activations take the same permutation (pair_like_decode), so every k index of
// the MMA multiplies matching elements: a sum over the stage's 256 K in another order than the natural one,
// the same for every call (bitwise deterministic). Fragment row g of row tile mt is CTA row
// rg*64 + mt*16 + sigma(g) (and + 8), sigma(g) = 2 (g % 4) + g / 4, so that the 8-byte loads of a half warp
// hit 16 distinct bank pairs under the 128-byte swizzle.
//
// Numerics: B decodes to e2m1 * e4m3 * 2^-7 in the MMA's type (BDecode: exact in fp16 and bf16); 16-bit A is
// taken as it is, NVFP4 A decodes to e2m1 * e4m3 in fp16 (decode_a_word: exact, as in the small-M kernel; lane
// (g, tig) reads token g's bytes of its own scale group, so A's pairs line up with B's); products are exact in
// fp32 and summed in fp32; the epilogue multiplies 2^7 * alpha and rounds once.
//
// Split-K over CTAs: (row block, split) CTAs each write their fp32 [TOKENS][128] tile to the workspace; the
// last to arrive (atomic counter) sums them in split order, writes C and sets the counter back to zero
// (split_counters.cuh: no reset launch ahead of this grid, where a slot is free).
//
// Filling the pipeline: every CTA of a decode-size call starts at once, so if each asked for all its STAGES
// at once, the memory system would hold the whole grid's pipelines (18 MB at (1, 4096, 14336)) in one queue and
// every CTA's first stage would land only as that queue drained (5.0 us after entry on an H200, the consumers
// idle until then). The producer asks for the first stage alone and the rest once it has landed: first stage at
// 2.1 us, (1, 4096, 14336) 16.8 -> 15.0 us a call, (1, 28672, 4096) 27.7 -> 25.6 (docs/NOTES.md, from the
// kernel's own timeline: benchmarks/diagnostics/wk_trace.py).
//
// Programmatic dependent launch: before griddepcontrol.wait the producer only asks L2 to prefetch the first
// stage's B and scales. A prefetch reads nothing into the CTA, so it is right even where the kernel ahead wrote
// B (quantize, then mm at once on the same stream: that kernel's writes are visible only after the wait). Every
// load into shared memory, and so every write to C, the workspace and the counters, comes after the wait, and
// the consumers wait before they touch global memory. One exception, b_early: where the kernel ahead is
// this call's own quantization of float A (backend.cu, quant_a_wk_kernel), which writes only the workspace and
// starts only once the kernel before it has finished (its own wait comes first), B cannot be the kernel
// ahead's output, and its stages load into shared memory while A is being quantized.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <cutlass/arch/barrier.h>

#include <type_traits>

#include "common/pdl.h"
#include "common/problem.h"
#include "sm90/fp4_decode.cuh"
#include "sm90/per_device.h"
#include "sm90/split_counters.cuh"
#include "sm90/trace.cuh"

namespace nvfp4_gemm::sm90 {

inline constexpr int kWkConsumers = 256;                 // 8 consumer warps
inline constexpr int kWkThreads = kWkConsumers + 32;     // + the producer warp
inline constexpr int kWkRows = 128;                      // B rows per CTA
inline constexpr int kWkK = 256;                         // K per stage
inline constexpr int kWkBBytes = kWkRows * kWkK / 2;     // 16 KB of packed B per stage
inline constexpr int kWkSfBytes = 4 * kSfAtomBytes;      // the stage's 4 scale atoms, 2 KB
inline constexpr int kWkRedStride = 128 + 4;             // floats per token row of the K-slice sums (banks)

// A per stage: 16-bit activations, 4 boxes of TOKENS x 64 K; or packed e2m1, one box of TOKENS x 128 bytes
// (256 K) followed by the stage's four scale atoms of A's row block (2 KB, as for B).
constexpr int wk_a_bytes(int tokens, bool a4) { return a4 ? tokens * kWkK / 2 + kWkSfBytes : tokens * kWkK * 2; }
constexpr int wk_stage_bytes(int tokens, bool a4) { return kWkBBytes + kWkSfBytes + wk_a_bytes(tokens, a4); }
constexpr int wk_red_bytes(int tokens) { return 4 * tokens * kWkRedStride * 4; }
constexpr int wk_smem_bytes(int tokens, int stages, bool a4) {
  const int pipe = stages * wk_stage_bytes(tokens, a4);
  return (pipe > wk_red_bytes(tokens) ? pipe : wk_red_bytes(tokens)) + 2 * stages * 8 + 1024;
}

struct WkParams {
  CUtensorMap tmap_a;   // A [rows][K] 16-bit, box {64, TOKENS}; or packed e2m1 [rows][K/2] bytes, box {128, TOKENS};
                        // SWIZZLE_128B
  CUtensorMap tmap_b;   // B: row-major [N][K/2] bytes, box {128, 128}; or tiles [tiles][128][128], box {128, 128, 1}
  const uint8_t* sfb;   // blocked scales of B (16-byte aligned)
  const uint8_t* sfa;   // e2m1 A: the blocked scales of A's 128-row block that holds this launch's rows (16-byte
                        // aligned); a_row0: the launch's first row within that block
  int a_row0;
  const float* alpha;   // nullptr: 1
  const float* alpha2;  // nullptr, or a second factor of alpha
  void* c;              // [m][ldc] of out_dtype (rows of this launch)
  float* partial;       // [row blocks][splits][TOKENS][128] fp32, when splits > 1
  uint32_t* counters;   // [row blocks] in the workspace, zero at launch, when splits > 1 and counter_slot < 0
  int counter_slot;     // >= 0: the counters of this slot of split_counters.cuh (zero at launch, left zero)
  int64_t ldc;
  int m, n, k;
  int sf_atoms;         // K/64: scale atoms per row block
  int kblocks;          // K / 256
  int kb_per_cta;       // stages per split (the last split may have fewer)
  int splits;
  int b_early;          // > 0 only where the grid this one depends on writes neither B nor its scales (this
                        // call's own quantization of A, backend.cu): the first b_early stages of B load before
                        // griddepcontrol.wait
  float out_mult;       // 2^7
  OutDtype out_dtype;
  uint64_t* trace;      // diagnostics builds: nullptr, or the timeline below
};

// Timeline trace (diagnostics builds, sm90/trace.cuh), per CTA (blockIdx.y * gridDim.x + blockIdx.x): [0] entry,
// [1] producer past the grid dependency, [2] consumer warp 0 has its first stage, [3] its main loop done,
// [4] the K slices summed, [5] the split counter taken, [6] exit, [9] 1 if it summed the splits, [10] SM id.
__device__ __forceinline__ uint64_t* wk_trace(const WkParams& p) { return kDiagnostics ? p.trace : nullptr; }

struct WkLaunch {
  WkParams params;
  int row_blocks;
  cudaStream_t stream;
};

// cp.async.bulk of `bytes` (a multiple of 16, 16-byte aligned both sides) completing on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          cute::cast_smem_ptr_to_uint(dst)),
      "l"(src), "r"(bytes), "r"(cute::cast_smem_ptr_to_uint(bar))
      : "memory");
}

// cp.async.bulk.prefetch.L2 of `bytes` (a multiple of 16, 16-byte aligned): a hint, nothing waits on it.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// atom.add with acquire-release semantics at GPU scope: the old value.
__device__ __forceinline__ uint32_t atomic_add_acq_rel(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

template <Elem E>
__device__ __forceinline__ void wk_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  using Atom = std::conditional_t<E == Elem::kBf16, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                  cute::SM80_16x8x16_F32F16F16F32_TN>;
  Atom::fma(d[0], d[1], d[2], d[3], a0, a1, a2, a3, b0, b1, d[0], d[1], d[2], d[3]);
}

template <typename T>
__device__ __forceinline__ void wk_store(const WkParams& p, int token, int col, float v) {
  if (token < p.m && col < p.n) reinterpret_cast<T*>(p.c)[static_cast<int64_t>(token) * p.ldc + col] = convert_out<T>(v);
}

// A: what A holds (AType::kE2m1: packed NVFP4 with blocked scales; kFloat16 / kBFloat16: activations). The MMA
// runs in bf16 for bf16 activations, in fp16 otherwise.
template <int TOKENS, int STAGES, int CTAS, AType A>
__global__ void __launch_bounds__(kWkThreads, CTAS) wk_kernel(const __grid_constant__ WkParams p) {
  static_assert(TOKENS == 8 || TOKENS == 16, "one or two n-tiles of 8 tokens");
  static_assert(A == AType::kE2m1 || A == AType::kFloat16 || A == AType::kBFloat16, "e2m1, fp16 or bf16 A");
  constexpr bool kA4 = A == AType::kE2m1;
  constexpr Elem E = A == AType::kBFloat16 ? Elem::kBf16 : Elem::kHalf;
  static_assert(CTAS * (wk_smem_bytes(TOKENS, STAGES, kA4) + 1024) <= 233472, "pipeline too large for CTAS per SM");
  constexpr int NT = TOKENS / 8;
  constexpr int kStage = wk_stage_bytes(TOKENS, kA4);
  constexpr int kSfOff = kWkBBytes;
  constexpr int kAOff = kWkBBytes + kWkSfBytes;  // 1024-aligned (SWIZZLE_128B's period)
  constexpr int kABox = kA4 ? TOKENS * kWkK / 2 : TOKENS * 128;  // packed: the stage's one box; 16-bit: one of 4
  constexpr int kAsfOff = kAOff + kABox;          // e2m1 A: the stage's four scale atoms of A
  static_assert(kAOff % 1024 == 0 && kStage % 1024 == 0 && kABox % 1024 == 0, "swizzled boxes at 1024-byte offsets");
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  using Dec = BDecode<E>;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (cute::cast_smem_ptr_to_uint(smem_raw) & 1023u)) & 1023u);
  const int pipe_bytes = STAGES * kStage > wk_red_bytes(TOKENS) ? STAGES * kStage : wk_red_bytes(TOKENS);
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + pipe_bytes);
  uint64_t* empty_bar = full_bar + STAGES;
  __shared__ uint32_t s_last;

  const int rb = blockIdx.x, split = blockIdx.y;
  const int kb0 = split * p.kb_per_cta;
  const int nkb = min(p.kb_per_cta, p.kblocks - kb0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cta = blockIdx.y * gridDim.x + blockIdx.x;

  if (threadIdx.x == 0) {
    trace_at(wk_trace(p), cta, 0, global_ns());
    trace_at(wk_trace(p), cta, 10, sm_id());
    for (int s = 0; s < STAGES; ++s) {
      Barrier::init(&full_bar[s], 1);
      EmptyBarrier::init(&empty_bar[s], kWkConsumers / 32);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp == kWkConsumers / 32) {  // the producer
    if (lane == 0) {
      cute::prefetch_tma_descriptor(&p.tmap_a);
      cute::prefetch_tma_descriptor(&p.tmap_b);
      auto load_b = [&](int kb, int s) {
        uint8_t* st = smem + s * kStage;
        Barrier::arrive_and_expect_tx(&full_bar[s], kStage);
        cute::SM90_TMA_LOAD_2D::copy(&p.tmap_b, &full_bar[s], 0, st, kb * (kWkK / 2), rb * kWkRows);
        bulk_copy_g2s(st + kSfOff, p.sfb + (static_cast<int64_t>(rb) * p.sf_atoms + kb * 4) * kSfAtomBytes,
                      kWkSfBytes, &full_bar[s]);
      };
      auto load_a = [&](int kb, int s) {
        uint8_t* st = smem + s * kStage + kAOff;
        if constexpr (kA4) {
          cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &full_bar[s], 0, st, kb * (kWkK / 2), 0);
          bulk_copy_g2s(st + kABox, p.sfa + static_cast<int64_t>(kb) * 4 * kSfAtomBytes, kWkSfBytes, &full_bar[s]);
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &full_bar[s], 0, st + q * kABox, kb * kWkK + q * 64, 0);
        }
      };
      const int pre = min(STAGES, nkb);
      if (const int early = min(p.b_early, pre); early > 0) {
        // The kernel ahead quantizes this call's A and writes nothing B is made of: B's first stages load while
        // it runs, A's once it is done, then the rest of the pipeline once the first stage has landed.
        for (int x = 0; x < early; ++x) load_b(kb0 + x, x);
        cudaGridDependencySynchronize();
        trace_at(wk_trace(p), cta, 1, global_ns());
        for (int x = 0; x < early; ++x) load_a(kb0 + x, x);
        if (early < pre) {
          Barrier::wait(&full_bar[0], 0);
          for (int x = early; x < pre; ++x) load_b(kb0 + x, x), load_a(kb0 + x, x);
        }
      } else {
        // The first stage alone, then the rest of the pipeline once it has landed (see "Filling the pipeline").
        // Before the wait: L2 prefetches only (see "Programmatic dependent launch").
        cute::SM90_TMA_LOAD_2D::PREFETCH::copy(&p.tmap_b, kb0 * (kWkK / 2), rb * kWkRows);
        prefetch_l2(p.sfb + (static_cast<int64_t>(rb) * p.sf_atoms + kb0 * 4) * kSfAtomBytes, kWkSfBytes);
        cudaGridDependencySynchronize();  // A is the kernel ahead's output, and B may be
        trace_at(wk_trace(p), cta, 1, global_ns());
        load_b(kb0, 0);
        load_a(kb0, 0);
        if (pre > 1) {
          Barrier::wait(&full_bar[0], 0);
          for (int x = 1; x < pre; ++x) load_b(kb0 + x, x), load_a(kb0 + x, x);
        }
      }
      int s = pre % STAGES, phase = pre == STAGES ? 1 : 0;
      for (int i = pre; i < nkb; ++i) {
        EmptyBarrier::wait(&empty_bar[s], phase ^ 1);
        load_b(kb0 + i, s);
        load_a(kb0 + i, s);
        if (++s == STAGES) s = 0, phase ^= 1;
      }
    }
    return;
  }

  // The consumers read alpha from global memory (in the epilogue), which the kernel ahead may have written: they
  // wait for it too. No cost: their first stage holds A, which the producer loads only after its own wait.
  cudaGridDependencySynchronize();
  const int g = lane >> 2, tig = lane & 3;
  const int rg = warp >> 2, ks = warp & 3;
  const int sigma = 2 * (g & 3) + (g >> 2);
  const int row_base = rg * 64 + sigma;  // row of tile mt: row_base + 16 mt (and + 8)
  // This lane's 8 bytes of a row: chunk 2 ks + tig / 2, half tig % 2, the chunk XORed with row % 8 = sigma.
  const uint32_t b_off = row_base * 128 + ((((2 * ks + (tig >> 1)) ^ sigma)) << 4) + (tig & 1) * 8;
  // Scale byte of row r for this lane's group: atom ks of the stage, docs/CONTRACT.md's offset inside the atom.
  auto sf_at = [&](int r) { return kSfOff + ks * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4 + tig; };
  // A: box ks holds K [64 ks, 64 ks + 64) of the stage; token t's elements 16 tig .. 16 tig + 15 are
  // chunks 2 tig and 2 tig + 1 of its 128-byte row, XORed with t % 8 (= g: n-tiles are 8 rows).
  const uint32_t a_off = kAOff + ks * kABox + g * 128;
  const uint32_t a_c0 = ((2 * tig) ^ g) << 4, a_c1 = ((2 * tig + 1) ^ g) << 4;
  // e2m1 A: token t = 8 j + g's 8 bytes of this lane's group, placed as B's (its row's chunks XORed with t % 8 =
  // g), and its scale byte: atom ks of the stage, row a_row0 + t of A's row block.
  const uint32_t a4_off = kAOff + g * 128 + ((((2 * ks + (tig >> 1)) ^ g)) << 4) + (tig & 1) * 8;
  auto asf_at = [&](int t) {
    const int r = p.a_row0 + t;
    return kAsfOff + ks * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4 + tig;
  };
  const int nt_live = min(NT, (p.m + 7) / 8);
  // The stage offsets of this lane's B rows' scale bytes, computed once and kept (an empty asm makes them opaque to
  // the compiler, which otherwise rebuilt these and b_off from the thread index in every stage: ~35 of a stage's
  // ~440 instructions at 8 tokens).
  uint32_t sfo[4][2];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    sfo[mt][0] = sf_at(row_base + 16 * mt);
    sfo[mt][1] = sf_at(row_base + 16 * mt + 8);
  }
  uint32_t b_off_kept = b_off;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) asm volatile("" : "+r"(sfo[mt][0]), "+r"(sfo[mt][1]));
  asm volatile("" : "+r"(b_off_kept));

  float acc[4][NT][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;

  int s = 0, phase = 0;
  for (int i = 0; i < nkb; ++i) {
    Barrier::wait(&full_bar[s], phase);
    if (i == 0 && threadIdx.x == 0) trace_at(wk_trace(p), cta, 2, global_ns());
    const uint8_t* st = smem + s * kStage;
    uint32_t af[NT][8];  // pairs in decode_word's order: [4 h + x] is pair x of elements 8 h .. 8 h + 7
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (NT > 1 && j >= nt_live) break;
      if constexpr (kA4) {
        // e2m1 * e4m3 exactly in fp16, in decode_word's order (as the small-M kernel stages its A).
        const uint2 w = *reinterpret_cast<const uint2*>(st + a4_off + j * 8 * 128);
        const uint8_t sc = st[asf_at(8 * j + g)];
        const uint32_t s2 = Dec::scales(static_cast<uint16_t>(sc | (sc << 8)));
        const __half2 sa = *reinterpret_cast<const __half2*>(&s2), fold = __half2half2(__ushort_as_half(0x5800));
        const uint4 v0 = decode_a_word(w.x, sa, fold), v1 = decode_a_word(w.y, sa, fold);
        af[j][0] = v0.x; af[j][1] = v0.y; af[j][2] = v0.z; af[j][3] = v0.w;
        af[j][4] = v1.x; af[j][5] = v1.y; af[j][6] = v1.z; af[j][7] = v1.w;
      } else {
        const uint8_t* ar = st + a_off + j * 8 * 128;
        const uint4 v0 = pair_like_decode(*reinterpret_cast<const uint4*>(ar + a_c0));
        const uint4 v1 = pair_like_decode(*reinterpret_cast<const uint4*>(ar + a_c1));
        af[j][0] = v0.x; af[j][1] = v0.y; af[j][2] = v0.z; af[j][3] = v0.w;
        af[j][4] = v1.x; af[j][5] = v1.y; af[j][6] = v1.z; af[j][7] = v1.w;
      }
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const uint2 w0 = *reinterpret_cast<const uint2*>(st + b_off_kept + mt * 16 * 128);
      const uint2 w1 = *reinterpret_cast<const uint2*>(st + b_off_kept + (mt * 16 + 8) * 128);
      const uint16_t sc = static_cast<uint16_t>(st[sfo[mt][0]] | (st[sfo[mt][1]] << 8));
      const uint32_t s2 = Dec::scales(sc);
      const uint32_t s0 = low_pair(s2), s1 = high_pair(s2);
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // word h of the 8 bytes: elements 8 h .. 8 h + 7, MMA steps 2 h, 2 h + 1
        const BFragments<E> f(h ? w0.y : w0.x, h ? w1.y : w1.x, s0, s1);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (NT > 1 && j >= nt_live) break;
          wk_mma<E>(acc[mt][j], f.g[0], f.e[0], f.g[1], f.e[1], af[j][4 * h + 0], af[j][4 * h + 1]);
          wk_mma<E>(acc[mt][j], f.g[2], f.e[2], f.g[3], f.e[3], af[j][4 * h + 2], af[j][4 * h + 3]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) EmptyBarrier::arrive(&empty_bar[s]);
    if (++s == STAGES) s = 0, phase ^= 1;
  }

  cudaTriggerProgrammaticLaunchCompletion();  // past the main loop: the successor may launch
  uint64_t* const trace = threadIdx.x == 0 ? wk_trace(p) : nullptr;
  trace_at(trace, cta, 3, global_ns());

  // The 4 K slices of each (row, token), summed in slice order through shared memory. Every stage has been
  // waited for by every consumer, so no copy is still landing in the pipeline's bytes.
  cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);
  float* red = reinterpret_cast<float*>(smem);  // [ks][token][kWkRedStride]
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = j * 8 + 2 * tig + (e & 1), row = row_base + 16 * mt + (e >> 1) * 8;
        red[(ks * TOKENS + token) * kWkRedStride + row] = acc[mt][j][e];
      }
  cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);

  // Thread t takes (token, row) = (t / 128 + 2 x, t % 128): rows of a token are consecutive columns of C.
  const int t = threadIdx.x;
  constexpr int kPer = TOKENS * kWkRows / kWkConsumers;
  float v[kPer];
#pragma unroll
  for (int x = 0; x < kPer; ++x) {
    const int token = t / kWkRows + 2 * x, row = t % kWkRows;
    const float* r = red + token * kWkRedStride + row;
    v[x] = ((r[0] + r[TOKENS * kWkRedStride]) + r[2 * TOKENS * kWkRedStride]) + r[3 * TOKENS * kWkRedStride];
  }
  trace_at(trace, cta, 4, global_ns());
  if (p.splits > 1) {
    float* mine = p.partial + (static_cast<int64_t>(rb) * p.splits + split) * (TOKENS * kWkRows);
#pragma unroll
    for (int x = 0; x < kPer; ++x) __stcg(mine + x * kWkConsumers + t, v[x]);
    // The CTA's stores are ordered before thread 0's release by the barrier; its acquire orders the last
    // arriver's loads after every split's release (one fence for the CTA, not one per thread).
    cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);
    uint32_t* counters = split_counters(p.counter_slot, p.counters);
    if (t == 0) {
      s_last = atomic_add_acq_rel(counters + rb, 1u) == static_cast<uint32_t>(p.splits - 1);
      if (s_last) counters[rb] = 0;  // every split has arrived: zero for the next launch on this slot
    }
    cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);
    trace_at(trace, cta, 5, global_ns());
    trace_at(trace, cta, 9, s_last);
    if (!s_last) {
      trace_at(trace, cta, 6, global_ns());
      return;
    }
    // Split order, whatever the arrival order: the same bits on every call. The partials of kBatch splits are
    // all loaded before any is added, so the sum waits one L2 round trip per kBatch splits, not one per split.
    constexpr int kBatch = 32 / kPer;
    const float* base = p.partial + static_cast<int64_t>(rb) * p.splits * (TOKENS * kWkRows) + t;
    for (int q0 = 0; q0 < p.splits; q0 += kBatch) {
      float w[kBatch][kPer];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int x = 0; x < kPer; ++x)
          if (q0 + b < p.splits) w[b][x] = __ldcg(base + static_cast<int64_t>(q0 + b) * (TOKENS * kWkRows) + x * kWkConsumers);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int x = 0; x < kPer; ++x)
          if (q0 + b < p.splits) v[x] = q0 + b == 0 ? w[b][x] : v[x] + w[b][x];
    }
  }
  const float scale = p.alpha ? p.out_mult * alpha_of(p.alpha, p.alpha2) : p.out_mult;
#pragma unroll
  for (int x = 0; x < kPer; ++x) {
    const int token = t / kWkRows + 2 * x, col = rb * kWkRows + t % kWkRows;
    switch (p.out_dtype) {
      case OutDtype::kFloat16: wk_store<__half>(p, token, col, v[x] * scale); break;
      case OutDtype::kBFloat16: wk_store<__nv_bfloat16>(p, token, col, v[x] * scale); break;
      default: wk_store<float>(p, token, col, v[x] * scale); break;
    }
  }
  trace_at(trace, cta, 6, global_ns());
}

template <int TOKENS, int STAGES, int CTAS, AType A>
cudaError_t launch_wk(const WkLaunch& l) {
  auto* kernel = wk_kernel<TOKENS, STAGES, CTAS, A>;
  constexpr int smem = wk_smem_bytes(TOKENS, STAGES, A == AType::kE2m1);
  static OncePerDevice smem_limit;  // the attribute is per device (per_device.h)
  const cudaError_t attr = smem_limit.run(
      [&] { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); });
  if (attr != cudaSuccess) return attr;
  cudaLaunchAttribute attrs[1];  // programmatic dependent launch: see the note at the top
  const cudaLaunchConfig_t cfg =
      launch_config(dim3(l.row_blocks, l.params.splits), dim3(kWkThreads), smem, l.stream, /*pdl=*/true, attrs);
  return cudaLaunchKernelEx(&cfg, kernel, l.params);
}

}  // namespace nvfp4_gemm::sm90
