// Grouped verification (c): what the grouped argument builder gives CUTLASS for each group (common/cutlass_grouped.h's
// describe_group, run here through describe_groups_host, the builder's work done serially) addresses the caller's
// buffers exactly as docs/CONTRACT.md's grouped layout says, for every (row, k) of every group, swapped and not:
//  - the group's scales: CUTLASS's Sm1xxBlkScaledConfig layout for a block of m_g rows, from the group's SFA
//    pointer, lands on blocked_sf_offset(P_g + r, s, K/16) of the grouped sfa (P_g = sum_{i<g} round_up(m_i,128)),
//    and never leaves the sfa_rows the buffer holds;
//  - the group's rows of A, its weight B_g and sfb block, its rows of C (ldc), its alpha;
//  - empty groups (m_g = 0, decreasing offsets, offsets past T) are empty problems; rows whose scales lie past
//    sfa are not computed but listed for the NaN fill;
//  - the argument arrays the builder stores (ArgArrays::carve / store) read back as described.
// Host only.
#include <algorithm>
#include <array>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/cutlass_grouped.h"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::grouped;

static int failures = 0;

#define EXPECT(cond, ...)                                \
  do {                                                   \
    if (!(cond)) {                                       \
      if (failures++ < 20) {                             \
        std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
        std::printf(__VA_ARGS__);                        \
        std::printf("\n");                               \
      }                                                  \
    }                                                    \
  } while (0)

static const uint8_t* fake(uintptr_t a) { return reinterpret_cast<const uint8_t*>(a); }

struct Routing {
  std::vector<int32_t> offs;
  int64_t t;
};

// The group's operand of `rows` x K (kernel role), its SF layout from `sf` (byte offset from the buffer base
// `sf_base`), and where docs/CONTRACT.md puts it: scale (r, s) at sf_base + (first_row + r) blocked.
template <class LayoutSFT, class StrideT>
static void check_operand(const std::string& what, const LayoutSFT& layout_sf, const void* sf, const uint8_t* sf_base,
                          int64_t first_row, int64_t sf_rows_cap, const StrideT& stride, const void* data,
                          const uint8_t* data_want, int64_t rows, int64_t k, int64_t ld_bytes) {
  using namespace cute;
  const int64_t sf_cols = k / kSfVecSize, sp = round_up(sf_cols, kSfAtomCols);
  const int64_t base = static_cast<const uint8_t*>(sf) - sf_base;
  EXPECT(data == data_want, "%s: data pointer %p, want %p", what.c_str(), data, (const void*)data_want);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kk = 0; kk < k; kk += (r % 3 == 0 ? 1 : 7)) {
      const int64_t got = base + layout_sf(make_coord(int(r), int(kk), 0));
      const int64_t want = blocked_sf_offset(first_row + r, kk / kSfVecSize, sf_cols);
      EXPECT(got == want, "%s rows=%lld K=%lld: SF of (row %lld, k %lld) at %lld, docs/CONTRACT.md says %lld",
             what.c_str(), (long long)rows, (long long)k, (long long)r, (long long)kk, (long long)got, (long long)want);
    }
    const int64_t kk = (r * 7919) % k;
    const int64_t elem = r * get<0>(stride) + kk * get<1>(stride);
    EXPECT(elem == 2 * (r * ld_bytes) + kk, "%s: element (%lld, %lld) at e2m1 index %lld, want %lld", what.c_str(),
           (long long)r, (long long)kk, (long long)elem, (long long)(2 * r * ld_bytes + kk));
  }
  if (rows > 0) {
    // TMA reads whole 128x4 atoms: the layout spans the group's padded block, which ends inside the buffer.
    const int64_t span = cosize(filter_zeros(layout_sf));
    EXPECT(span <= round_up(rows, kSfAtomRows) * sp, "%s: SF layout spans %lld bytes, the group's block %lld",
           what.c_str(), (long long)span, (long long)(round_up(rows, kSfAtomRows) * sp));
    EXPECT(base + span <= sf_rows_cap * sp, "%s: SF block ends at byte %lld, the buffer holds %lld", what.c_str(),
           (long long)(base + span), (long long)(sf_rows_cap * sp));
  }
}

template <bool Swap>
static void check_routing(const Routing& rt, int64_t n, int64_t k, int64_t sfa_rows, int64_t pad, OutDtype dt,
                          bool alpha) {
  GroupedProblem p{};
  p.a = fake(0x100000000);
  p.b = fake(0x200000000);
  p.sfa = fake(0x300000000);
  p.sfb = fake(0x400000000);
  p.c = const_cast<uint8_t*>(fake(0x500000000));
  p.alpha = alpha ? reinterpret_cast<const float*>(0x600000000) : nullptr;
  p.offs = rt.offs.data();
  p.t = rt.t;
  p.n = n;
  p.k = k;
  p.g = static_cast<int64_t>(rt.offs.size());
  p.lda = k / 2 + pad;
  p.ldb = k / 2 + 2 * pad;
  p.b_group_bytes = n * p.ldb + 16 * pad;
  p.ldc = n + (pad ? 8 : 0);
  p.sfa_rows = sfa_rows;
  p.out_dtype = dt;
  const float* one = reinterpret_cast<const float*>(0x700000000);
  const auto groups = describe_groups_host<Swap>(p, one);
  const int64_t sp = round_up(k / kSfVecSize, kSfAtomCols);
  const int64_t esize = dt == OutDtype::kFloat32 ? 4 : 2;
  std::string route;
  for (int32_t o : rt.offs) route += std::to_string(o) + ",";
  char tag[256];
  int64_t prev_end = 0, pad_row = 0;
  for (int64_t i = 0; i < p.g; ++i) {
    const GroupOperands<Swap>& o = groups[i];
    // The contract's rows of group i (clamped, a decrease empty) and its first padded row.
    const int64_t hi = std::min<int64_t>(std::max<int64_t>(rt.offs[i], 0), rt.t);
    const int64_t lo = prev_end, m = hi > lo ? hi - lo : 0;
    prev_end = hi;
    const int64_t fit = std::max<int64_t>(0, std::min<int64_t>(m, sfa_rows - pad_row));
    std::snprintf(tag, sizeof(tag), "%s T=%lld N=%lld K=%lld offs=[%s] sfa_rows=%lld group %lld", Swap ? "swap" : "noswap",
                  (long long)rt.t, (long long)n, (long long)k, route.c_str(), (long long)sfa_rows, (long long)i);
    EXPECT(o.rows == fit && o.nan_begin == lo + fit && o.nan_end == lo + m,
           "%s: computes %lld rows, NaN rows [%lld, %lld); want %lld rows of %lld from row %lld", tag,
           (long long)o.rows, (long long)o.nan_begin, (long long)o.nan_end, (long long)fit, (long long)m, (long long)lo);
    const int rows = static_cast<int>(o.rows);
    const auto want_shape = Swap ? GroupShape{int(n), rows, int(k)} : GroupShape{rows, int(n), int(k)};
    EXPECT(o.shape == want_shape, "%s: problem (%d, %d, %d)", tag, cute::get<0>(o.shape), cute::get<1>(o.shape),
           cute::get<2>(o.shape));
    const uint8_t* a_rows = p.a + lo * p.lda;
    const uint8_t* b_group = p.b + i * p.b_group_bytes;
    const uint8_t* sfb_group = p.sfb + i * round_up(n, kSfAtomRows) * sp;
    // Ours: A rows (scales from padded row pad_row of sfa) and B_g (scales from its own block of sfb).
    const std::string ta = std::string(tag) + (Swap ? " kernel-B=our A" : " kernel-A=our A");
    const std::string tb = std::string(tag) + (Swap ? " kernel-A=our B_g" : " kernel-B=our B_g");
    if (rows > 0) {
      if (Swap)
        check_operand(ta, o.layout_sfb, o.sfb, p.sfa, pad_row, sfa_rows, o.stride_b, o.b, a_rows, rows, k, p.lda);
      else
        check_operand(ta, o.layout_sfa, o.sfa, p.sfa, pad_row, sfa_rows, o.stride_a, o.a, a_rows, rows, k, p.lda);
    }
    const uint8_t* sfb_base = p.sfb + i * round_up(n, kSfAtomRows) * sp;
    if (Swap)
      check_operand(tb, o.layout_sfa, o.sfa, sfb_base, 0, round_up(n, kSfAtomRows), o.stride_a, o.a, b_group, n, k,
                    p.ldb);
    else
      check_operand(tb, o.layout_sfb, o.sfb, sfb_base, 0, round_up(n, kSfAtomRows), o.stride_b, o.b, b_group, n, k,
                    p.ldb);
    EXPECT((const void*)sfb_group == (Swap ? (const void*)o.sfa : (const void*)o.sfb), "%s: sfb block", tag);
    // C: the group's rows from row lo, ldc elements apart; D(i, j) of the kernel is C[lo + i][j], or C[lo + j][i].
    EXPECT(o.d == static_cast<uint8_t*>(p.c) + lo * p.ldc * esize, "%s: D pointer", tag);
    for (int64_t r : {int64_t(0), int64_t(rows) - 1}) {
      if (r < 0) continue;
      for (int64_t j : {int64_t(0), n - 1}) {
        const int64_t got = Swap ? j * cute::get<0>(o.stride_d) + r * cute::get<1>(o.stride_d)
                                 : r * cute::get<0>(o.stride_d) + j * cute::get<1>(o.stride_d);
        EXPECT(got == r * p.ldc + j, "%s: C(%lld, %lld) at element %lld, want %lld", tag, (long long)r, (long long)j,
               (long long)got, (long long)(r * p.ldc + j));
      }
    }
    EXPECT(o.alpha == (alpha ? p.alpha + i : one), "%s: alpha pointer", tag);
    pad_row += round_up(m, kSfAtomRows);
  }

  // The arrays the device builder stores, in a host buffer: each entry reads back as described.
  ArgArrays<Swap> arr{};
  std::vector<uint8_t> buf(static_cast<size_t>(ArgArrays<Swap>::carve(nullptr, p.g, nullptr)) + 256);
  uint8_t* base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<int64_t>(buf.data()), 256));
  ArgArrays<Swap>::carve(base, p.g, &arr);
  for (int64_t i = 0; i < p.g; ++i) arr.store(i, groups[i]);
  for (int64_t i = 0; i < p.g; ++i) {
    const GroupOperands<Swap>& o = groups[i];
    EXPECT(arr.shapes[i] == o.shape && arr.a[i] == o.a && arr.b[i] == o.b && arr.sfa[i] == o.sfa &&
               arr.sfb[i] == o.sfb && arr.d[i] == o.d && arr.alpha[i] == o.alpha &&
               arr.stride_a[i] == o.stride_a && arr.stride_b[i] == o.stride_b && arr.stride_d[i] == o.stride_d &&
               arr.layout_sfa[i] == o.layout_sfa && arr.layout_sfb[i] == o.layout_sfb,
           "%s group %lld: the stored arguments differ from the description", Swap ? "swap" : "noswap", (long long)i);
    const uintptr_t ptrs[] = {uintptr_t(arr.shapes), uintptr_t(arr.a), uintptr_t(arr.stride_a), uintptr_t(arr.layout_sfa),
                              uintptr_t(arr.stride_d), uintptr_t(arr.alpha)};
    for (uintptr_t q : ptrs) EXPECT(q % 16 == 0, "argument array at %p not 16-byte aligned", (void*)q);
  }
}

int main() {
  std::vector<Routing> routings = {
      {{100, 100, 137, 257, 257}, 257},  // an empty group inside, one at the end
      {{0, 0, 5}, 5},                    // empty groups first
      {{1, 2, 3, 4, 5, 6}, 6},           // groups of one row
      {{300}, 300},                      // one group, rows past one atom
      {{128, 256, 384}, 384},            // exact atoms
      {{129, 129, 400}, 400},
      {{50, 20, 70}, 70},                // a decrease: group 1 empty, group 2 = rows [20, 70)
      {{-5, 999, 40}, 40},               // offsets past [0, T] clamp; group 2 reads as empty
  };
  std::mt19937_64 rng(99);
  for (int i = 0; i < 10; ++i) {
    std::uniform_int_distribution<int> gd(1, 40), td(0, 600);
    const int g = gd(rng);
    const int64_t t = td(rng);
    std::vector<int32_t> offs(g);
    std::uniform_int_distribution<int64_t> cut(0, t);
    for (auto& o : offs) o = static_cast<int32_t>(cut(rng));
    std::sort(offs.begin(), offs.end());
    offs.back() = static_cast<int32_t>(t);
    routings.push_back({offs, t});
  }
  int cases = 0;
  for (const Routing& rt : routings) {
    const int64_t g = static_cast<int64_t>(rt.offs.size());
    const int64_t worst = worst_sfa_rows(rt.t, g);
    // Enough rows for every routing; only round_up(T, 128) (groups past it get the NaN fill); the least, 128.
    for (int64_t sfa_rows : {std::max<int64_t>(worst, 128), std::max<int64_t>(round_up(rt.t, 128), 128), int64_t(128)}) {
      for (auto [n, k] : {std::array<int64_t, 2>{8, 32}, {136, 160}, {256, 1056}, {72, 96}}) {
        for (int64_t pad : {0, 16}) {
          const OutDtype dt = static_cast<OutDtype>(cases % 3);
          check_routing<false>(rt, n, k, sfa_rows, pad, dt, cases % 2 == 0);
          check_routing<true>(rt, n, k, sfa_rows, pad, dt, cases % 2 == 1);
          cases += 2;
        }
      }
    }
  }
  if (failures) {
    std::printf("grouped_layout_test: %d mismatches over %d problems\n", failures, cases);
    return 1;
  }
  std::printf("grouped_layout_test: OK, %d grouped problems (every group's A, B_g, scales, C and alpha, swapped and "
              "not) match docs/CONTRACT.md's grouped layout\n", cases);
  return 0;
}
