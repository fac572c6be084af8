// Every fp32 bit pattern with the sign clear (zeros, subnormals, normals, inf, NaN) through
// recipe.h's e2m1_magnitude against the midpoint-counting definition, and through mse_search.h's
// e2m1_round_value against the value of that code. Also the device's product of an e2m1 value and a
// candidate scale (mse_search.h: the value's bits shifted, the scale times 2^896) against the host's, for
// every value and every finite e4m3 scale. Prints "mismatches=N".
#include <cmath>
#include <cstdio>

#include "quant/mse_search.h"
#include "quant/recipe.h"

using nvfp4_gemm::quant::bits_float;
using nvfp4_gemm::quant::e2m1_magnitude;
using nvfp4_gemm::quant::e2m1_round_value;
using nvfp4_gemm::quant::e2m1_value_shifted_bits;
using nvfp4_gemm::quant::e4m3_value;

static const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

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
    const float value = e2m1_round_value(q);
    if (value != kValues[want] && bad++ < 5) std::printf("q bits %08llx (%g): value %g, want %g\n", b, q, value, kValues[want]);
  }
  for (float v : kValues) {
    for (uint32_t c = 0; c < 0x7F; ++c) {
      const double s = e4m3_value(static_cast<uint8_t>(c));
      const double device = e2m1_value_shifted_bits(v) * (s * 0x1p896), host = static_cast<double>(v) * s;
      if (device != host && bad++ < 5) std::printf("e2m1 %g times scale byte %02x: %.17g, want %.17g\n", v, c, device, host);
    }
  }
  std::printf("mismatches=%llu\n", bad);
  return bad != 0;
}
