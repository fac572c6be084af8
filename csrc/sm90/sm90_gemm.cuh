// Hopper fused NVFP4 GEMM: B (weights) decoded in registers and fed to register-sourced fp16 wgmma,
// A (activations) decoded inside the kernel by producer warps into shared memory, where wgmma reads it.
// Torch-free.
//
// Roles are swapped against the usual GEMM: wgmma's M side is 64 rows of B per consumer warpgroup, its
// N side is TOKENS rows of A, so C^T tiles come out of the accumulators. At M = 128 this keeps the MMA
// shape m64n128 instead of wasting a 128-row A tile, and B (the large operand) never leaves registers
// after decode.
//
// Numerics (exact up to fp32 accumulation):
//  - Both operands are decoded to e2m1 * e4m3 * 2^-14 in fp16 (decode_word): the nibble's three
//    magnitude bits land on fp16 exponent/mantissa bits 11..9, which reads as value * 2^-14 (code 1 = 0.5
//    becomes the subnormal 2^-15), then one HMUL2 by the scale. Every such product is a multiple of 2^-24
//    with at most 6 significant bits and at most 6 * 448 * 2^-14 = 0.164, so it is exact in fp16. The
//    products of two are >= 2^-48, far above fp32's normal range, so the fp32 sums round exactly as the
//    unscaled ones would; the epilogue multiplies the power of two back out together with alpha.
//    By default 2^7 is folded into both operands' e4m3 scales (exact: 448 * 2^7 < 65504), so decoded
//    values are e2m1 * e4m3 * 2^-7, mostly normal fp16, and the sums carry 2^-14. Measured (v4): the same
//    speed as the plain 2^-14 decode, where most values are subnormal; NVFP4_GEMM_SM90_FOLD=0 selects it.
//  - K order inside each 64-wide K block is permuted (the same way for A and B; a sum does not care):
//    each consumer thread owns a whole 16-element scale group of its B row, so it loads 8 bytes and one
//    scale byte per row per 64 K; the A decoders write decoded A in the matching order (permuted_k).
//
// Pipeline (per CTA; warpgroup 0 produces, warpgroups 1 and 2 consume):
//  - warp 0, one thread: TMA of packed B, packed A and both operands' blocked scale atoms into a ring of
//    STAGES packed slots (tma_full / pk_empty barriers). Everything it loads is the caller's data as mm
//    received it; no other kernel runs first unless a split needs its arrival counters zeroed.
//  - warps 1..3: decode the packed A of each slot into a ring of adec_stages() decoded-A slots (fp16,
//    128-byte swizzle, the layout wgmma's shared-memory descriptor reads; adec_full / adec_empty).
//  - consumers: decode B in registers and run wgmma with B from registers and A from shared memory.
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

#include <type_traits>
#include <utility>

#include "common/problem.h"
#include "sm90/fp4_decode.cuh"

namespace nvfp4_gemm::sm90 {

inline constexpr int kTileW = 128;       // B rows per CTA: 2 consumer warpgroups x wgmma M = 64
inline constexpr int kThreads = 384;     // producer warpgroup + 2 consumer warpgroups
inline constexpr int kDecodeThreads = 96;  // producer warps 1..3 decode A
inline constexpr int kAtom = static_cast<int>(kSfAtomBytes);  // 128 rows x 4 scales of the blocked layout

// Shared memory: adec_stages() decoded-A slots, then STAGES packed slots, then the barriers.
// Decoded A slot: [KT/64 blocks][TOKENS][64] fp16, 128-byte swizzle. Packed slot: B [128][KT/2] bytes
// (64-byte swizzle for KT = 128, 128-byte for 256), A [TOKENS][KT/2] bytes (same swizzle), then the
// KT/64 scale atoms of B's 128 rows and those of A's scale row blocks (two at 256 tokens).
constexpr int adec_stages(int tokens) { return tokens >= 256 ? 2 : 3; }
constexpr int adec_slot_bytes(int tokens, int kt) { return tokens * kt * 2; }
constexpr int sfa_row_blocks(int tokens) { return tokens > 128 ? tokens / 128 : 1; }
constexpr int b_bytes(int kt) { return kTileW * kt / 2; }
constexpr int pa_offset(int kt) { return b_bytes(kt); }
constexpr int sfb_offset(int tokens, int kt) { return pa_offset(kt) + tokens * kt / 2; }
constexpr int sfa_offset(int tokens, int kt) { return sfb_offset(tokens, kt) + (kt / 64) * kAtom; }
constexpr int packed_slot_bytes(int tokens, int kt) {
  return sfa_offset(tokens, kt) + sfa_row_blocks(tokens) * (kt / 64) * kAtom;
}
constexpr int smem_bytes(int tokens, int kt, int stages) {
  return adec_stages(tokens) * adec_slot_bytes(tokens, kt) + stages * packed_slot_bytes(tokens, kt) +
         2 * (stages + adec_stages(tokens)) * 8 + 1024;
}

// Logical K offset (0..63) inside a 64-K block of the element that wgmma step s (0..3) reads at
// column j (0..15). Thread quad lane q holds scale group q; its two fp16x2 registers per row hold group
// elements (s, s+4) and (8+s, 12+s) (see decode_word).
__host__ __device__ constexpr int permuted_k(int s, int j) {
  return 16 * ((j % 8) / 2) + s + 4 * (j % 2) + 8 * (j / 8);
}

struct GemmParams {
  CUtensorMap tmap_a;     // packed A [rows][k/2] bytes, box {KT/2, TOKENS}, B's swizzle
  CUtensorMap tmap_sfa;   // blocked scales of A as [half atoms][256] bytes, box {256, 2 * KT/64}
  CUtensorMap tmap_b;     // packed B [n][k/2] bytes, box {KT/2, 128}, SWIZZLE_64B (KT 128) or 128B (KT 256)
  CUtensorMap tmap_sfb;   // blocked scales of B as [half atoms][256] bytes, box {256, 2 * KT/64}
  const float* alpha;     // nullptr: 1
  void* c;                // output rows of this M chunk
  float4* partial;        // [grid][2 segments][TOKENS/8][256] partial sums, when grid > tiles
  uint32_t* counters;     // [tiles] arrivals per tile, zeroed by zero_counters_kernel just before
  int64_t ldc;
  int m, n, k;
  int sf_atoms_per_row;   // ceil(K/16 / 4)
  int ktiles;             // ceil(K / KT)
  int tiles_w, tiles;     // B-row tiles, all (B-row x token) tiles
  int grid;               // CTAs; CTA c runs global K tiles [c * total / grid, (c+1) * total / grid)
  int64_t total;          // tiles * ktiles
  uint64_t hint_a, hint_b;  // L2 cache policies of the TMA loads (packed A is re-read by every B tile)
  uint32_t fold;          // fp16x2 power of two folded into both operands' scales (see numerics above)
  int vec_out;            // C's rows are 16-byte aligned: the epilogue stores 16-byte vectors
  int wait_counters;      // the counters come from the kernel before (PDL): wait for it before arriving
  float out_mult;         // 2^28 / (the folds squared): what the epilogue multiplies back
  OutDtype out_dtype;
  uint64_t* trace;        // nullptr, or kTraceSlots timestamps per CTA after kTraceHeader (see trace_at)
};

// Timeline trace (diagnostics only, NVFP4_GEMM_SM90_TRACE=<file>, backend.cu): %globaltimer stamps in ns.
// Per CTA: [0] entry, [1] first decoded-A slot ready (decoder warp 1), [2] consumers start, then per
// segment s (two at most): [3 + 3s] first stage ready, [4 + 3s] MMA done, [5 + 3s] epilogue done;
// [9] segment count, [10] SM id, [11 + s] K tiles of segment s, [13 + s] 1 if this CTA did its fix-up.
inline constexpr int kTraceHeader = 16, kTraceSlots = 16;
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void trace_at(uint64_t* trace, int cta, int slot, uint64_t v) {
  if (trace) trace[kTraceHeader + cta * kTraceSlots + slot] = v;
}

// Balanced split ("stream-K" without waiting): the tiles x ktiles units are cut into `grid` equal
// contiguous ranges. A tile whose units span several CTAs is summed by whichever of them arrives last,
// reading the others' partials in CTA order, so the result is the same whatever the timing. grid >= tiles,
// so a range touches at most two tiles.
__host__ __device__ __forceinline__ int64_t range_start(int64_t c, int64_t total, int64_t grid) {
  return c * total / grid;
}
__host__ __device__ __forceinline__ int64_t cta_of_unit(int64_t u, int64_t total, int64_t grid) {
  return ((u + 1) * grid - 1) / total;
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

// 16-byte chunk index XOR of a TMA-swizzled row of packed bytes: 64-byte rows (KT = 128, SWIZZLE_64B)
// XOR chunk bits with address bits 7..8, 128-byte rows (KT = 256, SWIZZLE_128B) with bits 7..9.
template <int KT>
__device__ __forceinline__ int packed_swizzle(int row) {
  return KT == 128 ? ((row >> 1) & 3) : (row & 7);
}

// Decodes token row r, 64-K block b of a packed slot into the decoded-A slot: 32 packed bytes and four
// scales become eight 16-byte chunks; chunk v = 2s + h holds decode_word<s>(word h of scale group q) x
// scale q for q = 0..3 (the order permuted_k describes), stored at chunk v ^ (r % 8) of the row
// (128-byte swizzle). row_in_atom: r's row inside its scale row block(s).
template <int TOKENS, int KT>
__device__ __forceinline__ void decode_a_row(const uint8_t* pk, uint8_t* adec, int r, int b, int row_in_atom,
                                             __half2 fold) {
  const int swz = packed_swizzle<KT>(r);
  const uint8_t* row = pk + pa_offset(KT) + r * (KT / 2);
  const uint4 lo = *reinterpret_cast<const uint4*>(row + (((2 * b) ^ swz) << 4));
  const uint4 hi = *reinterpret_cast<const uint4*>(row + (((2 * b + 1) ^ swz) << 4));
  const uint32_t sw = *reinterpret_cast<const uint32_t*>(
      pk + sfa_offset(TOKENS, KT) + ((row_in_atom / 128) * (KT / 64) + b) * kAtom + (row_in_atom % 32) * 16 +
      ((row_in_atom % 128) / 32) * 4);
  const __half2_raw s01r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(sw & 0xFFFF), __NV_E4M3);
  const __half2_raw s23r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(sw >> 16), __NV_E4M3);
  const __half2 s01 = __hmul2(*reinterpret_cast<const __half2*>(&s01r), fold);
  const __half2 s23 = __hmul2(*reinterpret_cast<const __half2*>(&s23r), fold);
  const __half2 sc0 = __low2half2(s01), sc1 = __high2half2(s01), sc2 = __low2half2(s23), sc3 = __high2half2(s23);
  uint8_t* out = adec + b * (TOKENS * 128) + r * 128;
  // Scale group q is bytes 8q..8q+7 of the block: words 2q (elements 0..7) and 2q + 1 (8..15).
  auto put = [&](auto step, int h) {
    constexpr int S = decltype(step)::value;
    const int v = 2 * S + h;
    *reinterpret_cast<uint4*>(out + ((v ^ (r & 7)) << 4)) =
        make_uint4(hmul2_u32(decode_word<S>(h ? lo.y : lo.x), sc0), hmul2_u32(decode_word<S>(h ? lo.w : lo.z), sc1),
                   hmul2_u32(decode_word<S>(h ? hi.y : hi.x), sc2), hmul2_u32(decode_word<S>(h ? hi.w : hi.z), sc3));
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    put(std::integral_constant<int, 0>{}, h);
    put(std::integral_constant<int, 1>{}, h);
    put(std::integral_constant<int, 2>{}, h);
    put(std::integral_constant<int, 3>{}, h);
  }
}

// Epilogue staging: a [tokens][128] tile of C in shared memory, rows of 128 * sizeof(T) bytes with their
// 16-byte chunks XOR-swizzled by (token % 8), so that both the fragment-order writes and the row-order
// reads are free of bank conflicts.
template <typename T>
__device__ __forceinline__ void stage_value(uint8_t* buf, int tok, int col, float v) {
  constexpr int kRow = kTileW * static_cast<int>(sizeof(T));
  const int byte = col * static_cast<int>(sizeof(T));
  *reinterpret_cast<T*>(buf + tok * kRow + ((((byte >> 4) ^ (tok & 7))) << 4) + (byte & 15)) = convert_out<T>(v);
}

// One accumulator quad (B rows col0, col0 + 8 = C columns; tokens tok, tok + 1) into the staging tile.
template <typename T>
__device__ __forceinline__ void stage_quad(uint8_t* buf, int tok, int col0, float4 v, float scale) {
  stage_value<T>(buf, tok, col0, v.x * scale);
  stage_value<T>(buf, tok + 1, col0, v.y * scale);
  stage_value<T>(buf, tok, col0 + 8, v.z * scale);
  stage_value<T>(buf, tok + 1, col0 + 8, v.w * scale);
}

// Writes `rows` staged token rows to C (rows tok0.., columns n0..n0+127) by the 256 consumer threads:
// 16-byte vectors along N (N % 8 == 0, so a vector is wholly inside C or wholly outside).
template <typename T>
__device__ __forceinline__ void copy_out(const GemmParams& p, const uint8_t* buf, int t, int rows, int tok0, int n0) {
  constexpr int kRow = kTileW * static_cast<int>(sizeof(T));
  constexpr int kChunks = kRow / 16;
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  for (int i = t; i < rows * kChunks; i += 256) {
    const int r = i / kChunks, c = i % kChunks;
    const int tok = tok0 + r, n = n0 + c * kPer;
    if (tok >= p.m || n >= p.n) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(buf + r * kRow + ((c ^ (r & 7)) << 4));
    T* dst = reinterpret_cast<T*>(p.c) + static_cast<int64_t>(tok) * p.ldc + n;
    if (p.vec_out) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const T* src = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int e = 0; e < kPer; ++e) dst[e] = src[e];
    }
  }
}

// Token rows of C the staging tile holds at once: all of them, except fp32 output at KT = 128 (two passes).
template <typename T, int TOKENS, int SLOT_BYTES>
inline constexpr int kStageTokens = TOKENS * 128 * static_cast<int>(sizeof(T)) <= SLOT_BYTES
                                        ? TOKENS
                                        : SLOT_BYTES / (128 * static_cast<int>(sizeof(T)));

// A whole tile from the accumulators (acc: this thread's fragment, 4 values per 8 tokens) to C.
template <typename T, int TOKENS, int SLOT_BYTES>
__device__ __forceinline__ void store_tile(const GemmParams& p, const float (&acc)[TOKENS / 2], uint8_t* buf, int t,
                                           int row0, int tok0, int n0, float scale) {
  constexpr int kCT = kStageTokens<T, TOKENS, SLOT_BYTES>;
  const int q = t % 4;
#pragma unroll
  for (int pass = 0; pass < TOKENS / kCT; ++pass) {
#pragma unroll
    for (int xi = 0; xi < kCT / 8; ++xi) {
      const int x = pass * kCT / 8 + xi;
      stage_quad<T>(buf, 8 * xi + 2 * q, row0, make_float4(acc[4 * x], acc[4 * x + 1], acc[4 * x + 2], acc[4 * x + 3]),
                    scale);
    }
    cutlass::arch::NamedBarrier::arrive_and_wait(256, 1);
    copy_out<T>(p, buf, t, kCT, tok0 + pass * kCT, n0);
    cutlass::arch::NamedBarrier::arrive_and_wait(256, 1);
  }
}

// The split fix-up: sums the tile's partials (slots src0 of CTA c_first, then the first slot of each CTA up
// to c_last, in that order, so the result does not depend on which CTA arrives last) and writes C. Every
// quad of one contributor is in flight at once (v3 waited one L2 round trip per quad and contributor).
template <typename T, int TOKENS, int SLOT_BYTES>
__device__ __forceinline__ void fixup_tile(const GemmParams& p, const float4* src0, int c_first, int c_last,
                                           uint8_t* buf, int t, int row0, int tok0, int n0, float scale) {
  constexpr int kCT = kStageTokens<T, TOKENS, SLOT_BYTES>;
  constexpr int kChunk = kCT / 8 < 16 ? kCT / 8 : 16;
  constexpr int64_t kSlotStride = 2 * (TOKENS / 8) * 256;  // float4s between CTAs' slots
  const int q = t % 4;
#pragma unroll
  for (int pass = 0; pass < TOKENS / kCT; ++pass) {
#pragma unroll
    for (int xc = 0; xc < kCT / 8; xc += kChunk) {
      const int x0 = pass * kCT / 8 + xc;
      float4 sum[kChunk];
#pragma unroll
      for (int x = 0; x < kChunk; ++x) sum[x] = __ldcg(src0 + (x0 + x) * 256);
      for (int c = c_first + 1; c <= c_last; ++c) {
        const float4* src = p.partial + static_cast<int64_t>(c) * kSlotStride + t;
        float4 v[kChunk];
#pragma unroll
        for (int x = 0; x < kChunk; ++x) v[x] = __ldcg(src + (x0 + x) * 256);
#pragma unroll
        for (int x = 0; x < kChunk; ++x) {
          sum[x].x += v[x].x; sum[x].y += v[x].y; sum[x].z += v[x].z; sum[x].w += v[x].w;
        }
      }
#pragma unroll
      for (int x = 0; x < kChunk; ++x) stage_quad<T>(buf, 8 * (xc + x) + 2 * q, row0, sum[x], scale);
    }
    cutlass::arch::NamedBarrier::arrive_and_wait(256, 1);
    copy_out<T>(p, buf, t, kCT, tok0 + pass * kCT, n0);
    cutlass::arch::NamedBarrier::arrive_and_wait(256, 1);
  }
}

// Output scale: the power of two the decodes left in the sums (GemmParams::out_mult), times alpha.
__device__ __forceinline__ float out_scale(const float* alpha, float out_mult) {
  return alpha ? out_mult * __ldg(alpha) : out_mult;
}

// ---------------------------------------------------------------------------------------------------
// The main kernel. grid = params.grid CTAs of 384 threads (see the pipeline above).
// CTAS_PER_SM stays in the config key (and names); every entry runs one CTA per SM.
template <int TOKENS, int KT, int STAGES, int CTAS_PER_SM>
__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(const __grid_constant__ GemmParams p) {
  static_assert(CTAS_PER_SM == 1, "one CTA per SM (the decoded-A and packed rings fill shared memory)");
  static_assert(smem_bytes(TOKENS, KT, STAGES) + 1024 <= 233472,
                "pipeline does not fit in 227 KB of shared memory per CTA / 228 KB per SM");
  static_assert(KT == 128 || KT == 256, "B rows of 64 or 128 bytes per stage (SW64 / SW128)");
  constexpr int kNB = KT / 64;              // 64-K blocks per stage; even, so block b uses register set b % 2
  constexpr int kAS = adec_stages(TOKENS);
  constexpr int kABlock = TOKENS * 128;     // bytes of one 64-K block of decoded A
  constexpr int kAdec = adec_slot_bytes(TOKENS, KT);
  constexpr int kPacked = packed_slot_bytes(TOKENS, KT);
  constexpr int kPackedBase = kAS * kAdec;
  constexpr int kSfbOff = sfb_offset(TOKENS, KT), kSfaOff = sfa_offset(TOKENS, KT);
  // Small token tiles make each wgmma short, so a chain of them on one accumulator waits on latency;
  // independent accumulators per K step let the four of a block overlap (summed in a fixed order).
  constexpr int kAcc = TOKENS <= 16 ? 4 : (TOKENS <= 64 ? 2 : 1);
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using PlainBarrier = cutlass::arch::ClusterBarrier;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Rounded up to 1024 bytes (the 128-byte swizzle's period) by adding to smem_raw, not through an integer
  // round trip, so the compiler still knows every access is to shared memory (LDS / STS, not generic
  // LD / ST, which cost more latency on each of the decode's loads).
  uint8_t* smem = smem_raw + ((1024u - (cute::cast_smem_ptr_to_uint(smem_raw) & 1023u)) & 1023u);
  uint64_t* tma_full = reinterpret_cast<uint64_t*>(smem + kPackedBase + STAGES * kPacked);
  uint64_t* pk_empty = tma_full + STAGES;
  uint64_t* adec_full = pk_empty + STAGES;
  uint64_t* adec_empty = adec_full + kAS;
  __shared__ int last_flag;

  const int wg = threadIdx.x / 128;
  const int lane = threadIdx.x % 32;
  const int cta = blockIdx.x;
  const int u_begin = static_cast<int>(range_start(cta, p.total, p.grid));
  const int u_end = static_cast<int>(range_start(cta + 1, p.total, p.grid));

  if (threadIdx.x == 0) {
    if (p.trace) {
      uint32_t smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      trace_at(p.trace, cta, 0, global_ns());
      trace_at(p.trace, cta, 10, smid);
    }
    for (int s = 0; s < STAGES; ++s) {
      Barrier::init(&tma_full[s], 1);
      PlainBarrier::init(&pk_empty[s], 8);  // one arrive per consumer warp
    }
    for (int s = 0; s < kAS; ++s) {
      PlainBarrier::init(&adec_full[s], kDecodeThreads / 32);  // one arrive per decoder warp
      PlainBarrier::init(&adec_empty[s], 8);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<80>();  // the decoders need more than a TMA thread
    if (threadIdx.x == 0 && u_end > u_begin) {  // TMA
      cute::prefetch_tma_descriptor(&p.tmap_a);
      cute::prefetch_tma_descriptor(&p.tmap_sfa);
      cute::prefetch_tma_descriptor(&p.tmap_b);
      cute::prefetch_tma_descriptor(&p.tmap_sfb);
      int s = 0, phase = 0;
      for (int u = u_begin; u < u_end; ++u) {
        PlainBarrier::wait(&pk_empty[s], phase ^ 1);
        const int tile = u / p.ktiles, kt = u % p.ktiles;
        const int tile_w = tile % p.tiles_w, tile_t = tile / p.tiles_w;
        uint8_t* st = smem + kPackedBase + s * kPacked;
        // Every box lands whole (TMA zero-fills what lies outside the tensor). The scale boxes always span
        // kNB atoms; past K's end they hold the next row block's atoms (or zero fill after the last), which
        // are never read: those blocks are skipped.
        Barrier::arrive_and_expect_tx(&tma_full[s], kPacked);
        cute::SM90_TMA_LOAD_2D::copy(&p.tmap_sfb, &tma_full[s], p.hint_b, st + kSfbOff, 0,
                                     (tile_w * p.sf_atoms_per_row + kNB * kt) * 2);
        cute::SM90_TMA_LOAD_2D::copy(&p.tmap_b, &tma_full[s], p.hint_b, st, kt * (KT / 2), tile_w * kTileW);
        cute::SM90_TMA_LOAD_2D::copy(&p.tmap_a, &tma_full[s], p.hint_a, st + pa_offset(KT), kt * (KT / 2),
                                     tile_t * TOKENS);
        const int rb0 = tile_t * TOKENS / 128;
#pragma unroll
        for (int rb = 0; rb < sfa_row_blocks(TOKENS); ++rb)
          cute::SM90_TMA_LOAD_2D::copy(&p.tmap_sfa, &tma_full[s], p.hint_a, st + kSfaOff + rb * kNB * kAtom, 0,
                                       ((rb0 + rb) * p.sf_atoms_per_row + kNB * kt) * 2);
        if (++s == STAGES) s = 0, phase ^= 1;
      }
    } else if (threadIdx.x >= 32) {  // decode A
      const int d = threadIdx.x - 32;
      const __half2 fold = *reinterpret_cast<const __half2*>(&p.fold);
      int s = 0, phase = 0, as = 0, aphase = 0;
      for (int u = u_begin; u < u_end; ++u) {
        const int tile = u / p.ktiles, kt = u % p.ktiles;
        const int tile_t = tile / p.tiles_w;
        const int a_blocks = min(kNB, (p.k - kt * KT + 63) / 64);
        Barrier::wait(&tma_full[s], phase);
        PlainBarrier::wait(&adec_empty[as], aphase ^ 1);
        const uint8_t* pk = smem + kPackedBase + s * kPacked;
        uint8_t* ad = smem + as * kAdec;
        const int atom_row0 = (tile_t * TOKENS) % 128;
        for (int x = d; x < TOKENS * a_blocks; x += kDecodeThreads)
          decode_a_row<TOKENS, KT>(pk, ad, x % TOKENS, x / TOKENS, atom_row0 + x % TOKENS, fold);
        cutlass::arch::fence_view_async_shared();  // generic-proxy stores -> wgmma's async-proxy reads
        __syncwarp();
        if (lane == 0) PlainBarrier::arrive(&adec_full[as]);
        if (p.trace && u == u_begin && threadIdx.x == 32) trace_at(p.trace, cta, 1, global_ns());
        if (++s == STAGES) s = 0, phase ^= 1;
        if (++as == kAS) as = 0, aphase ^= 1;
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<208>();  // 128 x 80 + 256 x 208 <= 64K
  const int t = threadIdx.x - 128;        // 0..255 over both consumer warpgroups
  const bool trace = p.trace && t == 0;
  if (trace) trace_at(p.trace, cta, 2, global_ns());
  const int g = lane / 4, q = lane % 4;
  const int row0 = (t / 32) * 16 + g;      // CTA-local B row; row0 + 8 is the other
  const int row1 = row0 + 8;
  // Packed-B byte offsets inside a slot for this thread's 8-byte group, undoing TMA's swizzle: the
  // 16-byte chunk 2 j + q / 2 of the row is stored at (2 j + q / 2) ^ swizzle = (2 j) ^ bx.
  const uint32_t brow0 = row0 * (KT / 2) + (q & 1) * 8, brow1 = row1 * (KT / 2) + (q & 1) * 8;
  const int bx0 = packed_swizzle<KT>(row0) ^ (q / 2);
  const int bx1 = packed_swizzle<KT>(row1) ^ (q / 2);
  const uint32_t sfoff0 = kSfbOff + (row0 % 32) * 16 + (row0 / 32) * 4 + q;
  const uint32_t sfoff1 = kSfbOff + (row1 % 32) * 16 + (row1 / 32) * 4 + q;
  const uint32_t smem_base = cute::cast_smem_ptr_to_uint(smem);
  const __half2 fold = *reinterpret_cast<const __half2*>(&p.fold);

  float acc[kAcc][TOKENS / 2];
  uint32_t fr0[16], fr1[16];  // decoded B for the two 64-K blocks in flight

  // Decodes 64-K block j of packed slot s into fr: [0..3] row0 elems 0..7, [4..7] row1 elems 0..7,
  // [8..11] row0 elems 8..15, [12..15] row1 elems 8..15 (as pairs (e, e+4), see decode_word).
  auto decode = [&](uint32_t(&fr)[16], int s, int j) {
    const uint8_t* st = smem + kPackedBase + s * kPacked;
    const uint2 w0 = *reinterpret_cast<const uint2*>(st + brow0 + (((2 * j) ^ bx0) << 4));
    const uint2 w1 = *reinterpret_cast<const uint2*>(st + brow1 + (((2 * j) ^ bx1) << 4));
    const uint16_t sc = static_cast<uint16_t>(st[sfoff0 + j * kAtom]) |
                        static_cast<uint16_t>(static_cast<uint16_t>(st[sfoff1 + j * kAtom]) << 8);
    const __half2_raw sr = __nv_cvt_fp8x2_to_halfraw2(sc, __NV_E4M3);
    const __half2 s2 = __hmul2(*reinterpret_cast<const __half2*>(&sr), fold);
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
  auto fence_acc = [&]() {
#pragma unroll
    for (int a = 0; a < kAcc; ++a)
#pragma unroll
      for (int i = 0; i < TOKENS / 2; ++i) cute::warpgroup_fence_operand(acc[a][i]);
  };
  auto issue = [&](uint32_t(&fr)[16], int as, int j) {
#pragma unroll
    for (int i = 0; i < 16; ++i) cute::warpgroup_fence_operand(fr[i]);
    fence_acc();
    cute::warpgroup_arrive();
    const uint64_t desc = sw128_desc(smem_base + as * kAdec + j * kABlock);
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      const uint32_t a[4] = {fr[step], fr[4 + step], fr[8 + step], fr[12 + step]};
      wgmma_call<TOKENS>(a, desc + 2 * step, acc[step % kAcc], std::make_index_sequence<TOKENS / 2>{});
    }
    cute::warpgroup_commit_batch();
    fence_acc();
  };
  auto arrive = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) PlainBarrier::arrive(bar);
  };
  // Pipeline stage i (continuous over this CTA's segments) sits in packed slot i % STAGES and decoded-A
  // slot i % kAS; slots and phases are recomputed from i where needed (fewer live registers at 256 tokens).
  auto wait_stage = [&](int i) {
    Barrier::wait(&tma_full[i % STAGES], (i / STAGES) & 1);
    PlainBarrier::wait(&adec_full[i % kAS], (i / kAS) & 1);
  };

  const float scale = out_scale(p.alpha, p.out_mult);
  int i = 0;
  int seg = 0;
  bool counters_ready = !p.wait_counters;
  for (int u = u_begin; u < u_end; ++seg) {
    const int tile = u / p.ktiles;
    const int kt0 = u % p.ktiles;
    const int n_kt = min(p.ktiles - kt0, u_end - u);
#pragma unroll
    for (int a = 0; a < kAcc; ++a)
#pragma unroll
      for (int x = 0; x < TOKENS / 2; ++x) acc[a][x] = 0.0f;

    wait_stage(i);
    if (trace && seg < 2) trace_at(p.trace, cta, 3 + 3 * seg, global_ns());
    decode(fr0, i % STAGES, 0);
    for (int j = 0; j < n_kt; ++j, ++i) {
      // Blocks of this stage that hold K < p.k (only the tile's last stage has fewer than kNB).
      const int nblk = min(kNB, (p.k - (kt0 + j) * KT + 63) / 64);
#pragma unroll
      for (int blk = 0; blk < kNB; ++blk) {
        if (blk < nblk) {
          uint32_t(&fcur)[16] = (blk % 2 == 0) ? fr0 : fr1;
          uint32_t(&fnxt)[16] = (blk % 2 == 0) ? fr1 : fr0;
          issue(fcur, i % kAS, blk);
          cute::warpgroup_wait<1>();  // block blk - 1 is done: its registers and (blk 0) its stage are free
#pragma unroll
          for (int x = 0; x < 16; ++x) cute::warpgroup_fence_operand(fnxt[x]);
          if (blk == 0 && j > 0) {
            arrive(&pk_empty[(i - 1) % STAGES]);
            arrive(&adec_empty[(i - 1) % kAS]);
          }
          if (blk + 1 < nblk) {
            decode(fnxt, i % STAGES, blk + 1);
          } else if (j + 1 < n_kt) {
            wait_stage(i + 1);
            decode(fnxt, (i + 1) % STAGES, 0);
          }
        }
      }
    }
    cute::warpgroup_wait<0>();
    fence_acc();
    arrive(&pk_empty[(i - 1) % STAGES]);
    // The segment's last decoded-A slot stays ours until the epilogue has used it as its staging tile.
    const int last_as = (i - 1) % kAS;
    uint8_t* const stage_buf = smem + last_as * kAdec;
    if (trace && seg < 2) {
      trace_at(p.trace, cta, 4 + 3 * seg, global_ns());
      trace_at(p.trace, cta, 9, seg + 1);
      trace_at(p.trace, cta, 11 + seg, n_kt);
    }
    u += n_kt;
#pragma unroll
    for (int a = 1; a < kAcc; ++a)
#pragma unroll
      for (int x = 0; x < TOKENS / 2; ++x) acc[0][x] += acc[a][x];

    const int tile_w = tile % p.tiles_w, tile_t = tile / p.tiles_w;
    const int tok0 = tile_t * TOKENS, n0 = tile_w * kTileW;
    if (kt0 == 0 && n_kt == p.ktiles) {  // the whole tile is ours
      if (p.out_dtype == OutDtype::kFloat16)
        store_tile<__half, TOKENS, kAdec>(p, acc[0], stage_buf, t, row0, tok0, n0, scale);
      else if (p.out_dtype == OutDtype::kBFloat16)
        store_tile<__nv_bfloat16, TOKENS, kAdec>(p, acc[0], stage_buf, t, row0, tok0, n0, scale);
      else
        store_tile<float, TOKENS, kAdec>(p, acc[0], stage_buf, t, row0, tok0, n0, scale);
      arrive(&adec_empty[last_as]);
      if (trace && seg < 2) trace_at(p.trace, cta, 5 + 3 * seg, global_ns());
      continue;
    }
    // Publish this segment's partial sums (accumulator order, coalesced float4), then count arrivals.
    float4* mine = p.partial + (static_cast<int64_t>(cta) * 2 + seg) * (TOKENS / 8) * 256 + t;
#pragma unroll
    for (int x = 0; x < TOKENS / 8; ++x)
      __stcg(mine + x * 256, make_float4(acc[0][4 * x], acc[0][4 * x + 1], acc[0][4 * x + 2], acc[0][4 * x + 3]));
    __threadfence();
    if (!counters_ready) {  // zeroed by the kernel before this one (programmatic dependent launch)
      cudaGridDependencySynchronize();
      counters_ready = true;
    }
    cutlass::arch::NamedBarrier::arrive_and_wait(256, 0);
    const int64_t first_u = static_cast<int64_t>(tile) * p.ktiles;
    const int c_first = static_cast<int>(cta_of_unit(first_u, p.total, p.grid));
    const int c_last = static_cast<int>(cta_of_unit(first_u + p.ktiles - 1, p.total, p.grid));
    if (t == 0) last_flag = atomicAdd(&p.counters[tile], 1u) == static_cast<uint32_t>(c_last - c_first);
    cutlass::arch::NamedBarrier::arrive_and_wait(256, 0);
    if (!last_flag) {
      arrive(&adec_empty[last_as]);
      if (trace && seg < 2) trace_at(p.trace, cta, 5 + 3 * seg, global_ns());
      continue;
    }
    if (trace && seg < 2) trace_at(p.trace, cta, 13 + seg, 1);
    __threadfence();
    // Our own partial is read back like the others, which frees the accumulators for the loads.
    // CTA c_first holds the tile's first units in its second slot unless its range starts inside the
    // tile (then its first); every later CTA of the tile starts inside it, so uses its first slot.
    const float4* src0 = p.partial + (static_cast<int64_t>(c_first) * 2 +
                                      (tile - static_cast<int>(range_start(c_first, p.total, p.grid) / p.ktiles))) *
                                         (TOKENS / 8) * 256 + t;
    if (p.out_dtype == OutDtype::kFloat16)
      fixup_tile<__half, TOKENS, kAdec>(p, src0, c_first, c_last, stage_buf, t, row0, tok0, n0, scale);
    else if (p.out_dtype == OutDtype::kBFloat16)
      fixup_tile<__nv_bfloat16, TOKENS, kAdec>(p, src0, c_first, c_last, stage_buf, t, row0, tok0, n0, scale);
    else
      fixup_tile<float, TOKENS, kAdec>(p, src0, c_first, c_last, stage_buf, t, row0, tok0, n0, scale);
    arrive(&adec_empty[last_as]);
    if (trace && seg < 2) trace_at(p.trace, cta, 5 + 3 * seg, global_ns());
  }
}

// Zeroes the split arrival counters of the GEMM that follows on the stream, which may start as soon as
// this grid does (it waits for this one's writes before its first arrival).
__global__ void zero_counters_kernel(uint32_t* counters, int n);

struct LaunchArgs {
  GemmParams params;
  cudaStream_t stream;
  bool pdl;  // the kernel before on the stream is zero_counters_kernel (programmatic dependent launch)
};

template <int TOKENS, int KT, int STAGES, int CTAS_PER_SM>
cudaError_t launch_gemm(const LaunchArgs& args) {
  constexpr int smem = smem_bytes(TOKENS, KT, STAGES);
  cudaError_t err = cudaFuncSetAttribute(gemm_kernel<TOKENS, KT, STAGES, CTAS_PER_SM>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(args.params.grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = args.stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = args.pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, gemm_kernel<TOKENS, KT, STAGES, CTAS_PER_SM>, args.params);
}

}  // namespace nvfp4_gemm::sm90
