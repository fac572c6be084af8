// SM90 grouped GEMM, the form for groups of tens to hundreds of rows (prefill): the wgmma kernel's grouped form
// (sm90_gemm.cuh, GemmParams::offs) over (group, token tile, 128- or 256-row B tile), where each B tile is decoded once
// per 32 to 256 rows of its group (the tile's TOKENS) instead of once per 8 or 16 as in the K-sliced configs. Host
// code; the kernels are instantiated in grouped_wgmma_t{32,64,80,128,160,256}_{f16,bf16}.cu (128-row tiles) and
// grouped_wgmma_w256_t{80,128}_{f16,bf16}.cu (256-row tiles). Torch-free.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "common/grouped.h"
#include "sm90/grouped.h"
#include "sm90/grouped_scan.cuh"
#include "sm90/sm90_gemm.cuh"
#include "sm90/tensor_map.h"

namespace nvfp4_gemm::sm90 {

#define NVFP4_SM90_GROUPED_WGMMA_EXTERN(T, KT, S, W)                                                  \
  extern template cudaError_t launch_gemm<T, KT, S, 1, Elem::kHalf, true, W / 64>(const LaunchArgs&);  \
  extern template cudaError_t launch_gemm<T, KT, S, 1, Elem::kBf16, true, W / 64>(const LaunchArgs&);
NVFP4_SM90_GROUPED_WGMMA_CONFIGS(NVFP4_SM90_GROUPED_WGMMA_EXTERN)
#undef NVFP4_SM90_GROUPED_WGMMA_EXTERN

namespace {

struct GwgConfig {
  const char* name;
  int tokens, kt, stages, cons;  // cons: consumer warpgroups, of 64 B rows each
  cudaError_t (*launch[2])(const LaunchArgs&);  // fp16, bf16 A
};
#define NVFP4_SM90_GROUPED_WGMMA_ENTRY(T, KT, S, W)               \
  {NVFP4_SM90_GROUPED_WGMMA_NAME(T, KT, S, W), T, KT, S, W / 64, \
   {&launch_gemm<T, KT, S, 1, Elem::kHalf, true, W / 64>, &launch_gemm<T, KT, S, 1, Elem::kBf16, true, W / 64>}},
constexpr GwgConfig kGwg[] = {NVFP4_SM90_GROUPED_WGMMA_CONFIGS(NVFP4_SM90_GROUPED_WGMMA_ENTRY)};
#undef NVFP4_SM90_GROUPED_WGMMA_ENTRY
static_assert(sizeof(kGwg) / sizeof(kGwg[0]) == kNumGroupedWgmma, "grouped.h counts the wgmma configs");

// A in the kernel's K order (order_a16_kernel, decode_a_grouped_kernel): T rows of K 16-bit values (K % 256 == 0,
// the table's rule).
int64_t a_order_bytes(const GroupedProblem& p) { return round_up(p.t * p.k * 2, 256); }

// A in the kernel's order stays below this (the workspace is allocated per call).
constexpr int64_t kMaxAOrderBytes = int64_t{1} << 31;

// NVFP4 A with the grouped blocked scales (common/grouped.h) decoded to A_dec as decode_a_kernel decodes dense A.
// Group j's rows are [end_{j-1}, end_j), end the running max of offs clamped to [0, T] (the GEMM's work list,
// build_grouped_tiles), and its scales start at padded row pad_j = the sum of round_up(rows, 128) before it, so row
// r of group j reads padded row pad_j + r - end_{j-1}. A row whose padded row lies past the sfa buffer (a routing the
// buffer was not sized for) decodes to NaN, so its outputs are NaN and nothing is read past; a row in no group
// (offs[G-1] < T) to zero. A grid-stride loop over a few waves: each CTA scans offs once.
__global__ void __launch_bounds__(256) decode_a_grouped_kernel(const uint8_t* __restrict__ a, int64_t lda,
                                                               const uint8_t* __restrict__ sfa, int64_t sfa_rows,
                                                               const int32_t* __restrict__ offs, int groups, int t,
                                                               int k, __half* __restrict__ out, uint32_t a_fold,
                                                               uint32_t a_post) {
  cudaTriggerProgrammaticLaunchCompletion();  // the GEMM may launch now; it waits for our writes itself
  __shared__ int s_end[kWgmmaMaxGroups];
  __shared__ int64_t s_pad[kWgmmaMaxGroups];
  for (int g = threadIdx.x; g < groups; g += blockDim.x) s_end[g] = min(max(offs[g], 0), t);
  __syncthreads();
  if (threadIdx.x < 32)  // each group's end, and the padded sfa rows ahead of it
    scan_groups<int64_t>(
        s_end, groups, [](int start, int end) { return round_up(int64_t{end} - start, kSfAtomRows); },
        [&](int g, int, int end, int64_t before, int64_t) {
          s_end[g] = end;
          s_pad[g] = before;
        });
  __syncthreads();
  const int kblocks = k / 64;  // K % 256 == 0: every block is whole
  const int64_t total = static_cast<int64_t>(t) * kblocks * 8;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int v = static_cast<int>(idx & 7);
    const int64_t blk = idx >> 3;
    const int r = static_cast<int>(blk / kblocks), kb = static_cast<int>(blk % kblocks);
    int lo = 0, hi = groups;  // the first group whose end is past r
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (s_end[mid] > r) hi = mid; else lo = mid + 1;
    }
    uint4 val = make_uint4(0, 0, 0, 0);
    if (lo < groups) {
      const int64_t prow = s_pad[lo] + (r - (lo ? s_end[lo - 1] : 0));
      if (prow >= sfa_rows) {
        val = make_uint4(0x7E007E00u, 0x7E007E00u, 0x7E007E00u, 0x7E007E00u);  // fp16 NaN
      } else {
        const uint8_t* src = a + static_cast<int64_t>(r) * lda + kb * 32;
        const uint4 w_lo = __ldg(reinterpret_cast<const uint4*>(src));
        const uint4 w_hi = __ldg(reinterpret_cast<const uint4*>(src + 16));
        const uint32_t sw = __ldg(reinterpret_cast<const uint32_t*>(sfa + blocked_sf_word_offset(prow, kb, kblocks)));
        val = decode_a_vector(w_lo, w_hi, sw, v, a_fold, a_post);
      }
    }
    reinterpret_cast<uint4*>(out + static_cast<int64_t>(r) * k + kb * 64)[v] = val;
  }
}

}  // namespace

bool grouped_wgmma_check(const GroupedProblem& p, int wgmma_config, char* why, size_t why_len) {
  const GwgConfig& c = kGwg[wgmma_config];
  auto no = [&](const char* fmt, auto... args) {
    if (why && why_len) {
      const int n = std::snprintf(why, why_len, "sm90 grouped %s: ", c.name);
      if (n >= 0 && static_cast<size_t>(n) < why_len) std::snprintf(why + n, why_len - n, fmt, args...);
    }
    return false;
  };
  if (p.g > kWgmmaMaxGroups)
    return no("at most %d groups, got %lld", kWgmmaMaxGroups, static_cast<long long>(p.g));
  if (a_order_bytes(p) > kMaxAOrderBytes)
    return no("T x K = %lld x %lld needs more than 2 GiB of workspace", static_cast<long long>(p.t),
              static_cast<long long>(p.k));
  // The kernel's (tile, K tile) units are 32-bit: at most (T / TOKENS + G) tiles of each B-row tile.
  const int64_t units =
      (ceil_div(p.t, int64_t{c.tokens}) + p.g) * ceil_div(p.n, int64_t{tile_rows(c.cons)}) * (p.k / c.kt);
  if (units >= (int64_t{1} << 31))
    return no("%lld work units exceed the kernel's 32-bit indices", static_cast<long long>(units));
  return true;
}

size_t grouped_wgmma_workspace(const GroupedProblem& p) { return static_cast<size_t>(a_order_bytes(p)); }

bool grouped_wgmma_run(const GroupedProblem& p, int wgmma_config, const DeviceInfo& dev, void* workspace,
                       size_t ws_bytes, cudaStream_t stream, char* err, size_t err_len) {
  const GwgConfig& c = kGwg[wgmma_config];
  if (workspace == nullptr || ws_bytes < grouped_wgmma_workspace(p)) {
    set_msg(err, err_len, "sm90 grouped: workspace smaller than workspace_bytes() asked for");
    return false;
  }
  const bool bf16 = p.a_type == AType::kBFloat16, a4 = p.a_type == AType::kE2m1;
  const int sf_atoms_per_row = static_cast<int>(p.k / 64);
  const int weight_rows = tile_rows(c.cons);  // B rows of one tile: 128 or 256
  const int tiles_w = static_cast<int>(ceil_div(p.n, int64_t{weight_rows}));
  LaunchArgs args{};
  GemmParams& gp = args.params;
  // B: [g][n][k/2] bytes, one (K tile, B tile, group) box a stage; rows past N read as zero (the last tile's, where N
  // is not a multiple of the tile's rows), not as the next group's.
  const cuuint64_t b_dims[3] = {static_cast<cuuint64_t>(p.k / 2), static_cast<cuuint64_t>(p.n),
                                static_cast<cuuint64_t>(p.g)};
  const cuuint64_t b_strides[2] = {static_cast<cuuint64_t>(p.ldb), static_cast<cuuint64_t>(p.b_group_bytes)};
  const cuuint32_t b_box[3] = {static_cast<cuuint32_t>(c.kt / 2), static_cast<cuuint32_t>(weight_rows), 1};  // <= 256
  if (!encode_map(&gp.tmap_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, p.b, b_dims, b_strides, b_box,
                  c.kt == 128 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B)) {
    set_msg(err, err_len, "sm90 grouped: cuTensorMapEncodeTiled failed for B");
    return false;
  }
  // B's scales as rows of 256 bytes (half an atom), the groups' blocked scales one after another, each N rows padded to
  // 128 (whatever the tile; a 256-row tile loads one box per 128-row block, gemm_kernel's load_b).
  gp.sf_group_rows = static_cast<int>(ceil_div(p.n, kSfAtomRows)) * sf_atoms_per_row * 2;
  if (!encode_2d(&gp.tmap_sf, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.sfb, 256,
                 static_cast<uint64_t>(p.g) * static_cast<uint64_t>(gp.sf_group_rows), 256, 256, static_cast<uint32_t>(2 * c.kt / 64),
                 CU_TENSOR_MAP_SWIZZLE_NONE)) {
    set_msg(err, err_len, "sm90 grouped: cuTensorMapEncodeTiled failed for B's scales");
    return false;
  }
  auto* a_order = static_cast<uint16_t*>(workspace);
  if (!encode_2d(&gp.tmap_a, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, a_order,
                 static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.t), static_cast<uint64_t>(p.k * 2), 64,
                 static_cast<uint32_t>(c.tokens), CU_TENSOR_MAP_SWIZZLE_128B)) {
    set_msg(err, err_len, "sm90 grouped: cuTensorMapEncodeTiled failed for A in the kernel's order");
    return false;
  }
  // A is re-read by every B-row tile of its token tile (EVICT_LAST); B by every token tile of its group.
  constexpr uint64_t kEvictNormal = 0x1000000000000000ull, kEvictLast = 0x14F0000000000000ull;
  gp.sfb = p.sfb;
  gp.hint_a = kEvictLast;
  gp.hint_b = kEvictNormal;
  gp.alpha = p.alpha;  // [g] in the grouped form
  gp.c = p.c;
  gp.ldc = p.ldc;
  gp.m = static_cast<int>(p.t);
  gp.n = static_cast<int>(p.n);
  gp.k = static_cast<int>(p.k);
  gp.sf_atoms_per_row = sf_atoms_per_row;
  gp.ktiles = static_cast<int>(p.k / c.kt);
  gp.tiles_w = tiles_w;
  gp.grid = dev.num_sms;  // one wave of whole tiles (one CTA per SM)
  gp.cluster = 1;
  gp.cluster_groups = 1;
  // Powers of two folded into the decodes (as in the dense run, backend.cu): B's scales x 2^7; NVFP4 A x 2^7 x 2^7
  // (A_dec = e2m1 x e4m3 exactly), 16-bit A taken as it is; the sums carry 2^-7, which the epilogue multiplies back.
  constexpr uint32_t kHalf2Two7 = 0x58005800u;  // fp16x2 {128, 128}
  gp.out_mult = 128.0f;
  gp.out_dtype = p.out_dtype;
  gp.staged_c = 1;  // c is 16-byte aligned and ldc * sizeof(out) a multiple of 16 (common/grouped.h)
  gp.offs = p.offs;
  gp.groups = static_cast<int>(p.g);
  args.stream = stream;
  const int64_t threads = p.t * (p.k / 64) * 8;  // one 16-byte vector a thread
  if (a4) {  // a few waves of CTAs, each scanning offs once
    const int64_t blocks = std::min<int64_t>(ceil_div(threads, int64_t{256}), int64_t{8} * dev.num_sms);
    decode_a_grouped_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        p.a, p.lda, p.sfa, p.sfa_rows, p.offs, static_cast<int>(p.g), static_cast<int>(p.t), static_cast<int>(p.k),
        reinterpret_cast<__half*>(a_order), kHalf2Two7, kHalf2Two7);
  } else {
    order_a16_kernel<<<static_cast<unsigned>(ceil_div(threads, int64_t{256})), 256, 0, stream>>>(
        p.a, p.lda, static_cast<int>(p.t), static_cast<int>(p.k), a_order, static_cast<int>(p.k), nullptr, 0);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    if (err && err_len)
      std::snprintf(err, err_len, "sm90 grouped %s: launching the A prepass failed: %s", c.name, cudaGetErrorString(e));
    return false;
  }
  const cudaError_t e = c.launch[bf16 ? 1 : 0](args);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (err && err_len)
      std::snprintf(err, err_len, "sm90 grouped %s: launch failed (grid %d, %d bytes of shared memory): %s",
                    c.name, gp.grid, smem_bytes(c.tokens, c.kt, c.stages, c.cons),
                    cudaGetErrorString(e));
    return false;
  }
  return true;
}

}  // namespace nvfp4_gemm::sm90
