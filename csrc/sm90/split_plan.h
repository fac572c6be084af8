// How the wgmma kernel (sm90_gemm.cuh) splits K when a chunk's tiles do not fill the SMs: plain host arithmetic,
// without CUDA, so that CI checks it on a CPU (tests/sm90_host/split_plan_test.cpp). backend.cu feeds it the
// device's numbers (SMs, the clusters it holds at once) and sizes the workspace from the same functions that pick
// the split, so that workspace_bytes() and run() always agree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/problem.h"

namespace nvfp4_gemm::sm90 {

inline constexpr int kMaxGemmCluster = 8;  // CTAs of one cluster and K slices of one tile, at most (portable size)

// Fixed time of one wave of CTAs in the cost model: its first stage's loads and its epilogue (~4-5 us measured at
// M = 128, docs/SM90_NOTES.md's timeline trace), paid again by every later wave.
inline constexpr double kWaveSeconds = 4.0e-6;

struct SplitInputs {
  int tiles = 0;                  // B-row x token tiles of the chunk
  int ktiles = 0;                 // K tiles of one tile
  int sms = 0;                    // CTAs one wave holds (SMs x CTAs per SM)
  double t_tile = 0.0;            // the cost model's seconds per K tile of one CTA
  int64_t tile_bytes = 0;         // one tile's fp32 sums: tokens x the tile's B rows (128 or 256) x 4 bytes
  double wave_seconds = kWaveSeconds;  // a wave's fixed time (select's model: the config's measured one)
  int64_t workspace_left = 0;     // what the workspace bound leaves once decoded A is placed
  int forced = 0;                 // a forced split count (tests and benchmarks); 0: automatic
  bool clusters = false;          // the config and the caller allow the cluster split
};

// GemmParams' grid, cluster and cluster_groups (sm90_gemm.cuh).
struct Split {
  int grid = 0;
  int cluster = 1;  // 1: the balanced split over `grid` CTAs; S > 1: clusters of S CTAs
  int groups = 1;   // clusters per tile (cluster > 1)
};

// Counters the split counts arrivals on: one per tile for the balanced split, one per tile and cluster rank where
// a tile has several clusters, none otherwise.
inline int64_t split_counters(const SplitInputs& in, const Split& sp) {
  if (sp.cluster > 1) return sp.groups > 1 ? static_cast<int64_t>(in.tiles) * sp.cluster : 0;
  return sp.grid != in.tiles ? in.tiles : 0;
}

// Workspace bytes for partial sums: two segments per CTA for the balanced split (only the first and the last tile
// of a CTA's contiguous range can be partial), one tile per cluster where a tile has several clusters, none
// otherwise.
inline int64_t split_partial_bytes(const SplitInputs& in, const Split& sp) {
  if (sp.cluster > 1) return sp.groups > 1 ? static_cast<int64_t>(in.tiles) * sp.groups * in.tile_bytes : 0;
  return sp.grid != in.tiles ? static_cast<int64_t>(sp.grid) * 2 * in.tile_bytes : 0;
}

inline int64_t split_workspace_bytes(const SplitInputs& in, const Split& sp) {
  return split_partial_bytes(in, sp) + round_up(split_counters(in, sp) * 4, 256);
}

// The cost model's time to fix up a split: partial sums of `bytes` a contributor written, then read back by the last
// arriver (~50 GB/s a CTA), plus ~1 us of counting.
inline double fixup_seconds(double bytes) { return 1.0e-6 + 1.5 * bytes / 50e9; }

// The balanced split. Candidates: one CTA per tile (no partial sums); g > tiles CTAs over whole waves that cut the
// tiles x ktiles units into equal contiguous ranges; and, where the tiles need more than one wave, one wave of
// `sms` CTAs ("stream-K"): each range then holds whole tiles in its middle, stored directly, and at most two
// partial ones, its first and its last, so two partial slots a CTA still suffice. Cost = waves x (K tiles per
// CTA x t_tile + the wave's fixed time), plus the fix-up of a split (partials written, the last arriver reads them back).
// A forced count f runs tiles x f CTAs (at most one per unit, within the workspace).
inline Split choose_grid(const SplitInputs& in, double* cost_out = nullptr) {
  const int64_t total = static_cast<int64_t>(in.tiles) * in.ktiles;
  const int64_t slot_bytes = 2 * in.tile_bytes;
  const int64_t counters = round_up(static_cast<int64_t>(in.tiles) * 4, 256);
  const int64_t max_partial = in.workspace_left - counters;
  Split sp;
  if (in.forced > 0) {
    const int64_t fit = std::max<int64_t>(in.tiles, max_partial / slot_bytes);
    sp.grid = static_cast<int>(std::min<int64_t>({static_cast<int64_t>(in.tiles) * in.forced, total, fit}));
    if (cost_out) *cost_out = 0.0;
    return sp;
  }
  auto cost = [&](int64_t g) {
    const double waves = std::ceil(static_cast<double>(g) / in.sms);
    double c = waves * (std::ceil(static_cast<double>(total) / g) * in.t_tile + in.wave_seconds);
    if (g != in.tiles) c += fixup_seconds(static_cast<double>(slot_bytes));
    return c;
  };
  int64_t best = in.tiles;
  double best_cost = cost(in.tiles);
  auto consider = [&](int64_t g) {
    const double c = cost(g);
    if (c < best_cost * 0.97) {
      best_cost = c;
      best = g;
    }
  };
  if (in.tiles > in.sms && static_cast<int64_t>(in.sms) * slot_bytes <= max_partial) consider(in.sms);
  for (int64_t w = 1; w <= 8; ++w) {
    const int64_t g = std::min<int64_t>(w * in.sms, total);
    if (g <= in.tiles) continue;
    if (g * slot_bytes > max_partial) break;
    consider(g);
  }
  sp.grid = static_cast<int>(best);
  if (cost_out) *cost_out = best_cost;
  return sp;
}

// The balanced split, or, where the model says it costs less, each tile's K cut into S x G slices run by G clusters
// of S CTAs whose sums meet in distributed shared memory: no partials through L2 (G = 1), or 1/S of a tile's
// partials per CTA (G > 1), and no last arriver reading a whole tile per contributor. Taken only where the grid is
// one wave whose clusters the device holds at once (`cap(S)`: clusters of S CTAs held at once; an H100 holds 66 of
// 2 but only 30 of 4 of this kernel), every slice has at least two K tiles, and the partials fit the workspace.
template <typename Cap>
Split choose_split(const SplitInputs& in, Cap&& cap, double* cost_out = nullptr) {
  double best = 0.0;
  Split sp = choose_grid(in, &best);
  if (cost_out) *cost_out = best;
  if (in.forced > 0 || !in.clusters) return sp;
  for (int size = 2; size <= kMaxGemmCluster; ++size) {
    for (int groups = 1; size * groups <= kMaxGemmCluster; ++groups) {
      const int slices = size * groups;
      if (in.ktiles < 2 * slices || static_cast<int64_t>(in.tiles) * slices > in.sms) break;
      const Split c_sp{in.tiles * slices, size, groups};
      if (split_workspace_bytes(in, c_sp) > in.workspace_left) break;
      double c = std::ceil(static_cast<double>(in.ktiles) / slices) * in.t_tile + in.wave_seconds + 0.5e-6;
      if (groups > 1) c += fixup_seconds(groups * static_cast<double>(in.tile_bytes) / size);  // 1/S each
      if (c < best && static_cast<int64_t>(cap(size)) >= static_cast<int64_t>(in.tiles) * groups) {
        best = c;
        sp = c_sp;
      }
    }
  }
  if (cost_out) *cost_out = best;
  return sp;
}

// Token tiles per launch where decoded A holds at most `max_tiles` of the problem's `total` token tiles at once:
// launches of c tiles and one of the rest, c chosen for the least summed cost, launch_cost(tiles, c) being the
// split model's time of a launch of `tiles` token tiles with the workspace sized for c (split buffers take what
// decoded A leaves). The largest c wins ties within 1% (fewer launches). Whole waves matter: 8 token tiles of 32
// B-row tiles on 132 SMs at most 5 a launch run as 5 + 3 in 2 + 1 waves of whole tiles but as 4 + 4 in 1 + 1.
// Launches of fewer than half the bound are not considered (more launches, each its own first and last wave).
template <typename LaunchCost>
int chunk_token_tiles(int total, int max_tiles, LaunchCost&& launch_cost) {
  if (total <= max_tiles) return total;
  int best = max_tiles;
  double best_cost = 0.0;
  for (int c = max_tiles; c >= std::max(1, (max_tiles + 1) / 2); --c) {
    const int rest = total % c;
    const double cost = (total / c) * launch_cost(c, c) + (rest ? launch_cost(rest, c) : 0.0);
    if (c == max_tiles || cost < best_cost * 0.99) {
      best = c;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace nvfp4_gemm::sm90
