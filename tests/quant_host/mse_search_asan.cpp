// mse_search.h's candidate-table lookups stay inside the table for every encode scale, the ones the op
// bindings refuse included (negative, -0, zero, NaN, inf): the table is a heap array of exactly
// kCandidateBytes entries, so a build with -fsanitize=address reports any read past it. Blocks cover
// zeros, subnormals, normals, the e4m3 range's ends, inf and NaN. Prints "blocks=N" and exits 0 when clean.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "quant/mse_search.h"

namespace q = nvfp4_gemm::quant;

struct HeapTable {
  const q::CandidateScale* entries;
  q::CandidateScale operator()(int c) const { return entries[c]; }
};

int main() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float scales[] = {-1.0f, -0.0f, 0.0f, nan, inf, -inf, 1e-45f, 1.0f, 2688.0f, 3.0e38f, -3.0e38f};
  const float fill[] = {0.0f, 1e-45f, 1e-8f, 0.3f, 1.0f, 6.0f, 448.0f, 1e30f, 3.0e38f, inf, nan};
  unsigned long long blocks = 0;
  for (float gs : scales) {
    std::vector<q::CandidateScale> table(q::kCandidateBytes);  // exactly the table's size, on the heap
    for (int c = 0; c < q::kCandidateBytes; ++c) table[c] = q::candidate_scale(c, gs);
    const HeapTable lookup{table.data()};
    for (float big : fill) {
      for (float small : fill) {
        float a[16];
        double h[16];
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i) {
          a[i] = (i % 3 == 0) ? big : small * (1.0f + 0.125f * static_cast<float>(i));
          h[i] = 1.0;
          amax = (std::isnan(a[i]) || a[i] > amax) ? a[i] : amax;
        }
        for (int n = 0; n <= 4; ++n) {
          for (bool clip : {true, false}) {
            const q::MseChoice best = q::mse_search<false>(a, amax, gs, n, clip, h, lookup);
            const q::MseChoice weighted = q::mse_search<true>(a, amax, gs, n, clip, h, lookup);
            if (best.byte >= static_cast<uint32_t>(q::kCandidateBytes) ||
                weighted.byte >= static_cast<uint32_t>(q::kCandidateBytes)) {
              std::printf("byte out of range: %u / %u for gs %g\n", best.byte, weighted.byte, gs);
              return 1;
            }
            volatile float inv = lookup(best.byte).inv;  // the encoding's own lookup of the chosen byte
            (void)inv;
            ++blocks;
          }
        }
      }
    }
  }
  std::printf("blocks=%llu\n", blocks);
  return 0;
}
