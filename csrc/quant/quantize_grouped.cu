// Grouped NVFP4 quantization for any SM >= 8.0: one launch that writes the packed rows and every byte of sfa. Each
// group is worked by CTAs of its own, as many as its work needs (its real scale items and its atoms' padding, about 8
// units a thread: Work below; one CTA for an empty group), so a popular expert of a skewed routing is spread like any
// other, and a group of one row at large K still takes several CTAs: every CTA scans offs once (the grouped GEMM's
// routing rules, csrc/cuda/grouped.cu: offsets clamped to [0, rows], a decrease read as an empty group) to find its
// group, its part, and the group's padded start, with no routing prologue, no memset and no search per element. With
// dynamic scales a group's amax comes first: from a launch of its own ahead where a group may need more than
// kInCtaAmaxCtas CTAs; otherwise (decode, a few rows in all) inside the same launch, each CTA of a group over all the
// group's rows. One dynamic scale for all groups (one_scale, the MoE layer's per-tensor scale) comes the same two ways
// from all T rows, inside the launch only while x is small (kInCtaOneScaleBytes). A thread quantizes one block of 16
// elements and stores its scale byte where blocked_sf_offset puts it; the padding rows of the group's atoms are zeroed
// 16 bytes a store where a whole chunk is padding. What lies past the routing's padded rows up to sfa_rows is zeroed by
// every CTA together. Each group's third output is recipe.h's alpha: fl(decode * weight_scale_2), so the grouped GEMM
// reads it as it is (the decode scale itself where no weight_scale_2 is given). Both kernels are programmatic
// dependents (quant/pdl.cuh): the grouped GEMM behind them launches while they run.
#include "quant/quantize_grouped.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <type_traits>

#include "quant/elem.cuh"
#include "quant/pdl.cuh"
#include "quant/recipe.h"

namespace nvfp4_gemm::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 8;  // work units a thread of a CTA (Work)
// Dynamic scales take the amax launch ahead where some group may need more than this many CTAs (the host does not
// read offs: any group may hold every row); below, each CTA of a group reads all the group's rows for its amax.
constexpr long long kInCtaAmaxCtas = 16;
// One dynamic scale for all groups is formed inside the quantizing launch only up to this much of x: each of its
// CTAs reads all T rows, so past a decode step's few rows (8 rows at K 2048 in bf16: 32 KiB) the launch ahead costs
// less than ~100 CTAs each reading x (H200: 128 rows x 768 in bf16 cost ~12 us a MoE layer in the in-CTA pass).
constexpr long long kInCtaOneScaleBytes = 64 << 10;

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

// A group's work in units: a real (row, scale column) item, one block quantized, weighs 2; a 16-byte chunk of its
// 128-row atoms (32 a scale-atom column), zeroed where it is all padding, weighs 1. ctas(m): the CTAs of a group of m
// rows, about kUnitsPerThread units a thread, one at least.
struct Work {
  long long per_row, per_atom;
  __host__ __device__ long long ctas(long long m) const {
    const long long units = m * per_row + (m + kSfAtomRows - 1) / kSfAtomRows * per_atom;
    constexpr long long kPerCta = static_cast<long long>(kThreads) * kUnitsPerThread;
    return units > kPerCta ? (units + kPerCta - 1) / kPerCta : 1;
  }
};
inline Work work_for(int64_t k) {
  const long long atom_cols = ceil_div(k / kSfVecSize, kSfAtomCols);
  return Work{atom_cols * kSfAtomCols * 2, atom_cols * 32};
}

// A CTA's share of the launch: group j, part p of its `parts` CTAs (the group's first CTA is `first`), the padded
// rows of the groups before j and of all groups (sum of round_up(m_i, 128)). live is false for a CTA past the
// groups' CTAs (it only zeroes its share of sfa's tail).
struct Share {
  int64_t j, first, pad_start, pad_total;
  int p, parts;
  bool live;
};

// This CTA's share: group j takes work.ctas(m_j) CTAs, in group order. One pass over the groups,
// kThreads at a time, a group a thread: a block-wide exclusive scan (shuffles in each warp, then the warps' totals
// through shared memory) of the CTA counts and of the padded rows, so the answer costs one load a thread and two
// barriers a chunk. A routing whose groups overlap (offs decreasing, then increasing again) can need more CTAs than
// the launch holds (its bound assumes the groups partition the rows): then every group gets one CTA (CTA j works group
// j), so every byte is still written; the same pass keeps that answer too. Called once a CTA.
__device__ __forceinline__ Share share_of(const int32_t* offs, int64_t t, int64_t g, Work work) {
  constexpr int kWarps = kThreads / 32;
  constexpr unsigned kAll = 0xFFFFFFFFu;
  __shared__ long long s_warp[2][kWarps];  // a chunk's per-warp sums: CTAs, padded rows
  __shared__ long long s_found[4];         // under the rows rule: group, first CTA, CTAs, padded start
  __shared__ long long s_own_pad;          // the padded start of group blockIdx.x (the one-a-group answer)
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const long long me = blockIdx.x;
  if (threadIdx.x == 0) s_found[0] = -1, s_found[1] = s_found[2] = s_found[3] = 0;  // written below after a barrier
  long long cta_base = 0, pad_base = 0;    // sums over the chunks before (the same in every thread)
  for (int64_t c0 = 0; c0 < g; c0 += kThreads) {
    const int64_t i = c0 + threadIdx.x;
    const long long rows = i < g ? group_rows(offs, t, i).count : 0;
    const long long n = i < g ? work.ctas(rows) : 0;
    const long long pad = round_up(rows, static_cast<long long>(kSfAtomRows));
    long long n_incl = n, pad_incl = pad;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const long long x = __shfl_up_sync(kAll, n_incl, d), y = __shfl_up_sync(kAll, pad_incl, d);
      if (lane >= d) n_incl += x, pad_incl += y;
    }
    if (lane == 31) s_warp[0][warp] = n_incl, s_warp[1][warp] = pad_incl;
    __syncthreads();
    long long n_before = cta_base, pad_before = pad_base, n_chunk = 0, pad_chunk = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const long long wn = s_warp[0][w], wp = s_warp[1][w];
      if (w < warp) n_before += wn, pad_before += wp;
      n_chunk += wn, pad_chunk += wp;
    }
    const long long first = n_before + n_incl - n, pad_start = pad_before + pad_incl - pad;
    if (i < g && me >= first && me < first + n)  // at most one thread of the launch: the ranges partition the CTAs
      s_found[0] = i, s_found[1] = first, s_found[2] = n, s_found[3] = pad_start;
    if (i == me) s_own_pad = pad_start;
    cta_base += n_chunk, pad_base += pad_chunk;
    __syncthreads();  // s_warp is rewritten by the next chunk; s_found / s_own_pad are read after the loop
  }
  Share sh;
  sh.pad_total = pad_base;
  if (cta_base > static_cast<long long>(gridDim.x)) {  // overlapping groups: one CTA a group
    sh.j = me < g ? me : -1, sh.first = me, sh.parts = 1, sh.pad_start = me < g ? s_own_pad : 0;
  } else {
    sh.j = s_found[0], sh.first = s_found[1], sh.parts = static_cast<int>(s_found[2]), sh.pad_start = s_found[3];
  }
  sh.live = sh.j >= 0;
  sh.p = static_cast<int>(me - sh.first);
  return sh;
}

// The max of every thread's m, every thread of the CTA getting it: a warp reduction, then the warps' through shared
// memory. Called at most once per CTA and kernel (its shared words are not reused).
__device__ __forceinline__ uint32_t cta_max(uint32_t m) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  __shared__ uint32_t warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = max(m, warp_max[w]);
  return m;
}

// The finite amax (fp32 bits; 0 where nothing is finite) of CTA p of `parts`'s share of group rows r, every thread
// of the CTA getting it: 16-byte loads strided over the parts' threads, then a warp and a CTA reduction.
template <InDtype D>
__device__ __forceinline__ uint32_t share_finite_amax(const uint8_t* __restrict__ x, int64_t ld_x_bytes, int64_t k,
                                                      Rows r, int p, int parts) {
  constexpr int kPerChunk = 16 / Elem<D>::kBytes;  // elements per 16-byte load
  const int64_t per_row = k / kPerChunk, chunks = r.count * per_row;
  constexpr int kIlp = 4;  // loads in flight a thread: the loop is latency-bound where one CTA reads a whole group
  const int64_t stride = static_cast<int64_t>(parts) * kThreads;
  uint32_t m = 0;
  for (int64_t c0 = static_cast<int64_t>(p) * kThreads + threadIdx.x; c0 < chunks; c0 += kIlp * stride) {
    uint4 v[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      const int64_t c = c0 + u * stride;
      v[u] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(x + (r.start + c / per_row) * ld_x_bytes) + c % per_row)
                        : make_uint4(0, 0, 0, 0);  // zero bits: no effect on the max
    }
#pragma unroll
    for (int u = 0; u < kIlp; ++u)
#pragma unroll
      for (int i = 0; i < kPerChunk; ++i) {
        const uint32_t bits = Elem<D>::bits(&v[u], i) & 0x7FFFFFFFu;
        if (bits < 0x7F800000u) m = max(m, bits);  // finite only: inf and NaN do not set the scale
      }
  }
  return cta_max(m);
}

// The max of n words at v (amax slots), every thread of the CTA getting it.
__device__ __forceinline__ uint32_t slots_max(const uint32_t* __restrict__ v, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) m = max(m, v[i]);
  return cta_max(m);
}

// Dynamic scales, the launch ahead: CTA p of group j's `parts` (> 1) writes the finite amax of its share of the group's
// elements to amax[first + p], its own index. The quantization reads exactly the slots of its group's CTAs, all
// written here, so the workspace needs no clearing; a group of one CTA forms its amax in the quantization itself.
// One scale for all groups (one_scale): every CTA writes the amax of its share of all T rows to amax[blockIdx.x].
template <InDtype D>
__global__ void __launch_bounds__(kThreads) group_amax_kernel(const uint8_t* __restrict__ x, int64_t ld_x_bytes,
                                                              int64_t t, int64_t k, const int32_t* __restrict__ offs,
                                                              int64_t g, Work work, bool one_scale,
                                                              uint32_t* __restrict__ amax) {
  wait_for_predecessor_then_release();
  if (one_scale) {
    const uint32_t m = share_finite_amax<D>(x, ld_x_bytes, k, Rows{0, t}, static_cast<int>(blockIdx.x),
                                            static_cast<int>(gridDim.x));
    if (threadIdx.x == 0) amax[blockIdx.x] = m;
    return;
  }
  const Share sh = share_of(offs, t, g, work);
  if (!sh.live || sh.parts == 1) return;
  const uint32_t m = share_finite_amax<D>(x, ld_x_bytes, k, group_rows(offs, t, sh.j), sh.p, sh.parts);
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

// CTA sh.p of group sh.j's sh.parts: its scales, and its share of the group's items.
template <InDtype D>
__device__ __forceinline__ void quantize_share(const uint8_t* __restrict__ x, int64_t ld_x_bytes, int64_t t, int64_t k,
                                               const int32_t* __restrict__ offs, const Share& sh,
                                               const float* __restrict__ input_scale, bool one_scale,
                                               const uint32_t* __restrict__ amax,
                                               const float* __restrict__ weight_scale_2, int64_t sfa_rows,
                                               uint8_t* __restrict__ packed, uint8_t* __restrict__ sf,
                                               float* __restrict__ scale_out) {
  const int64_t j = sh.j;
  const int p = sh.p, parts = sh.parts;
  const Rows r = group_rows(offs, t, j);
  const float ws2 = weight_scale_2 != nullptr ? weight_scale_2[j] : 1.0f;  // alpha = fl(decode * 1) = decode
  InputScales sc;
  if (input_scale != nullptr) {
    sc = static_input_scales(input_scale[j], ws2);
  } else if (one_scale) {  // all T rows: from every CTA's slot of the launch ahead, or this CTA's own pass
    const uint32_t m = amax != nullptr ? slots_max(amax, gridDim.x) : share_finite_amax<D>(x, ld_x_bytes, k, Rows{0, t},
                                                                                           0, 1);
    sc = dynamic_input_scales(__uint_as_float(m), ws2);
  } else if (amax == nullptr || parts == 1) {
    sc = dynamic_input_scales(__uint_as_float(share_finite_amax<D>(x, ld_x_bytes, k, r, 0, 1)), ws2);
  } else {
    uint32_t m = 0;
    for (int i = 0; i < parts; ++i) m = max(m, amax[sh.first + i]);
    sc = dynamic_input_scales(__uint_as_float(m), ws2);
  }
  if (p == 0 && threadIdx.x == 0) scale_out[j] = sc.alpha;

  const int64_t sf_cols = k / kSfVecSize;
  const int64_t atom_cols = ceil_div(sf_cols, kSfAtomCols);
  // The group's padded rows that fit the capacity: whole atoms, as pad_start and sfa_rows are multiples of 128;
  // rows past it are not quantized.
  const int64_t fit = sfa_rows - sh.pad_start;
  const int64_t atom_rows = fit <= 0 ? 0 : min(round_up(r.count, kSfAtomRows), fit) / kSfAtomRows;
  const int64_t real = min(r.count, atom_rows * kSfAtomRows);
  // Two kinds of items, writing disjoint bytes: (row, scale column) of a real row, padded columns included, its
  // block quantized (zero past sf_cols) and the scale byte stored (consecutive threads: consecutive blocks of a
  // row, one block each so that every lane works at a few rows a group); then each 16-byte chunk of the group's
  // atoms (rows q, q + 32, q + 64, q + 96 of an atom), its padding rows' words zeroed.
  const int64_t padded_cols = atom_cols * kSfAtomCols;
  const int64_t n_real = real * padded_cols, n_items = n_real + atom_rows * atom_cols * 32;
  uint8_t* const sf_group = sf + sh.pad_start * padded_cols;
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
}

// The quantization: CTA p of group j's `parts` takes its share of the group's items (below), CTA p = 0 writes
// scale_out[j] (fl(decode * weight_scale_2[j]), or the decode scale where weight_scale_2 is null), and every CTA
// zeroes its share of the bytes past the routing's padded rows. Scales: static from input_scale; dynamic from the
// group's amax slots (group_amax_kernel ran ahead) where it has several CTAs and amax is given, else from this CTA's
// own pass over all the group's rows; one_scale: one dynamic scale from all T rows (all the launch's amax slots, or
// this CTA's own pass over x).
template <InDtype D>
__global__ void __launch_bounds__(kThreads) quantize_grouped_kernel(
    const uint8_t* __restrict__ x, int64_t ld_x_bytes, int64_t t, int64_t k, const int32_t* __restrict__ offs,
    int64_t g, Work work, const float* __restrict__ input_scale, bool one_scale, const uint32_t* __restrict__ amax,
    const float* __restrict__ weight_scale_2, int64_t sfa_rows, uint8_t* __restrict__ packed, uint8_t* __restrict__ sf,
    float* __restrict__ scale_out) {
  wait_for_predecessor_then_release();
  const Share sh = share_of(offs, t, g, work);
  const int64_t sf_cols = k / kSfVecSize;
  const int64_t atom_cols = ceil_div(sf_cols, kSfAtomCols);
  if (sh.live) quantize_share<D>(x, ld_x_bytes, t, k, offs, sh, input_scale, one_scale, amax, weight_scale_2, sfa_rows,
                                 packed, sf, scale_out);
  // Past the routing's padded rows (when the capacity exceeds them): zero, 16 bytes a store over the whole grid.
  const int64_t used = sh.pad_total < sfa_rows ? sh.pad_total : sfa_rows;
  const int64_t tail = (sfa_rows - used) * atom_cols * kSfAtomCols / 16;  // whole 512-byte atoms: 16-byte stores
  uint4* const tail_sf = reinterpret_cast<uint4*>(sf + used * atom_cols * kSfAtomCols);
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; u < tail;
       u += static_cast<int64_t>(gridDim.x) * kThreads)
    tail_sf[u] = make_uint4(0, 0, 0, 0);
}

// CTAs of a launch, whatever the routing: sum_j ctas(m_j) <= g + sum_j units(m_j) / U (U units a CTA), and
// sum_j ceil(m_j / 128) <= rows / 128 + g for groups that partition the rows (share_of falls back to one CTA a group
// where overlapping groups would need more).
int64_t grid_for(int64_t rows, int64_t k, int64_t g) {
  const Work w = work_for(k);
  const int64_t units = rows * w.per_row + (ceil_div(rows, int64_t{kSfAtomRows}) + g) * w.per_atom;
  return g + ceil_div(units, int64_t{kThreads} * kUnitsPerThread);
}

// Whether dynamic scales take the amax launch ahead: per group, where a group holding every row needs more than
// kInCtaAmaxCtas; with one scale for all groups, where x exceeds kInCtaOneScaleBytes, since every CTA of the launch
// (at least one a group) would read all of x for it.
bool amax_launch(int64_t rows, int64_t k, bool one_scale, int64_t elem_bytes) {
  return one_scale ? rows * k * elem_bytes > kInCtaOneScaleBytes : work_for(k).ctas(rows) > kInCtaAmaxCtas;
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
            const float* input_scale, bool one_scale, const float* weight_scale_2, int64_t sfa_rows, void* workspace,
            uint8_t* packed, uint8_t* sf, float* scale_out, cudaStream_t stream, char* err, size_t err_len) {
  const Work work = work_for(k);
  const auto blocks = static_cast<unsigned>(grid_for(rows, k, g));
  // Dynamic scales: the amax slots of groups with several CTAs from a launch ahead (one slot a CTA), or none.
  uint32_t* const amax = input_scale == nullptr && amax_launch(rows, k, one_scale, Elem<D>::kBytes)
                             ? static_cast<uint32_t*>(workspace)
                             : nullptr;
  const auto* src = static_cast<const uint8_t*>(x);
  const int64_t ld_bytes = ld_x * Elem<D>::kBytes;
  if (amax != nullptr) {
    if (const cudaError_t e = launch_kernel(group_amax_kernel<D>, blocks, stream, src, ld_bytes, rows, k, offs, g,
                                            work, one_scale, amax);
        e != cudaSuccess) {
      std::snprintf(err, err_len, "quantize_grouped amax launch failed: %s", cudaGetErrorString(e));
      return false;
    }
  }
  if (const cudaError_t e = launch_kernel(quantize_grouped_kernel<D>, blocks, stream, src, ld_bytes, rows, k, offs, g,
                                          work, input_scale, one_scale, static_cast<const uint32_t*>(amax),
                                          weight_scale_2,
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
  return static_cast<size_t>(round_up(grid_for(rows, k, g) * 4, 16));
}

bool quantize_grouped_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x, const int32_t* offs,
                           int64_t g, const float* input_scale, bool one_scale, const float* weight_scale_2,
                           int64_t sfa_rows, void* workspace, uint8_t* packed, uint8_t* sf, float* scale_out,
                           cudaStream_t stream, char* err, size_t err_len) {
  if (g < 1 || grid_for(rows, k, g) > 0x7FFFFFFF || rows > 0x7FFFFFFF) {
    std::snprintf(err, err_len, "quantize_grouped: rows=%lld k=%lld groups=%lld past the grid limit",
                  static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(g));
    return false;
  }
  const auto run = [&](auto d) {
    return launch<decltype(d)::value>(x, rows, k, ld_x, offs, g, input_scale, one_scale && input_scale == nullptr,
                                      weight_scale_2, sfa_rows, workspace, packed, sf, scale_out, stream, err, err_len);
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
