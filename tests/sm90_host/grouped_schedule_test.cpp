// csrc/sm90/grouped_schedule.h on the host: over random and garbage routings, the grouped kernel's work list
// covers every (group, chunk, 128-row block, K split) exactly once and nothing else; chunks stay inside their
// group's rows and inside [0, T); tiles, partial slots and split counters stay inside their buffers; the K splits
// cover K with no empty split; the padded sfa rows of a valid routing stay within T + G x 127 rounded up to 128.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "sm90/grouped_schedule.h"

using namespace nvfp4_gemm::sm90;

static int failures = 0;
#define CHECK(cond, ...)                                         \
  do {                                                           \
    if (!(cond)) {                                               \
      if (++failures <= 20) {                                    \
        std::printf("FAIL %s:%d %s: ", __FILE__, __LINE__, #cond); \
        std::printf(__VA_ARGS__);                                \
        std::printf("\n");                                       \
      }                                                          \
    }                                                            \
  } while (0)

template <int TOKENS>
void check_case(const std::vector<int32_t>& offs, int t, int row_blocks, int kblocks, int slots, int forced,
                bool valid) {
  const int g = static_cast<int>(offs.size());
  std::vector<int> start(g + 1), cum(g), pad(g);
  gwk_tables(offs.data(), g, t, TOKENS, start.data(), cum.data(), pad.data());
  const int chunks = cum[g - 1];
  const int tiles = chunks * row_blocks;
  const int max_items = slots;  // the backend sizes the partials for one item per CTA of the grid
  const int splits = gwk_splits(tiles, slots, max_items, kblocks, forced);
  CHECK(splits >= 1 && splits <= kGwkMaxSplits && splits <= kblocks, "splits %d", splits);
  const int kb_per = (kblocks + splits - 1) / splits;
  CHECK((splits - 1) * kb_per < kblocks, "empty last split: kblocks %d splits %d", kblocks, splits);
  if (forced == 0 && splits > 1) CHECK(kblocks / splits >= kGwkMinSplitStages, "kblocks %d splits %d", kblocks, splits);
  if (splits > 1) CHECK(tiles * splits <= max_items && tiles <= kGwkCounterRows, "tiles %d splits %d", tiles, splits);
  const int items = tiles * splits, rbs = row_blocks * splits;
  std::set<std::tuple<int, int, int, int>> seen;
  std::set<int> tiles_seen;
  for (int w = 0; w < items; ++w) {
    const GwkItem it = gwk_item<TOKENS>(w, start.data(), cum.data(), pad.data(), g, rbs, splits);
    CHECK(it.g >= 0 && it.g < g, "w %d group %d", w, it.g);
    if (it.g < 0 || it.g >= g) continue;
    const int s = start[it.g], e = start[it.g + 1];
    CHECK(it.rows >= 1 && it.rows <= TOKENS, "w %d rows %d", w, it.rows);
    CHECK(it.row0 >= s && it.row0 + it.rows <= e && e <= t, "w %d rows [%d, %d) outside group [%d, %d) or T %d", w,
          it.row0, it.row0 + it.rows, s, e, t);
    CHECK((it.row0 - s) % TOKENS == 0, "w %d chunk start %d", w, it.row0 - s);
    CHECK(it.rb >= 0 && it.rb < row_blocks && it.split >= 0 && it.split < splits, "w %d rb %d split %d", w, it.rb,
          it.split);
    CHECK(it.tile >= 0 && it.tile < tiles, "w %d tile %d of %d", w, it.tile, tiles);
    CHECK(it.pad_row0 % TOKENS == 0 && it.pad_row0 - pad[it.g] == it.row0 - s && it.pad_row0 % 128 + TOKENS <= 128,
          "w %d pad row %d", w, it.pad_row0);
    if (valid) CHECK(it.pad_row0 + it.rows <= (t + g * 127 + 127) / 128 * 128, "w %d pad row %d past capacity", w,
                     it.pad_row0);
    CHECK(seen.insert({it.g, it.row0, it.rb, it.split}).second, "w %d repeats (g %d, row %d, rb %d, split %d)", w,
          it.g, it.row0, it.rb, it.split);
    tiles_seen.insert(it.tile);
    if (splits > 1) CHECK(it.tile * splits + it.split < max_items, "w %d partial slot", w);
  }
  CHECK(static_cast<int>(tiles_seen.size()) == tiles, "tiles seen %zu of %d", tiles_seen.size(), tiles);
  // Every chunk of every group, each row block and split: exactly the items seen.
  int expected = 0;
  for (int j = 0; j < g; ++j) {
    const int m = start[j + 1] - start[j];
    CHECK(m >= 0, "group %d negative", j);
    expected += (m + TOKENS - 1) / TOKENS;
    if (valid) {
      const int want_end = offs[j], want_start = j ? offs[j - 1] : 0;
      CHECK(start[j] == want_start && start[j + 1] == want_end, "valid routing group %d [%d, %d) vs [%d, %d)", j,
            start[j], start[j + 1], want_start, want_end);
    }
  }
  CHECK(expected * row_blocks * splits == items && static_cast<int>(seen.size()) == items, "items %d expected %d",
        items, expected * row_blocks * splits);
}

template <int TOKENS>
void sweep(std::mt19937& rng, int cases) {
  for (int c = 0; c < cases; ++c) {
    const int g = 1 + static_cast<int>(rng() % (c % 3 == 0 ? 300 : 12));
    const int t = static_cast<int>(rng() % (c % 4 == 0 ? 2000 : 70));
    std::vector<int32_t> offs(g);
    const bool valid = rng() % 4 != 0;
    if (valid) {
      std::vector<int> counts(g, 0);
      const bool skew = rng() % 2;
      for (int r = 0; r < t; ++r) counts[skew ? (rng() % (1 + rng() % g)) : rng() % g]++;
      int run = 0;
      for (int j = 0; j < g; ++j) offs[j] = run += counts[j];
    } else {  // garbage: decreasing, negative, past T, extremes
      for (int j = 0; j < g; ++j) {
        switch (rng() % 5) {
          case 0: offs[j] = -static_cast<int32_t>(rng() % 100); break;
          case 1: offs[j] = static_cast<int32_t>(t + rng() % 100); break;
          case 2: offs[j] = (rng() % 2) ? INT32_MAX : INT32_MIN; break;
          default: offs[j] = static_cast<int32_t>(rng() % (t + 1)); break;
        }
      }
    }
    const int row_blocks = 1 + static_cast<int>(rng() % 60);
    const int kblocks = 1 + static_cast<int>(rng() % 60);
    const int slots = (rng() % 2 ? 264 : 132) / (rng() % 3 ? 1 : 2);
    const int forced = rng() % 4 == 0 ? static_cast<int>(rng() % 20) : 0;
    check_case<TOKENS>(offs, t, row_blocks, kblocks, slots, forced, valid);
  }
}

int main() {
  std::mt19937 rng(2026);
  // Fixed cases: every row in one group, groups of one row, all empty, T = 0, splits on a tiny grid.
  check_case<8>({0, 0, 41, 41, 41}, 41, 3, 14, 264, 0, true);
  check_case<16>({1, 2, 3, 4, 5, 6, 7}, 7, 56, 8, 264, 0, true);
  check_case<8>({0, 0, 0}, 0, 4, 4, 264, 0, true);
  check_case<16>({0, 0, 0, 37}, 37, 2, 56, 264, 0, true);
  check_case<8>({9, 4, 20, 16}, 16, 2, 3, 264, 3, false);
  check_case<32>({0, 70, 70, 101, 101, 230}, 230, 12, 8, 132, 0, true);
  check_case<32>({40, 12, 300, 64}, 64, 5, 3, 132, 2, false);
  sweep<8>(rng, 3000);
  sweep<16>(rng, 3000);
  sweep<32>(rng, 3000);
  // The split rule on the shapes that matter: Mixtral down at one token (2 groups x 32 row blocks, K 56 stages):
  // 4 splits of 14 stages; DeepSeek-V3 gate_up at one token (8 x 32 tiles): no split.
  CHECK(gwk_splits(64, 264, 264, 56, 0) == 4, "mixtral down splits %d", gwk_splits(64, 264, 264, 56, 0));
  CHECK(gwk_splits(256, 264, 264, 28, 0) == 1, "dsv3 gate_up splits %d", gwk_splits(256, 264, 264, 28, 0));
  CHECK(gwk_splits(600, 264, 264, 28, 4) == 1, "forced splits past the buffers");
  // Qwen3-30B-A3B at one token (8 groups of one row): gate_up (8 x 12 tiles, K 8 stages) 2 splits of 4; down
  // (8 x 16 tiles, K 3 stages) none (a split would hold one stage); forced, down to one stage a split.
  CHECK(gwk_splits(96, 264, 264, 8, 0) == 2, "qwen3 gate_up splits %d", gwk_splits(96, 264, 264, 8, 0));
  CHECK(gwk_splits(128, 264, 264, 3, 0) == 1, "qwen3 down splits %d", gwk_splits(128, 264, 264, 3, 0));
  CHECK(gwk_splits(1, 264, 264, 3, 0) == 1 && gwk_splits(1, 264, 264, 4, 0) == 2, "small K splits");
  CHECK(gwk_splits(1, 264, 264, 3, 16) == 3, "forced splits of one stage %d", gwk_splits(1, 264, 264, 3, 16));
  if (failures) {
    std::printf("grouped_schedule_test: %d failures\n", failures);
    return 1;
  }
  std::printf("grouped_schedule_test: ok\n");
  return 0;
}
