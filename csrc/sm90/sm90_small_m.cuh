// Hopper NVFP4 GEMM for small M (a few tokens): a bandwidth-bound stream of packed B into mma.sync m16n8k16
// (fp16 operands, fp32 accumulation). Torch-free.
//
// Two ways to move B (the RING template parameter, csrc/sm90/generate.py): RING = 0, a register buffer of DEPTH K blocks
// per lane (the description below); RING = R, a per-thread R-stage cp.async ring in shared memory: each
// thread copies exactly the bytes it will consume (the same pieces as the register buffer, so the MMAs and the
// summation order are the same), waits on its own copy groups and reads them back, so the ring needs no
// barrier and no producer warp, and the loop is one block per iteration. The ring variant also stages A for
// the launch's tokens only (not whole n-tiles: 1/8 of the shared memory at M = 1), and reduces up to
// kMaxClusterSplits K splits in a thread-block cluster through distributed shared memory (no workspace, no
// counter reset) when the grid is one wave.
//
// Why not the wgmma kernel: at M <= 32 the work is mostly reading B (N x K/2 bytes + scales) once; the
// wgmma kernel moves B through TMA -> shared memory -> registers behind an mbarrier ring, and measured 4-13%
// slower than this kernel there (the M <= 32 rules of csrc/sm90/generate.py, docs/SM90_NOTES.md). Here every lane loads its B bytes straight from global memory
// with 16-byte non-allocating loads, issued for DEPTH K blocks ahead, and decodes them into the A
// fragments of mma.sync; no producer warp, no barrier per stage, no prepass.
//
// Roles: B rows (weights) are the MMA's M = 16 side, the tokens its N = 8 side (TOKENS / 8 n-tiles).
// CTA = 8 warps x 16 B rows = 128 rows (one row block of the scale layout); grid = row blocks x K splits.
//
// K permutation (the same for both operands, so the dot products are unchanged): K is cut into blocks of
// 256 (128 bytes per row). In a block, lane (g, tig) of a warp owns bytes [16 tig, 16 tig + 16) and
// [64 + 16 tig, 64 + 16 tig + 16) of rows g and g + 8 of the warp's 16, i.e. K [32 tig, 32 tig + 32) and
// [128 + 32 tig, 128 + 32 tig + 32): each 16-byte load instruction of the warp covers 8 rows x 64 whole
// bytes (two full 32-byte sectors per row), and each half is two scale groups, one 16-bit pair of the
// blocked layout. Word i (0..7) of the lane's 32 bytes of a row feeds MMA steps 2i and 2i+1: step 2i + h
// takes decode_word<2h> as the k = 2tig, 2tig+1 pair and decode_word<2h+1> as k = 2tig+8, 2tig+9. The
// activations are decoded once per CTA into shared memory in the matching order: for (block, token t,
// tig), 8 chunks of 16 bytes, chunk i = the four decode_word outputs of the A word at the same K as the
// lane's B word i, so one 16-byte shared load gives the B fragments {b0, b1} of two steps.
//
// Numerics as in sm90_gemm.cuh: B decodes to e2m1 * e4m3 * 2^-7 (2^7 folded into the scale), A to
// e2m1 * e4m3 exactly; both exact in fp16, products exact in fp32; the epilogue multiplies by 2^7 * alpha
// and rounds once to the output type. The weight-only form (A = fp16 or bf16 activations) stages A's
// values unchanged, in the same order, and decodes B in A's type (BDecode: exact in both), with the
// mma.sync of that type.
//
// Split-K: the grid is one wave (row blocks x splits <= CTAS CTAs per SM) whenever N allows, so no CTA waits
// behind another's tail. Each (row block, split) CTA writes its fp32 tile to the workspace; the last CTA of
// a row block to arrive (atomic counter) sums the splits in split order and writes C, so the result does
// not depend on timing, and sets the counter back to zero. The counters are a slot of split_counters.cuh,
// zero between launches; where no slot is free they are workspace words zeroed by a one-block kernel
// launched just before this grid.
//
// Programmatic dependent launch (PDL), so that a chain of small GEMMs does not pay each launch in full:
// every launch here may start before the kernel ahead of it on the stream has finished, and each grid
// lets its successor launch once all its CTAs are past their main loop (not earlier: a successor's CTAs
// would take the slots of this grid's later CTAs). What runs before the wait for the predecessor
// (griddepcontrol.wait) is only what cannot read its results:
//  - no split, or a split counting on a slot's counters: the predecessor is anyone's kernel; before the wait
//    a CTA only asks L2 for its first B blocks (a prefetch reads nothing into registers, so it is right even
//    if that kernel wrote B).
//  - a split counting on workspace counters: the predecessor is the counter reset, which itself waits for the
//    kernel ahead of it before it lets this grid launch; so A and B are final when a CTA starts, and it waits
//    only before it counts its arrival on the counters the reset writes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cooperative_groups.h>
#include <cute/arch/mma_sm80.hpp>

#include <type_traits>

#include "common/pdl.h"
#include "common/problem.h"
#include "sm90/fp4_decode.cuh"
#include "sm90/per_device.h"
#include "sm90/quant_a.cuh"
#include "sm90/split_counters.cuh"

namespace nvfp4_gemm::sm90 {

inline constexpr int kSmallThreads = 256;  // 8 warps
inline constexpr int kSmallRows = 128;     // B rows per CTA: 8 warps x MMA M = 16
inline constexpr int kSmallKBlock = 256;   // K per block (4 lanes x 64)
// Shared bytes of decoded A per (block, token, tig): 128 of data + 16 of padding, so that the 8 lanes of
// a quarter warp (g = 0..1 or 2..3, tig = 0..3) hit 8 different 16-byte bank groups (stride 9 chunks per
// tig, 36 per token).
inline constexpr int kSmallTigBytes = 144;

// Dynamic shared memory cap: 227 KB per block on sm_90 counts the kernel's static shared memory too.
inline constexpr int kSmallMMaxSmem = 227 * 1024 - 1024;

constexpr int small_m_smem_bytes(int tokens, int kblocks_per_cta) {
  return kblocks_per_cta * tokens * 4 * kSmallTigBytes;
}

// The shared-memory B ring (RING > 0): per stage and thread, the thread's own four 16-byte pieces of B and
// one 16 bytes of scale words, laid out [stage][piece][thread][16 bytes] so that a warp's shared loads are
// consecutive (no bank conflicts). Each thread reads back only what its own cp.async wrote: waiting on its
// own copy groups is all the synchronization the ring needs (no barrier, no producer warp).
inline constexpr int kRingPieces = 5;
inline constexpr int kRingPieceStride = kSmallThreads * 16;
inline constexpr int kRingStageBytes = kRingPieces * kRingPieceStride;  // 20 KB
// Up to this many K splits of a row block are one thread-block cluster and reduce through distributed
// shared memory; more go through the workspace as the register variant's do. Measured (H100, docs/NOTES.md):
// 4 splits in a cluster beat the workspace ((16, 6144, 4096): 14.4 vs 15.7 us), 8 lost to it ((16, 4096,
// 4096): 17.5 vs 11.8 us; (16, 4096, 14336): 36.1 vs 24.0 us), 16 lost everywhere.
inline constexpr int kMaxClusterSplits = 4;

constexpr int small_m_ring_bytes(int ring) { return ring * kRingStageBytes; }

// Tokens a launch of `rows` rows stages (whole n-tiles of 8, at most the config's TOKENS).
constexpr int small_m_live_tokens(int config_tokens, int64_t rows) {
  return static_cast<int>(rows >= config_tokens ? config_tokens : (rows + 7) / 8 * 8);
}

struct SmallMParams {
  const uint8_t* a;
  const uint8_t* b;
  const uint8_t* sfa;
  const uint8_t* sfb;
  const float* alpha;   // nullptr: 1
  const float* alpha2;  // nullptr, or a second factor of alpha
  const float* a_scale; // quantize-on-the-fly (e2m1 instantiation): float A of type x_type, encode scale
  bool a_scale_is_decode;
  AType x_type;
  void* c;
  float4* partial;      // [row blocks][splits][8 warps][TOKENS/8][32 lanes] float4, when splits > 1
  uint32_t* counters;   // [row blocks] in the workspace, zero at launch, when splits > 1 and counter_slot < 0
  int counter_slot;     // >= 0: the counters of this slot of split_counters.cuh (zero at launch, left zero)
  int64_t lda, ldb, ldc;
  int m, n, k;
  int sfa_row0;         // row of A's scales that A's row 0 is (launches of TOKENS rows)
  int sf_atoms;         // ceil(K/16 / 4): atoms per row block of either scale tensor
  int kblocks;          // ceil(K / 256)
  int kb_per_cta;       // K blocks per split (the last split may have fewer)
  int splits;
  bool cluster;         // the splits of a row block are one cluster (ring variant): no workspace, no counters
  float out_mult;       // 2^7: the power of two the B decode leaves in the sums
  OutDtype out_dtype;
};

struct SmallMLaunch {
  SmallMParams params;
  int row_blocks;
  int smem;
  cudaStream_t stream;
};

// One K block of B for one lane: rows g and g + 8, two 16-byte halves each, and their scale pairs.
struct BBlock {
  uint4 r[4];     // r[0], r[1]: row g, bytes [16 tig, +16) and [64 + 16 tig, +16); r[2], r[3]: row g + 8
  uint32_t s[2];  // row g, row g + 8: the scale bytes of groups 2 tig, 2 tig + 1, 8 + 2 tig, 9 + 2 tig
};

// B is read exactly once: keep it out of L1 (the scales and A use it). PTX here because no CuTe copy atom
// carries the L1::no_allocate hint.
__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// cp.async with zero fill: `valid` false writes zeros and reads nothing (src is then any mapped address).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The two scale bytes of groups (2 c, 2 c + 1) of a 256-K block for the row at byte offset sf_row_off of
// its atom: atom column 4 kblk + c / 2, bytes 2 (c % 2) and 2 (c % 2) + 1 (docs/CONTRACT.md's blocked layout).
__device__ __forceinline__ uint32_t ld_scale_pair(const uint8_t* sf, int64_t sf_rb_base, int kblk, int c,
                                                  int sf_row_off) {
  const uint8_t* q = sf + (sf_rb_base + kblk * 4 + c / 2) * kSfAtomBytes + sf_row_off + 2 * (c % 2);
  return __ldg(reinterpret_cast<const uint16_t*>(q));
}

__device__ __forceinline__ void load_bblock(BBlock& bb, const SmallMParams& p, int row, int sf_row_off, int sf_row_off8,
                                            int64_t sf_rb_base, int kblk, int tig) {
  const int kel = kblk * kSmallKBlock + tig * 32;
  const uint8_t* src = p.b + static_cast<int64_t>(row) * p.ldb + kblk * (kSmallKBlock / 2) + tig * 16;
  const bool r0 = row < p.n, r1 = row + 8 < p.n;
  // K % 32 == 0: each 16-byte half (32 K) is wholly inside K or wholly past it; inside K its scale atom
  // exists. Rows past N are inside the layout's 128-row padding (zero bytes) and their loads are skipped.
  const bool h0 = kel < p.k, h1 = kel + 128 < p.k;
  const uint4 z = make_uint4(0, 0, 0, 0);
  bb.r[0] = (r0 && h0) ? ld_stream(src) : z;
  bb.r[1] = (r0 && h1) ? ld_stream(src + 64) : z;
  bb.r[2] = (r1 && h0) ? ld_stream(src + 8 * p.ldb) : z;
  bb.r[3] = (r1 && h1) ? ld_stream(src + 8 * p.ldb + 64) : z;
  bb.s[0] = (h0 ? ld_scale_pair(p.sfb, sf_rb_base, kblk, tig, sf_row_off) : 0u) |
            (h1 ? ld_scale_pair(p.sfb, sf_rb_base, kblk, 4 + tig, sf_row_off) << 16 : 0u);
  bb.s[1] = (h0 ? ld_scale_pair(p.sfb, sf_rb_base, kblk, tig, sf_row_off8) : 0u) |
            (h1 ? ld_scale_pair(p.sfb, sf_rb_base, kblk, 4 + tig, sf_row_off8) << 16 : 0u);
}

// load_bblock's bytes for K block kblk, copied into this thread's pieces of ring stage `slot` (the ring
// variant). The scale pairs come as the aligned 4-byte words that hold them (scale pairs of lanes tig and
// tig ^ 1 share a word); read_ring_bblock picks this lane's half.
__device__ __forceinline__ void issue_ring_bblock(uint32_t ring, int slot, const SmallMParams& p, int row, int sf_row_off,
                                                  int sf_row_off8, int64_t sf_rb_base, int kblk, int tig) {
  const int kel = kblk * kSmallKBlock + tig * 32;
  const uint8_t* src = p.b + static_cast<int64_t>(row) * p.ldb + kblk * (kSmallKBlock / 2) + tig * 16;
  const bool r0 = row < p.n, r1 = row + 8 < p.n;
  const bool h0 = kel < p.k, h1 = kel + 128 < p.k;
  const uint32_t d = ring + slot * kRingStageBytes + threadIdx.x * 16;
  cp_async_16(d, (r0 && h0) ? src : p.b, r0 && h0);
  cp_async_16(d + kRingPieceStride, (r0 && h1) ? src + 64 : p.b, r0 && h1);
  cp_async_16(d + 2 * kRingPieceStride, (r1 && h0) ? src + 8 * p.ldb : p.b, r1 && h0);
  cp_async_16(d + 3 * kRingPieceStride, (r1 && h1) ? src + 8 * p.ldb + 64 : p.b, r1 && h1);
  const uint8_t* lo = p.sfb + (sf_rb_base + kblk * 4 + tig / 2) * kSfAtomBytes;  // groups 2 tig, 2 tig + 1
  const uint8_t* hi = lo + 2 * kSfAtomBytes;                                       // groups 8 + 2 tig, 9 + 2 tig
  const uint32_t ds = d + 4 * kRingPieceStride;
  cp_async_4(ds, h0 ? lo + sf_row_off : p.sfb, h0);
  cp_async_4(ds + 4, h1 ? hi + sf_row_off : p.sfb, h1);
  cp_async_4(ds + 8, h0 ? lo + sf_row_off8 : p.sfb, h0);
  cp_async_4(ds + 12, h1 ? hi + sf_row_off8 : p.sfb, h1);
}

__device__ __forceinline__ void read_ring_bblock(BBlock& bb, const uint8_t* ring, int slot, int tig) {
  const uint8_t* d = ring + slot * kRingStageBytes + threadIdx.x * 16;
#pragma unroll
  for (int q = 0; q < 4; ++q) bb.r[q] = *reinterpret_cast<const uint4*>(d + q * kRingPieceStride);
  const uint4 w = *reinterpret_cast<const uint4*>(d + 4 * kRingPieceStride);
  const uint32_t sel = (tig & 1) ? 0x7632u : 0x5410u;  // this lane's 16-bit pair of each word
  bb.s[0] = __byte_perm(w.x, w.y, sel);
  bb.s[1] = __byte_perm(w.z, w.w, sel);
}

// Asks L2 for the first `blocks` K blocks of this lane's B rows (rows g and g + 8; lanes tig 0 / 1 take the
// first and last byte of row g's 128-byte segment, tig 2 / 3 those of row g + 8, so both lines of a
// segment that straddles two are covered). A hint: nothing is read into registers.
__device__ __forceinline__ void prefetch_b_l2(const SmallMParams& p, int row, int kb0, int blocks, int tig) {
  const int r = row + (tig >> 1) * 8;
  if (r >= p.n) return;
  const int64_t row_bytes = p.k / 2;
  for (int d = 0; d < blocks; ++d) {
    const int64_t off = static_cast<int64_t>(kb0 + d) * (kSmallKBlock / 2);
    const int64_t last = off + kSmallKBlock / 2 - 1;
    const int64_t at = (tig & 1) ? (last < row_bytes ? last : row_bytes - 1) : off;
    if (off < row_bytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(p.b + static_cast<int64_t>(r) * p.ldb + at));
  }
}

// One m16n8k16 step on the tensor cores (CuTe's SM80 atoms; Hopper runs them as HMMA.16816).
template <Elem E>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  using Atom = std::conditional_t<E == Elem::kBf16, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                  cute::SM80_16x8x16_F32F16F16F32_TN>;
  Atom::fma(d[0], d[1], d[2], d[3], a0, a1, a2, a3, b0, b1, d[0], d[1], d[2], d[3]);
}

// Scale word (4 e4m3 bytes) -> {s0, s0}, {s1, s1}, ... in E, times BDecode's fold.
template <Elem E>
__device__ __forceinline__ void scales_of(uint32_t w, uint32_t (&s)[4]) {
  const uint32_t l = BDecode<E>::scales(static_cast<uint16_t>(w & 0xFFFF));
  const uint32_t h = BDecode<E>::scales(static_cast<uint16_t>(w >> 16));
  s[0] = low_pair(l);
  s[1] = high_pair(l);
  s[2] = low_pair(h);
  s[3] = high_pair(h);
}

// nt_live: the n-tiles that hold tokens of this launch (the rest are all zero and skipped). COMPACT: A is
// staged for the launch's `tok` tokens only (not whole n-tiles), and lanes of the tokens past it take zeros.
template <int NT, Elem E, bool COMPACT = false>
__device__ __forceinline__ void compute_bblock(const BBlock& bb, const uint8_t* a_blk, int g, int tig, int nt_live,
                                               float (&acc)[NT][4], int tok = 0) {
  uint32_t sg[4], s8[4];
  scales_of<E>(bb.s[0], sg);
  scales_of<E>(bb.s[1], s8);
  const uint32_t* wg = reinterpret_cast<const uint32_t*>(&bb.r[0]);  // r[0], r[1] contiguous: 8 words
  const uint32_t* w8 = reinterpret_cast<const uint32_t*>(&bb.r[2]);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const BFragments<E> f(wg[i], w8[i], sg[i / 2], s8[i / 2]);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (NT > 1 && j >= nt_live) break;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (!COMPACT || j * 8 + g < tok)
        v = *reinterpret_cast<const uint4*>(a_blk + ((j * 8 + g) * 4 + tig) * kSmallTigBytes + i * 16);
      mma16816<E>(acc[j], f.g[0], f.e[0], f.g[1], f.e[1], v.x, v.y);
      mma16816<E>(acc[j], f.g[2], f.e[2], f.g[3], f.e[3], v.z, v.w);
    }
  }
}

template <typename T>
__device__ __forceinline__ void store_small(const SmallMParams& p, int token, int col, float v) {
  if (token < p.m && col < p.n) reinterpret_cast<T*>(p.c)[static_cast<int64_t>(token) * p.ldc + col] = convert_out<T>(v);
}

// A: what A holds (e2m1 with scales, or fp16 / bf16 activations); the MMA runs in A's 16-bit type.
template <int TOKENS, int KBMAX, int DEPTH, int CTAS, int RING, AType A>
__global__ void __launch_bounds__(kSmallThreads, CTAS) small_m_kernel(const __grid_constant__ SmallMParams p) {
  static_assert(TOKENS % 8 == 0 && TOKENS <= 32, "n-tiles of 8 tokens, up to 4");
  static_assert(A == AType::kE2m1 || A == AType::kFloat16 || A == AType::kBFloat16, "e2m1, fp16 or bf16 A");
  static_assert(RING == 0 || (RING >= 2 && TOKENS / 8 <= kRingPieces), "a ring of 2+ stages; partials fit a slot");
  constexpr bool kRing = RING > 0;
  constexpr int NT = TOKENS / 8;
  constexpr Elem E = A == AType::kBFloat16 ? Elem::kBf16 : Elem::kHalf;
  constexpr bool kA16 = A != AType::kE2m1;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t s_last;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int rb = blockIdx.x, split = blockIdx.y;
  const int kb0 = split * p.kb_per_cta;
  const int nkb = min(p.kb_per_cta, p.kblocks - kb0);
  const int rloc = warp * 16 + g;  // row inside the 128-row block
  const int row = rb * kSmallRows + rloc;
  const int sf_off = (rloc % 32) * 16 + (rloc / 32) * 4, sf_off8 = ((rloc + 8) % 32) * 16 + ((rloc + 8) / 32) * 4;
  const int64_t sf_rb_base = static_cast<int64_t>(rb) * p.sf_atoms;

  if (kRing || p.splits == 1 || p.counter_slot >= 0) {  // see the PDL note above (no counter reset ahead)
    prefetch_b_l2(p, row, kb0, min(nkb, kRing ? RING - 1 : DEPTH), tig);
    cudaGridDependencySynchronize();
  }
  // The ring sits past the staged A (whose size is a multiple of 16 bytes).
  const int a_bytes = small_m_smem_bytes(min(TOKENS, p.m), p.kb_per_cta);
  uint8_t* ring = smem + a_bytes;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  if constexpr (kRing) {  // the first RING - 1 blocks of B go out before A is staged
#pragma unroll
    for (int s = 0; s < RING - 1; ++s) {
      if (s < nkb) issue_ring_bblock(ring_s, s, p, row, sf_off, sf_off8, sf_rb_base, kb0 + s, tig);
      cp_async_commit();
    }
  }

  // A for this CTA's K range, decoded to e2m1 * e4m3 (exact in fp16) in the permuted order; tokens past M
  // and K past the end are zeros. One thread per 16-byte chunk of A (32 K, two scale groups): chunk c of a
  // block is the lane-tig = c % 4 half c / 4 of the permutation above. A batch's loads are all issued
  // before its first decode (one round trip per batch, not per chunk); the first batch goes out ahead of
  // the B loads (measured no faster than behind them, docs/SM90_NOTES.md, but it costs nothing).
  constexpr int kBatch = 4;
  // Staged A holds the live n-tiles only (tokens rounded up to 8; small_m_live_tokens on the host sizes it).
  // The ring variant stages exactly the launch's tokens (its shared memory buys ring stages and CTAs).
  const int nt_live = min(NT, (p.m + 7) / 8), tok = kRing ? min(TOKENS, p.m) : nt_live * 8;
  const int per_token = nkb * 8, n_chunks = tok * per_token;
  // 16-bit A: one item per 16 bytes (8 values) of a chunk, 4 per chunk; e2m1 A: one item per chunk.
  constexpr int kItemsPerChunk = kA16 ? 4 : 1;
  const int n_items = n_chunks * kItemsPerChunk;
  uint4 aw[kBatch];
  uint32_t asp[kBatch];
  auto load_a = [&](int base) {
#pragma unroll
    for (int x = 0; x < kBatch; ++x) {
      const int idx = base + x * kSmallThreads;
      const int chunk = idx / kItemsPerChunk, v = idx % kItemsPerChunk;
      const int t = chunk / per_token, rem = chunk - t * per_token;
      const int blk = rem >> 3, c = rem & 7;
      const int kg = (kb0 + blk) * kSmallKBlock + (c & 3) * 32 + (c >> 2) * 128;
      aw[x] = make_uint4(0, 0, 0, 0);
      asp[x] = 0;
      if (idx < n_items && t < p.m && kg < p.k) {
        if constexpr (kA16) {
          aw[x] = __ldg(reinterpret_cast<const uint4*>(p.a + static_cast<int64_t>(t) * p.lda + (kg + 8 * v) * 2));
        } else {
          aw[x] = __ldg(reinterpret_cast<const uint4*>(p.a + static_cast<int64_t>(t) * p.lda + kg / 2));
          const int r = p.sfa_row0 + t;  // docs/CONTRACT.md's blocked offset: row r, groups kg / 16 and kg / 16 + 1
          asp[x] = ld_scale_pair(p.sfa, static_cast<int64_t>(r / 128) * p.sf_atoms, kb0 + blk,
                                 (c & 3) + 4 * (c >> 2), (r % 32) * 16 + ((r % 128) / 32) * 4);
        }
      }
    }
  };
  auto store_a = [&](int base) {
    const __half2 fold = __half2half2(__ushort_as_half(0x5800));  // 128, twice: see the numerics note
#pragma unroll
    for (int x = 0; x < kBatch; ++x) {
      const int idx = base + x * kSmallThreads;
      if (idx >= n_items) break;
      const int chunk = idx / kItemsPerChunk, v = idx % kItemsPerChunk;
      const int t = chunk / per_token, rem = chunk - t * per_token;
      const int blk = rem >> 3, c = rem & 7;
      uint8_t* dst = smem + ((blk * tok + t) * 4 + (c & 3)) * kSmallTigBytes + (c >> 2) * 64;
      if constexpr (kA16) {
        // Values 8v..8v+7 of the chunk, ordered as decode_word orders word v of an e2m1 chunk.
        *reinterpret_cast<uint4*>(dst + v * 16) = pair_like_decode(aw[x]);
      } else {
        const __half2_raw sr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(asp[x]), __NV_E4M3);
        const __half2 s2 = __hmul2(*reinterpret_cast<const __half2*>(&sr), fold);
        const __half2 s_lo = __low2half2(s2), s_hi = __high2half2(s2);
        const uint32_t words[4] = {aw[x].x, aw[x].y, aw[x].z, aw[x].w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const __half2 sc = w < 2 ? s_lo : s_hi;  // words 0, 1: group 2 c; words 2, 3: group 2 c + 1
          *reinterpret_cast<uint4*>(dst + w * 16) = decode_a_word(words[w], sc, fold);
        }
      }
    }
  };
  // Float activations quantized here (Problem::a_scale; the e2m1 instantiation only): one item per 16-value
  // scale group, its codes and scale byte exactly as nvfp4_gemm::quantize makes them, then decoded like
  // packed A's words.
  const bool quantize = A == AType::kE2m1 && p.a_scale != nullptr;
  auto stage_quantized = [&]() {
    const float gs = encode_scale_of(p.a_scale, p.a_scale_is_decode);
    const int eb = elem_bytes(p.x_type);
    const __half2 fold = __half2half2(__ushort_as_half(0x5800));
    // Several groups' loads in flight per thread before any is quantized (one memory round trip per batch);
    // 2 where the launch bound leaves 80 registers a thread (8 tokens, 3 CTAs per SM), else 4.
    constexpr int kQBatch = CTAS >= 3 ? 2 : 4;
    for (int base = tid; base < n_chunks * 2; base += kQBatch * kSmallThreads) {
      uint32_t raw[kQBatch][16];
      int kgs[kQBatch], ts[kQBatch];
#pragma unroll
      for (int b = 0; b < kQBatch; ++b) {
        const int idx = base + b * kSmallThreads;
        const int chunk = idx >> 1, grp = idx & 1;
        const int t = chunk / per_token, rem = chunk - t * per_token;
        const int blk = rem >> 3, c = rem & 7;
        ts[b] = t;
        kgs[b] = (kb0 + blk) * kSmallKBlock + (c & 3) * 32 + (c >> 2) * 128 + 16 * grp;
        if (idx < n_chunks * 2 && t < p.m && kgs[b] < p.k)
          load_group(p.x_type, p.a + static_cast<int64_t>(t) * p.lda + static_cast<int64_t>(kgs[b]) * eb, raw[b]);
      }
#pragma unroll
      for (int b = 0; b < kQBatch; ++b) {
        const int idx = base + b * kSmallThreads;
        if (idx >= n_chunks * 2) break;
        const int chunk = idx >> 1, grp = idx & 1;
        const int rem = chunk - ts[b] * per_token;
        const int blk = rem >> 3, c = rem & 7;
        uint8_t s8 = 0;
        uint32_t w[2] = {0, 0};
        if (ts[b] < p.m && kgs[b] < p.k) quantize_loaded(p.x_type, raw[b], gs, s8, w[0], w[1]);
        const __half2_raw sr =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s8 | (s8 << 8)), __NV_E4M3);
        const __half2 sc = __hmul2(*reinterpret_cast<const __half2*>(&sr), fold);
        uint8_t* dst = smem + ((blk * tok + ts[b]) * 4 + (c & 3)) * kSmallTigBytes + (c >> 2) * 64 + grp * 32;
#pragma unroll
        for (int v = 0; v < 2; ++v)
          *reinterpret_cast<uint4*>(dst + v * 16) = decode_a_word(w[v], sc, fold);
      }
    }
  };
  // Quantizing A needs more registers than the B blocks leave free: it runs before their loads are issued.
  if (quantize) stage_quantized();
  else load_a(tid);

  // Then B: DEPTH blocks per lane are in flight while the CTA decodes A.
  constexpr int kDepth = kRing ? 1 : DEPTH;
  BBlock buf[kDepth];
  if constexpr (!kRing) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
      if (d < nkb) load_bblock(buf[d], p, row, sf_off, sf_off8, sf_rb_base, kb0 + d, tig);
  }

  if (!quantize) {
    store_a(tid);
    for (int base = tid + kBatch * kSmallThreads; base < n_items; base += kBatch * kSmallThreads) {
      load_a(base);
      store_a(base);
    }
  }
  __syncthreads();

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  if constexpr (kRing) {
    // One block per iteration: wait for this thread's copies of block blk, take them into registers, refill
    // the slot emptied one iteration ago, then compute.
    for (int blk = 0; blk < nkb; ++blk) {
      cp_async_wait<RING - 2>();
      read_ring_bblock(buf[0], ring, blk % RING, tig);
      const int nb = blk + RING - 1;
      if (nb < nkb) issue_ring_bblock(ring_s, nb % RING, p, row, sf_off, sf_off8, sf_rb_base, kb0 + nb, tig);
      cp_async_commit();
      compute_bblock<NT, E, true>(buf[0], smem + blk * tok * 4 * kSmallTigBytes, g, tig, nt_live, acc, tok);
    }
  } else {
    for (int base = 0; base < nkb; base += DEPTH) {
#pragma unroll
      for (int d = 0; d < DEPTH; ++d) {
        const int blk = base + d;
        if (blk < nkb) {
          compute_bblock<NT, E>(buf[d], smem + blk * tok * 4 * kSmallTigBytes, g, tig, nt_live, acc);
          if (blk + DEPTH < nkb) load_bblock(buf[d], p, row, sf_off, sf_off8, sf_rb_base, kb0 + blk + DEPTH, tig);
        }
      }
    }
  }

  cudaTriggerProgrammaticLaunchCompletion();  // past the main loop: the successor may launch

  if (kRing && p.cluster) {
    // The splits of this row block are one cluster: each thread leaves its partials in its own ring slot 0,
    // and split 0 sums all of them in split order (bitwise the same on every call, as the workspace path).
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cp_async_wait<0>();  // the (empty) trailing copy groups: nothing may still land in slot 0
    float4* mine = reinterpret_cast<float4*>(ring + threadIdx.x * 16);
#pragma unroll
    for (int j = 0; j < NT; ++j) mine[j * kSmallThreads] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    cluster.sync();
    if (split == 0) {
      for (int r = 1; r < p.splits; ++r) {
        const float4* theirs = cluster.map_shared_rank(mine, r);
        float4 v[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) v[j] = theirs[j * kSmallThreads];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          acc[j][0] += v[j].x; acc[j][1] += v[j].y; acc[j][2] += v[j].z; acc[j][3] += v[j].w;
        }
      }
    }
    cluster.sync();  // the peers' shared memory stays alive until split 0 has read it
    if (split != 0) return;
  } else if (p.splits > 1) {
    float4* part = p.partial + ((static_cast<int64_t>(rb) * p.splits + split) * 8 + warp) * NT * 32;
#pragma unroll
    for (int j = 0; j < NT; ++j) __stcg(part + j * 32 + lane, make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
    __threadfence();
    __syncthreads();
    cudaGridDependencySynchronize();  // the counter reset, where one was launched just before this grid, is done
    if (tid == 0) {
      uint32_t* counters = split_counters(p.counter_slot, p.counters);
      s_last = atomicAdd(counters + rb, 1u) == static_cast<uint32_t>(p.splits - 1);
      if (s_last) counters[rb] = 0;  // every split has arrived: zero for the next launch on this slot
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // Split order, whatever the arrival order: bitwise the same result on every call. The partials of
    // kBatch splits are loaded before any is added, so the sum waits one L2 round trip per batch.
    constexpr int kBatch = 16 / NT;
    const float4* base = p.partial + (static_cast<int64_t>(rb) * p.splits * 8 + warp) * NT * 32 + lane;
    const int64_t split_stride = 8 * NT * 32;
    float4 sum[NT];
    for (int q0 = 0; q0 < p.splits; q0 += kBatch) {
      float4 v[kBatch][NT];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (q0 + b < p.splits) v[b][j] = __ldcg(base + (q0 + b) * split_stride + j * 32);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (q0 + b >= p.splits) continue;
          if (q0 + b == 0) {
            sum[j] = v[b][j];
          } else {
            sum[j].x += v[b][j].x; sum[j].y += v[b][j].y; sum[j].z += v[b][j].z; sum[j].w += v[b][j].w;
          }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      acc[j][0] = sum[j].x;
      acc[j][1] = sum[j].y;
      acc[j][2] = sum[j].z;
      acc[j][3] = sum[j].w;
    }
  }

  const float alpha = alpha_of(p.alpha, p.alpha2);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = j * 8 + 2 * tig + (e & 1), col = row + (e >> 1) * 8;
      const float v = (acc[j][e] * p.out_mult) * alpha;
      switch (p.out_dtype) {
        case OutDtype::kFloat16: store_small<__half>(p, token, col, v); break;
        case OutDtype::kBFloat16: store_small<__nv_bfloat16>(p, token, col, v); break;
        default: store_small<float>(p, token, col, v); break;
      }
    }
  }
}

template <int TOKENS, int KBMAX, int DEPTH, int CTAS, int RING, AType A>
cudaError_t launch_small_m(const SmallMLaunch& l) {
  auto* kernel = small_m_kernel<TOKENS, KBMAX, DEPTH, CTAS, RING, A>;
  static OncePerDevice smem_limit;  // the attribute is per device (per_device.h)
  const cudaError_t attr = smem_limit.run(
      [&] { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmallMMaxSmem); });
  if (attr != cudaSuccess) return attr;
  cudaLaunchAttribute attrs[2];  // programmatic dependent launch: see the note at the top
  cudaLaunchConfig_t cfg = launch_config(dim3(l.row_blocks, l.params.splits), dim3(kSmallThreads), l.smem, l.stream,
                                         /*pdl=*/true, attrs);
  if (l.params.cluster) add_cluster_dim(cfg, dim3(1, l.params.splits, 1));  // a row block's splits: one cluster
  return cudaLaunchKernelEx(&cfg, kernel, l.params);
}

}  // namespace nvfp4_gemm::sm90
