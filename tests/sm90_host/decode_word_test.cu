// The sm90 kernels' FP4 decode (csrc/sm90/fp4_decode.cuh) checked on the host over every 32-bit word: output r
// of decode_word must hold nibble r in its low half and nibble r + 4 in its high half, each as the fp16 bits of
// its e2m1 value times 2^-14; decode_word_bf16 the same in bf16 bits, times 2^-126. The expected bits come
// from the e2m1 values themselves, converted by cuda_fp16.h / cuda_bf16.h on the host.
#include <cstdio>

#include "sm90/fp4_decode.cuh"

using namespace nvfp4_gemm::sm90;

namespace {

float e2m1_value(int code) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}

template <int R>
uint64_t mismatches(uint32_t w, const uint32_t (&half_bits)[16], const uint32_t (&bf16_bits)[16]) {
  const uint32_t lo = (w >> (4 * R)) & 15u, hi = (w >> (4 * R + 16)) & 15u;
  return (decode_word<R>(w) != (half_bits[lo] | half_bits[hi] << 16)) +
         (decode_word_bf16<R>(w) != (bf16_bits[lo] | bf16_bits[hi] << 16));
}

}  // namespace

int main() {
  uint32_t half_bits[16], bf16_bits[16];
  for (int c = 0; c < 16; ++c) {
    const __half h = __float2half_rn(e2m1_value(c) * 0x1p-14f);
    const __nv_bfloat16 b = __float2bfloat16_rn(e2m1_value(c) * 0x1p-126f);
    half_bits[c] = __half_as_ushort(h);
    bf16_bits[c] = __bfloat16_as_ushort(b);
  }
  uint64_t bad = 0;
  for (uint64_t x = 0; x < (uint64_t{1} << 32); ++x) {
    const uint32_t w = static_cast<uint32_t>(x);
    bad += mismatches<0>(w, half_bits, bf16_bits) + mismatches<1>(w, half_bits, bf16_bits) +
           mismatches<2>(w, half_bits, bf16_bits) + mismatches<3>(w, half_bits, bf16_bits);
  }
  if (bad != 0) {
    std::printf("decode_word_test: %llu outputs differ from the e2m1 values\n", static_cast<unsigned long long>(bad));
    return 1;
  }
  std::printf("decode_word_test: ok (every 32-bit word, fp16 and bf16)\n");
  return 0;
}
