// Hopper grouped (mixture-of-experts) NVFP4 GEMM for the decode regime: the K-sliced kernel of sm90_wk.cuh
// turned into one persistent launch over all groups. Torch-free.
//
// Work: group g's rows [start_g, end_g) come in chunks of TOKENS (the last one partial); a work item is
// (group, 128-row block of B, K split, chunk). Every CTA first reads offs (after griddepcontrol.wait: the
// routing may be the kernel ahead's output) and scans it in shared memory: each offset clamped to [0, t], a
// running max (a decrease makes an empty group), the chunks per group and, for NVFP4 A, each group's first
// padded row of the grouped blocked sfa. From the total chunk count every CTA derives the same split count and
// item count, then walks items blockIdx.x, + gridDim.x, ... (the grid is one wave: SMs x resident CTAs per SM).
// Empty groups own no item, so they cost nothing; no host sync, so a captured graph stays valid when the
// routing changes between replays.
//
// Item order: a group's items are contiguous and, inside a group, the chunks of one (row block, split) are
// neighbours, so a weight tile wanted by several chunks (a group with more than TOKENS rows) is read by CTAs
// that run at the same time: from HBM once, then from L2.
//
// Pipeline: as in the K-sliced kernel (one producer warp issuing TMA boxes of B [g][n][k/2] through a 3-D map,
// the stage's scale atoms of B and A, and A's box of TOKENS rows at the chunk's first row; 8 consumer warps,
// warp (rg, ks) taking 64 rows x 64 K of each 256-K stage), but continuous over the CTA's items: the producer
// runs ahead into the next item while the consumers finish the current one. The producer alone maps an item
// index to its (group, chunk, row block, split) (a binary search over the groups and four divisions, ~500 cycles)
// and hands the result to the consumers through a ring in shared memory (s_items), so that the item's path through
// the consumers holds no search. Rows of the box past the group's end belong to other groups (or are zero past
// t): they are multiplied like the others and never stored, and no token's column mixes with another's in the
// MMA. The K-slice sums go through a buffer of their own (not the pipeline's bytes, which the producer is already
// refilling), 8 tokens a round (16 at 32 tokens).
//
// Numerics: exactly those of sm90_wk.cuh per (row, token): the same decode, the same MMA order over a stage, the
// four K slices summed in slice order, splits summed in split order by the last arriver, then
// 2^7 * alpha[g] and one rounding. With one split per tile the bits equal the dense K-sliced kernel's run on
// the group alone with one split.
#pragma once

#include "sm90/grouped_schedule.h"
#include "sm90/sm90_wk.cuh"

namespace nvfp4_gemm::sm90 {

static_assert(kGwkCounterRows <= kSplitCounterRows, "a tile's split counter lies in one counter slot");

// Pipeline depth per token tile: 8 tokens 4 stages (22 KB each for 16-bit A), 16 tokens 3 (26 KB): with the
// K-slice buffer (17 KB) and the group arrays, two CTAs fit an SM up to ~460 groups (8 tokens) and ~1200 (16);
// past that the grid is one CTA per SM (grouped_backend.cu asks the occupancy calculator). 32 tokens: 4 stages
// (34 KB) at one CTA per SM, because its accumulators (64 per thread) and fragments of A (32) do not fit the
// 112 registers of two CTAs per SM (ptxas: 96 at 16 tokens).
constexpr int gwk_stages(int tokens) { return tokens == 16 ? 3 : 4; }
constexpr int gwk_ctas(int tokens) { return tokens == 32 ? 1 : 2; }
// Tokens per round of the K-slice sums: 8 (17 KB), or 16 (34 KB) at 32 tokens, where one CTA per SM leaves the room
// and a round costs the CTA's consumers two barriers with no other CTA on the SM to fill them.
constexpr int gwk_red_tokens(int tokens) { return tokens == 32 ? 16 : 8; }
constexpr int gwk_red_bytes(int tokens) { return 4 * gwk_red_tokens(tokens) * kWkRedStride * 4; }
inline constexpr int kGwkMaxGroups = 4096;
// Per group: the first row (start), the cumulative chunk count, the first padded row of sfa; plus one start.
constexpr int gwk_group_bytes(int groups) { return (3 * groups + 1) * 4; }
constexpr int gwk_fixed_bytes(int tokens, bool a4) {
  return gwk_stages(tokens) * wk_stage_bytes(tokens, a4) + gwk_red_bytes(tokens) + 2 * gwk_stages(tokens) * 8 + 1024;
}
constexpr int gwk_smem_bytes(int tokens, bool a4, int groups) {
  return gwk_fixed_bytes(tokens, a4) + gwk_group_bytes(groups);
}

struct GwkParams {
  CUtensorMap tmap_a;   // A [t][K] 16-bit, box {64, TOKENS}; or packed e2m1 [t][K/2] bytes, box {128, TOKENS};
                        // SWIZZLE_128B
  CUtensorMap tmap_b;   // B [g][n][K/2] bytes, box {128, 128, 1}, SWIZZLE_128B
  const uint8_t* sfb;   // [g] blocked scales of B, sfb_group_bytes apart
  const uint8_t* sfa;   // e2m1 A: the grouped blocked scales, sfa_blocks 128-row blocks
  const int32_t* offs;  // [g] cumulative row ends (device)
  const float* alpha;   // [g] or nullptr
  void* c;              // [t][ldc] of out_dtype
  float* partial;       // [max_items][TOKENS][128] fp32 (split items)
  uint32_t* counters;   // [kSplitCounterRows] zeroed workspace counters, when counter_slot < 0
  int counter_slot;     // >= 0: split_counters.cuh's slot (zero at launch, left zero)
  int64_t ldc;
  int64_t sfb_group_bytes;
  int t, n, k, g;
  int row_blocks;       // ceil(n / 128)
  int kblocks;          // K / 256
  int sf_atoms;         // K / 64
  int sfa_blocks;       // sfa_rows / 128 (e2m1 A)
  int max_items;        // split items the partial buffer holds (>= gridDim.x)
  int forced_splits;    // tests: > 0 forces this split count where the buffers allow it; 0: automatic
  int offs_ready;       // GroupedProblem::offs_ready: offs, B and sfb may be read before the grid dependency resolves
  float out_mult;       // 2^7
  OutDtype out_dtype;
};

// A work item as the producer found it (grouped_schedule.h) and its stage count, for the consumers.
struct GwkSlot {
  GwkItem it;
  int nkb;
};

// The s_items entry of the CTA's item w (blockIdx.x, + gridDim.x, ...): its count among the CTA's items, mod ring.
__device__ __forceinline__ int gwk_ring_index(int w, int ring) {
  return (w - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) % ring;
}

// Exclusive running max over the CTA's kThreads threads (values >= 0, identity 0); `total` gets the CTA's max.
// s_warp holds one word per warp.
template <int kThreads>
__device__ __forceinline__ int gwk_block_max_scan(int v, int* s_warp, int& total) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xFFFFFFFFu, x, d);
    if (lane >= d) x = max(x, y);
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  int pre = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int y = s_warp[w];
    if (w < warp) pre = max(pre, y);
    all = max(all, y);
  }
  __syncthreads();  // s_warp free for the next scan
  total = all;
  int ex = __shfl_up_sync(0xFFFFFFFFu, x, 1);
  if (lane == 0) ex = 0;
  return max(pre, ex);
}

// Exclusive sums of two values at once over the CTA's kThreads threads (values >= 0): one pair of barriers for
// both. s_warp holds two words per warp.
template <int kThreads>
__device__ __forceinline__ int2 gwk_block_sum2(int a, int b, int* s_warp, int& total_a, int& total_b) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = a, y = b;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int xa = __shfl_up_sync(0xFFFFFFFFu, x, d), yb = __shfl_up_sync(0xFFFFFFFFu, y, d);
    if (lane >= d) x += xa, y += yb;
  }
  if (lane == 31) s_warp[2 * warp] = x, s_warp[2 * warp + 1] = y;
  __syncthreads();
  int pa = 0, pb = 0, ta = 0, tb = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int wa = s_warp[2 * w], wb = s_warp[2 * w + 1];
    if (w < warp) pa += wa, pb += wb;
    ta += wa, tb += wb;
  }
  __syncthreads();  // s_warp free for the next scan
  total_a = ta, total_b = tb;
  return make_int2(pa + x - a, pb + y - b);  // inclusive minus own: exclusive
}

template <typename T>
__device__ __forceinline__ void gwk_store(const GwkParams& p, int row, int col, float v) {
  reinterpret_cast<T*>(p.c)[static_cast<int64_t>(row) * p.ldc + col] = convert_out<T>(v);
}

template <int TOKENS, AType A>
__global__ void __launch_bounds__(kWkThreads, gwk_ctas(TOKENS)) gwk_kernel(const __grid_constant__ GwkParams p) {
  static_assert(TOKENS == 8 || TOKENS == 16 || TOKENS == 32, "one, two or four n-tiles of 8 tokens");
  static_assert(A == AType::kE2m1 || A == AType::kFloat16 || A == AType::kBFloat16, "e2m1, fp16 or bf16 A");
  constexpr bool kA4 = A == AType::kE2m1;
  constexpr Elem E = A == AType::kBFloat16 ? Elem::kBf16 : Elem::kHalf;
  constexpr int STAGES = gwk_stages(TOKENS);
  constexpr int NT = TOKENS / 8;
  constexpr int kStage = wk_stage_bytes(TOKENS, kA4);
  constexpr int kSfOff = kWkBBytes;
  constexpr int kAOff = kWkBBytes + kWkSfBytes;
  constexpr int kABox = kA4 ? TOKENS * kWkK / 2 : TOKENS * 128;
  constexpr int kAsfOff = kAOff + kABox;
  constexpr int kRedOff = STAGES * kStage;
  constexpr int kBarOff = kRedOff + gwk_red_bytes(TOKENS);
  constexpr int RT = gwk_red_tokens(TOKENS), RJ = RT / 8;  // tokens and n-tiles per round of the K-slice sums
  static_assert(kAOff % 1024 == 0 && kStage % 1024 == 0 && kABox % 1024 == 0, "swizzled boxes at 1024-byte offsets");
  // Per CTA: the dynamic bytes, 2 KB of static shared memory (the 1024-aligned dynamic base) and 1 KB reserved.
  static_assert(gwk_ctas(TOKENS) * (gwk_smem_bytes(TOKENS, kA4, 256) + 3072) <= 233472,
                "gwk_ctas(TOKENS) CTAs per SM at 256 groups");
  static_assert(gwk_smem_bytes(TOKENS, kA4, kGwkMaxGroups) + 3072 <= 233472, "one CTA per SM at the most groups");
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  using Dec = BDecode<E>;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (cute::cast_smem_ptr_to_uint(smem_raw) & 1023u)) & 1023u);
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + kBarOff);
  uint64_t* empty_bar = full_bar + STAGES;
  int* s_start = reinterpret_cast<int*>(empty_bar + STAGES);  // [g + 1]
  int* s_cum = s_start + p.g + 1;                              // [g]
  int* s_pad = s_cum + p.g;                                    // [g]
  __shared__ int s_warp[2 * (kWkThreads / 32)];
  // The CTA's items in flight, written by the producer as it issues an item's first stage (after that stage's empty
  // barrier: the consumers have then left the item kRing back, whose entry this was) and read by the consumers
  // once that stage has landed (the full barrier's arrive releases the entry's stores). STAGES + 1 entries: the
  // producer runs at most STAGES stages, so STAGES items, ahead of the item the consumers are finishing.
  constexpr int kRing = STAGES + 1;
  __shared__ GwkSlot s_items[kRing];
  __shared__ uint32_t s_last;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      Barrier::init(&full_bar[s], 1);
      EmptyBarrier::init(&empty_bar[s], kWkConsumers / 32);
    }
    cutlass::arch::fence_barrier_init();
  }
  if (threadIdx.x == kWkConsumers) {
    cute::prefetch_tma_descriptor(&p.tmap_a);
    cute::prefetch_tma_descriptor(&p.tmap_b);
  }

  // The routing: offs may be the kernel ahead's output, as may A, B, the scales and alpha. With offs_ready only A,
  // sfa and alpha may be: the producer then streams the first stages' B and scales of B before it waits (below), and
  // the consumers wait before their first stage (they read alpha and write C).
  if (!p.offs_ready) cudaGridDependencySynchronize();

  // Scan of offs, each thread a contiguous run of groups: pass 1 the running max of the clamped ends (group
  // j's rows are [max(end_0 .. end_{j-1}), max(end_0 .. end_j)): a decrease makes an empty group), pass 2 the
  // chunk and padded-row counts (one scan for both: every barrier pair here is on the path from the grid
  // dependency to the first weight load). Integers throughout: every CTA finds the same work list.
  const int per = (p.g + kWkThreads - 1) / kWkThreads;
  const int j0 = min(p.g, static_cast<int>(threadIdx.x) * per), j1 = min(p.g, j0 + per);
  int run = 0;
  for (int j = j0; j < j1; ++j) run = max(run, gwk_clamped_end(__ldg(p.offs + j), p.t));
  int rows_total = 0;
  int start = gwk_block_max_scan<kWkThreads>(run, s_warp, rows_total);
  int chunks = 0, pads = 0;
  for (int j = j0; j < j1; ++j) {
    s_start[j] = start;
    const int end = max(start, gwk_clamped_end(__ldg(p.offs + j), p.t));
    chunks += (end - start + TOKENS - 1) / TOKENS;
    pads += (end - start + 127) / 128 * 128;
    start = end;
  }
  if (threadIdx.x == 0) s_start[p.g] = rows_total;
  int total_chunks = 0, total_pad = 0;
  const int2 ex = gwk_block_sum2<kWkThreads>(chunks, pads, s_warp, total_chunks, total_pad);
  int cum = ex.x, pad = ex.y;
  for (int j = j0; j < j1; ++j) {
    const int m = s_start[j + 1] - s_start[j];
    cum += (m + TOKENS - 1) / TOKENS;
    s_cum[j] = cum;
    s_pad[j] = pad;
    pad += (m + 127) / 128 * 128;
  }
  // The schedule: items, row blocks x splits, splits, stages per split. Kept in shared memory and read where
  // used, so that the consumers' main loop holds none of it in registers (at 16 tokens it would spill).
  __shared__ int s_sched[4];
  if (threadIdx.x == 0) {
    const int tiles = total_chunks * p.row_blocks;
    const int splits = gwk_splits(tiles, gridDim.x, p.max_items, p.kblocks, p.forced_splits);
    s_sched[0] = tiles * splits;
    s_sched[1] = p.row_blocks * splits;
    s_sched[2] = splits;
    s_sched[3] = (p.kblocks + splits - 1) / splits;
  }
  __syncthreads();

  if (warp == kWkConsumers / 32) {  // the producer
    if (lane == 0) {
      const int items = s_sched[0], rbs = s_sched[1], splits = s_sched[2], kb_per = s_sched[3];
      int s = 0, phase = 0, loads = 0, n = 0;
      // A's box (and its scales) of stage s at K block kb.
      auto load_a = [&](int s, int kb, int row0, const uint8_t* sfa) {
        uint8_t* st = smem + s * kStage;
        if constexpr (kA4) {
          cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &full_bar[s], 0, st + kAOff, kb * (kWkK / 2), row0);
          bulk_copy_g2s(st + kAsfOff, sfa + static_cast<int64_t>(kb) * 4 * kSfAtomBytes, kWkSfBytes, &full_bar[s]);
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &full_bar[s], 0, st + kAOff + q * kABox, kb * kWkK + q * 64, row0);
        }
      };
      // offs_ready: the CTA's first STAGES stages get B and the scales of B at once, their A once the grid dependency
      // has resolved (the kernel ahead may be writing A): those loads wait here, at most STAGES of them.
      int pend_kb[STAGES], pend_row0[STAGES], npend = 0;
      const uint8_t* pend_sfa[STAGES];
      auto load_pending = [&]() {
        cudaGridDependencySynchronize();
        for (int x = 0; x < npend; ++x) load_a(x, pend_kb[x], pend_row0[x], pend_sfa[x]);  // stage x: the first ones
        npend = 0;
      };
      for (int w = blockIdx.x; w < items; w += gridDim.x) {
        const GwkItem it = gwk_item<TOKENS>(w, s_start, s_cum, s_pad, p.g, rbs, splits);
        const int kb0 = it.split * kb_per, nkb = min(kb_per, p.kblocks - kb0);
        const uint8_t* sfb = p.sfb + static_cast<int64_t>(it.g) * p.sfb_group_bytes +
                             static_cast<int64_t>(it.rb) * p.sf_atoms * kSfAtomBytes;
        const uint8_t* sfa = nullptr;
        if constexpr (kA4) {  // clamped: never read past the buffer (the consumers write those rows as NaN)
          const int blk = min(it.pad_row0 / 128, p.sfa_blocks - 1);
          sfa = p.sfa + static_cast<int64_t>(blk) * p.sf_atoms * kSfAtomBytes;
        }
        for (int i = 0; i < nkb; ++i, ++loads) {
          if (p.offs_ready) {
            if (loads == STAGES) load_pending();  // before the first stage is waited for again
          } else if (loads == 1) {
            // The CTA's first stage alone, the rest once it has landed (sm90_wk.cuh, "Filling the pipeline").
            Barrier::wait(&full_bar[0], 0);
          }
          EmptyBarrier::wait(&empty_bar[s], phase ^ 1);
          if (i == 0) {
            s_items[n] = GwkSlot{it, nkb};
            if (++n == kRing) n = 0;
            asm volatile("" ::: "memory");  // the entry's stores stay ahead of the arrive (release) below
          }
          const int kb = kb0 + i;
          uint8_t* st = smem + s * kStage;
          Barrier::arrive_and_expect_tx(&full_bar[s], kStage);
          cute::SM90_TMA_LOAD_3D::copy(&p.tmap_b, &full_bar[s], 0, st, kb * (kWkK / 2), it.rb * kWkRows, it.g);
          bulk_copy_g2s(st + kSfOff, sfb + static_cast<int64_t>(kb) * 4 * kSfAtomBytes, kWkSfBytes, &full_bar[s]);
          if (p.offs_ready && loads < STAGES) {
            pend_kb[npend] = kb;
            pend_row0[npend] = it.row0;
            pend_sfa[npend] = sfa;
            ++npend;
          } else {
            load_a(s, kb, it.row0, sfa);
          }
          if (++s == STAGES) s = 0, phase ^= 1;
        }
      }
      if (npend > 0) load_pending();  // a CTA of fewer than STAGES stages
    }
    return;
  }

  // The consumers: as in sm90_wk.cuh.
  const int g = lane >> 2, tig = lane & 3;
  const int rg = warp >> 2, ks = warp & 3;
  const int sigma = 2 * (g & 3) + (g >> 2);
  const int row_base = rg * 64 + sigma;
  uint32_t b_off = row_base * 128 + ((((2 * ks + (tig >> 1)) ^ sigma)) << 4) + (tig & 1) * 8;
  auto sf_at = [&](int r) { return kSfOff + ks * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4 + tig; };
  const uint32_t a_off = kAOff + ks * kABox + g * 128;
  const uint32_t a_c0 = ((2 * tig) ^ g) << 4, a_c1 = ((2 * tig + 1) ^ g) << 4;
  const uint32_t a4_off = kAOff + g * 128 + ((((2 * ks + (tig >> 1)) ^ g)) << 4) + (tig & 1) * 8;
  uint32_t sfo[4][2];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    sfo[mt][0] = sf_at(row_base + 16 * mt);
    sfo[mt][1] = sf_at(row_base + 16 * mt + 8);
  }
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) asm volatile("" : "+r"(sfo[mt][0]), "+r"(sfo[mt][1]));
  asm volatile("" : "+r"(b_off));

  if (p.offs_ready) cudaGridDependencySynchronize();  // alpha and C, below, may be the kernel ahead's
  float* red = reinterpret_cast<float*>(smem + kRedOff);  // [ks][RT tokens][kWkRedStride]
  const int t = threadIdx.x;
  constexpr int kPer = TOKENS * kWkRows / kWkConsumers;  // values per thread: TOKENS / 2
  int s = 0, phase = 0;
  for (int w = blockIdx.x; w < s_sched[0]; w += gridDim.x) {
    const int n = gwk_ring_index(w, kRing);
    float acc[4][NT][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;

    // The item's first stage, then its entry (s_items): the main loop keeps only these three.
    int nkb = 1, nt_live = NT, a_row0 = 0;
    for (int i = 0; i < nkb; ++i) {
      Barrier::wait(&full_bar[s], phase);
      if (i == 0) {
        asm volatile("" ::: "memory");  // no read of the entry ahead of the wait
        const volatile GwkSlot& slot = s_items[n];
        nkb = slot.nkb;
        nt_live = min(NT, (slot.it.rows + 7) / 8);
        a_row0 = slot.it.pad_row0 % 128;
      }
      const uint8_t* st = smem + s * kStage;
      uint32_t af[NT][8];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (NT > 1 && j >= nt_live) break;
        if constexpr (kA4) {
          const uint2 wa = *reinterpret_cast<const uint2*>(st + a4_off + j * 8 * 128);
          const int r = a_row0 + 8 * j + g;
          const uint8_t sc = st[kAsfOff + ks * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4 + tig];
          const uint32_t s2 = Dec::scales(static_cast<uint16_t>(sc | (sc << 8)));
          const __half2 sa = *reinterpret_cast<const __half2*>(&s2), fold = __half2half2(__ushort_as_half(0x5800));
          const uint4 v0 = decode_a_word(wa.x, sa, fold), v1 = decode_a_word(wa.y, sa, fold);
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
        const uint2 w0 = *reinterpret_cast<const uint2*>(st + b_off + mt * 16 * 128);
        const uint2 w1 = *reinterpret_cast<const uint2*>(st + b_off + (mt * 16 + 8) * 128);
        const uint16_t sc = static_cast<uint16_t>(st[sfo[mt][0]] | (st[sfo[mt][1]] << 8));
        const uint32_t s2 = Dec::scales(sc);
        const uint32_t s0 = low_pair(s2), s1 = high_pair(s2);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
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
    if (w + static_cast<int>(gridDim.x) >= s_sched[0]) cudaTriggerProgrammaticLaunchCompletion();  // the CTA's last item
    const int splits = s_sched[2];
    // The entry stays until this item's stages are all released (see s_items); its fields read where used
    // (volatile), not held through the sums. At 16 tokens with bf16 A the kernel sits at its 96-register bound:
    // ptxas keeps two loop-invariant words in local memory (one store per CTA, two L1 loads per item, none in the
    // main loop), where recomputing the item here (a binary search over the groups and four divisions: ~500 cycles
    // on every item's path) kept them in registers.
    const volatile GwkItem& it = s_items[n].it;

    // The 4 K slices of each (row, token) summed in slice order, RT tokens (RJ n-tiles) a round through red. The
    // barrier ahead of each round's writes also keeps them behind every read of the round (or item) before. A
    // round's n-tiles past the live rows hold zeros (never accumulated): summed, never stored.
    float v[kPer];
#pragma unroll
    for (int x = 0; x < kPer; ++x) v[x] = 0.f;
#pragma unroll
    for (int j0 = 0; j0 < NT; j0 += RJ) {
      if (NT > RJ && j0 >= nt_live) break;
      cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);
#pragma unroll
      for (int jj = 0; jj < RJ; ++jj)
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int token = 8 * jj + 2 * tig + (e & 1), row = row_base + 16 * mt + (e >> 1) * 8;
            red[(ks * RT + token) * kWkRedStride + row] = acc[mt][j0 + jj][e];
          }
      cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);
#pragma unroll
      for (int x = 0; x < 4 * RJ; ++x) {  // token 8 j0 + t / 128 + 2 x of the round's RT
        const float* r = red + (t / kWkRows + 2 * x) * kWkRedStride + t % kWkRows;
        v[4 * j0 + x] = ((r[0] + r[RT * kWkRedStride]) + r[2 * RT * kWkRedStride]) + r[3 * RT * kWkRedStride];
      }
    }
    if (splits > 1) {
      const int tile = it.tile;
      float* mine = p.partial + (static_cast<int64_t>(tile) * splits + it.split) * (TOKENS * kWkRows);
#pragma unroll
      for (int x = 0; x < kPer; ++x) __stcg(mine + x * kWkConsumers + t, v[x]);
      // As in sm90_wk.cuh: the barrier orders the CTA's stores before thread 0's release, its acquire the last
      // arriver's loads after every split's release.
      cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);
      uint32_t* counters = split_counters(p.counter_slot, p.counters);
      if (t == 0) {
        s_last = atomic_add_acq_rel(counters + tile, 1u) == static_cast<uint32_t>(splits - 1);
        if (s_last) counters[tile] = 0;  // every split has arrived: zero for the next launch
      }
      cutlass::arch::NamedBarrier::arrive_and_wait(kWkConsumers, 1);
      if (!s_last) continue;
      const float* base = p.partial + static_cast<int64_t>(tile) * splits * (TOKENS * kWkRows) + t;
      for (int q = 0; q < splits; ++q) {  // split order, whatever the arrival order
        float wv[kPer];
#pragma unroll
        for (int x = 0; x < kPer; ++x) wv[x] = __ldcg(base + static_cast<int64_t>(q) * (TOKENS * kWkRows) + x * kWkConsumers);
#pragma unroll
        for (int x = 0; x < kPer; ++x) v[x] = q == 0 ? wv[x] : v[x] + wv[x];
      }
    }
    float scale = p.alpha ? p.out_mult * __ldg(p.alpha + it.g) : p.out_mult;
    // A routing that needs more sfa rows than the buffer holds (the binding cannot see offs): the chunk's
    // scales lie past the buffer, so its rows are NaN, as on the generic path, never silently wrong numbers.
    if constexpr (kA4) {
      if (it.pad_row0 / 128 >= p.sfa_blocks) scale = __int_as_float(0x7fc00000);
    }
    const int col = it.rb * kWkRows + t % kWkRows, rows = it.rows, row0 = it.row0;
    if (col < p.n) {
#pragma unroll
      for (int x = 0; x < kPer; ++x) {
        const int token = (x / 4) * 8 + t / kWkRows + 2 * (x % 4);
        if (token >= rows) continue;
        switch (p.out_dtype) {
          case OutDtype::kFloat16: gwk_store<__half>(p, row0 + token, col, v[x] * scale); break;
          case OutDtype::kBFloat16: gwk_store<__nv_bfloat16>(p, row0 + token, col, v[x] * scale); break;
          default: gwk_store<float>(p, row0 + token, col, v[x] * scale); break;
        }
      }
    }
  }
}

// Launch of one config: the grid is one wave (num_sms x the CTAs per SM the group arrays leave room for).
struct GwkLaunch {
  GwkParams params;
  int grid;
  int smem;
  cudaStream_t stream;
};

// The kernel's shared-memory limit, set once per device to what the most groups need (per_device.h).
template <int TOKENS, AType A>
cudaError_t gwk_allow_smem() {
  static OncePerDevice smem_limit;
  return smem_limit.run([] {
    return cudaFuncSetAttribute(gwk_kernel<TOKENS, A>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                gwk_smem_bytes(TOKENS, A == AType::kE2m1, kGwkMaxGroups));
  });
}

template <int TOKENS, AType A>
cudaError_t launch_gwk(const GwkLaunch& l) {
  if (const cudaError_t e = gwk_allow_smem<TOKENS, A>(); e != cudaSuccess) return e;
  cudaLaunchAttribute attrs[1];
  const cudaLaunchConfig_t cfg = launch_config(dim3(l.grid), dim3(kWkThreads), l.smem, l.stream, /*pdl=*/true, attrs);
  return cudaLaunchKernelEx(&cfg, gwk_kernel<TOKENS, A>, l.params);
}

// CTAs of this config resident per SM with `smem` bytes of dynamic shared memory (0 on error).
template <int TOKENS, AType A>
int gwk_ctas_per_sm(int smem) {
  int n = 0;
  if (gwk_allow_smem<TOKENS, A>() != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gwk_kernel<TOKENS, A>, kWkThreads, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace nvfp4_gemm::sm90
