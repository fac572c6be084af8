// The scale-factor layouts the SM120 launcher hands CUTLASS (operands.h, the code the kernels use) address
// the caller's blocked buffers exactly as docs/CONTRACT.md's formula (common/problem.h's blocked_sf_offset), for
// every (row, k), for A and B; strides, roles and D as the Problem says. Host only.
#include <array>
#include <cstdio>
#include <random>
#include <vector>

#include "sm120/operands.h"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::sm120;

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

// One rows x K operand: its SF layout against docs/CONTRACT.md, its data stride against the row pitch.
template <class LayoutSFT, class StrideT>
static void check_operand(const char* what, const LayoutSFT& layout_sf, const StrideT& stride, int64_t rows,
                          int64_t k, int64_t ld_bytes) {
  using namespace cute;
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t padded = round_up(rows, kSfAtomRows) * round_up(sf_cols, kSfAtomCols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const int64_t got = layout_sf(make_coord(int(r), int(kk), 0));
      const int64_t want = blocked_sf_offset(r, kk / kSfVecSize, sf_cols);
      EXPECT(got == want, "%s rows=%lld K=%lld: SF of (row %lld, k %lld) at %lld, docs/CONTRACT.md says %lld", what,
             (long long)rows, (long long)k, (long long)r, (long long)kk, (long long)got, (long long)want);
    }
    // Element (r, k) of the operand is nibble k%2 of byte r*ld + k/2 (strides count e2m1 elements).
    const int64_t kk = (r * 7919) % k;
    const int64_t elem = r * get<0>(stride) + kk * get<1>(stride);
    EXPECT(elem == 2 * (r * ld_bytes) + kk, "%s: element (%lld, %lld) at e2m1 index %lld, want %lld", what,
           (long long)r, (long long)kk, (long long)elem, (long long)(2 * r * ld_bytes + kk));
  }
  // TMA reads whole 128x4 atoms: the layout's extent must be the padded buffer, not more.
  EXPECT(cosize(filter_zeros(layout_sf)) <= padded, "%s: SF layout spans %lld bytes, buffer has %lld", what,
         (long long)cosize(filter_zeros(layout_sf)), (long long)padded);
}

static void check_problem(int64_t m, int64_t n, int64_t k, int64_t pad_a, int64_t pad_b) {
  Problem p{};
  p.a = fake(0x10000);
  p.b = fake(0x20000);
  p.sfa = fake(0x30000);
  p.sfb = fake(0x40000);
  p.c = const_cast<uint8_t*>(fake(0x50000));
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k / 2 + pad_a;
  p.ldb = k / 2 + pad_b;
  p.ldc = n + 8;
  p.out_dtype = OutDtype::kFloat16;
  const float* alpha = reinterpret_cast<const float*>(0x60000);
  const Operands o = make_operands(p, alpha);
  char tag[96];
  std::snprintf(tag, sizeof(tag), "M=%lld N=%lld K=%lld pad=%lld", (long long)m, (long long)n, (long long)k,
                (long long)pad_a);
  EXPECT((const void*)o.a == p.a && (const void*)o.sfa == p.sfa, "%s: A / SFA pointers", tag);
  EXPECT((const void*)o.b == p.b && (const void*)o.sfb == p.sfb, "%s: B / SFB pointers", tag);
  EXPECT(o.m == m && o.n == n && o.k == k, "%s: kernel problem %d x %d x %d", tag, o.m, o.n, o.k);
  EXPECT(o.alpha == alpha && o.d == p.c, "%s: alpha / D pointers", tag);
  check_operand(tag, o.layout_sfa, o.stride_a, m, k, p.lda);
  check_operand(tag, o.layout_sfb, o.stride_b, n, k, p.ldb);
  // D(i, j) is C[i][j]; C rows are ldc elements apart.
  for (int64_t i : {int64_t(0), int64_t(1), m - 1}) {
    for (int64_t j : {int64_t(0), n - 1}) {
      const int64_t got = i * cute::get<0>(o.stride_d) + j * cute::get<1>(o.stride_d);
      EXPECT(got == i * p.ldc + j, "%s: D(%lld, %lld) at %lld, C wants %lld", tag, (long long)i, (long long)j,
             (long long)got, (long long)(i * p.ldc + j));
    }
  }
}

int main() {
  std::vector<std::array<int64_t, 3>> shapes = {
      // rows not a multiple of 128; K/16 not a multiple of 4 (K = 32, 96, 160, 1056); M = 1; N = 8.
      {1, 8, 32},       {1, 8, 96},     {3, 16, 64},     {127, 24, 160},  {128, 128, 256},
      {129, 136, 1056}, {200, 8, 288},  {255, 264, 512}, {256, 256, 544}, {300, 392, 2080},
      {128, 7168, 64},  {1, 4096, 7168 / 8},
  };
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 12; ++i) {
    std::uniform_int_distribution<int64_t> rows(1, 700), kb(1, 40), nb(1, 60);
    shapes.push_back({rows(rng), 8 * nb(rng), 32 * kb(rng)});
  }
  int cases = 0;
  for (auto [m, n, k] : shapes) {
    for (int64_t pad : {0, 16}) {
      check_problem(m, n, k, pad, 2 * pad);
      ++cases;
    }
  }
  if (failures) {
    std::printf("layout_test: %d mismatches over %d problems\n", failures, cases);
    return 1;
  }
  std::printf("layout_test: OK, %d problems (A and B) match docs/CONTRACT.md's blocked offsets\n", cases);
  return 0;
}
