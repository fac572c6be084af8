// The per-tensor scales of nvfp4_gemm::linear's input in one launch: finite amax of x, encode / decode
// scales and the GEMM's alpha (dynamic mode), or the same three from a calibrated input scale (static:
// linear itself leaves that to quantize, which forms them in the same launch; nvfp4_gemm::_input_scales
// uses this one). Dynamic replaces ~12 ATen launches (abs, isfinite, where, amax, cast, reciprocal, mul,
// compare, where, clamp, reciprocal, mul) with one.
//
// Grid reduction without a memset: each block folds its max into a running max with atomicMax (maxima of
// non-negative floats compared as integers: exact and order-independent, so the result is deterministic),
// then counts itself in; the last block to arrive computes the scales and writes both words back to zero.
// The state therefore has to be zero before a launch without anyone clearing it, and no two launches that
// may overlap may share it:
//   * It lives in a __device__ array (zeroed when the module loads; one copy per device), not in memory
//     from the caching allocator, whose blocks hold other data in between and would need a memset launch.
//     Launches name their slot by index, so the host never asks for the array's address (no module-load
//     call that could land inside a graph capture).
//   * A slot belongs to one (device, stream, capture sequence): common/stream_slots.h says why that keeps
//     launches that may overlap apart.
// A kernel that dies midway leaves a slot nonzero, but then the context is unusable anyway.
// When the slots run out (kSlots captures or streams on one device) the caller supplies zeroed words of
// its own (one extra launch), so running out costs speed, never correctness.
#include "quant/input_scales.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "common/stream_slots.h"
#include "quant/pdl.cuh"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread
constexpr int64_t kTileChunks = int64_t{kThreads} * kUnroll;
// 4 x 256 threads x 64 bytes = 64 KB of loads in flight per SM, past the ~15 KB an H100 SM needs to keep
// HBM busy (estimate, Little's law: 3.35 TB/s x ~0.6 us latency / 132 SMs); not measured yet.
constexpr int kBlocksPerSm = 4;
constexpr int kSlots = 4096;

__device__ uint32_t g_reduction_slots[kSlots][2];  // [running max as fp32 bits, blocks arrived]

// Largest finite |value| among one 16-byte chunk, as the abs bits of the storage type (0 if none).
// Non-negative floats order as their bit patterns do; NaN and inf have the largest exponent field, so one
// compare against inf's bits drops both.
template <InDtype D>
struct Finite;
template <>
struct Finite<InDtype::kFloat32> {
  __device__ static uint32_t chunk_max(const uint4& v) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t a = (&v.x)[i] & 0x7FFFFFFFu;
      m = max(m, a < 0x7F800000u ? a : 0u);
    }
    return m;
  }
  __device__ static uint32_t to_f32_bits(uint32_t m) { return m; }
};
template <uint32_t kInfBits>
struct Finite16 {
  __device__ static uint32_t chunk_max(const uint4& v) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = (&v.x)[i];
      const uint32_t lo = w & 0x7FFFu, hi = (w >> 16) & 0x7FFFu;
      m = max(m, max(lo < kInfBits ? lo : 0u, hi < kInfBits ? hi : 0u));
    }
    return m;
  }
};
template <>
struct Finite<InDtype::kBFloat16> : Finite16<0x7F80u> {
  __device__ static uint32_t to_f32_bits(uint32_t m) { return m << 16; }
};
template <>
struct Finite<InDtype::kFloat16> : Finite16<0x7C00u> {
  // Exact, subnormals included.
  __device__ static uint32_t to_f32_bits(uint32_t m) {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(m))));
  }
};

__device__ void write_scales(const InputScales& s, float* __restrict__ out) {
  out[kEncode] = s.encode;
  out[kDecode] = s.decode;
  out[kAlpha] = s.alpha;
}

// x is `rows` rows of `row_chunks` 16-byte chunks, `ld_bytes` apart; a work item is one tile of
// kTileChunks chunks of one row, and blocks stride over the work items.
template <InDtype D>
__global__ void __launch_bounds__(kThreads)
    dynamic_scales_kernel(const uint8_t* __restrict__ x, int64_t ld_bytes, int64_t row_chunks, int64_t tiles_per_row,
                          int64_t work_items, const float* __restrict__ weight_scale_2, float* __restrict__ out,
                          ReductionSlot rs) {
  wait_for_predecessor_then_release();
  uint32_t* slot = rs.index >= 0 ? g_reduction_slots[rs.index] : rs.words;
  uint32_t m = 0;
  for (int64_t w = blockIdx.x; w < work_items; w += gridDim.x) {
    const int64_t r = w / tiles_per_row;
    const int64_t c0 = (w - r * tiles_per_row) * kTileChunks + threadIdx.x;
    const uint4* row = reinterpret_cast<const uint4*>(x + r * ld_bytes);
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t{u} * kThreads;
      v[u] = c < row_chunks ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) m = max(m, Finite<D>::chunk_max(v[u]));
  }
  uint32_t bits = __reduce_max_sync(0xFFFFFFFFu, Finite<D>::to_f32_bits(m));
  __shared__ uint32_t warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = bits;
  __syncthreads();
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int i = 1; i < kThreads / 32; ++i) bits = max(bits, warp_max[i]);
  atomicMax(&slot[0], bits);
  __threadfence();  // this block's max is visible before its arrival is
  if (atomicAdd(&slot[1], 1u) != gridDim.x - 1) return;
  __threadfence();  // every other block's max (fenced before its arrival) is visible to the reads below
  const uint32_t amax_bits = atomicExch(&slot[0], 0u);
  atomicExch(&slot[1], 0u);
  write_scales(dynamic_input_scales(__uint_as_float(amax_bits), *weight_scale_2), out);
}

__global__ void static_scales_kernel(const float* __restrict__ input_scale, const float* __restrict__ weight_scale_2,
                                     float* __restrict__ out) {
  write_scales(static_input_scales(*input_scale, *weight_scale_2), out);
}

int64_t element_bytes(InDtype d) { return d == InDtype::kFloat32 ? 4 : 2; }

StreamSlots& slot_table() {
  static StreamSlots* table = new StreamSlots(kSlots);  // never destroyed: launches may still come at exit
  return *table;
}

cudaError_t sm_count(int* out) {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_per_device(cached, out, [](int dev, int* v) {
    return cudaDeviceGetAttribute(v, cudaDevAttrMultiProcessorCount, dev);
  });
}

bool failed(cudaError_t e, const char* what, char* err, size_t err_len) {
  if (e == cudaSuccess) return false;
  cudaGetLastError();  // a failed runtime call is also recorded as the last error; later launch checks read it
  std::snprintf(err, err_len, "input scales: %s failed: %s", what, cudaGetErrorString(e));
  return true;
}

// The launch's own error is read once by input_scales_cuda (cudaGetLastError); the return value is that of
// reading the kernel's attributes.
template <InDtype D>
cudaError_t launch_dynamic(const void* x, int64_t rows, int64_t k, int64_t ld_x, const float* ws2, float* out,
                           ReductionSlot slot, int blocks_cap, cudaStream_t stream) {
  int pdl = 0;
  if (const cudaError_t e = waits_for_predecessor(dynamic_scales_kernel<D>, &pdl); e != cudaSuccess) return e;
  const int64_t esize = element_bytes(D);
  // A contiguous x (or a single row) is one long row: tiles then never end early at row ends.
  if (rows <= 1 || ld_x == k) {
    k *= rows;
    rows = rows > 0 ? 1 : 0;
    ld_x = k;
  }
  const int64_t row_chunks = k * esize / 16;
  const int64_t tiles_per_row = (row_chunks + kTileChunks - 1) / kTileChunks;
  const int64_t work = rows * tiles_per_row;
  const int64_t blocks = work < 1 ? 1 : work < blocks_cap ? work : blocks_cap;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, pdl != 0, attr);
  cudaLaunchKernelEx(&cfg, dynamic_scales_kernel<D>, static_cast<const uint8_t*>(x), ld_x * esize, row_chunks,
                     tiles_per_row > 0 ? tiles_per_row : int64_t{1}, work, ws2, out, slot);
  return cudaSuccess;
}

}  // namespace

ReductionSlot reduction_slot(cudaStream_t stream) {
  ReductionSlot slot;
  if (slot_table().get(stream, &slot.index) != cudaSuccess) {
    cudaGetLastError();
    slot.index = -1;  // the caller's own zeroed words work wherever a slot does
  }
  return slot;
}

bool input_scales_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x,
                       const float* input_scale, const float* weight_scale_2, float* out, ReductionSlot slot,
                       cudaStream_t stream, char* err, size_t err_len) {
  if (input_scale != nullptr) {
    static_scales_kernel<<<1, 1, 0, stream>>>(input_scale, weight_scale_2, out);
  } else {
    int sms = 0;
    if (failed(sm_count(&sms), "reading the SM count", err, err_len)) return false;
    const int cap = sms * kBlocksPerSm;
    cudaError_t e = cudaSuccess;
    switch (dtype) {
      case InDtype::kFloat32:
        e = launch_dynamic<InDtype::kFloat32>(x, rows, k, ld_x, weight_scale_2, out, slot, cap, stream);
        break;
      case InDtype::kFloat16:
        e = launch_dynamic<InDtype::kFloat16>(x, rows, k, ld_x, weight_scale_2, out, slot, cap, stream);
        break;
      case InDtype::kBFloat16:
        e = launch_dynamic<InDtype::kBFloat16>(x, rows, k, ld_x, weight_scale_2, out, slot, cap, stream);
        break;
    }
    if (failed(e, "reading the input-scales kernel's attributes", err, err_len)) return false;
  }
  // Read once: cudaGetLastError also clears the error, so a second call would report "no error".
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "input scales kernel launch failed (%s, rows=%lld k=%lld): %s (was the core module "
                  "compiled for this GPU? rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)",
                  input_scale != nullptr ? "static" : "dynamic", static_cast<long long>(rows),
                  static_cast<long long>(k), cudaGetErrorString(e));
    return false;
  }
  return true;
}

}  // namespace nvfp4_gemm::quant
