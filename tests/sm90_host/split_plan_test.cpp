// Host checks of the wgmma kernel's K-split planner (csrc/sm90/split_plan.h), run by tests/test_sm90_host.py.
// No GPU: the device's numbers are an H100's (132 SMs; clusters of 1..8 CTAs held at once by this kernel, measured
// with cudaOccupancyMaxActiveClusters, benchmarks/RESULTS.md) or made up for the sweep.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "sm90/split_plan.h"

using nvfp4_gemm::sm90::choose_split;
using nvfp4_gemm::sm90::chunk_token_tiles;
using nvfp4_gemm::sm90::kMaxGemmCluster;
using nvfp4_gemm::sm90::Split;
using nvfp4_gemm::sm90::split_counters;
using nvfp4_gemm::sm90::split_partial_bytes;
using nvfp4_gemm::sm90::split_workspace_bytes;
using nvfp4_gemm::sm90::SplitInputs;

namespace {

int failures = 0;

#define EXPECT(cond, ...)                                       \
  do {                                                          \
    if (!(cond)) {                                              \
      ++failures;                                               \
      std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                 \
      std::printf("\n");                                        \
    }                                                           \
  } while (0)

constexpr int kH100Caps[kMaxGemmCluster + 1] = {0, 132, 66, 39, 30, 22, 17, 15, 15};
constexpr int64_t kWorkspace = 63ll << 20;

// The inputs backend.cu forms for a config of `tokens` x `kt` (its k_tile_seconds, one CTA per SM).
SplitInputs inputs(int tiles, int ktiles, int tokens, int kt, int sms = 132) {
  SplitInputs in;
  in.tiles = tiles;
  in.ktiles = ktiles;
  in.sms = sms;
  const double stage = static_cast<double>(tokens) * kt * 2 + 128.0 * kt / 2 + (kt / 64) * 512.0;
  const double t_mma = 2.0 * 128 * tokens * kt / 5.0e12, t_mem = stage / (3.0e12 / sms);
  in.t_tile = t_mma > t_mem ? t_mma : t_mem;
  in.tile_bytes = static_cast<int64_t>(tokens) * 128 * 4;
  in.workspace_left = kWorkspace - 8ll * (1 << 20);
  in.clusters = true;
  return in;
}

Split h100(const SplitInputs& in) {
  return choose_split(in, [](int s) { return kH100Caps[s]; });
}

void expect_split(const Split& got, int grid, int cluster, int groups, const char* what) {
  EXPECT(got.grid == grid && got.cluster == cluster && got.groups == groups,
         "%s: got grid %d, cluster %d, groups %d; expected %d, %d, %d", what, got.grid, got.cluster, got.groups, grid,
         cluster, groups);
}

// Shapes of an 8B decoder and the benchmarks, as the H100 plans them.
void h100_shapes() {
  // (128, 4096, 7168) at 128 tokens: 32 tiles; clusters of 4 would need 32 at once (the H100 holds 30), so two
  // clusters of 2 per tile.
  expect_split(h100(inputs(32, 56, 128, 128)), 128, 2, 2, "32 tiles x 56 K tiles");
  // (512, 4096, 7168) at 256 tokens: 64 tiles in clusters of 2, one cluster per tile.
  expect_split(h100(inputs(64, 56, 256, 128)), 128, 2, 1, "64 tiles x 56 K tiles");
  // (128, 7168, 2048): 56 tiles in clusters of 2.
  expect_split(h100(inputs(56, 16, 128, 128)), 112, 2, 1, "56 tiles x 16 K tiles");
  // gate_up at M = 128 (224 tiles): more tiles than SMs, no cluster.
  EXPECT(h100(inputs(224, 32, 128, 128)).cluster == 1, "224 tiles take a cluster");
  // ... and one wave of 132 CTAs over its 224 tiles x 32 K tiles (54-55 K tiles a CTA), not two waves of whole
  // tiles (64 a CTA's SM) nor two of 264 (56); the same for gate_up at M = 64 and at M = 512 (448 tiles).
  expect_split(h100(inputs(224, 32, 128, 128)), 132, 1, 1, "gate_up, M = 128");
  expect_split(h100(inputs(224, 16, 64, 256)), 132, 1, 1, "gate_up, M = 64");
  expect_split(h100(inputs(448, 32, 256, 128)), 132, 1, 1, "gate_up, M = 512");
  // Without clusters allowed (a config of two CTAs per SM), or with a forced split count, the balanced split.
  SplitInputs off = inputs(32, 56, 128, 128);
  off.clusters = false;
  EXPECT(h100(off).cluster == 1 && h100(off).grid == 132, "clusters off: grid %d cluster %d", h100(off).grid,
         h100(off).cluster);
  SplitInputs forced = inputs(32, 56, 128, 128);
  forced.forced = 3;
  expect_split(h100(forced), 96, 1, 1, "forced 3 splits");
  // A device that holds no cluster of any size.
  const Split none = choose_split(inputs(32, 56, 128, 128), [](int) { return 0; });
  EXPECT(none.cluster == 1, "no cluster capacity, yet cluster %d", none.cluster);
}

// Every plan over a sweep of tile counts, K tile counts, token tiles, SM counts and capacities keeps the split's
// rules: one wave, every cluster resident at once, >= 2 K tiles a slice, within the workspace, and the workspace
// functions agree with the split.
void sweep() {
  const int configs[][2] = {{8, 256}, {16, 256}, {32, 256}, {64, 256}, {128, 128}, {256, 128}};
  int checked = 0, clustered = 0, grouped = 0, one_wave = 0;
  for (int sms : {132, 114, 78, 16}) {
    for (const auto& c : configs) {
      for (int tiles = 1; tiles <= 300; tiles += (tiles < 40 ? 1 : 7)) {
        for (int ktiles = 1; ktiles <= 160; ktiles += (ktiles < 20 ? 1 : 9)) {
          for (int capset = 0; capset < 3; ++capset) {
            SplitInputs in = inputs(tiles, ktiles, c[0], c[1], sms);
            if (capset == 2) in.workspace_left = 1 << 20;  // a tight workspace
            const Split sp = choose_split(in, [&](int s) {
              return capset == 0 ? kH100Caps[s] * sms / 132 : sms / s;  // the H100's shape scaled, or every SM
            });
            ++checked;
            // Fewer CTAs than tiles only as one wave over more tiles than it holds (each range then longer than a
            // tile, so no tile has more than two contributors and no CTA more than two partial tiles).
            EXPECT(sp.grid >= tiles || (sp.grid == sms && tiles > sms), "grid %d < tiles %d (sms %d)", sp.grid, tiles,
                   sms);
            EXPECT(split_workspace_bytes(in, sp) <= in.workspace_left || (sp.cluster == 1 && sp.grid == tiles),
                   "tiles %d ktiles %d: workspace %lld > %lld", tiles, ktiles,
                   static_cast<long long>(split_workspace_bytes(in, sp)), static_cast<long long>(in.workspace_left));
            if (sp.cluster > 1) {
              ++clustered;
              grouped += sp.groups > 1;
              const int slices = sp.cluster * sp.groups;
              const int cap = capset == 0 ? kH100Caps[sp.cluster] * sms / 132 : sms / sp.cluster;
              EXPECT(slices <= kMaxGemmCluster, "slices %d", slices);
              EXPECT(sp.grid == tiles * slices, "grid %d != %d x %d", sp.grid, tiles, slices);
              EXPECT(sp.grid <= sms, "grid %d over one wave of %d", sp.grid, sms);
              EXPECT(static_cast<int64_t>(tiles) * sp.groups <= cap, "%d clusters, %d held", tiles * sp.groups, cap);
              EXPECT(ktiles >= 2 * slices, "ktiles %d over %d slices", ktiles, slices);
              EXPECT((split_partial_bytes(in, sp) == 0) == (sp.groups == 1), "groups %d, partial bytes %lld",
                     sp.groups, static_cast<long long>(split_partial_bytes(in, sp)));
              EXPECT(split_counters(in, sp) == (sp.groups > 1 ? static_cast<int64_t>(tiles) * sp.cluster : 0),
                     "counters %lld", static_cast<long long>(split_counters(in, sp)));
            } else {
              EXPECT(sp.groups == 1, "groups %d without a cluster", sp.groups);
              EXPECT(sp.grid <= static_cast<int64_t>(tiles) * ktiles, "grid %d > %d units", sp.grid, tiles * ktiles);
              EXPECT(split_counters(in, sp) == (sp.grid != tiles ? tiles : 0), "counters");
              EXPECT((split_partial_bytes(in, sp) == 0) == (sp.grid == tiles), "grid %d, tiles %d, partial bytes %lld",
                     sp.grid, tiles, static_cast<long long>(split_partial_bytes(in, sp)));
              one_wave += sp.grid < tiles;
            }
          }
        }
      }
    }
  }
  EXPECT(clustered > 1000 && grouped > 100 && one_wave > 100,
         "the sweep reached %d cluster splits, %d with groups, %d one-wave splits over more tiles", clustered, grouped,
         one_wave);
  std::printf("sweep: %d plans, %d cluster splits, %d with several clusters a tile, %d one wave over more tiles\n",
              checked, clustered, grouped, one_wave);
}

// Token tiles per launch where decoded A holds only some of M's token tiles at once (chunk_token_tiles).
void chunks() {
  // Whole waves of 32 B-row tiles a token tile on 132 SMs: 8 token tiles, at most 5 a launch: 4 + 4 (one wave
  // each), not 5 + 3 (two and one).
  auto waves = [](int tiles, int) { return std::ceil(32.0 * tiles / 132.0); };
  EXPECT(chunk_token_tiles(8, 5, waves) == 4, "8 tiles by 5: got %d", chunk_token_tiles(8, 5, waves));
  EXPECT(chunk_token_tiles(5, 5, waves) == 5 && chunk_token_tiles(3, 5, waves) == 3, "one launch holds them all");
  // Equal costs keep the most tiles a launch (fewer launches).
  auto flat = [](int, int) { return 1.0; };
  EXPECT(chunk_token_tiles(10, 4, flat) == 4, "ties: got %d", chunk_token_tiles(10, 4, flat));
  // The split model at (2048, 4096, 14336), 256 tokens x 128 K (112 K tiles), 28 KiB of decoded A a row: 8 token
  // tiles, 5 within 40 MiB. With a 63 MiB workspace, 5 tiles of decoded A leave no room for a one-wave split
  // of 160 tiles (two waves of whole tiles, then one for the last 3): 4 + 4, one wave of 132 CTAs each.
  auto model = [](int64_t workspace) {
    return [workspace](int tiles, int chunk) {
      SplitInputs in = inputs(32 * tiles, 112, 256, 128);
      in.workspace_left = workspace - int64_t{chunk} * 256 * 28672;
      double cost = 0.0;
      choose_split(in, [](int s) { return kH100Caps[s]; }, &cost);
      return cost;
    };
  };
  EXPECT(chunk_token_tiles(8, 5, model(63ll << 20)) == 4, "63 MiB: got %d", chunk_token_tiles(8, 5, model(63ll << 20)));
  // Every choice: a launch holds at most the bound and at least half of it, and costs no more than the bound's.
  int checked = 0;
  for (int most = 1; most <= 40; ++most) {
    for (int total = 1; total <= 200; total += 3) {
      for (int w : {16, 32, 56, 112}) {
        auto cost = [w](int tiles, int) { return std::ceil(static_cast<double>(w) * tiles / 132.0) + 0.01 * tiles; };
        const int c = chunk_token_tiles(total, most, cost);
        auto sum = [&](int k) { return (total / k) * cost(k, k) + (total % k ? cost(total % k, k) : 0.0); };
        ++checked;
        if (total <= most) {
          EXPECT(c == total, "total %d most %d: got %d", total, most, c);
          continue;
        }
        EXPECT(c <= most && 2 * c >= most, "total %d most %d: got %d", total, most, c);
        EXPECT(sum(c) <= sum(most), "total %d most %d: %d costs %g > %g", total, most, c, sum(c), sum(most));
      }
    }
  }
  std::printf("chunks: %d choices\n", checked);
}

}  // namespace

int main() {
  h100_shapes();
  sweep();
  chunks();
  if (failures) {
    std::printf("split_plan_test: %d failures\n", failures);
    return 1;
  }
  std::printf("split_plan_test: ok\n");
  return 0;
}
