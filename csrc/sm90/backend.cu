// SM90 backend: the BackendApi table (select / can_run / workspace_bytes / run), the per-problem plan
// (M chunks, split-K), tensor maps, and the A-decode prepass. Torch-free.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/problem.h"
#include "sm90/backend.h"
#include "sm90/configs.h"
#include "sm90/sm90_gemm.cuh"

namespace nvfp4_gemm::sm90 {

#define NVFP4_SM90_EXTERN(T, S) extern template cudaError_t launch_gemm<T, S>(const LaunchArgs&);
NVFP4_SM90_CONFIGS(NVFP4_SM90_EXTERN)
#undef NVFP4_SM90_EXTERN

namespace {

using LaunchFn = cudaError_t (*)(const LaunchArgs&);
#define NVFP4_SM90_LAUNCH(T, S) &launch_gemm<T, S>,
constexpr LaunchFn kLaunch[] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_LAUNCH)};
#undef NVFP4_SM90_LAUNCH
static_assert(sizeof(kLaunch) / sizeof(kLaunch[0]) == kNumConfigs, "one launcher per config");

#define NVFP4_SM90_NAME_ENTRY(T, S) NVFP4_SM90_NAME(T, S),
constexpr const char* kConfigNames[] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_NAME_ENTRY)};
#undef NVFP4_SM90_NAME_ENTRY

// Decoded A lives in the workspace; past this many bytes M is processed in chunks, so the workspace stays
// bounded (the issue's 64 MiB) whatever M is.
constexpr int64_t kMaxADecBytes = 48ll << 20;
constexpr int64_t kMaxPartialBytes = 16ll << 20;

struct Plan {
  int config = -1;
  int tokens = 0;
  int64_t kp = 0;          // K rounded up to 64: the row length of A_dec
  int64_t chunk_rows = 0;  // rows of A per launch
  int tiles_w = 0;
  int ktiles = 0;
  int splits = 1;
  int64_t a_bytes = 0;       // A_dec bytes of one chunk, rounded to 256
  int64_t partial_bytes = 0;
};

int num_sms_of_current_device() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Split-K: pick the split count whose critical path (waves x K tiles per CTA x time of one K tile) plus
// the reduction (one extra launch, partials written and read once) is least. One K tile costs its MMA time
// (128 x tokens x 128 at ~7.2 TFLOP/s per SM) or its bytes at the SM's share of 3 TB/s, whichever is more.
int choose_splits(int tiles, int ktiles, int tokens, int sms) {
  if (const char* env = std::getenv("NVFP4_GEMM_SM90_SPLITS")) {
    const int forced = std::atoi(env);
    if (forced >= 1) return std::min(forced, ktiles);
  }
  const double t_mma = 2.0 * kTileW * tokens * kTileK / 7.2e12;
  const double t_mem = static_cast<double>(stage_bytes(tokens)) / (3.0e12 / sms);
  const double t_tile = std::max(t_mma, t_mem);
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= std::min(ktiles, 32); ++s) {
    const int64_t partial = static_cast<int64_t>(s) * tiles * tokens * kTileW * 4;
    if (s > 1 && partial > kMaxPartialBytes) break;
    const double waves = std::ceil(static_cast<double>(tiles) * s / sms);
    double cost = waves * std::ceil(static_cast<double>(ktiles) / s) * t_tile;
    if (s > 1) cost += 2.5e-6 + 2.0 * partial / 3.0e12;
    if (cost < best_cost * 0.98) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

Plan make_plan(const Problem& p, int config, int sms) {
  Plan pl;
  pl.config = config;
  pl.tokens = kConfigs[config].tokens;
  pl.kp = round_up(p.k, 64);
  const int64_t row_bytes = pl.kp * 2;
  pl.chunk_rows = p.m;
  if (p.m * row_bytes > kMaxADecBytes) pl.chunk_rows = std::max<int64_t>(kMaxADecBytes / row_bytes / pl.tokens, 1) * pl.tokens;
  pl.tiles_w = static_cast<int>(ceil_div(p.n, kTileW));
  pl.ktiles = static_cast<int>(ceil_div(p.k, kTileK));
  const int tiles = pl.tiles_w * static_cast<int>(ceil_div(pl.chunk_rows, pl.tokens));
  pl.splits = choose_splits(tiles, pl.ktiles, pl.tokens, sms);
  pl.a_bytes = round_up(pl.chunk_rows * row_bytes, 256);
  pl.partial_bytes = pl.splits > 1 ? static_cast<int64_t>(pl.splits) * tiles * pl.tokens * kTileW * 4 : 0;
  return pl;
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// Through the runtime's driver entry point, so the module needs no link against libcuda.
EncodeTiledFn encode_tiled() {
  static EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      ptr = nullptr;
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

bool encode_2d(CUtensorMap* map, CUtensorMapDataType dtype, const void* base, uint64_t inner, uint64_t outer,
               uint64_t row_stride_bytes, uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle) {
  EncodeTiledFn fn = encode_tiled();
  if (!fn) return false;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  return fn(map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

void set_msg(char* buf, size_t len, const char* msg) {
  if (buf && len) std::snprintf(buf, len, "%s", msg);
}

int tokens_for_m(int64_t m) {
  if (m <= 8) return 8;
  if (m <= 16) return 16;
  if (m <= 32) return 32;
  if (m <= 64) return 64;
  if (m <= 128) return 128;
  return 256;
}

bool supports_sm(int32_t sm) { return sm == 90; }

bool can_run(const Problem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len) {
  if (config < 0 || config >= kNumConfigs) {
    set_msg(why, why_len, "sm90: config index out of range");
    return false;
  }
  if (dev && dev->sm != 90) {
    if (why && why_len)
      std::snprintf(why, why_len, "sm90 kernels are built for sm_90a (wgmma, setmaxnreg); this device is sm_%d",
                    static_cast<int>(dev->sm));
    return false;
  }
  const int smem = smem_bytes(kConfigs[config].tokens, kConfigs[config].stages);
  if (dev && dev->smem_optin < smem) {
    if (why && why_len)
      std::snprintf(why, why_len, "%s needs %d bytes of shared memory per block, the device allows %lld",
                    kConfigs[config].name, smem, static_cast<long long>(dev->smem_optin));
    return false;
  }
  if (round_up(p->k, 64) * 2 * kConfigs[config].tokens > kMaxADecBytes) {
    if (why && why_len)
      std::snprintf(why, why_len, "sm90: K = %lld too large for the bounded decode workspace",
                    static_cast<long long>(p->k));
    return false;
  }
  if (p->n > (int64_t{1} << 31) || p->m > (int64_t{1} << 31)) {
    set_msg(why, why_len, "sm90: M and N must be below 2^31");
    return false;
  }
  return true;
}

int32_t select(const Problem* p, const DeviceInfo* dev, char* why, size_t why_len) {
  const int tokens = tokens_for_m(p->m);
  for (int i = 0; i < kNumConfigs; ++i) {
    if (kConfigs[i].tokens != tokens) continue;
    if (!can_run(p, i, dev, why, why_len)) return -1;
    return i;
  }
  set_msg(why, why_len, "sm90: no config for this M (unreachable)");
  return -1;
}

size_t workspace_bytes(const Problem* p, int32_t config, const DeviceInfo* dev) {
  const int sms = dev && dev->num_sms > 0 ? dev->num_sms : num_sms_of_current_device();
  const Plan pl = make_plan(*p, config, sms);
  return static_cast<size_t>(pl.a_bytes + pl.partial_bytes);
}

bool run(const Problem* p, int32_t config, void* workspace, size_t ws_bytes, cudaStream_t stream, char* err,
         size_t err_len) {
  if (config < 0 || config >= kNumConfigs) {
    set_msg(err, err_len, "sm90: config index out of range");
    return false;
  }
  const Plan pl = make_plan(*p, config, num_sms_of_current_device());
  if (ws_bytes < static_cast<size_t>(pl.a_bytes + pl.partial_bytes) || workspace == nullptr) {
    set_msg(err, err_len, "sm90: workspace smaller than workspace_bytes() asked for");
    return false;
  }
  auto* a_dec = static_cast<__half*>(workspace);
  float* partial = pl.partial_bytes ? reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + pl.a_bytes) : nullptr;
  const int64_t out_elem = p->out_dtype == OutDtype::kFloat32 ? 4 : 2;
  const int sf_atoms_per_row = static_cast<int>(ceil_div(p->k / kSfVecSize, kSfAtomCols));

  LaunchArgs args{};
  GemmParams& gp = args.params;
  if (!encode_2d(&gp.tmap_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, p->b, static_cast<uint64_t>(p->k / 2),
                 static_cast<uint64_t>(p->n), static_cast<uint64_t>(p->ldb), 64, kTileW, CU_TENSOR_MAP_SWIZZLE_64B)) {
    set_msg(err, err_len, "sm90: cuTensorMapEncodeTiled failed for B");
    return false;
  }
  gp.sfb = p->sfb;
  gp.alpha = p->alpha;
  gp.partial = partial;
  gp.ldc = p->ldc;
  gp.n = static_cast<int>(p->n);
  gp.k = static_cast<int>(p->k);
  gp.sf_atoms_per_row = sf_atoms_per_row;
  gp.ktiles = pl.ktiles;
  gp.splits = pl.splits;
  gp.out_dtype = p->out_dtype;
  args.tiles_w = pl.tiles_w;
  args.stream = stream;

  for (int64_t r0 = 0; r0 < p->m; r0 += pl.chunk_rows) {
    const int64_t rows = std::min(pl.chunk_rows, p->m - r0);
    const int64_t threads = rows * (pl.kp / 64);
    decode_a_kernel<<<static_cast<unsigned>(ceil_div(threads, 256)), 256, 0, stream>>>(
        p->a + r0 * p->lda, p->lda, p->sfa, static_cast<int>(r0), static_cast<int>(rows), static_cast<int>(p->k),
        sf_atoms_per_row, a_dec, static_cast<int>(pl.kp));
    if (!encode_2d(&gp.tmap_a, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, a_dec, static_cast<uint64_t>(pl.kp),
                   static_cast<uint64_t>(rows), static_cast<uint64_t>(pl.kp * 2), 64,
                   static_cast<uint32_t>(pl.tokens), CU_TENSOR_MAP_SWIZZLE_128B)) {
      set_msg(err, err_len, "sm90: cuTensorMapEncodeTiled failed for decoded A");
      return false;
    }
    gp.c = static_cast<uint8_t*>(p->c) + r0 * p->ldc * out_elem;
    gp.m = static_cast<int>(rows);
    args.tiles_t = static_cast<int>(ceil_div(rows, pl.tokens));
    const cudaError_t e = kLaunch[config](args);
    if (e != cudaSuccess) {
      if (err && err_len) std::snprintf(err, err_len, "sm90 %s: %s", kConfigs[config].name, cudaGetErrorString(e));
      return false;
    }
  }
  return true;
}

}  // namespace

__global__ void __launch_bounds__(256) decode_a_kernel(const uint8_t* __restrict__ a, int64_t lda,
                                                       const uint8_t* __restrict__ sfa, int row_begin, int rows,
                                                       int k, int sf_atoms_per_row, __half* __restrict__ out,
                                                       int kp) {
  const int kblocks = kp / 64;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= static_cast<int64_t>(rows) * kblocks) return;
  const int r = static_cast<int>(idx / kblocks), kb = static_cast<int>(idx % kblocks);
  const uint8_t* src = a + static_cast<int64_t>(r) * lda + kb * 32;
  const uint4 lo = *reinterpret_cast<const uint4*>(src);  // K % 32 == 0: the first 32 K always exist
  const uint4 hi = (kb * 64 + 64 <= k) ? *reinterpret_cast<const uint4*>(src + 16) : make_uint4(0, 0, 0, 0);
  const int rg = row_begin + r;
  const uint32_t sw = *reinterpret_cast<const uint32_t*>(
      sfa + ((static_cast<int64_t>(rg) / kSfAtomRows) * sf_atoms_per_row + kb) * kSfAtomBytes + (rg % 32) * 16 +
      ((rg % kSfAtomRows) / 32) * 4);
  const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  float sc[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>((sw >> (8 * i)) & 0xFF), __NV_E4M3);
    sc[i] = __half2float(__half(h));
  }
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(r) * kp + kb * 64);
#pragma unroll
  for (int v = 0; v < 8; ++v) {  // 8 output vectors of 8 fp16
    uint32_t packed[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      __half pair[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int pos = v * 8 + h * 2 + x;
        const int e = permuted_k(pos / 16, pos % 16);
        const uint32_t code = (words[e / 8] >> (4 * (e % 8))) & 0xF;
        const uint32_t ex = (code >> 1) & 3, mb = code & 1;
        const float mag = (ex == 0 ? 0.5f * mb : (1.0f + 0.5f * mb) * static_cast<float>(1u << (ex - 1))) *
                          sc[e / 16];  // exact: 2 x 4 significant bits
        pair[x] = __float2half_rn((code & 8) ? -mag : mag);
      }
      packed[h] = static_cast<uint32_t>(__half_as_ushort(pair[0])) |
                  (static_cast<uint32_t>(__half_as_ushort(pair[1])) << 16);
    }
    dst[v] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

const BackendApi& backend_api() {
  static const BackendApi api = {
      kBackendAbiVersion, "sm90", "sm_90a", kNumConfigs, kConfigNames, &supports_sm, &select, &can_run,
      &workspace_bytes,   &run,
  };
  return api;
}

}  // namespace nvfp4_gemm::sm90
