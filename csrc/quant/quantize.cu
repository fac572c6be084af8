// NVFP4 quantization for any SM >= 8.0: one pass over x, writing packed e2m1 data and the blocked e4m3
// scales (padding included) directly. The arithmetic is recipe.h's, shared with the CPU backend.
//
// Mapping: one thread per 16-element block (one e4m3 scale): 2 (bf16 / fp16) or 4 (fp32) 16-byte loads,
// one 8-byte store of packed codes (a warp stores 256 contiguous bytes), one scale byte. A warp's loads
// cover 1 or 2 KiB of contiguous row; each load instruction uses half of every 32-byte sector it touches
// and the next one the other half, from L1, so DRAM sees each byte once. The alternative, 2 or 4 threads
// per block combining their amax with shuffles, compiled to ~35 instructions per element against a
// budget near 35 at 80% of H100 copy bandwidth: the per-block work (e4m3 rounding, the divide, the
// blocked offset) was done 2-4 times. Threads of the padded scale rows / columns write the zero padding.
// Each thread handles kItems blocks half a grid apart, issuing all loads before any math.
//
// A programmatic dependent launch where the code allows it (quant/pdl.cuh): the kernel waits for the kernel
// ahead before it reads the scales or x, then lets the GEMM that follows launch and prefetch its weights while
// it quantizes. At decode sizes (one to 16 rows) the kernel is mostly launch latency, and linear runs it
// before every K-sliced W4A4 GEMM.
#include "quant/quantize.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>

#include "quant/elem.cuh"
#include "quant/pdl.cuh"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 2;

// Index: uint32_t whenever the block count fits, since a 64-bit division (block -> row) is a
// ~70-instruction software routine; uint64_t otherwise.
template <InDtype D, typename Index>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const uint8_t* __restrict__ x, int64_t ld_x_bytes,
                                                            int64_t rows, int64_t k, Index half_items,
                                                            GlobalScale scale, uint8_t* __restrict__ packed,
                                                            uint8_t* __restrict__ sf) {
  constexpr int kLoads = kSfVecSize * Elem<D>::kBytes / 16;  // 16-byte loads per block
  static_assert(kLoads == 2 || kLoads == 4, "a 16-element block is 32 (16-bit) or 64 (fp32) bytes");
  const int64_t sf_cols = k / kSfVecSize;
  const Index blocks_per_row = static_cast<Index>(round_up(sf_cols, kSfAtomCols));
  wait_for_predecessor_then_release();
  float gs = scale.encode != nullptr ? __ldg(scale.encode) : 1.0f;
  if (scale.decode != nullptr) {
    const float decode = __ldg(scale.decode);
    gs = static_encode_scale(decode);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      *scale.alpha_out = static_input_scales(decode, __ldg(scale.weight_scale_2)).alpha;
    }
  }

  int64_t r[kItems], s[kItems];
  bool live[kItems];
  uint4 raw[kItems][kLoads];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const Index t = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x + it * half_items;
    const Index row = t / blocks_per_row;
    r[it] = static_cast<int64_t>(row);
    s[it] = static_cast<int64_t>(t - row * blocks_per_row);
    live[it] = r[it] < rows && s[it] < sf_cols;
    const uint4* src = reinterpret_cast<const uint4*>(x + r[it] * ld_x_bytes + s[it] * (kLoads * 16));
#pragma unroll
    for (int l = 0; l < kLoads; ++l) raw[it][l] = live[it] ? __ldg(src + l) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    uint32_t abs_bits[kSfVecSize];
    uint32_t amax_bits = 0;  // |x| bits compared as integers: NaN bits exceed inf's, so a NaN wins
#pragma unroll
    for (int i = 0; i < kSfVecSize; ++i) {
      abs_bits[i] = Elem<D>::bits(raw[it], i) & 0x7FFFFFFFu;
      amax_bits = max(amax_bits, abs_bits[i]);
    }
    const uint8_t s8 = live[it] ? block_scale(bits_float(amax_bits), gs) : uint8_t{0};
    sf[blocked_sf_offset(r[it], s[it], sf_cols)] = s8;
    if (!live[it]) continue;
    *reinterpret_cast<uint2*>(packed + r[it] * (k / 2) + s[it] * (kSfVecSize / 2)) =
        block_codes([&](int i) { return abs_bits[i]; }, [&](int i) { return Elem<D>::sign(raw[it], i); },
                    value_multiplier(s8, gs));
  }
}

template <InDtype D>
bool launch(const void* x, int64_t rows, int64_t k, int64_t ld_x, const GlobalScale& gs, uint8_t* packed,
            uint8_t* sf, cudaStream_t stream, char* err, size_t err_len) {
  // A multiple of 128 * 4 = 512 = kItems * kThreads: no partial thread block.
  const int64_t items = round_up(rows, kSfAtomRows) * round_up(k / kSfVecSize, kSfAtomCols);
  const int64_t half_items = items / kItems;
  const int64_t blocks = half_items / kThreads;
  if (blocks > 0x7FFFFFFF) {
    std::snprintf(err, err_len, "quantize: rows=%lld k=%lld need %lld thread blocks, past the grid limit of 2^31 - 1",
                  static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(blocks));
    return false;
  }
  const auto* src = static_cast<const uint8_t*>(x);
  cudaLaunchAttribute attr[1];
  const auto run = [&](auto kernel, auto half) {
    int pdl = 0;
    if (const cudaError_t e = waits_for_predecessor(kernel, &pdl); e != cudaSuccess) return e;
    const cudaLaunchConfig_t cfg = launch_config(dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, pdl != 0, attr);
    return cudaLaunchKernelEx(&cfg, kernel, src, ld_x * Elem<D>::kBytes, rows, k, half, gs, packed, sf);
  };
  cudaError_t e = items <= 0xFFFFFFFFll ? run(quantize_kernel<D, uint32_t>, static_cast<uint32_t>(half_items))
                                        : run(quantize_kernel<D, uint64_t>, static_cast<uint64_t>(half_items));
  // Read once: cudaGetLastError also clears the error, so a second call would report "no error".
  const cudaError_t last = cudaGetLastError();
  if (e == cudaSuccess) e = last;
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "quantize kernel launch failed for rows=%lld k=%lld: %s (was the generic module "
                  "compiled for this GPU? rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)",
                  static_cast<long long>(rows), static_cast<long long>(k), cudaGetErrorString(e));
    return false;
  }
  return true;
}

}  // namespace

bool quantize_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const GlobalScale& global_scale,
                   uint8_t* packed, uint8_t* sf, cudaStream_t stream, char* err, size_t err_len) {
  switch (dtype) {
    case InDtype::kFloat32:
      return launch<InDtype::kFloat32>(x, rows, k, ld_x, global_scale, packed, sf, stream, err, err_len);
    case InDtype::kFloat16:
      return launch<InDtype::kFloat16>(x, rows, k, ld_x, global_scale, packed, sf, stream, err, err_len);
    case InDtype::kBFloat16:
      return launch<InDtype::kBFloat16>(x, rows, k, ld_x, global_scale, packed, sf, stream, err, err_len);
  }
  std::snprintf(err, err_len, "quantize: unknown input dtype code %d", static_cast<int>(dtype));
  return false;
}

}  // namespace nvfp4_gemm::quant
