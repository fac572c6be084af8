// NVFP4 quantization for any SM >= 8.0: one pass over x, writing packed e2m1 data and the blocked e4m3
// scales (padding included) directly. The arithmetic is recipe.h's, shared with the CPU backend.
//
// Mapping: every thread owns one 16-byte chunk of a row (8 bf16/fp16 or 4 fp32 elements), so a warp
// reads 512 contiguous bytes; the G = 2 or 4 threads of one 16-element block combine their amax with
// shuffles and each writes its own packed bytes (a warp writes 128 or 64 contiguous bytes). The
// threads of the padded scale columns / rows take part in the shuffles and write the zero padding.
// Each thread handles kItems chunks half a grid apart, issuing all loads before any math, to keep more
// bytes in flight per SM than one 16-byte load per thread would.
#include "quant/quantize.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 2;

template <InDtype D>
struct Elem;
template <>
struct Elem<InDtype::kFloat32> {
  static constexpr int kBytes = 4;
  __device__ static uint32_t bits(const uint4& v, int i) { return (&v.x)[i]; }
  __device__ static uint32_t sign(const uint4& v, int i) { return (&v.x)[i] >> 31; }
};
template <>
struct Elem<InDtype::kBFloat16> {
  static constexpr int kBytes = 2;
  __device__ static uint32_t bits(const uint4& v, int i) {
    return bf16_to_f32_bits(static_cast<uint16_t>((&v.x)[i / 2] >> (16 * (i % 2))));
  }
  __device__ static uint32_t sign(const uint4& v, int i) { return ((&v.x)[i / 2] >> (16 * (i % 2) + 15)) & 1u; }
};
template <>
struct Elem<InDtype::kFloat16> {
  static constexpr int kBytes = 2;
  __device__ static uint32_t bits(const uint4& v, int i) {
    return f16_to_f32_bits(static_cast<uint16_t>((&v.x)[i / 2] >> (16 * (i % 2))));
  }
  __device__ static uint32_t sign(const uint4& v, int i) { return ((&v.x)[i / 2] >> (16 * (i % 2) + 15)) & 1u; }
};

template <InDtype D>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const uint8_t* __restrict__ x, int64_t ld_x_bytes,
                                                            int64_t rows, int64_t k, int64_t half_items,
                                                            const float* __restrict__ global_scale,
                                                            uint8_t* __restrict__ packed, uint8_t* __restrict__ sf) {
  constexpr int kV = 16 / Elem<D>::kBytes;  // elements per thread
  constexpr int kG = kSfVecSize / kV;       // threads per 16-element block
  static_assert(kG == 2 || kG == 4, "a 16-element block spans 2 (16-bit) or 4 (fp32) 16-byte chunks");
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t chunks_per_row = round_up(sf_cols, kSfAtomCols) * kG;
  const float gs = global_scale != nullptr ? __ldg(global_scale) : 1.0f;

  int64_t r[kItems], s[kItems];
  int j[kItems];
  bool live[kItems];
  uint4 raw[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x + it * half_items;
    r[it] = t / chunks_per_row;
    const int64_t c = t - r[it] * chunks_per_row;
    s[it] = c / kG;
    j[it] = static_cast<int>(c % kG);
    live[it] = r[it] < rows && s[it] < sf_cols;
    raw[it] = live[it] ? __ldg(reinterpret_cast<const uint4*>(x + r[it] * ld_x_bytes + (s[it] * kG + j[it]) * 16))
                       : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    uint32_t abs_bits[kV];
    uint32_t amax_bits = 0;  // |x| bits compared as integers: NaN bits exceed inf's, so a NaN wins
#pragma unroll
    for (int i = 0; i < kV; ++i) {
      abs_bits[i] = Elem<D>::bits(raw[it], i) & 0x7FFFFFFFu;
      amax_bits = max(amax_bits, abs_bits[i]);
    }
#pragma unroll
    for (int o = 1; o < kG; o <<= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, o));
    const uint8_t s8 = live[it] ? block_scale(bits_float(amax_bits), gs) : uint8_t{0};
    if (j[it] == 0) sf[blocked_sf_offset(r[it], s[it], sf_cols)] = s8;
    if (!live[it]) continue;
    const float inv = value_multiplier(s8, gs);
    uint32_t word = 0;  // kV codes, element 2i in the low nibble of byte i
#pragma unroll
    for (int i = 0; i < kV; ++i) {
      word |= e2m1_code(abs_bits[i], Elem<D>::sign(raw[it], i), inv) << (4 * i);
    }
    uint8_t* dst = packed + r[it] * (k / 2) + s[it] * (kSfVecSize / 2) + j[it] * (kV / 2);
    if constexpr (kV == 8) {
      *reinterpret_cast<uint32_t*>(dst) = word;
    } else {
      *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(word);
    }
  }
}

template <InDtype D>
bool launch(const void* x, int64_t rows, int64_t k, int64_t ld_x, const float* gs, uint8_t* packed, uint8_t* sf,
            cudaStream_t stream) {
  constexpr int kG = kSfVecSize * Elem<D>::kBytes / 16;
  // A multiple of 128 * 4 * 2 = 1024 = kItems * 2 * kThreads: no partial block, no partial warp.
  const int64_t items = round_up(rows, kSfAtomRows) * round_up(k / kSfVecSize, kSfAtomCols) * kG;
  const int64_t half_items = items / kItems;
  const int64_t blocks = half_items / kThreads;
  if (blocks > 0x7FFFFFFF) return false;
  quantize_kernel<D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(x), ld_x * Elem<D>::kBytes, rows, k, half_items, gs, packed, sf);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace

bool quantize_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const float* global_scale,
                   uint8_t* packed, uint8_t* sf, cudaStream_t stream, char* err, size_t err_len) {
  bool ok = false;
  switch (dtype) {
    case InDtype::kFloat32: ok = launch<InDtype::kFloat32>(x, rows, k, ld_x, global_scale, packed, sf, stream); break;
    case InDtype::kFloat16: ok = launch<InDtype::kFloat16>(x, rows, k, ld_x, global_scale, packed, sf, stream); break;
    case InDtype::kBFloat16: ok = launch<InDtype::kBFloat16>(x, rows, k, ld_x, global_scale, packed, sf, stream); break;
  }
  if (!ok) {
    std::snprintf(err, err_len, "quantize kernel launch failed for rows=%lld k=%lld: %s (was the generic module "
                  "compiled for this GPU? rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)",
                  static_cast<long long>(rows), static_cast<long long>(k), cudaGetErrorString(cudaGetLastError()));
  }
  return ok;
}

}  // namespace nvfp4_gemm::quant
