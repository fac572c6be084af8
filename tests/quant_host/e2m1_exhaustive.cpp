// Every fp32 bit pattern with the sign clear (zeros, subnormals, normals, inf, NaN) through
// recipe.h's e2m1_magnitude against the midpoint-counting definition. Prints "mismatches=N".
#include <cmath>
#include <cstdio>

#include "quant/recipe.h"

using nvfp4_gemm::quant::bits_float;
using nvfp4_gemm::quant::e2m1_magnitude;

static uint32_t by_midpoints(float q) {
  if (std::isnan(q)) return 7;
  return (q > 0.25f) + (q >= 0.75f) + (q > 1.25f) + (q >= 1.75f) + (q > 2.5f) + (q >= 3.5f) + (q > 5.0f);
}

int main() {
  unsigned long long bad = 0;
  for (unsigned long long b = 0; b <= 0x7FFFFFFFull; ++b) {
    const float q = bits_float(static_cast<uint32_t>(b));
    const uint32_t got = e2m1_magnitude(q), want = by_midpoints(q);
    if (got != want && bad++ < 5) std::printf("q bits %08llx (%g): %u, want %u\n", b, q, got, want);
  }
  std::printf("mismatches=%llu\n", bad);
  return bad != 0;
}
