// The work list of the grouped K-sliced kernel (grouped_wk.cuh), as plain integer arithmetic that compiles for
// the host too, so that CI checks it on a CPU (tests/sm90_host/grouped_schedule_test.cpp): the group tables the
// kernel scans from offs, the split count it derives, and the mapping of a work item index to its (group, chunk,
// 128-row block of B, K split). No CUDA, no torch.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define NVFP4_GWK_HD __host__ __device__ __forceinline__
#else
#define NVFP4_GWK_HD inline
#endif

namespace nvfp4_gemm::sm90 {

inline constexpr int kGwkMaxSplits = 16;
inline constexpr int kGwkCounterRows = 512;  // split counters a launch may use: split_counters.cuh's slot size

NVFP4_GWK_HD int gwk_min(int a, int b) { return a < b ? a : b; }
NVFP4_GWK_HD int gwk_max(int a, int b) { return a > b ? a : b; }

// Group j's end as the kernel reads it: offs[j] clamped to [0, t].
NVFP4_GWK_HD int gwk_clamped_end(int32_t off, int t) { return gwk_min(gwk_max(off, 0), t); }

// The split count every CTA derives from the tile count (tiles = chunks x row blocks): one item per tile where the
// tiles fill the grid (`slots` CTAs), else as many K splits as fit the grid, within the partial buffer
// (max_items) and one counter per tile, each of at least kGwkMinSplitStages stages; spread evenly (the last
// split at most one stage short, none empty). forced > 0 (tests): that count where the buffers allow it, down to
// one stage a split.
//
// Why at least two stages: a split costs its item the fix-up (partials to L2, an atomic round trip, the last
// arriver's loads: two L2 round trips on the critical path) and saves the stages it moves to another CTA. A split
// of one stage saves at most one stage (~0.7 us at 8 tokens, two CTAs per SM), less than the fix-up; and at
// K = 768 (Qwen3-30B-A3B's down projection: 3 stages) the two splits of 2 and 1 stages landed two long items
// on half the SMs (the items of one SM are 132 apart, so they share the split's parity) while one item of 3
// stages per SM would have taken the same time without a fix-up.
inline constexpr int kGwkMinSplitStages = 2;
NVFP4_GWK_HD int gwk_splits(int tiles, int slots, int max_items, int kblocks, int forced) {
  if (tiles <= 0 || tiles > kGwkCounterRows) return 1;
  const int cap = gwk_min(gwk_min(slots, max_items) / tiles, gwk_min(kblocks, kGwkMaxSplits));
  const int s = forced > 0 ? gwk_min(forced, cap)
                           : (tiles >= slots ? 1 : gwk_min(cap, kblocks / kGwkMinSplitStages));
  if (s <= 1) return 1;
  const int kb = (kblocks + s - 1) / s;
  return (kblocks + kb - 1) / kb;
}

struct GwkItem {
  int g;         // group
  int row0;      // first row of A / C of the chunk
  int rows;      // live rows of the chunk (1 .. TOKENS)
  int rb;        // 128-row block of B
  int split;     // K split
  int tile;      // (group, row block, chunk) index in [0, tiles): the split counter and partials of the item
  int pad_row0;  // the chunk's first padded row in the grouped blocked sfa
};

// Work item w (0 <= w < tiles x splits) from the group tables: start[j] group j's first row (start[g] the end of
// the last), cum[j] the chunks of groups 0..j, pad[j] group j's first padded sfa row. Group j holds items
// [cum[j-1], cum[j]) x rbs (rbs = row blocks x splits), ordered (row block, split, chunk): the chunks of one weight
// tile are neighbours, so CTAs that run at the same time read it (from HBM once, then L2).
template <int TOKENS>
NVFP4_GWK_HD GwkItem gwk_item(int w, const int* start, const int* cum, const int* pad, int groups, int rbs, int splits) {
  const int q = w / rbs;  // the group is the first j with cum[j] > q
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (cum[mid] > q) hi = mid;
    else lo = mid + 1;
  }
  GwkItem it;
  it.g = lo;
  const int base = lo ? cum[lo - 1] : 0, chunks = cum[lo] - base;
  const int local = w - base * rbs;
  const int c = local % chunks, r = local / chunks;
  it.split = r % splits;
  it.rb = r / splits;
  it.row0 = start[lo] + c * TOKENS;
  it.rows = gwk_min(TOKENS, start[lo + 1] - it.row0);
  it.tile = base * (rbs / splits) + it.rb * chunks + c;
  it.pad_row0 = pad[lo] + c * TOKENS;
  return it;
}

// The tables the kernel's scan builds (host reference of that scan, serial): group j's rows are
// [max(end_0 .. end_{j-1}), max(end_0 .. end_j)) with end_i = offs[i] clamped to [0, t], so a decrease makes an
// empty group and the groups never overlap; chunks of TOKENS rows; padded sfa rows round_up(rows, 128).
inline void gwk_tables(const int32_t* offs, int groups, int t, int tokens, int* start, int* cum, int* pad) {
  int run = 0, chunks = 0, padded = 0;
  for (int j = 0; j < groups; ++j) {
    start[j] = run;
    const int end = gwk_max(run, gwk_clamped_end(offs[j], t));
    chunks += (end - run + tokens - 1) / tokens;
    cum[j] = chunks;
    pad[j] = padded;
    padded += (end - run + 127) / 128 * 128;
    run = end;
  }
  start[groups] = run;
}

}  // namespace nvfp4_gemm::sm90
