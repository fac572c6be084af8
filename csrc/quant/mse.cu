// The "mse" NVFP4 quantization for any SM >= 8.0: one pass over x; each thread searches one 16-element
// block's candidate scales (mse_search.h, shared with the CPU backend) in registers, then writes the
// chosen scale byte, the block's packed codes and, when asked, the search's error.
//
// The search is compute-bound: per element and candidate one fp32 multiply, the e2m1 rounding (a mask, an
// add-and-max, two adds, a min), the shift that builds the value's double, a zeroing move and three fp64
// operations (r - v as one FMA, the square, the pairwise sum): 12.4 issue slots in the sm_90 SASS of the
// fp16 loop, ~150 per element with ten candidates, against the ~2.6 bytes each element moves. The fp64
// arithmetic is what keeps the result identical to the float64 definition in methods.py; H100's fp64 pipe
// runs at half the fp32 rate, so its 6 cycles of the 12.4 are not the limit (the issue rate is). The
// fp32 -> fp64 conversions (a quarter of the fp64 rate) happen once per element (r) and once per table
// entry, never per element and candidate. docs/QUANTIZE.md has the versions measured out and the
// predicted H100 time.
#include "quant/mse.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "quant/elem.cuh"
#include "quant/mse_search.h"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 128;
static_assert(kThreads == kCandidateBytes, "one thread builds each entry of the candidate-scale table");

// The candidate scales' (multiplier, scale) pairs, built once per thread block from the encode scale: a
// lookup per candidate instead of the e4m3 decoding and the IEEE division (~60 instructions per candidate).
struct SharedTable {
  const float* inv;
  const double* scale;
  __device__ CandidateScale operator()(int c) const { return CandidateScale{inv[c], scale[c]}; }
};

// Index: uint32_t whenever the block count fits (a 64-bit division is a ~70-instruction routine).
template <InDtype D, bool kWeighted, typename Index>
__global__ void __launch_bounds__(kThreads) mse_kernel(const uint8_t* __restrict__ x, int64_t ld_x_bytes, Index sf_cols,
                                                       Index blocks, const float* __restrict__ global_scale,
                                                       int neighbours, bool clip,
                                                       const float* __restrict__ column_weight,
                                                       uint8_t* __restrict__ packed, uint8_t* __restrict__ scale,
                                                       double* __restrict__ error) {
  constexpr int kLoads = kSfVecSize * Elem<D>::kBytes / 16;  // 16-byte loads per block
  static_assert(kLoads == 2 || kLoads == 4, "a 16-element block is 32 (16-bit) or 64 (fp32) bytes");
  __shared__ float table_inv[kCandidateBytes];
  __shared__ double table_scale[kCandidateBytes];
  const float gs = __ldg(global_scale);
  {
    const CandidateScale cs = candidate_scale(threadIdx.x, gs);
    table_inv[threadIdx.x] = cs.inv;
    table_scale[threadIdx.x] = cs.scale;
  }
  __syncthreads();
  const Index t = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= blocks) return;
  const Index row = t / sf_cols;
  const Index s = t - row * sf_cols;
  const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * ld_x_bytes +
                                                    static_cast<int64_t>(s) * (kLoads * 16));
  uint4 raw[kLoads];
#pragma unroll
  for (int l = 0; l < kLoads; ++l) raw[l] = __ldg(src + l);

  uint32_t abs_bits[kSfVecSize];
  float a[kSfVecSize];
  uint32_t amax_bits = 0;  // |x| bits compared as integers: NaN bits exceed inf's, so a NaN wins
#pragma unroll
  for (int i = 0; i < kSfVecSize; ++i) {
    abs_bits[i] = Elem<D>::bits(raw, i) & 0x7FFFFFFFu;
    a[i] = bits_float(abs_bits[i]);
    amax_bits = max(amax_bits, abs_bits[i]);
  }
  double h[kSfVecSize];
  if constexpr (kWeighted) {
    const float4* w = reinterpret_cast<const float4*>(column_weight + static_cast<int64_t>(s) * kSfVecSize);
#pragma unroll
    for (int l = 0; l < kSfVecSize / 4; ++l) {
      const float4 v = __ldg(w + l);
      h[4 * l] = v.x;
      h[4 * l + 1] = v.y;
      h[4 * l + 2] = v.z;
      h[4 * l + 3] = v.w;
    }
  }
  const MseChoice best = mse_search<kWeighted>(a, bits_float(amax_bits), gs, neighbours, clip, h,
                                               SharedTable{table_inv, table_scale});
  scale[t] = static_cast<uint8_t>(best.byte);
  if (error != nullptr) error[t] = best.err;
  const float inv = table_inv[best.byte];
  reinterpret_cast<uint2*>(packed)[t] =  // packed is [rows, k/2] contiguous
      block_codes([&](int i) { return abs_bits[i]; }, [&](int i) { return Elem<D>::sign(raw, i); }, inv);
}

template <InDtype D, bool kWeighted>
bool launch(const void* x, int64_t rows, int64_t k, int64_t ld_x, const float* gs, int neighbours, bool clip,
            const float* column_weight, uint8_t* packed, uint8_t* scale, double* error, cudaStream_t stream, char* err,
            size_t err_len) {
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t blocks = rows * sf_cols;
  const int64_t grid = ceil_div(blocks, kThreads);
  if (grid > 0x7FFFFFFF) {
    std::snprintf(err, err_len, "quantize_mse: rows=%lld k=%lld need %lld thread blocks, past the grid limit of 2^31 - 1",
                  static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(grid));
    return false;
  }
  const auto* src = static_cast<const uint8_t*>(x);
  const int64_t ld_bytes = ld_x * Elem<D>::kBytes;
  if (grid * kThreads <= 0xFFFFFFFFll) {  // every thread's index fits in 32 bits
    mse_kernel<D, kWeighted, uint32_t><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        src, ld_bytes, static_cast<uint32_t>(sf_cols), static_cast<uint32_t>(blocks), gs, neighbours, clip,
        column_weight, packed, scale, error);
  } else {
    mse_kernel<D, kWeighted, uint64_t><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        src, ld_bytes, static_cast<uint64_t>(sf_cols), static_cast<uint64_t>(blocks), gs, neighbours, clip,
        column_weight, packed, scale, error);
  }
  // Read once: cudaGetLastError also clears the error, so a second call would report "no error".
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "quantize_mse kernel launch failed for rows=%lld k=%lld: %s (was the generic module "
                  "compiled for this GPU? rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)",
                  static_cast<long long>(rows), static_cast<long long>(k), cudaGetErrorString(e));
    return false;
  }
  return true;
}

template <InDtype D>
bool launch_dtype(const void* x, int64_t rows, int64_t k, int64_t ld_x, const float* gs, int neighbours, bool clip,
                  const float* column_weight, uint8_t* packed, uint8_t* scale, double* error, cudaStream_t stream,
                  char* err, size_t err_len) {
  return column_weight != nullptr
             ? launch<D, true>(x, rows, k, ld_x, gs, neighbours, clip, column_weight, packed, scale, error, stream, err, err_len)
             : launch<D, false>(x, rows, k, ld_x, gs, neighbours, clip, column_weight, packed, scale, error, stream, err, err_len);
}

}  // namespace

bool quantize_mse_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const float* global_scale,
                       int neighbours, bool clip, const float* column_weight, uint8_t* packed, uint8_t* scale,
                       double* error, cudaStream_t stream, char* err, size_t err_len) {
  switch (dtype) {
    case InDtype::kFloat32:
      return launch_dtype<InDtype::kFloat32>(x, rows, k, ld_x, global_scale, neighbours, clip, column_weight, packed,
                                             scale, error, stream, err, err_len);
    case InDtype::kFloat16:
      return launch_dtype<InDtype::kFloat16>(x, rows, k, ld_x, global_scale, neighbours, clip, column_weight, packed,
                                             scale, error, stream, err, err_len);
    case InDtype::kBFloat16:
      return launch_dtype<InDtype::kBFloat16>(x, rows, k, ld_x, global_scale, neighbours, clip, column_weight, packed,
                                              scale, error, stream, err, err_len);
  }
  std::snprintf(err, err_len, "quantize_mse: unknown input dtype code %d", static_cast<int>(dtype));
  return false;
}

}  // namespace nvfp4_gemm::quant
