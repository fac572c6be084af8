// Hopper fused NVFP4 GEMM: B (weights) decoded in registers and fed to register-sourced fp16 wgmma,
// A (activations) decoded once per call by a prepass into fp16 and read by TMA. Torch-free.
//
// Roles are swapped against the usual GEMM: wgmma's M side is 64 rows of B per consumer warpgroup, its
// N side is TOKENS rows of A, so C^T tiles come out of the accumulators. At M = 128 this keeps the MMA
// shape m64n128 instead of wasting a 128-row A tile, and B (the large operand) never leaves registers
// after decode.
//
// Numerics (exact up to fp32 accumulation):
//  - A_dec = e2m1(A) * e4m3(sfa) in fp16, exact (|value| <= 6 * 448 = 2688).
//  - B is decoded to e2m1(B) * e4m3(sfb) * 2^-14 in fp16: the nibble's three magnitude bits land on fp16
//    exponent/mantissa bits 11..9, which reads as value * 2^-14 (code 1 = 0.5 becomes the subnormal
//    2^-15), then one HMUL2 by the scale. Every product is a multiple of 2^-24 with at most 6
//    significant bits, so it is exact in fp16; the 2^-14 is a power of two, so the fp32 sums round exactly
//    as the unscaled ones would, and the epilogue multiplies it back out.
//  - K order inside each 64-wide K block is permuted (the same way for A and B; a sum does not care):
//    each thread owns a whole 16-element scale group of its B row, so it loads 8 bytes and one scale
//    byte per row per 64 K. The prepass writes A_dec in the matching order (permuted_k below).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <utility>

#include "common/problem.h"

namespace nvfp4_gemm::sm90 {

inline constexpr int kTileW = 128;   // B rows per CTA: 2 consumer warpgroups x wgmma M = 64
inline constexpr int kTileK = 128;   // K per pipeline stage (two 64-K blocks)
inline constexpr int kThreads = 384; // producer warpgroup + 2 consumer warpgroups
inline constexpr int kStageBBytes = kTileW * kTileK / 2;    // 8 KB packed B, SW64 by TMA
inline constexpr int kStageSfBytes = 2 * kSfAtomBytes;        // two 128x4 scale atoms = 1 KB
inline constexpr float kBScaleBack = 16384.0f;                // undoes the 2^-14 of the B decode

constexpr int stage_bytes(int tokens) { return tokens * kTileK * 2 + kStageBBytes + kStageSfBytes; }
constexpr int smem_bytes(int tokens, int stages) { return stages * stage_bytes(tokens) + 2 * stages * 8 + 1024; }

// Logical K offset (0..63) inside a 64-K block of the element that wgmma step s (0..3) reads at
// column j (0..15). Thread quad lane q holds scale group q; its two fp16x2 registers per row hold group
// elements (s, s+4) and (8+s, 12+s) (see decode_word).
__host__ __device__ constexpr int permuted_k(int s, int j) {
  return 16 * ((j % 8) / 2) + s + 4 * (j % 2) + 8 * (j / 8);
}

struct GemmParams {
  CUtensorMap tmap_a;     // A_dec [rows][kp] fp16, box {64, TOKENS}, SWIZZLE_128B
  CUtensorMap tmap_b;     // B [n][k/2] bytes, box {64, 128}, SWIZZLE_64B
  const uint8_t* sfb;     // blocked scales of B
  const float* alpha;     // nullptr: 1
  void* c;                // output rows of this M chunk
  float* partial;         // split-K partial sums (splits > 1), else nullptr
  int64_t ldc;
  int m, n, k;
  int sf_atoms_per_row;   // ceil(K/16 / 4)
  int ktiles;             // ceil(K / 128)
  int splits;
  OutDtype out_dtype;
};

// ---------------------------------------------------------------------------------------------------
// FP4 decode: 8 packed e2m1 (one 32-bit word) -> four fp16x2 holding value * 2^-14. Output r holds
// nibbles r (low half) and r + 4 (high half): both sit at the same place in their 16-bit half, so one
// shift and two masks place magnitude (bits 11..9) and sign (bit 15) of both.
template <int R>
__device__ __forceinline__ uint32_t decode_word(uint32_t w) {
  static_assert(R >= 0 && R < 4, "four outputs per word");
  const uint32_t mag = (R < 3 ? (w << (9 - 4 * R)) : (w >> 3)) & 0x0E000E00u;
  const uint32_t sgn = (w << (12 - 4 * R)) & 0x80008000u;
  return mag | sgn;
}

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t x, __half2 s) {
  __half2 h = __hmul2(*reinterpret_cast<__half2*>(&x), s);
  return *reinterpret_cast<uint32_t*>(&h);
}

// ---------------------------------------------------------------------------------------------------
template <int TOKENS>
struct Wgmma;
#define NVFP4_SM90_WGMMA(N)                                                                        \
  template <>                                                                                      \
  struct Wgmma<N> {                                                                                \
    using Op = cute::SM90::GMMA::MMA_64x##N##x16_F32F16F16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>; \
  };
NVFP4_SM90_WGMMA(8)
NVFP4_SM90_WGMMA(16)
NVFP4_SM90_WGMMA(32)
NVFP4_SM90_WGMMA(64)
NVFP4_SM90_WGMMA(128)
NVFP4_SM90_WGMMA(256)
#undef NVFP4_SM90_WGMMA

template <int TOKENS, size_t... I>
__device__ __forceinline__ void wgmma_call(const uint32_t (&a)[4], uint64_t desc, float (&d)[TOKENS / 2],
                                           std::index_sequence<I...>) {
  Wgmma<TOKENS>::Op::fma(a[0], a[1], a[2], a[3], desc, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}

// K-major SWIZZLE_128B descriptor of a [TOKENS][64] fp16 tile at a 1024-aligned address: 8-row groups
// 1024 bytes apart; each 16-wide K step moves the start address by 32 bytes.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((smem_addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 1;  // SWIZZLE_128B
  return d.desc_;
}

template <typename T>
__device__ __forceinline__ T convert_out(float v);
template <>
__device__ __forceinline__ __half convert_out<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 convert_out<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ float convert_out<float>(float v) { return v; }

// Output scale: the 2^14 of the B decode, times alpha. Both factors in one fp32 multiply: 2^14 is exact.
__device__ __forceinline__ float out_scale(const float* alpha) {
  return alpha ? kBScaleBack * __ldg(alpha) : kBScaleBack;
}

template <typename T>
__device__ __forceinline__ void store_c(void* c, int64_t ldc, int m, int n, int rows_m, int cols_n, float v) {
  if (m < rows_m && n < cols_n) reinterpret_cast<T*>(c)[static_cast<int64_t>(m) * ldc + n] = convert_out<T>(v);
}

// Writes one thread's accumulator quad (rows n0, n0+8 of the weight tile; tokens m0, m0+1).
__device__ __forceinline__ void store_quad(const GemmParams& p, int n0, int m0, float4 v, float scale) {
  switch (p.out_dtype) {
    case OutDtype::kFloat16:
      store_c<__half>(p.c, p.ldc, m0, n0, p.m, p.n, v.x * scale);
      store_c<__half>(p.c, p.ldc, m0 + 1, n0, p.m, p.n, v.y * scale);
      store_c<__half>(p.c, p.ldc, m0, n0 + 8, p.m, p.n, v.z * scale);
      store_c<__half>(p.c, p.ldc, m0 + 1, n0 + 8, p.m, p.n, v.w * scale);
      break;
    case OutDtype::kBFloat16:
      store_c<__nv_bfloat16>(p.c, p.ldc, m0, n0, p.m, p.n, v.x * scale);
      store_c<__nv_bfloat16>(p.c, p.ldc, m0 + 1, n0, p.m, p.n, v.y * scale);
      store_c<__nv_bfloat16>(p.c, p.ldc, m0, n0 + 8, p.m, p.n, v.z * scale);
      store_c<__nv_bfloat16>(p.c, p.ldc, m0 + 1, n0 + 8, p.m, p.n, v.w * scale);
      break;
    default:
      store_c<float>(p.c, p.ldc, m0, n0, p.m, p.n, v.x * scale);
      store_c<float>(p.c, p.ldc, m0 + 1, n0, p.m, p.n, v.y * scale);
      store_c<float>(p.c, p.ldc, m0, n0 + 8, p.m, p.n, v.z * scale);
      store_c<float>(p.c, p.ldc, m0 + 1, n0 + 8, p.m, p.n, v.w * scale);
      break;
  }
}

// ---------------------------------------------------------------------------------------------------
// The main kernel. grid = (ceil(n / 128), ceil(m / TOKENS), splits).
template <int TOKENS, int STAGES>
__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(const __grid_constant__ GemmParams p) {
  static_assert(smem_bytes(TOKENS, STAGES) <= 232448, "pipeline does not fit in 227 KB of shared memory");
  constexpr int kABytes = TOKENS * 64 * 2;  // one 64-K block of A_dec
  constexpr int kStage = stage_bytes(TOKENS);
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem + STAGES * kStage);
  uint64_t* empty_bar = full_bar + STAGES;

  const int wg = threadIdx.x / 128;
  const int tile_w = blockIdx.x, tile_t = blockIdx.y, split = blockIdx.z;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(split) * p.ktiles / p.splits);
  const int kt_end = static_cast<int>(static_cast<int64_t>(split + 1) * p.ktiles / p.splits);
  const int num_kt = kt_end - kt_begin;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      Barrier::init(&full_bar[s], 1);
      EmptyBarrier::init(&empty_bar[s], 8);  // one arrive per consumer warp
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0 && num_kt > 0) {
      cute::prefetch_tma_descriptor(&p.tmap_a);
      cute::prefetch_tma_descriptor(&p.tmap_b);
      const uint8_t* sf_tile = p.sfb + static_cast<int64_t>(tile_w) * p.sf_atoms_per_row * kSfAtomBytes;
      for (int i = 0; i < num_kt; ++i) {
        const int s = i % STAGES;
        const int kt = kt_begin + i;
        if (i >= STAGES) EmptyBarrier::wait(&empty_bar[s], ((i / STAGES) - 1) & 1);
        const int sf_atoms = min(2, p.sf_atoms_per_row - 2 * kt);
        uint8_t* st = smem + s * kStage;
        Barrier::arrive_and_expect_tx(&full_bar[s], 2 * kABytes + kStageBBytes + sf_atoms * kSfAtomBytes);
        cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &full_bar[s], 0, st, kt * kTileK, tile_t * TOKENS);
        cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &full_bar[s], 0, st + kABytes, kt * kTileK + 64, tile_t * TOKENS);
        cute::SM90_TMA_LOAD_2D::copy(&p.tmap_b, &full_bar[s], 0, st + 2 * kABytes, kt * (kTileK / 2), tile_w * kTileW);
        cute::SM90_BULK_COPY_G2S::copy(sf_tile + 2 * kt * kSfAtomBytes, &full_bar[s], st + 2 * kABytes + kStageBBytes,
                                       sf_atoms * kSfAtomBytes);
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int t = threadIdx.x - 128;        // 0..255 over both consumer warpgroups
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int row0 = (t / 32) * 16 + g;      // CTA-local B row; row0 + 8 is the other
  const int row1 = row0 + 8;
  // Packed-B byte offsets inside a stage for this thread's 8-byte group, undoing TMA's 64B swizzle
  // (16-byte chunk index XOR address bits 7..8).
  uint32_t boff[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    boff[j][0] = 2 * kABytes + row0 * 64 + ((((j * 2 + q / 2) ^ ((row0 >> 1) & 3))) << 4) + (q & 1) * 8;
    boff[j][1] = 2 * kABytes + row1 * 64 + ((((j * 2 + q / 2) ^ ((row1 >> 1) & 3))) << 4) + (q & 1) * 8;
  }
  const uint32_t sfoff0 = 2 * kABytes + kStageBBytes + (row0 % 32) * 16 + (row0 / 32) * 4 + q;
  const uint32_t sfoff1 = 2 * kABytes + kStageBBytes + (row1 % 32) * 16 + (row1 / 32) * 4 + q;
  const uint32_t smem_base = cute::cast_smem_ptr_to_uint(smem);

  float acc[TOKENS / 2];
#pragma unroll
  for (int i = 0; i < TOKENS / 2; ++i) acc[i] = 0.0f;

  uint32_t fr0[16], fr1[16];  // decoded B for the two 64-K blocks in flight

  // Decodes 64-K block j of stage s into fr: [0..3] row0 elems 0..7, [4..7] row1 elems 0..7,
  // [8..11] row0 elems 8..15, [12..15] row1 elems 8..15.
  auto decode = [&](uint32_t(&fr)[16], int s, int j) {
    const uint8_t* st = smem + s * kStage;
    const uint2 w0 = *reinterpret_cast<const uint2*>(st + boff[j][0]);
    const uint2 w1 = *reinterpret_cast<const uint2*>(st + boff[j][1]);
    const uint16_t sc = static_cast<uint16_t>(st[sfoff0 + j * kSfAtomBytes]) |
                        static_cast<uint16_t>(static_cast<uint16_t>(st[sfoff1 + j * kSfAtomBytes]) << 8);
    const __half2_raw sr = __nv_cvt_fp8x2_to_halfraw2(sc, __NV_E4M3);
    const __half2 s2 = *reinterpret_cast<const __half2*>(&sr);
    const __half2 s0 = __low2half2(s2), s1 = __high2half2(s2);
    fr[0] = hmul2_u32(decode_word<0>(w0.x), s0);
    fr[1] = hmul2_u32(decode_word<1>(w0.x), s0);
    fr[2] = hmul2_u32(decode_word<2>(w0.x), s0);
    fr[3] = hmul2_u32(decode_word<3>(w0.x), s0);
    fr[4] = hmul2_u32(decode_word<0>(w1.x), s1);
    fr[5] = hmul2_u32(decode_word<1>(w1.x), s1);
    fr[6] = hmul2_u32(decode_word<2>(w1.x), s1);
    fr[7] = hmul2_u32(decode_word<3>(w1.x), s1);
    fr[8] = hmul2_u32(decode_word<0>(w0.y), s0);
    fr[9] = hmul2_u32(decode_word<1>(w0.y), s0);
    fr[10] = hmul2_u32(decode_word<2>(w0.y), s0);
    fr[11] = hmul2_u32(decode_word<3>(w0.y), s0);
    fr[12] = hmul2_u32(decode_word<0>(w1.y), s1);
    fr[13] = hmul2_u32(decode_word<1>(w1.y), s1);
    fr[14] = hmul2_u32(decode_word<2>(w1.y), s1);
    fr[15] = hmul2_u32(decode_word<3>(w1.y), s1);
  };
  auto issue = [&](uint32_t(&fr)[16], int s, int j) {
#pragma unroll
    for (int i = 0; i < 16; ++i) cute::warpgroup_fence_operand(fr[i]);
#pragma unroll
    for (int i = 0; i < TOKENS / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
    cute::warpgroup_arrive();
    const uint64_t desc = sw128_desc(smem_base + s * kStage + j * kABytes);
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      const uint32_t a[4] = {fr[step], fr[4 + step], fr[8 + step], fr[12 + step]};
      wgmma_call<TOKENS>(a, desc + 2 * step, acc, std::make_index_sequence<TOKENS / 2>{});
    }
    cute::warpgroup_commit_batch();
#pragma unroll
    for (int i = 0; i < TOKENS / 2; ++i) cute::warpgroup_fence_operand(acc[i]);
  };
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) EmptyBarrier::arrive(&empty_bar[s]);
  };

  if (num_kt > 0) {
    Barrier::wait(&full_bar[0], 0);
    decode(fr0, 0, 0);
    for (int i = 0; i < num_kt; ++i) {
      const int s = i % STAGES;
      const int kt = kt_begin + i;
      const bool two_blocks = (kt * kTileK + 64) < p.k;
      issue(fr0, s, 0);
      cute::warpgroup_wait<1>();
#pragma unroll
      for (int x = 0; x < 16; ++x) cute::warpgroup_fence_operand(fr1[x]);
      if (i > 0) release((i - 1) % STAGES);
      if (two_blocks) {
        decode(fr1, s, 1);
        issue(fr1, s, 1);
        cute::warpgroup_wait<1>();
      }
#pragma unroll
      for (int x = 0; x < 16; ++x) cute::warpgroup_fence_operand(fr0[x]);
      if (i + 1 < num_kt) {
        const int s1 = (i + 1) % STAGES;
        Barrier::wait(&full_bar[s1], ((i + 1) / STAGES) & 1);
        decode(fr0, s1, 0);
      }
    }
    cute::warpgroup_wait<0>();
  }
#pragma unroll
  for (int i = 0; i < TOKENS / 2; ++i) cute::warpgroup_fence_operand(acc[i]);

  const int tiles_w = gridDim.x;
  if (p.splits > 1) {
    // Partial sums in accumulator order: [split][tile][quad j][thread] float4, coalesced; the reduce
    // kernel adds splits in index order, so the result does not depend on timing.
    const int64_t tile = static_cast<int64_t>(tile_t) * tiles_w + tile_w;
    const int64_t tiles = static_cast<int64_t>(tiles_w) * gridDim.y;
    float4* out = reinterpret_cast<float4*>(p.partial) + ((split * tiles + tile) * (TOKENS / 8)) * 256 + t;
#pragma unroll
    for (int j = 0; j < TOKENS / 8; ++j)
      out[j * 256] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    return;
  }
  const float scale = out_scale(p.alpha);
  const int n0 = tile_w * kTileW + row0;
#pragma unroll
  for (int j = 0; j < TOKENS / 8; ++j) {
    const int m0 = tile_t * TOKENS + 8 * j + 2 * q;
    store_quad(p, n0, m0, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]), scale);
  }
}

// Sums split-K partials in split order and writes C. One thread per (tile, quad j, consumer thread).
template <int TOKENS>
__global__ void __launch_bounds__(256) splitk_reduce_kernel(const __grid_constant__ GemmParams p, int tiles_w,
                                                             int tiles) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  const int64_t per_tile = (TOKENS / 8) * 256;
  if (idx >= tiles * per_tile) return;
  const int tile = static_cast<int>(idx / per_tile);
  const int j = static_cast<int>((idx % per_tile) / 256);
  const int t = static_cast<int>(idx % 256);
  const float4* src = reinterpret_cast<const float4*>(p.partial) + idx;
  float4 v = src[0];
  for (int s = 1; s < p.splits; ++s) {
    const float4 w = src[static_cast<int64_t>(s) * tiles * per_tile];
    v.x += w.x; v.y += w.y; v.z += w.z; v.w += w.w;
  }
  const int lane = t % 32, g = lane / 4, q = lane % 4;
  const int row0 = (t / 32) * 16 + g;
  const int tile_w = tile % tiles_w, tile_t = tile / tiles_w;
  store_quad(p, tile_w * kTileW + row0, tile_t * TOKENS + 8 * j + 2 * q, v, out_scale(p.alpha));
}

// ---------------------------------------------------------------------------------------------------
// A prepass: A_dec[r][kb*64 + s*16 + j] = e2m1(A[r][kb*64 + permuted_k(s, j)]) * sfa, fp16, zero past K.
// One thread per (row, 64-K block): 32 packed bytes and one 4-byte scale word in, 128 bytes out.
__global__ void __launch_bounds__(256) decode_a_kernel(const uint8_t* __restrict__ a, int64_t lda,
                                                       const uint8_t* __restrict__ sfa, int row_begin, int rows,
                                                       int k, int sf_atoms_per_row, __half* __restrict__ out,
                                                       int kp);

struct LaunchArgs {
  GemmParams params;
  int tiles_w, tiles_t;
  cudaStream_t stream;
};

template <int TOKENS, int STAGES>
cudaError_t launch_gemm(const LaunchArgs& args) {
  constexpr int smem = smem_bytes(TOKENS, STAGES);
  cudaError_t err = cudaFuncSetAttribute(gemm_kernel<TOKENS, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(args.tiles_w, args.tiles_t, args.params.splits);
  gemm_kernel<TOKENS, STAGES><<<grid, kThreads, smem, args.stream>>>(args.params);
  if (args.params.splits > 1) {
    const int tiles = args.tiles_w * args.tiles_t;
    const int64_t threads = static_cast<int64_t>(tiles) * (TOKENS / 8) * 256;
    splitk_reduce_kernel<TOKENS><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, args.stream>>>(
        args.params, args.tiles_w, tiles);
  }
  return cudaGetLastError();
}

}  // namespace nvfp4_gemm::sm90
