// Grouped NVFP4 quantization for any SM >= 8.0: one launch that writes the packed rows and every byte of sfa. Each
// group is worked by `parts` CTAs of its own (blockIdx.x = group * parts + part), so no routing prologue, no memset
// and no search per element: a CTA reads its group's rows and padded start straight from offs (the grouped GEMM's
// routing rules, csrc/cuda/grouped.cu: offsets clamped to [0, rows], a decrease read as an empty group). With
// dynamic scales a group's amax comes first: inside the same launch where a group has one CTA (the decode regime,
// a few rows a group), else from a launch of its own ahead. A thread quantizes one block of 16 elements and stores
// its scale byte where blocked_sf_offset puts it; the padding rows of the group's atoms are zeroed 16 bytes a
// store where a whole chunk is padding. What lies past the routing's padded rows up to sfa_rows is zeroed by every
// CTA together. Each group's third output is recipe.h's alpha: fl(decode * weight_scale_2), so the grouped GEMM
// reads it as it is (the decode scale itself where no weight_scale_2 is given). Both kernels are programmatic
// dependents (quant/pdl.cuh): the grouped GEMM behind them launches while they run.
#include "quant/quantize_grouped.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <type_traits>

#include "quant/elem.cuh"
#include "quant/pdl.cuh"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxParts = 32;  // CTAs per group, at most

// Group j's first row and row count under the routing rules.
struct Rows {
  int64_t start, count;
};
__device__ __forceinline__ Rows group_rows(const int32_t* offs, int64_t t, int64_t j) {
  const auto clamp = [t](int64_t v) { return v < 0 ? int64_t{0} : v > t ? t : v; };
  const int64_t lo = j == 0 ? 0 : clamp(offs[j - 1]);
  const int64_t hi = clamp(offs[j]);
  return Rows{lo, hi > lo ? hi - lo : 0};
}

// Block-wide: the padded rows of the groups before j, and of all g groups (sum of round_up(m_i, 128)).
__device__ void padded_starts(const int32_t* offs, int64_t t, int64_t g, int64_t j, int64_t& before, int64_t& total) {
  __shared__ long long part[2][kThreads / 32];
  long long b = 0, a = 0;
  for (int64_t i = threadIdx.x; i < g; i += kThreads) {
    const long long pad = round_up(group_rows(offs, t, i).count, kSfAtomRows);
    a += pad;
    if (i < j) b += pad;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    b += __shfl_xor_sync(0xFFFFFFFFu, b, off);
    a += __shfl_xor_sync(0xFFFFFFFFu, a, off);
  }
  if (threadIdx.x % 32 == 0) part[0][threadIdx.x / 32] = b, part[1][threadIdx.x / 32] = a;
  __syncthreads();
  b = a = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) b += part[0][w], a += part[1][w];
  before = b, total = a;
}

// The finite amax (fp32 bits; 0 where nothing is finite) of CTA p of `parts`'s share of group rows r, every thread
// of the CTA getting it: 16-byte loads strided over the parts' threads, then a warp and a CTA reduction.
template <InDtype D>
__device__ uint32_t share_finite_amax(const uint8_t* __restrict__ x, int64_t ld_x_bytes, int64_t k, Rows r, int p,
                                      int parts) {
  constexpr int kPerChunk = 16 / Elem<D>::kBytes;  // elements per 16-byte load
  const int64_t per_row = k / kPerChunk, chunks = r.count * per_row;
  uint32_t m = 0;
  for (int64_t c = static_cast<int64_t>(p) * kThreads + threadIdx.x; c < chunks; c += static_cast<int64_t>(parts) * kThreads) {
    const int64_t row = r.start + c / per_row;
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + row * ld_x_bytes) + c % per_row);
#pragma unroll
    for (int i = 0; i < kPerChunk; ++i) {
      const uint32_t bits = Elem<D>::bits(&v, i) & 0x7FFFFFFFu;
      if (bits < 0x7F800000u) m = max(m, bits);  // finite only: inf and NaN do not set the scale
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  __shared__ uint32_t warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = max(m, warp_max[w]);
  return m;
}

// Dynamic scales over several CTAs a group, pass 1: CTA (j, p) of `parts` writes the finite amax of its share of group
// j's elements to amax[j * parts + p]: every slot written, so the workspace needs no clearing.
template <InDtype D>
__global__ void __launch_bounds__(kThreads) group_amax_kernel(const uint8_t* __restrict__ x, int64_t ld_x_bytes,
                                                              int64_t t, int64_t k, const int32_t* __restrict__ offs,
                                                              int parts, uint32_t* __restrict__ amax) {
  wait_for_predecessor_then_release();
  const int64_t j = blockIdx.x / parts;
  const int p = static_cast<int>(blockIdx.x % parts);
  const uint32_t m = share_finite_amax<D>(x, ld_x_bytes, k, group_rows(offs, t, j), p, parts);
  if (threadIdx.x == 0) amax[blockIdx.x] = m;
}

// One 16-element block at src quantized with encode scale gs (recipe.h): its scale byte and codes (element 2i in
// the low nibble of byte i), the bits of nvfp4_gemm::quantize.
template <InDtype D>
__device__ __forceinline__ uint8_t quantize_block(const uint8_t* src, float gs, uint2& codes) {
  constexpr int kLoads = kSfVecSize * Elem<D>::kBytes / 16;
  uint4 raw[kLoads];
#pragma unroll
  for (int l = 0; l < kLoads; ++l) raw[l] = __ldg(reinterpret_cast<const uint4*>(src) + l);
  uint32_t abs_bits[kSfVecSize];
  uint32_t amax_bits = 0;  // |x| bits compared as integers: NaN bits exceed inf's, so a NaN wins
#pragma unroll
  for (int i = 0; i < kSfVecSize; ++i) {
    abs_bits[i] = Elem<D>::bits(raw, i) & 0x7FFFFFFFu;
    amax_bits = max(amax_bits, abs_bits[i]);
  }
  const uint8_t s8 = block_scale(bits_float(amax_bits), gs);
  codes = block_codes([&](int i) { return abs_bits[i]; }, [&](int i) { return Elem<D>::sign(raw, i); },
                      value_multiplier(s8, gs));
  return s8;
}

// The quantization: CTA (j, p) of `parts` takes its share of group j's items (below), CTA (j, 0) writes scale_out[j]
// (fl(decode * weight_scale_2[j]), or the decode scale where weight_scale_2 is null), and every CTA zeroes its share
// of the bytes past the routing's padded rows. Scales: static from input_scale; dynamic from the parts' amax slots
// (group_amax_kernel ran ahead), or, where amax is null (one CTA a group), from this CTA's own pass over the rows.
template <InDtype D>
__global__ void __launch_bounds__(kThreads) quantize_grouped_kernel(
    const uint8_t* __restrict__ x, int64_t ld_x_bytes, int64_t t, int64_t k, const int32_t* __restrict__ offs,
    int64_t g, int parts, const float* __restrict__ input_scale, const uint32_t* __restrict__ amax,
    const float* __restrict__ weight_scale_2, int64_t sfa_rows, uint8_t* __restrict__ packed, uint8_t* __restrict__ sf,
    float* __restrict__ scale_out) {
  wait_for_predecessor_then_release();
  const int64_t j = blockIdx.x / parts;
  const int p = static_cast<int>(blockIdx.x % parts);
  const Rows r = group_rows(offs, t, j);
  int64_t pad_start, pad_total;
  padded_starts(offs, t, g, j, pad_start, pad_total);
  const float ws2 = weight_scale_2 != nullptr ? weight_scale_2[j] : 1.0f;  // alpha = fl(decode * 1) = decode
  InputScales sc;
  if (input_scale != nullptr) {
    sc = static_input_scales(input_scale[j], ws2);
  } else if (amax == nullptr) {
    sc = dynamic_input_scales(__uint_as_float(share_finite_amax<D>(x, ld_x_bytes, k, r, 0, 1)), ws2);
  } else {
    uint32_t m = 0;
    for (int i = 0; i < parts; ++i) m = max(m, amax[j * parts + i]);
    sc = dynamic_input_scales(__uint_as_float(m), ws2);
  }
  if (p == 0 && threadIdx.x == 0) scale_out[j] = sc.alpha;

  const int64_t sf_cols = k / kSfVecSize;
  const int64_t atom_cols = ceil_div(sf_cols, kSfAtomCols);
  // The group's padded rows that fit the capacity: whole atoms, as pad_start and sfa_rows are multiples of 128;
  // rows past it are not quantized.
  const int64_t fit = sfa_rows - pad_start;
  const int64_t atom_rows = fit <= 0 ? 0 : min(round_up(r.count, kSfAtomRows), fit) / kSfAtomRows;
  const int64_t real = min(r.count, atom_rows * kSfAtomRows);
  // Two kinds of items, writing disjoint bytes: (row, scale column) of a real row, padded columns included, its
  // block quantized (zero past sf_cols) and the scale byte stored (consecutive threads: consecutive blocks of a
  // row, one block each so that every lane works at a few rows a group); then each 16-byte chunk of the group's
  // atoms (rows q, q + 32, q + 64, q + 96 of an atom), its padding rows' words zeroed.
  const int64_t padded_cols = atom_cols * kSfAtomCols;
  const int64_t n_real = real * padded_cols, n_items = n_real + atom_rows * atom_cols * 32;
  uint8_t* const sf_group = sf + pad_start * padded_cols;
  for (int64_t it = static_cast<int64_t>(p) * kThreads + threadIdx.x; it < n_items;
       it += static_cast<int64_t>(parts) * kThreads) {
    if (it < n_real) {
      const int64_t rr = it / padded_cols, col = it % padded_cols, row = r.start + rr;
      uint8_t s8 = 0;
      if (col < sf_cols) {
        uint2 codes;
        s8 = quantize_block<D>(x + row * ld_x_bytes + col * kSfVecSize * Elem<D>::kBytes, sc.encode, codes);
        *reinterpret_cast<uint2*>(packed + row * (k / 2) + col * (kSfVecSize / 2)) = codes;
      }
      sf_group[blocked_sf_offset(rr, col, sf_cols)] = s8;
    } else {
      const int64_t c = it - n_real, q = c % 32, atom = c / 32;
      const int64_t r0 = atom / atom_cols * kSfAtomRows + q;  // the chunk's rows: r0 + 32 i
      uint8_t* const chunk = sf_group + atom * kSfAtomBytes + q * 16;
      if (r0 >= real) {
        *reinterpret_cast<uint4*>(chunk) = make_uint4(0, 0, 0, 0);
      } else {
#pragma unroll
        for (int i = 1; i < 4; ++i)
          if (r0 + 32 * i >= real) *reinterpret_cast<uint32_t*>(chunk + 4 * i) = 0;
      }
    }
  }
  // Past the routing's padded rows (when the capacity exceeds them): zero, 16 bytes a store over the whole grid.
  const int64_t used = pad_total < sfa_rows ? pad_total : sfa_rows;
  const int64_t tail = (sfa_rows - used) * atom_cols * kSfAtomCols / 16;  // whole 512-byte atoms: 16-byte stores
  uint4* const tail_sf = reinterpret_cast<uint4*>(sf + used * atom_cols * kSfAtomCols);
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < tail;
       u += static_cast<int64_t>(gridDim.x) * kThreads)
    tail_sf[u] = make_uint4(0, 0, 0, 0);
}

// CTAs per group, from the work of a group holding rows / min(rows, g) rows (each non-empty group's share when
// the rows spread over as many groups as they can): its real (row, scale column) items, one block quantized each
// (weighted 2), and its atoms' 16-byte chunks (weighted 1), about 8 units a thread; at most kMaxParts.
int parts_for(int64_t rows, int64_t k, int64_t g) {
  const int64_t share = rows <= 0 ? 1 : ceil_div(rows, rows < g ? rows : g);
  const int64_t atom_cols = ceil_div(k / kSfVecSize, kSfAtomCols);
  const int64_t units = share * atom_cols * kSfAtomCols * 2 + ceil_div(share, kSfAtomRows) * atom_cols * 32;
  const int64_t want = ceil_div(units, int64_t{kThreads} * 8);
  return static_cast<int>(want < 1 ? 1 : want > kMaxParts ? kMaxParts : want);
}

// `kernel` over `blocks` CTAs on `stream`, a programmatic dependent where its code waits (quant/pdl.cuh).
template <typename Kernel, typename... Args>
cudaError_t launch_kernel(Kernel* kernel, unsigned blocks, cudaStream_t stream, Args... args) {
  int pdl = 0;
  if (const cudaError_t e = waits_for_predecessor(kernel, &pdl); e != cudaSuccess) return e;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(dim3(blocks), dim3(kThreads), 0, stream, pdl != 0, attr);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  // Read once: cudaGetLastError also clears the error, so a second call would report "no error".
  const cudaError_t last = cudaGetLastError();
  return e != cudaSuccess ? e : last;
}

template <InDtype D>
bool launch(const void* x, int64_t rows, int64_t k, int64_t ld_x, const int32_t* offs, int64_t g,
            const float* input_scale, const float* weight_scale_2, int64_t sfa_rows, void* workspace, uint8_t* packed,
            uint8_t* sf, float* scale_out, cudaStream_t stream, char* err, size_t err_len) {
  const int parts = parts_for(rows, k, g);
  const auto blocks = static_cast<unsigned>(g * parts);
  // Dynamic scales over several CTAs a group: their amax slots from a launch ahead; one CTA a group forms its own.
  uint32_t* const amax = input_scale == nullptr && parts > 1 ? static_cast<uint32_t*>(workspace) : nullptr;
  const auto* src = static_cast<const uint8_t*>(x);
  const int64_t ld_bytes = ld_x * Elem<D>::kBytes;
  if (amax != nullptr) {
    if (const cudaError_t e = launch_kernel(group_amax_kernel<D>, blocks, stream, src, ld_bytes, rows, k, offs, parts,
                                            amax);
        e != cudaSuccess) {
      std::snprintf(err, err_len, "quantize_grouped amax launch failed: %s", cudaGetErrorString(e));
      return false;
    }
  }
  if (const cudaError_t e = launch_kernel(quantize_grouped_kernel<D>, blocks, stream, src, ld_bytes, rows, k, offs, g,
                                          parts, input_scale, static_cast<const uint32_t*>(amax), weight_scale_2,
                                          sfa_rows, packed, sf, scale_out);
      e != cudaSuccess) {
    std::snprintf(err, err_len, "quantize_grouped kernel launch failed: %s (was the generic module compiled for this "
                  "GPU? rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)", cudaGetErrorString(e));
    return false;
  }
  return true;
}

}  // namespace

size_t quantize_grouped_workspace_bytes(int64_t rows, int64_t k, int64_t g) {
  return static_cast<size_t>(round_up(g * parts_for(rows, k, g) * 4, 16));
}

bool quantize_grouped_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const int32_t* offs,
                           int64_t g, const float* input_scale, const float* weight_scale_2, int64_t sfa_rows,
                           void* workspace, uint8_t* packed, uint8_t* sf, float* scale_out, cudaStream_t stream,
                           char* err, size_t err_len) {
  if (g < 1 || g * parts_for(rows, k, g) > 0x7FFFFFFF || rows > 0x7FFFFFFF) {
    std::snprintf(err, err_len, "quantize_grouped: rows=%lld k=%lld groups=%lld past the grid limit",
                  static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(g));
    return false;
  }
  const auto run = [&](auto d) {
    return launch<decltype(d)::value>(x, rows, k, ld_x, offs, g, input_scale, weight_scale_2, sfa_rows, workspace,
                                      packed, sf, scale_out, stream, err, err_len);
  };
  switch (dtype) {
    case InDtype::kFloat32: return run(std::integral_constant<InDtype, InDtype::kFloat32>{});
    case InDtype::kFloat16: return run(std::integral_constant<InDtype, InDtype::kFloat16>{});
    case InDtype::kBFloat16: return run(std::integral_constant<InDtype, InDtype::kBFloat16>{});
  }
  std::snprintf(err, err_len, "quantize_grouped: unknown input dtype code %d", static_cast<int>(dtype));
  return false;
}

}  // namespace nvfp4_gemm::quant
