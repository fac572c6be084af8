// Hopper NVFP4 GEMM for small M (a few tokens): a bandwidth-bound stream of packed B through registers
// into mma.sync m16n8k16 (fp16 operands, fp32 accumulation). Torch-free.
//
// Why not the wgmma kernel: at M <= 16 the work is reading B (N x K/2 bytes + scales) once; the wgmma
// kernel moves B through TMA -> shared memory -> registers behind an mbarrier ring and reached 48% of the
// copy rate at M = 1 (docs/SM90_NOTES.md). Here every lane loads its B bytes straight from global memory
// with 16-byte non-allocating loads, issued for DEPTH K blocks ahead, and decodes them into the A
// fragments of mma.sync; no producer warp, no barrier per stage, no prepass.
//
// Roles: B rows (weights) are the MMA's M = 16 side, the tokens its N = 8 side (TOKENS / 8 n-tiles).
// CTA = 8 warps x 16 B rows = 128 rows (one row block of the scale layout); grid = row blocks x K splits.
//
// K permutation (the same for both operands, so the dot products are unchanged): K is cut into blocks of
// 256. In a block, lane (g, tig) of a warp owns K elements [64 tig, 64 tig + 64) of rows g and g + 8 of
// the warp's 16: 32 contiguous bytes per row (two 16-byte loads) and one 32-bit word of scales per row
// (the 4 scale groups of those 64 K are the 4 bytes of one blocked-layout word). Word i (0..7) of those
// 32 bytes feeds MMA steps 2i and 2i+1: step 2i + h takes decode_word<2h> as the k = 2tig, 2tig+1 pair and
// decode_word<2h+1> as k = 2tig+8, 2tig+9. The activations are decoded once per CTA into shared memory in
// the matching order: for (block, token t, tig), 8 chunks of 16 bytes, chunk i = the four decode_word
// outputs of A's word i, so one 16-byte shared load gives the B fragments {b0, b1} of two steps.
//
// Numerics as in sm90_gemm.cuh: B decodes to e2m1 * e4m3 * 2^-7 (2^7 folded into the scale), A to
// e2m1 * e4m3 exactly; both exact in fp16, products exact in fp32; the epilogue multiplies by 2^7 * alpha
// and rounds once to the output type.
//
// Split-K: each (row block, split) CTA writes its fp32 tile to the workspace; the last CTA of a row block
// to arrive (atomic counter, zeroed on the stream before the launch) sums the splits in split order and
// writes C, so the result does not depend on timing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "common/problem.h"
#include "sm90/fp4_decode.cuh"

namespace nvfp4_gemm::sm90 {

inline constexpr int kSmallThreads = 256;  // 8 warps
inline constexpr int kSmallRows = 128;     // B rows per CTA: 8 warps x MMA M = 16
inline constexpr int kSmallKBlock = 256;   // K per block (4 lanes x 64)
// Shared bytes of decoded A per (block, token, tig): 128 of data + 16 of padding, so that the 8 lanes of
// a quarter warp (g = 0..1 or 2..3, tig = 0..3) hit 8 different 16-byte bank groups (stride 9 chunks per
// tig, 36 per token).
inline constexpr int kSmallTigBytes = 144;

// Dynamic shared memory cap: 227 KB per block on sm_90 counts the kernel's static shared memory too.
inline constexpr int kSmallMMaxSmem = 227 * 1024 - 1024;

constexpr int small_m_smem_bytes(int tokens, int kblocks_per_cta) {
  return kblocks_per_cta * tokens * 4 * kSmallTigBytes;
}

struct SmallMParams {
  const uint8_t* a;
  const uint8_t* b;
  const uint8_t* sfa;
  const uint8_t* sfb;
  const float* alpha;   // nullptr: 1
  void* c;
  float4* partial;      // [row blocks][splits][8 warps][TOKENS/8][32 lanes] float4, when splits > 1
  uint32_t* counters;   // [row blocks], zero at launch when splits > 1
  int64_t lda, ldb, ldc;
  int m, n, k;
  int sfa_row0;         // row of A's scales that A's row 0 is (launches of TOKENS rows)
  int sf_atoms;         // ceil(K/16 / 4): atoms per row block of either scale tensor
  int kblocks;          // ceil(K / 256)
  int kb_per_cta;       // K blocks per split (the last split may have fewer)
  int splits;
  float out_mult;       // 2^7: the power of two the B decode leaves in the sums
  OutDtype out_dtype;
};

struct SmallMLaunch {
  SmallMParams params;
  int row_blocks;
  int smem;
  cudaStream_t stream;
};

// One K block of B for one lane: rows g and g + 8, 32 bytes each, and their scale words.
struct BBlock {
  uint4 r[4];  // r[0], r[1]: row g bytes 0..15, 16..31; r[2], r[3]: row g + 8
  uint32_t s[2];
};

// B is read exactly once: keep it out of L1 (the scales and A use it).
__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void load_bblock(BBlock& bb, const SmallMParams& p, int row, int sf_row_off, int sf_row_off8,
                                            int64_t sf_rb_base, int kblk, int tig) {
  const int kel = kblk * kSmallKBlock + tig * 64;
  const uint8_t* src = p.b + static_cast<int64_t>(row) * p.ldb + kel / 2;
  const bool r0 = row < p.n, r1 = row + 8 < p.n;
  // K % 32 == 0: each 16-byte half (32 K) is wholly inside K or wholly past it.
  const bool h0 = kel < p.k, h1 = kel + 32 < p.k;
  const uint4 z = make_uint4(0, 0, 0, 0);
  bb.r[0] = (r0 && h0) ? ld_stream(src) : z;
  bb.r[1] = (r0 && h1) ? ld_stream(src + 16) : z;
  bb.r[2] = (r1 && h0) ? ld_stream(src + 8 * p.ldb) : z;
  bb.r[3] = (r1 && h1) ? ld_stream(src + 8 * p.ldb + 16) : z;
  // Scale atom column kblk * 4 + tig holds this lane's 4 groups; past ceil(K/64) atoms it does not exist.
  // Rows past N are inside the layout's 128-row padding (zero bytes).
  const int ac = kblk * 4 + tig;
  if (ac < p.sf_atoms) {
    const uint8_t* s = p.sfb + (sf_rb_base + ac) * kSfAtomBytes;
    bb.s[0] = __ldg(reinterpret_cast<const uint32_t*>(s + sf_row_off));
    bb.s[1] = __ldg(reinterpret_cast<const uint32_t*>(s + sf_row_off8));
  } else {
    bb.s[0] = bb.s[1] = 0;
  }
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Scale word (4 e4m3 bytes) -> {s0, s0}, {s1, s1}, ... fp16x2, times the 2^7 fold.
__device__ __forceinline__ void scales_of(uint32_t w, __half2 (&s)[4]) {
  const __half2 fold = __half2half2(__ushort_as_half(0x5800));  // 128
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFF), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const __half2 l = __hmul2(*reinterpret_cast<const __half2*>(&lo), fold);
  const __half2 h = __hmul2(*reinterpret_cast<const __half2*>(&hi), fold);
  s[0] = __low2half2(l);
  s[1] = __high2half2(l);
  s[2] = __low2half2(h);
  s[3] = __high2half2(h);
}

template <int NT>
__device__ __forceinline__ void compute_bblock(const BBlock& bb, const uint8_t* a_blk, int g, int tig,
                                               float (&acc)[NT][4]) {
  __half2 sg[4], s8[4];
  scales_of(bb.s[0], sg);
  scales_of(bb.s[1], s8);
  const uint32_t* wg = reinterpret_cast<const uint32_t*>(&bb.r[0]);  // r[0], r[1] contiguous: 8 words
  const uint32_t* w8 = reinterpret_cast<const uint32_t*>(&bb.r[2]);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t x = wg[i], y = w8[i];
    const __half2 a = sg[i / 2], b = s8[i / 2];
    const uint32_t g0 = hmul2_u32(decode_word<0>(x), a), g1 = hmul2_u32(decode_word<1>(x), a);
    const uint32_t g2 = hmul2_u32(decode_word<2>(x), a), g3 = hmul2_u32(decode_word<3>(x), a);
    const uint32_t e0 = hmul2_u32(decode_word<0>(y), b), e1 = hmul2_u32(decode_word<1>(y), b);
    const uint32_t e2 = hmul2_u32(decode_word<2>(y), b), e3 = hmul2_u32(decode_word<3>(y), b);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint4 v = *reinterpret_cast<const uint4*>(a_blk + ((j * 8 + g) * 4 + tig) * kSmallTigBytes + i * 16);
      mma16816(acc[j], g0, e0, g1, e1, v.x, v.y);
      mma16816(acc[j], g2, e2, g3, e3, v.z, v.w);
    }
  }
}

template <typename T>
__device__ __forceinline__ void store_small(const SmallMParams& p, int token, int col, float v) {
  if (token < p.m && col < p.n) reinterpret_cast<T*>(p.c)[static_cast<int64_t>(token) * p.ldc + col] = convert_out<T>(v);
}

template <int TOKENS, int KBMAX, int DEPTH>
__global__ void __launch_bounds__(kSmallThreads, 2) small_m_kernel(const __grid_constant__ SmallMParams p) {
  static_assert(TOKENS % 8 == 0 && TOKENS <= 32, "n-tiles of 8 tokens, up to 4");
  constexpr int NT = TOKENS / 8;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t s_last;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int rb = blockIdx.x, split = blockIdx.y;
  const int kb0 = split * p.kb_per_cta;
  const int nkb = min(p.kb_per_cta, p.kblocks - kb0);
  const int rloc = warp * 16 + g;  // row inside the 128-row block
  const int row = rb * kSmallRows + rloc;
  const int sf_off = (rloc % 32) * 16 + (rloc / 32) * 4, sf_off8 = ((rloc + 8) % 32) * 16 + ((rloc + 8) / 32) * 4;
  const int64_t sf_rb_base = static_cast<int64_t>(rb) * p.sf_atoms;

  // B loads first: DEPTH blocks per lane are in flight while the CTA decodes A.
  BBlock buf[DEPTH];
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
    if (d < nkb) load_bblock(buf[d], p, row, sf_off, sf_off8, sf_rb_base, kb0 + d, tig);

  // A for this CTA's K range, decoded to e2m1 * e4m3 (exact in fp16) in the permuted order; tokens past M
  // and K past the end are zeros. One thread per 32-bit word of A: a warp reads 128 contiguous bytes.
  {
    const int words_per_token = nkb * 32;
    const __half2 fold = __half2half2(__ushort_as_half(0x5800));  // 128, twice: see the numerics note
    for (int idx = tid; idx < TOKENS * words_per_token; idx += kSmallThreads) {
      const int t = idx / words_per_token, rem = idx - t * words_per_token;
      const int blk = rem >> 5, tg = (rem >> 3) & 3, i = rem & 7;
      const int kg = (kb0 + blk) * kSmallKBlock + tg * 64 + i * 8;
      uint4 out = make_uint4(0, 0, 0, 0);
      if (t < p.m && kg < p.k) {
        const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(p.a + static_cast<int64_t>(t) * p.lda + kg / 2));
        const int r = p.sfa_row0 + t, sc = kg / 16;  // SPEC.md's blocked offset (blocked_sf_offset)
        const uint8_t sb = __ldg(p.sfa + (static_cast<int64_t>(r / 128) * p.sf_atoms + sc / 4) * kSfAtomBytes +
                                 (r % 32) * 16 + ((r % 128) / 32) * 4 + sc % 4);
        const __half_raw sr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(sb), __NV_E4M3);
        const __half2 s = __hmul2(__half2half2(*reinterpret_cast<const __half*>(&sr)), fold);
        out = make_uint4(hmul2_u32(hmul2_u32(decode_word<0>(w), s), fold), hmul2_u32(hmul2_u32(decode_word<1>(w), s), fold),
                         hmul2_u32(hmul2_u32(decode_word<2>(w), s), fold), hmul2_u32(hmul2_u32(decode_word<3>(w), s), fold));
      }
      *reinterpret_cast<uint4*>(smem + ((blk * TOKENS + t) * 4 + tg) * kSmallTigBytes + i * 16) = out;
    }
  }
  __syncthreads();

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int base = 0; base < nkb; base += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int blk = base + d;
      if (blk < nkb) {
        compute_bblock<NT>(buf[d], smem + blk * TOKENS * 4 * kSmallTigBytes, g, tig, acc);
        if (blk + DEPTH < nkb) load_bblock(buf[d], p, row, sf_off, sf_off8, sf_rb_base, kb0 + blk + DEPTH, tig);
      }
    }
  }

  if (p.splits > 1) {
    float4* part = p.partial + ((static_cast<int64_t>(rb) * p.splits + split) * 8 + warp) * NT * 32;
#pragma unroll
    for (int j = 0; j < NT; ++j) __stcg(part + j * 32 + lane, make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(p.counters + rb, 1u) == static_cast<uint32_t>(p.splits - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // Split order, whatever the arrival order: bitwise the same result on every call.
    const float4* base = p.partial + (static_cast<int64_t>(rb) * p.splits * 8 + warp) * NT * 32;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float4 s = __ldcg(base + j * 32 + lane);
      for (int q = 1; q < p.splits; ++q) {
        const float4 v = __ldcg(base + static_cast<int64_t>(q) * 8 * NT * 32 + j * 32 + lane);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      acc[j][0] = s.x;
      acc[j][1] = s.y;
      acc[j][2] = s.z;
      acc[j][3] = s.w;
    }
  }

  const float alpha = p.alpha ? __ldg(p.alpha) : 1.f;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = j * 8 + 2 * tig + (e & 1), col = row + (e >> 1) * 8;
      const float v = (acc[j][e] * p.out_mult) * alpha;
      switch (p.out_dtype) {
        case OutDtype::kFloat16: store_small<__half>(p, token, col, v); break;
        case OutDtype::kBFloat16: store_small<__nv_bfloat16>(p, token, col, v); break;
        default: store_small<float>(p, token, col, v); break;
      }
    }
  }
}

template <int TOKENS, int KBMAX, int DEPTH>
cudaError_t launch_small_m(const SmallMLaunch& l) {
  auto* kernel = small_m_kernel<TOKENS, KBMAX, DEPTH>;
  static const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmallMMaxSmem);
  if (attr != cudaSuccess) return attr;
  if (l.params.splits > 1) {
    const cudaError_t e = cudaMemsetAsync(l.params.counters, 0, sizeof(uint32_t) * l.row_blocks, l.stream);
    if (e != cudaSuccess) return e;
  }
  kernel<<<dim3(l.row_blocks, l.params.splits), kSmallThreads, l.smem, l.stream>>>(l.params);
  return cudaGetLastError();
}

}  // namespace nvfp4_gemm::sm90
