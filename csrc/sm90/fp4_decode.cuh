// The FP4 decode shared by the sm90 kernels (the wgmma kernel in sm90_gemm.cuh, the small-M streaming kernel in
// sm90_small_m.cuh and the K-sliced kernel in sm90_wk.cuh): the one place where e2m1 bits become fp16 or bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/convert_out.cuh"
#include "common/problem.h"

namespace nvfp4_gemm::sm90 {

// Bits of a where kMask has ones, of b elsewhere: one LOP3. On the device it is written out, since the compiler
// otherwise narrows the masks to the bits each later shift keeps and builds the result per use, in two.
template <uint32_t kMask>
__host__ __device__ __forceinline__ uint32_t select_bits(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(r) : "r"(a), "r"(b), "n"(kMask));  // (a & c) | (b & ~c)
  return r;
#else
  return (a & kMask) | (b & ~kMask);
#endif
}

// FP4 decode: 8 packed e2m1 (one 32-bit word) -> four fp16x2 holding value * 2^-14. Output r holds
// nibbles r (low half) and r + 4 (high half): both sit at the same place in their 16-bit half, so one
// shift and one mask place magnitude (bits 11..9) and sign (bit 15) of both, once each sign sits 6 bits above
// its magnitude instead of the nibble's 3. Two words do that, each formed with one LOP3 (select_bits) and
// read by two outputs: the even nibbles' magnitudes with the bits of w << 3 around them (an even nibble's
// sign lands in the odd nibble's place above it), and the odd nibbles' magnitudes from w >> 3 with w's own
// bits around them (the signs stay put). Bits no shift and mask reads are left as they fall. With w << 3 and
// w >> 3 formed once, a word takes 11 integer instructions (output 3 needs no shift) instead of 15.
template <int R>
__host__ __device__ __forceinline__ uint32_t decode_word(uint32_t w) {
  static_assert(R >= 0 && R < 4, "four outputs per word");
  if constexpr (R % 2 == 0) {  // nibbles 0 / 4 (R = 0) and 2 / 6: magnitudes at bits 0..2 / 8..10
    return (select_bits<0x07070707u>(w, w << 3) << (9 - 4 * R)) & 0x8E008E00u;
  } else {  // nibbles 1 / 5 (R = 1) and 3 / 7: magnitudes moved to bits 1..3 / 9..11, signs at 7 / 15
    return (select_bits<0x0E0E0E0Eu>(w >> 3, w) << (12 - 4 * R)) & 0x8E008E00u;
  }
}

// The same for bf16 (8 exponent bits, 7 mantissa bits): the magnitude lands on bits 8..6 (exponent bits
// 1..0, mantissa bit 6), which reads as value * 2^-126 (code 1 = 0.5 becomes the subnormal 2^-127). The sign
// must sit 9 bits above the magnitude: nibbles 0, 1, 4, 5 take their magnitudes from w and signs from w << 6,
// nibbles 2, 3, 6, 7 magnitudes from w >> 6 and signs from w; 11 integer instructions a word instead of 15.
template <int R>
__host__ __device__ __forceinline__ uint32_t decode_word_bf16(uint32_t w) {
  static_assert(R >= 0 && R < 4, "four outputs per word");
  if constexpr (R < 2) {  // magnitudes at bits 0..2 / 4..6, signs at 9 / 13
    return (select_bits<0x00770077u>(w, w << 6) << (6 - 4 * R)) & 0x81C081C0u;
  } else {  // magnitudes moved to bits 2..4 / 6..8, signs at 11 / 15
    return (select_bits<0x01DC01DCu>(w >> 6, w) << (12 - 4 * R)) & 0x81C081C0u;
  }
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t x, __half2 s) {
  __half2 h = __hmul2(*reinterpret_cast<__half2*>(&x), s);
  return *reinterpret_cast<uint32_t*>(&h);
}

// One word of packed A (8 codes) staged for the MMA: its four decode_word outputs times the group's scale
// (already times 2^7) and another 2^7 (fold), i.e. e2m1 * e4m3 exactly in fp16: 6 significant bits at most,
// between 2^-10 and 2688. The small-M and K-sliced kernels stage NVFP4 A this way.
__device__ __forceinline__ uint4 decode_a_word(uint32_t w, __half2 sc, __half2 fold) {
  return make_uint4(hmul2_u32(hmul2_u32(decode_word<0>(w), sc), fold), hmul2_u32(hmul2_u32(decode_word<1>(w), sc), fold),
                    hmul2_u32(hmul2_u32(decode_word<2>(w), sc), fold), hmul2_u32(hmul2_u32(decode_word<3>(w), sc), fold));
}

// Same bit placement as decode_word, with the output index r known only at run time (a 64-bit shift keeps
// the nibbles that a 32-bit left shift would drop).
__device__ __forceinline__ uint32_t decode_word_rt(uint32_t w, int r) {
  const uint64_t x = w;
  const uint32_t mag = static_cast<uint32_t>((x << 9) >> (4 * r)) & 0x0E000E00u;
  const uint32_t sgn = static_cast<uint32_t>((x << 12) >> (4 * r)) & 0x80008000u;
  return mag | sgn;
}

// The byte offset of the 4-byte word holding scale row `row`'s scales of 64-K block kb (four 16-element groups) in
// the 128x4 blocked layout with sf_atoms_per_row atoms per 128-row block.
__host__ __device__ __forceinline__ int64_t blocked_sf_word_offset(int64_t row, int kb, int sf_atoms_per_row) {
  return ((row / kSfAtomRows) * sf_atoms_per_row + kb) * kSfAtomBytes + (row % 32) * 16 + ((row % kSfAtomRows) / 32) * 4;
}

// Vector v (0..7) of one (row, 64-K block) of A_dec (the wgmma kernel's decoded A, sm90_gemm.cuh) from the block's
// packed bytes (lo: K 0..31, hi: K 32..63) and its four e4m3 scales (sw, group q in byte q): v = 2s + h holds, for
// q = 0..3, decode_word<s> of word h of scale group q, times the scale and a_fold, then a_post (fp16x2 powers of two
// folded into the decode, backend.cu run).
__device__ __forceinline__ uint4 decode_a_vector(uint4 lo, uint4 hi, uint32_t sw, int v, uint32_t a_fold,
                                                 uint32_t a_post) {
  const int s = v >> 1, h = v & 1;
  const __half2_raw s01r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(sw & 0xFFFF), __NV_E4M3);
  const __half2_raw s23r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(sw >> 16), __NV_E4M3);
  const __half2 fold = *reinterpret_cast<const __half2*>(&a_fold), post = *reinterpret_cast<const __half2*>(&a_post);
  const __half2 s01 = __hmul2(*reinterpret_cast<const __half2*>(&s01r), fold);
  const __half2 s23 = __hmul2(*reinterpret_cast<const __half2*>(&s23r), fold);
  // Scale group q is bytes 8q..8q+7 of the block: words 2q (elements 0..7) and 2q + 1 (8..15).
  const uint32_t w0 = h ? lo.y : lo.x, w1 = h ? lo.w : lo.z, w2 = h ? hi.y : hi.x, w3 = h ? hi.w : hi.z;
  return make_uint4(hmul2_u32(hmul2_u32(decode_word_rt(w0, s), __low2half2(s01)), post),
                    hmul2_u32(hmul2_u32(decode_word_rt(w1, s), __high2half2(s01)), post),
                    hmul2_u32(hmul2_u32(decode_word_rt(w2, s), __low2half2(s23)), post),
                    hmul2_u32(hmul2_u32(decode_word_rt(w3, s), __high2half2(s23)), post));
}

// The 16-bit type the tensor cores multiply in. kHalf serves both the W4A4 form (A decoded to fp16 too)
// and fp16 activations; kBf16 serves bf16 activations. Each decodes a B element to e2m1 * e4m3 * 2^-7
// exactly: 5 significant bits at most, between 2^-17 and 21, a normal number in either type. The
// epilogue multiplies 2^7 back (out_mult).
enum class Elem { kHalf, kBf16 };

template <Elem E>
struct BDecode;

template <>
struct BDecode<Elem::kHalf> {
  using T = __half;
  template <int R>
  __device__ __forceinline__ static uint32_t word(uint32_t w) { return decode_word<R>(w); }
  // Two e4m3 scales (low byte first) -> {s0 * 2^7, s1 * 2^7} in fp16 (exact: 448 * 2^7 < 65504), the
  // factor that turns word()'s value * 2^-14 into value * scale * 2^-7.
  __device__ __forceinline__ static uint32_t scales(uint16_t e4m3x2) {
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(e4m3x2), __NV_E4M3);
    const __half2 s = __hmul2(*reinterpret_cast<const __half2*>(&r), __half2half2(__ushort_as_half(0x5800)));
    return *reinterpret_cast<const uint32_t*>(&s);
  }
  __device__ __forceinline__ static uint32_t mul(uint32_t x, uint32_t s) {
    __half2 h = __hmul2(*reinterpret_cast<const __half2*>(&x), *reinterpret_cast<const __half2*>(&s));
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct BDecode<Elem::kBf16> {
  using T = __nv_bfloat16;
  template <int R>
  __device__ __forceinline__ static uint32_t word(uint32_t w) { return decode_word_bf16<R>(w); }
  // {s0 * 2^119, s1 * 2^119} in bf16, exact: 4 significant bits, from 2^-9 * 2^119 up to 448 * 2^119 =
  // 1.75 * 2^127 (bf16's largest is 1.99 * 2^127); it turns word()'s value * 2^-126 into value * scale * 2^-7.
  __device__ __forceinline__ static uint32_t scales(uint16_t e4m3x2) {
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(e4m3x2), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r));
    const __nv_bfloat162 s = __floats2bfloat162_rn(f.x * 0x1p119f, f.y * 0x1p119f);
    return *reinterpret_cast<const uint32_t*>(&s);
  }
  __device__ __forceinline__ static uint32_t mul(uint32_t x, uint32_t s) {
    __nv_bfloat162 h =
        __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&x), *reinterpret_cast<const __nv_bfloat162*>(&s));
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// The mma.sync m16n8k16 A fragments of two MMA steps from one packed word of each of a lane's two rows (g and
// g + 8, with their scale pairs sg / s8 from BDecode::scales): g[r] = row g's decode_word<r> output times sg,
// e[r] = row g + 8's times s8. Steps 2 h and 2 h + 1 take {g[0], e[0], g[1], e[1]} and {g[2], e[2], g[3], e[3]}.
template <Elem E>
struct BFragments {
  uint32_t g[4], e[4];
  __device__ __forceinline__ BFragments(uint32_t row_g, uint32_t row_g8, uint32_t sg, uint32_t s8) {
    using Dec = BDecode<E>;
    g[0] = Dec::mul(Dec::template word<0>(row_g), sg), g[1] = Dec::mul(Dec::template word<1>(row_g), sg);
    g[2] = Dec::mul(Dec::template word<2>(row_g), sg), g[3] = Dec::mul(Dec::template word<3>(row_g), sg);
    e[0] = Dec::mul(Dec::template word<0>(row_g8), s8), e[1] = Dec::mul(Dec::template word<1>(row_g8), s8);
    e[2] = Dec::mul(Dec::template word<2>(row_g8), s8), e[3] = Dec::mul(Dec::template word<3>(row_g8), s8);
  }
};

// alpha as the caller gave it: *alpha, fl(*alpha * *alpha2) with a second factor, 1 without either.
__device__ __forceinline__ float alpha_of(const float* alpha, const float* alpha2) {
  if (alpha == nullptr) return 1.0f;
  return alpha2 ? __fmul_rn(__ldg(alpha), __ldg(alpha2)) : __ldg(alpha);
}

// {lo, lo} and {hi, hi} of a pair of 16-bit values.
__device__ __forceinline__ uint32_t low_pair(uint32_t x) { return __byte_perm(x, 0, 0x1010); }
__device__ __forceinline__ uint32_t high_pair(uint32_t x) { return __byte_perm(x, 0, 0x3232); }

// Eight 16-bit activations (elements 0..7 of a group, low half first) in decode_word's output order:
// output r = {element r, element r + 4}, so that A lines up with the decoded B words element for element.
__device__ __forceinline__ uint4 pair_like_decode(uint4 v) {
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                    __byte_perm(v.y, v.w, 0x7632));
}

}  // namespace nvfp4_gemm::sm90
