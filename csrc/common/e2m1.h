// Host-side decoding of the NVFP4 formats (docs/CONTRACT.md), shared by the CPU backend and host tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace nvfp4_gemm {

// e2m1 code -> value: sign = bit 3, magnitude = {0, 0.5, 1, 1.5, 2, 3, 4, 6}[code & 7]; code 8 is -0.
inline float e2m1_to_float(uint8_t code) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[code & 7];
  return (code & 8) ? -v : v;
}

// e4m3 (float8_e4m3fn): bias 7, no infinities, 0x7F / 0xFF are NaN, subnormals 2^-6 * m/8.
inline float e4m3_to_float(uint8_t bits) {
  const int sign = bits >> 7, exp = (bits >> 3) & 0xF, man = bits & 7;
  float v;
  if (exp == 0xF && man == 7) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + man), exp - 10);
  }
  return sign ? -v : v;
}

}  // namespace nvfp4_gemm
