// SM90 backend: the BackendApi table (select / can_run / workspace_bytes / run), the per-problem plan
// (M chunks, split-K), tensor maps, and the A-decode prepass. Torch-free.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/pdl.h"
#include "common/problem.h"
#include "common/stream_slots.h"
#include "quant/input_scales.h"
#include "sm90/backend.h"
#include "sm90/configs.h"
#include "sm90/sm90_gemm.cuh"
#include "sm90/quant_a.cuh"
#include "sm90/sm90_small_m.cuh"
#include "sm90/sm90_wk.cuh"
#include "sm90/split_plan.h"
#include "sm90/tensor_map.h"

namespace nvfp4_gemm::sm90 {

// Each config is compiled once per A type it serves (generate.py writes one file per pair): the wgmma
// kernel for fp16 MMA (W4A4, whose A the prepass decodes to fp16, and fp16 activations) and bf16 MMA (bf16
// activations); the small-M kernel for e2m1, fp16 and bf16 A (it stages A itself).
#define NVFP4_SM90_EXTERN(T, KT, S, B, C)                                                            \
  extern template cudaError_t launch_gemm<T, KT, S, B, Elem::kHalf, false, C>(const LaunchArgs&); \
  extern template cudaError_t launch_gemm<T, KT, S, B, Elem::kBf16, false, C>(const LaunchArgs&); \
  extern template int max_active_clusters<T, KT, S, B, Elem::kHalf, C>(int);                     \
  extern template int max_active_clusters<T, KT, S, B, Elem::kBf16, C>(int);
NVFP4_SM90_CONFIGS(NVFP4_SM90_EXTERN)
#undef NVFP4_SM90_EXTERN
#define NVFP4_SM90_SMALL_M_EXTERN(T, KB, D, B, R)                                                        \
  extern template cudaError_t launch_small_m<T, KB, D, B, R, AType::kE2m1>(const SmallMLaunch&);    \
  extern template cudaError_t launch_small_m<T, KB, D, B, R, AType::kFloat16>(const SmallMLaunch&); \
  extern template cudaError_t launch_small_m<T, KB, D, B, R, AType::kBFloat16>(const SmallMLaunch&);
NVFP4_SM90_SMALL_M_CONFIGS(NVFP4_SM90_SMALL_M_EXTERN)
#undef NVFP4_SM90_SMALL_M_EXTERN
#define NVFP4_SM90_WK_EXTERN(T, S, B)                                                         \
  extern template cudaError_t launch_wk<T, S, B, AType::kE2m1>(const WkLaunch&);    \
  extern template cudaError_t launch_wk<T, S, B, AType::kFloat16>(const WkLaunch&); \
  extern template cudaError_t launch_wk<T, S, B, AType::kBFloat16>(const WkLaunch&);
NVFP4_SM90_WK_CONFIGS(NVFP4_SM90_WK_EXTERN)
#undef NVFP4_SM90_WK_EXTERN

namespace {

// Launchers by config index (the wgmma entries, then the small-M ones: the kConfigs order) and A type.
using LaunchFn = cudaError_t (*)(const LaunchArgs&);
#define NVFP4_SM90_LAUNCH(T, KT, S, B, C) \
  {&launch_gemm<T, KT, S, B, Elem::kHalf, false, C>, &launch_gemm<T, KT, S, B, Elem::kBf16, false, C>},
constexpr LaunchFn kLaunch[][2] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_LAUNCH)};
#undef NVFP4_SM90_LAUNCH
constexpr int kNumWgmma = sizeof(kLaunch) / sizeof(kLaunch[0]);
using ClusterCapFn = int (*)(int);
#define NVFP4_SM90_CLUSTER_CAP(T, KT, S, B, C) \
  {&max_active_clusters<T, KT, S, B, Elem::kHalf, C>, &max_active_clusters<T, KT, S, B, Elem::kBf16, C>},
constexpr ClusterCapFn kClusterCap[][2] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_CLUSTER_CAP)};
#undef NVFP4_SM90_CLUSTER_CAP
using SmallMLaunchFn = cudaError_t (*)(const SmallMLaunch&);
#define NVFP4_SM90_SMALL_M_LAUNCH(T, KB, D, B, R)                                                         \
  {&launch_small_m<T, KB, D, B, R, AType::kE2m1>, &launch_small_m<T, KB, D, B, R, AType::kFloat16>, \
   &launch_small_m<T, KB, D, B, R, AType::kBFloat16>},
constexpr SmallMLaunchFn kSmallMLaunch[][3] = {NVFP4_SM90_SMALL_M_CONFIGS(NVFP4_SM90_SMALL_M_LAUNCH)};
#undef NVFP4_SM90_SMALL_M_LAUNCH
constexpr int kNumSmallM = sizeof(kSmallMLaunch) / sizeof(kSmallMLaunch[0]);
using WkLaunchFn = cudaError_t (*)(const WkLaunch&);
#define NVFP4_SM90_WK_LAUNCH(T, S, B) \
  {&launch_wk<T, S, B, AType::kE2m1>, &launch_wk<T, S, B, AType::kFloat16>, &launch_wk<T, S, B, AType::kBFloat16>},
constexpr WkLaunchFn kWkLaunch[][3] = {NVFP4_SM90_WK_CONFIGS(NVFP4_SM90_WK_LAUNCH)};
#undef NVFP4_SM90_WK_LAUNCH
static_assert(kNumWgmma + kNumSmallM + sizeof(kWkLaunch) / sizeof(kWkLaunch[0]) == kNumConfigs,
              "one launcher per config");
static_assert(static_cast<int>(AType::kE2m1) == 0 && static_cast<int>(AType::kFloat16) == 1 &&
                  static_cast<int>(AType::kBFloat16) == 2,
              "kSmallMLaunch's and kWkLaunch's columns are AType values");

// 16-bit activations multiplied as they are (the weight-only form); float A quantized on the fly is NVFP4.
bool is_a16(const Problem& p) {
  return !quantizes_a(p) && (p.a_type == AType::kFloat16 || p.a_type == AType::kBFloat16);
}

// Whether the wgmma kernel multiplies in bf16 (bf16 activations); otherwise fp16 (NVFP4 A decodes to fp16).
bool mma_bf16(const Problem& p) { return is_a16(p) && p.a_type == AType::kBFloat16; }

// BackendApi::config_names: the table's names, in config-index order.
const char* const* config_names() {
  static const char* const* names = [] {
    static const char* list[kNumConfigs];
    for (int i = 0; i < kNumConfigs; ++i) list[i] = kConfigs[i].name;
    return list;
  }();
  return names;
}

// Decoded A lives in the workspace; past this many bytes M is processed in chunks, so the workspace stays
// bounded whatever M is.
constexpr int64_t kMaxADecBytes = 40ll << 20;
// The small-M and K-sliced kernels' split partials (<= 64 MiB).
constexpr int64_t kMaxWorkspaceBytes = 63ll << 20;
// The wgmma kernel's decoded A + split partials + counters (<= 128 MiB): room for one wave of 256-token partials
// (132 CTAs x 2 x 128 KiB = 33 MiB) beside a full 40 MiB of decoded A, so that large M x K runs the one-wave split
// instead of waves of whole tiles.
constexpr int64_t kMaxWgmmaWorkspaceBytes = 127ll << 20;

struct Plan {
  int config = -1;
  int tokens = 0;
  int64_t kp = 0;          // K rounded up to 64: the row length of A_dec
  int64_t chunk_rows = 0;  // rows of A per launch
  int rows = 0;            // B rows a tile (KernelConfig::rows)
  int tiles_w = 0;
  int kt = 0;
  int ktiles = 0;
  int64_t a_bytes = 0;       // A_dec bytes of one chunk, rounded to 256
  int64_t partial_bytes = 0;
  int64_t counter_bytes = 0;
  int64_t dyn_bytes = 0;     // dynamic scales: three zeroed words of grid-reduction state where no slot is free
  int64_t bytes() const { return a_bytes + partial_bytes + counter_bytes + dyn_bytes; }
};

// A failed runtime call's error, also taken out of the thread's last-error slot, so that the next launch
// checked with cudaGetLastError (ours or anyone's) does not report it again.
cudaError_t consumed(cudaError_t e) {
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}

// The device's SM count, from the DeviceInfo the binding layer fills once per device.
int sms_of(const DeviceInfo* dev) { return dev->num_sms; }

// The cost model's time of one K tile of one CTA of `rows` B rows: its MMA time at `rate` FLOP/s a SM or the bytes of
// its stage with `staged_tokens` rows of A at the SM's share of 3 TB/s, whichever is more. The split planner takes
// ~5 TFLOP/s for every config (measured: 0.83 us for 128 tokens over 128 rows) and the whole stage; select's model
// (modeled_seconds) each config's fitted rate and B's bytes only (A is re-read from L2).
double k_tile_seconds(int tokens, int kt, int rows, int sms, double rate = 5.0e12, int staged_tokens = -1) {
  const double t_mma = 2.0 * rows * tokens * kt / rate;
  const int a_rows = staged_tokens < 0 ? tokens : staged_tokens;
  const double t_mem = static_cast<double>(stage_bytes(a_rows, kt, rows / 64)) / (3.0e12 / sms);
  return std::max(t_mma, t_mem);
}

int tiles_of(const Plan& pl, int64_t rows) { return pl.tiles_w * static_cast<int>(ceil_div(rows, pl.tokens)); }

// The split planner's inputs for one chunk of `tiles` tiles (split_plan.h).
SplitInputs split_inputs(const Problem& p, const Plan& pl, int tiles, int config, int sms) {
  SplitInputs in;
  in.tiles = tiles;
  in.ktiles = pl.ktiles;
  in.sms = sms * kConfigs[config].ctas_per_sm;
  in.t_tile = k_tile_seconds(pl.tokens, pl.kt, pl.rows, in.sms);
  in.tile_bytes = static_cast<int64_t>(pl.tokens) * pl.rows * 4;
  in.workspace_left = kMaxWgmmaWorkspaceBytes - pl.a_bytes;
  in.forced = p.forced_splits;
  in.clusters = config < kNumWgmma && kConfigs[config].ctas_per_sm == 1;
  return in;
}

// split_plan.h's choice with this device's cluster capacity (max_active_clusters).
Split plan_split(const SplitInputs& in, int config, bool bf16, double* cost = nullptr) {
  return choose_split(in, [&](int size) { return kClusterCap[config][bf16 ? 1 : 0](size); }, cost);
}

// The most rows of A one launch takes: all of M, or as many whole token tiles as keep decoded A within
// kMaxADecBytes.
int64_t max_chunk_rows(const Problem& p, int config) {
  const int64_t row_bytes = round_up(p.k, 64) * 2, tokens = kConfigs[config].tokens;
  return p.m * row_bytes > kMaxADecBytes ? std::max<int64_t>(kMaxADecBytes / row_bytes / tokens, 1) * tokens : p.m;
}

Plan make_plan(const Problem& p, int config, int sms) {
  Plan pl;
  pl.config = config;
  pl.tokens = kConfigs[config].tokens;
  pl.kp = round_up(p.k, 64);
  const int64_t row_bytes = pl.kp * 2;
  pl.rows = kConfigs[config].rows;
  pl.tiles_w = static_cast<int>(ceil_div(p.n, pl.rows));
  pl.kt = kConfigs[config].kt;
  pl.ktiles = static_cast<int>(ceil_div(p.k, pl.kt));
  pl.chunk_rows = max_chunk_rows(p, config);
  if (pl.chunk_rows < p.m) {  // several launches: as many token tiles each as cost the least in all
    const int total = static_cast<int>(ceil_div(p.m, pl.tokens));
    const int most = static_cast<int>(pl.chunk_rows / pl.tokens);
    const bool bf16 = mma_bf16(p);
    const int c = chunk_token_tiles(total, most, [&](int tiles, int chunk) {
      Plan sized = pl;
      sized.a_bytes = round_up(int64_t{chunk} * pl.tokens * row_bytes, 256);
      double cost = 0.0;
      plan_split(split_inputs(p, sized, pl.tiles_w * tiles, config, sms), config, bf16, &cost);
      return cost;
    });
    pl.chunk_rows = int64_t{c} * pl.tokens;
  }
  // Whole token tiles of decoded A, so that no TMA box of A reaches past its rows (a partial token tile's
  // out-of-bounds rows, zero-filled by the TMA unit, cost up to 2x the whole tile's time: docs/NOTES.md
  // section 10). The rows past M are never written: each output row reads only its own A row, and rows past M
  // are not stored.
  pl.a_bytes = round_up(round_up(pl.chunk_rows, pl.tokens) * row_bytes, 256);
  if (dynamic_a(p)) pl.dyn_bytes = 256;
  // The first and the last chunk are the only two sizes; size the split buffers for the larger need.
  for (int64_t rows : {pl.chunk_rows, p.m - (ceil_div(p.m, pl.chunk_rows) - 1) * pl.chunk_rows}) {
    const int tiles = tiles_of(pl, rows);
    const SplitInputs in = split_inputs(p, pl, tiles, config, sms);
    const Split sp = plan_split(in, config, mma_bf16(p));
    pl.partial_bytes = std::max(pl.partial_bytes, split_partial_bytes(in, sp));
    pl.counter_bytes = std::max(pl.counter_bytes, round_up(split_counters(in, sp) * 4, 256));
  }
  return pl;
}

#ifdef NVFP4_GEMM_DIAGNOSTICS
// Timeline trace (diagnostics builds only): NVFP4_GEMM_SM90_TRACE=<file> appends each wgmma launch's
// timeline (sm90_gemm.cuh, trace_at) to <file>, read per call so that benchmarks/diagnostics/sm90_trace.py
// can switch it per shape. It synchronizes the stream after every launch.
constexpr int kTraceMaxCtas = 8192;
constexpr int kTraceMaxDevices = 64;

// The current device's trace buffer (allocated on first use), or nullptr when tracing is off.
uint64_t* trace_buffer_for_launch(int grid, cudaStream_t stream) {
  const char* file = std::getenv("NVFP4_GEMM_SM90_TRACE");
  int dev = 0;
  if (!file || !*file || grid > kTraceMaxCtas || cudaGetDevice(&dev) != cudaSuccess || dev >= kTraceMaxDevices)
    return nullptr;
  static std::mutex mutex;
  static uint64_t* bufs[kTraceMaxDevices] = {};
  std::lock_guard<std::mutex> lock(mutex);
  if (!bufs[dev] && consumed(cudaMalloc(&bufs[dev], sizeof(uint64_t) * (kTraceHeader + kTraceMaxCtas * kTraceSlots))))
    bufs[dev] = nullptr;
  if (bufs[dev])
    cudaMemsetAsync(bufs[dev], 0, sizeof(uint64_t) * (kTraceHeader + static_cast<size_t>(grid) * kTraceSlots), stream);
  return bufs[dev];
}

// One launch's timeline as text: a header line ("launch <config> <fields>"), then one line of kTraceSlots
// numbers per CTA.
void write_trace(const uint64_t* trace, int grid, const char* header, cudaStream_t stream) {
  const char* file = std::getenv("NVFP4_GEMM_SM90_TRACE");
  if (!file || !*file) return;
  const size_t n = kTraceHeader + static_cast<size_t>(grid) * kTraceSlots;
  uint64_t* host = static_cast<uint64_t*>(std::malloc(n * sizeof(uint64_t)));
  FILE* f = std::fopen(file, "a");
  if (host && f && cudaStreamSynchronize(stream) == cudaSuccess &&
      cudaMemcpy(host, trace, n * sizeof(uint64_t), cudaMemcpyDeviceToHost) == cudaSuccess) {
    std::fprintf(f, "launch %s prepass=%llu,%llu\n", header, static_cast<unsigned long long>(host[0]),
                 static_cast<unsigned long long>(host[1]));
    for (int c = 0; c < grid; ++c) {
      for (int i = 0; i < kTraceSlots; ++i)
        std::fprintf(f, i ? " %llu" : "%llu", static_cast<unsigned long long>(host[kTraceHeader + c * kTraceSlots + i]));
      std::fprintf(f, "\n");
    }
  }
  if (f) std::fclose(f);
  std::free(host);
}

void write_trace(const GemmParams& gp, const char* config, cudaStream_t stream) {
  char header[256];
  std::snprintf(header, sizeof(header), "%s m=%d n=%d k=%d grid=%d tiles=%d ktiles=%d", config, gp.m, gp.n, gp.k,
                gp.grid, gp.tiles, gp.ktiles);
  write_trace(gp.trace, gp.grid, header, stream);
}
#endif  // NVFP4_GEMM_DIAGNOSTICS

// Zeroes the small-M kernel's split counters. Launched as a programmatic dependent of the kernel ahead of
// it (sm90_small_m.cuh, PDL note): it waits for that kernel (whose workspace may be these very bytes), then
// lets the GEMM launch, which waits for this grid only right before it counts its first arrival.
__global__ void zero_counters_kernel(uint32_t* counters, int n) {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  for (int i = threadIdx.x; i < n; i += blockDim.x) counters[i] = 0;
}

// The split-counter slot of this stream (split_counters.cuh), or -1: none free, or more row blocks than a slot
// holds; the launch then counts on workspace counters behind a reset launch.
int split_counter_slot(int row_blocks, cudaStream_t stream) {
  static StreamSlots* slots = new StreamSlots(kSplitCounterSlots);  // never destroyed: launches may come at exit
  if (row_blocks > kSplitCounterRows) return -1;
  int index = -1;
  if (slots->get(stream, &index) != cudaSuccess) {
    cudaGetLastError();  // the stream query failed: the workspace path is always right
    return -1;
  }
  return index;
}

cudaError_t launch_zero_counters(uint32_t* counters, int n, cudaStream_t stream) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(dim3(1), dim3(256), 0, stream, /*pdl=*/true, attr);
  return cudaLaunchKernelEx(&cfg, zero_counters_kernel, counters, n);
}

// Whether the workspace the binding allocated holds the plan's `bytes` (workspace_bytes()).
bool workspace_ok(int64_t bytes, const void* workspace, size_t ws_bytes, char* err, size_t err_len) {
  if (ws_bytes >= static_cast<size_t>(bytes) && (bytes == 0 || workspace != nullptr)) return true;
  set_msg(err, err_len, "sm90: workspace smaller than workspace_bytes() asked for");
  return false;
}

// Small-M kernel plan: 128-row blocks of B x K splits of kb blocks of 256 K; M in launches of TOKENS rows.
struct SmallMPlan {
  int row_blocks = 0, kblocks = 0, kb = 0, splits = 0, smem = 0;
  bool cluster = false;
  int64_t partial_bytes = 0, counter_bytes = 0;
};

SmallMPlan make_small_m_plan(const Problem& p, int config, int sms) {
  const KernelConfig& c = kConfigs[config];
  SmallMPlan pl;
  pl.row_blocks = static_cast<int>(ceil_div(p.n, kSmallRows));
  pl.kblocks = static_cast<int>(ceil_div(p.k, kSmallKBlock));
  const int64_t slot_bytes = int64_t{kSmallRows} * c.tokens * 4;  // one CTA's fp32 partial tile
  // One wave of ctas_per_sm CTAs per SM (the launch bound) where N allows: as many K splits as fit next to
  // the row blocks, so every CTA streams a long K range (a CTA's fixed costs, the A decode and the split
  // fix-up, are paid once per CTA) and none waits behind another wave's tail. KBMAX caps the K blocks per
  // CTA at what keeps decoded A small enough for that many CTAs per SM; a launch stages only its live tokens
  // (whole n-tiles), so fewer tokens than the config's allow proportionally more K blocks.
  // The ring variant stages exactly the launch's tokens, the register variant whole n-tiles of 8.
  const int live = c.ring > 0 ? static_cast<int>(std::min<int64_t>(p.m, c.tokens))
                              : small_m_live_tokens(c.tokens, std::min<int64_t>(p.m, c.tokens));
  const int64_t splits_fit = std::max<int64_t>(1, static_cast<int64_t>(c.ctas_per_sm) * sms / pl.row_blocks);
  int64_t kb = std::clamp<int64_t>(ceil_div(pl.kblocks, splits_fit), 1, int64_t{c.kt} * c.tokens / live);
  if (p.forced_splits > 0) kb = ceil_div(pl.kblocks, p.forced_splits);  // tests
  // Decoded A for kb blocks (and the B ring) must fit in shared memory: a forced split count is a request,
  // not a promise.
  const int ring_bytes = small_m_ring_bytes(c.ring);
  kb = std::min<int64_t>(
      {kb, pl.kblocks, std::max(1, (kSmallMMaxSmem - ring_bytes) / small_m_smem_bytes(live, 1))});
  int64_t splits = ceil_div(pl.kblocks, kb);
  const int64_t counters = round_up(static_cast<int64_t>(pl.row_blocks) * 4, 256);
  const int64_t max_splits = std::max<int64_t>(1, (kMaxWorkspaceBytes - counters) / (pl.row_blocks * slot_bytes));
  splits = std::min(splits, max_splits);
  kb = ceil_div(pl.kblocks, splits);  // spread evenly: the last split is at most one block short
  splits = ceil_div(pl.kblocks, kb);
  pl.kb = static_cast<int>(kb);
  pl.splits = static_cast<int>(splits);
  pl.smem = static_cast<int>(
      std::min<int64_t>(int64_t{small_m_smem_bytes(live, 1)} * kb + ring_bytes, int64_t{1} << 30));
  // A cluster's CTAs are placed together: measured faster than the workspace only for a few splits in one
  // wave ((16, 6144, 4096): 4 splits, 192 CTAs, 14.4-14.6 vs 15.7 us); 3 splits over 2.5 waves lost
  // ((16, 28672, 4096): 53.8 vs 48.6 us), as did 8 splits in one wave (docs/NOTES.md).
  pl.cluster = c.ring > 0 && splits > 1 && splits <= kMaxClusterSplits &&
               static_cast<int64_t>(pl.row_blocks) * splits <= static_cast<int64_t>(c.ctas_per_sm) * sms;
  if (splits > 1 && !pl.cluster) {  // a cluster reduces through distributed shared memory: no workspace
    pl.partial_bytes = round_up(static_cast<int64_t>(pl.row_blocks) * splits * slot_bytes, 256);
    pl.counter_bytes = counters;
  }
  return pl;
}

bool run_small_m(const Problem* p, int32_t config, const DeviceInfo* dev, void* workspace, size_t ws_bytes,
                 cudaStream_t stream, char* err, size_t err_len) {
  const KernelConfig& c = kConfigs[config];
  const SmallMPlan pl = make_small_m_plan(*p, config, sms_of(dev));
  if (!workspace_ok(pl.partial_bytes + pl.counter_bytes, workspace, ws_bytes, err, err_len)) return false;
  SmallMLaunch l{};
  SmallMParams& sp = l.params;
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  sp.b = p->b;
  sp.sfa = p->sfa;
  sp.sfb = p->sfb;
  sp.alpha = p->alpha;
  sp.alpha2 = p->alpha2;
  sp.a_scale = quantizes_a(*p) ? p->a_scale : nullptr;
  sp.a_scale_is_decode = p->a_scale_is_decode;
  sp.x_type = p->a_type;
  sp.partial = pl.partial_bytes ? reinterpret_cast<float4*>(ws) : nullptr;
  sp.counters = pl.partial_bytes ? reinterpret_cast<uint32_t*>(ws + pl.partial_bytes) : nullptr;
  sp.lda = p->lda;
  sp.ldb = p->ldb;
  sp.ldc = p->ldc;
  sp.n = static_cast<int>(p->n);
  sp.k = static_cast<int>(p->k);
  sp.sf_atoms = static_cast<int>(ceil_div(p->k / kSfVecSize, kSfAtomCols));
  sp.kblocks = pl.kblocks;
  sp.kb_per_cta = pl.kb;
  sp.splits = pl.splits;
  sp.cluster = pl.cluster;
  // The ring configs count on a slot's counters (no reset launch): measured (H100, graph per call, same run,
  // docs/NOTES.md) 1.1-1.3 us faster per split call at (16, 1024 / 4096, 4096). The register configs keep the
  // reset launch ahead: their M = 1 calls measured 0.2-0.8 us slower on a slot ((1, 4096, 4096) 11.27 vs 10.47).
  sp.counter_slot = pl.partial_bytes && c.ring > 0 ? split_counter_slot(pl.row_blocks, stream) : -1;
  sp.out_mult = 128.0f;  // B decoded with 2^7 folded into its scales, A exact (sm90_small_m.cuh)
  sp.out_dtype = p->out_dtype;
  l.row_blocks = pl.row_blocks;
  l.smem = pl.smem;
  l.stream = stream;
  const int64_t out_elem = p->out_dtype == OutDtype::kFloat32 ? 4 : 2;
  // Rows of A beyond TOKENS (a forced config at larger M) run as further launches of TOKENS rows each.
  for (int64_t r0 = 0; r0 < p->m; r0 += c.tokens) {
    sp.a = p->a + r0 * p->lda;
    sp.c = static_cast<uint8_t*>(p->c) + r0 * p->ldc * out_elem;
    sp.sfa_row0 = static_cast<int>(r0);
    sp.m = static_cast<int>(std::min<int64_t>(c.tokens, p->m - r0));
    if (sp.splits > 1 && !sp.cluster && sp.counter_slot < 0) {  // the kernel overlaps this one (PDL), sm90_small_m.cuh
      if (const cudaError_t z = consumed(launch_zero_counters(sp.counters, pl.row_blocks, stream)); z != cudaSuccess) {
        if (err && err_len)
          std::snprintf(err, err_len, "sm90 %s: launching the split-counter reset failed: %s", c.name,
                        cudaGetErrorString(z));
        return false;
      }
    }
    // Quantize-on-the-fly runs in the e2m1 instantiation (its A is NVFP4 once staged).
    const int a_col = quantizes_a(*p) ? 0 : static_cast<int>(p->a_type);
    if (const cudaError_t e = consumed(kSmallMLaunch[config - kNumWgmma][a_col](l));
        e != cudaSuccess) {
      if (err && err_len)
        std::snprintf(err, err_len, "sm90 %s: launch failed (grid %d x %d, %d bytes of shared memory): %s", c.name,
                      l.row_blocks, sp.splits, l.smem, cudaGetErrorString(e));
      return false;
    }
  }
  return true;
}

// Stages of B the K-sliced kernel loads before its grid dependency wait where the kernel ahead is the call's own
// quantization of A: the first two, the rest of the pipeline after the first stage has landed (the weight-only
// order). Measured (bench_model 8B, H100): static W4A4 0.45 / 0.52 of fp16 at M = 1 / 16 with two, 0.46 / 0.52
// with one, 0.47 / 0.57 with the whole pipeline, whose requests queue ahead of A's.
constexpr int kWkEarlyBStages = 2;

// K-sliced kernel plan: 128-row blocks of B x K splits of kb stages of 256 K; M in launches of TOKENS rows.

struct WkPlan {
  int row_blocks = 0, kblocks = 0, kb = 0, splits = 0;
  int64_t partial_bytes = 0, counter_bytes = 0;
  int64_t qa_bytes = 0, qsf_bytes = 0;  // float A quantized on the fly: its packed rows and its scale atoms
  int64_t dyn_bytes = 0;  // dynamic scales: three zeroed words of grid-reduction state where no slot is free
  int64_t bytes() const { return partial_bytes + counter_bytes + qa_bytes + qsf_bytes + dyn_bytes; }
};

WkPlan make_wk_plan(const Problem& p, int config, int sms) {
  const KernelConfig& c = kConfigs[config];
  WkPlan pl;
  pl.row_blocks = static_cast<int>(ceil_div(p.n, kWkRows));
  pl.kblocks = static_cast<int>(p.k / kWkK);
  // One wave of ctas_per_sm CTAs per SM where N allows: as many K splits as fit beside the row blocks.
  const int64_t splits_fit = std::max<int64_t>(1, static_cast<int64_t>(c.ctas_per_sm) * sms / pl.row_blocks);
  int64_t kb = ceil_div(pl.kblocks, splits_fit);
  if (p.forced_splits > 0) kb = ceil_div(pl.kblocks, p.forced_splits);  // tests
  const int64_t slot_bytes = int64_t{kWkRows} * c.tokens * 4;
  const int64_t counters = round_up(static_cast<int64_t>(pl.row_blocks) * 4, 256);
  const int64_t max_splits = std::max<int64_t>(1, (kMaxWorkspaceBytes - counters) / (pl.row_blocks * slot_bytes));
  int64_t splits = std::min(ceil_div(pl.kblocks, kb), max_splits);
  kb = ceil_div(pl.kblocks, splits);  // spread evenly: the last split is at most one stage short
  splits = ceil_div(pl.kblocks, kb);
  pl.kb = static_cast<int>(kb);
  pl.splits = static_cast<int>(splits);
  if (splits > 1) {
    pl.partial_bytes = round_up(static_cast<int64_t>(pl.row_blocks) * splits * slot_bytes, 256);
    pl.counter_bytes = counters;
  }
  if (quantizes_a(p)) {  // one launch's TOKENS rows at a time (run_wk)
    pl.qa_bytes = round_up(int64_t{c.tokens} * (p.k / 2), 256);
    pl.qsf_bytes = round_up(p.k / 64 * kSfAtomBytes, 256);
  }
  if (dynamic_a(p)) pl.dyn_bytes = 256;
  return pl;
}

// Float A quantized for the K-sliced kernel (linear's W4A4 at decode M): the launch's rows [0, m) into the
// workspace as packed e2m1 ([m][k/2]) and one 128-row block of blocked scales (k/64 atoms), rows [m, tokens)
// of it zero, by quant_a.cuh's quantize_group: bit for bit what nvfp4_gemm::quantize writes for those rows.
// The GEMM then runs its NVFP4-A path on them, so linear gives exactly mm(quantize(x)). One thread per (row,
// 16-element group), a row's groups on consecutive threads. A programmatic dependent: it waits for the kernel
// ahead before it reads anything, then releases the GEMM at once, whose B loads overlap it
// (WkParams::b_early).
__global__ void __launch_bounds__(256) quant_a_wk_kernel(const uint8_t* __restrict__ x, int64_t ldx, AType xt, int m,
                                                         int tokens, int k, const float* __restrict__ a_scale,
                                                         bool is_decode, uint8_t* __restrict__ packed,
                                                         uint8_t* __restrict__ sf) {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  const int groups = k / 16;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= static_cast<int64_t>(tokens) * groups) return;
  const int r = static_cast<int>(idx / groups), g = static_cast<int>(idx % groups);
  uint8_t s8 = 0;
  if (r < m) {
    uint32_t w0, w1;
    quantize_group(xt, x + r * ldx + static_cast<int64_t>(g) * 16 * elem_bytes(xt), encode_scale_of(a_scale, is_decode),
                   s8, w0, w1);
    *reinterpret_cast<uint2*>(packed + static_cast<int64_t>(r) * (k / 2) + g * 8) = make_uint2(w0, w1);
  }
  sf[static_cast<int64_t>(g / 4) * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4 + g % 4] = s8;
}

// The max of a group's finite |values| as fp32 bits (NaN and inf left out), compared as integers, as the
// input-scales kernel takes it.
__device__ __forceinline__ uint32_t group_finite_max(AType xt, const uint32_t (&raw)[16]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t a = x_bits(xt, raw, i) & 0x7FFFFFFFu;
    m = max(m, a < 0x7F800000u ? a : 0u);
  }
  return m;
}

// The dynamic encode scale of a grid whose CTAs are all resident, from each thread's `finite_max`: a CTA's
// max joins the grid's running max (words[0]) and the CTA arrives (words[1]); every CTA waits until all have
// arrived, reads the max and forms recipe.h's scales (dynamic_input_scales); CTA 0 writes {encode, decode,
// alpha} to `out`; the last CTA to leave (words[2]) zeroes the three words for the next launch on the stream.
// Every thread calls it; s_max (zero, synced) and s_encode are the CTA's shared words.
__device__ float grid_dynamic_encode(uint32_t finite_max, uint32_t& s_max, float& s_encode, int slot,
                                     uint32_t* ws_words, const float* __restrict__ ws2, float* __restrict__ out) {
  finite_max = __reduce_max_sync(0xFFFFFFFFu, finite_max);
  if ((threadIdx.x & 31) == 0) atomicMax(&s_max, finite_max);
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* const words = split_counters(slot, ws_words);
    atomicMax(&words[0], s_max);
    __threadfence();  // the max before the arrival
    atomicAdd(&words[1], 1u);
    while (atomicAdd(&words[1], 0u) < gridDim.x) __nanosleep(32);
    __threadfence();
    const quant::InputScales sc = quant::dynamic_input_scales(__uint_as_float(atomicMax(&words[0], 0u)), __ldg(ws2));
    s_encode = sc.encode;
    if (blockIdx.x == 0) {
      out[quant::kEncode] = sc.encode;
      out[quant::kDecode] = sc.decode;
      out[quant::kAlpha] = sc.alpha;
    }
    if (atomicAdd(&words[2], 1u) == gridDim.x - 1) {  // every CTA has read the max: zero for the next launch
      words[0] = 0;
      words[1] = 0;
      words[2] = 0;
    }
  }
  __syncthreads();
  return s_encode;
}

// Dynamic scales (Problem::a_dynamic_ws2): the same, with the encode scale formed first from the finite amax of
// all of A, as the input-scales kernel forms it (csrc/quant/input_scales.cu; recipe.h dynamic_input_scales).
// Each CTA takes the max over its groups' finite |values| and the grid meets at grid_dynamic_encode's barrier
// (can_run keeps the grid within one CTA per SM, so all of it is resident); CTA 0 writes {encode, decode,
// alpha} to `out`, where the GEMM reads its alpha; then every CTA quantizes the values it loaded.
__global__ void __launch_bounds__(256) quant_a_wk_dynamic_kernel(
    const uint8_t* __restrict__ x, int64_t ldx, AType xt, int m, int tokens, int k, const float* __restrict__ ws2,
    float* __restrict__ out, int slot, uint32_t* ws_words, uint8_t* __restrict__ packed, uint8_t* __restrict__ sf) {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  __shared__ uint32_t s_max;
  __shared__ float s_encode;
  if (threadIdx.x == 0) s_max = 0;
  __syncthreads();
  const int groups = k / 16;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  const bool live = idx < static_cast<int64_t>(tokens) * groups;
  const int r = live ? static_cast<int>(idx / groups) : 0, g = live ? static_cast<int>(idx % groups) : 0;
  const bool has = live && r < m;
  uint32_t raw[16];
  uint32_t finite_max = 0;
  if (has) {
    load_group(xt, x + r * ldx + static_cast<int64_t>(g) * 16 * elem_bytes(xt), raw);
    finite_max = group_finite_max(xt, raw);
  }
  const float encode = grid_dynamic_encode(finite_max, s_max, s_encode, slot, ws_words, ws2, out);
  if (!live) return;
  uint8_t s8 = 0;
  if (has) {
    uint32_t w0, w1;
    quantize_loaded(xt, raw, encode, s8, w0, w1);
    *reinterpret_cast<uint2*>(packed + static_cast<int64_t>(r) * (k / 2) + g * 8) = make_uint2(w0, w1);
  }
  sf[static_cast<int64_t>(g / 4) * kSfAtomBytes + (r % 32) * 16 + (r / 32) * 4 + g % 4] = s8;
}

// CTAs of one A quantization launch (one thread per row and 16-element group of TOKENS rows).
int64_t quant_a_wk_blocks(int tokens, int64_t k) { return ceil_div(int64_t{tokens} * (k / 16), 256); }

// The launch's quantization of A ahead of the K-sliced kernel, with a static encode scale (Problem::a_scale)
// or dynamic scales (`words`: slot >= 0, or three zeroed workspace words).
cudaError_t launch_quant_a_wk(const Problem& p, int64_t r0, int rows, int tokens, uint8_t* packed, uint8_t* sf,
                              int slot, uint32_t* ws_words, cudaStream_t stream) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(dim3(static_cast<unsigned>(quant_a_wk_blocks(tokens, p.k))), dim3(256),
                                               0, stream, /*pdl=*/true, attr);
  const uint8_t* const x = p.a + r0 * p.lda;
  if (dynamic_a(p))
    return cudaLaunchKernelEx(&cfg, quant_a_wk_dynamic_kernel, x, p.lda, p.a_type, rows, tokens, static_cast<int>(p.k),
                              p.a_dynamic_ws2, p.a_dynamic_out, slot, ws_words, packed, sf);
  return cudaLaunchKernelEx(&cfg, quant_a_wk_kernel, x, p.lda, p.a_type, rows, tokens, static_cast<int>(p.k),
                            p.a_scale, p.a_scale_is_decode, packed, sf);
}

bool run_wk(const Problem* p, int32_t config, const DeviceInfo* dev, void* workspace, size_t ws_bytes,
            cudaStream_t stream, char* err, size_t err_len) {
  const KernelConfig& c = kConfigs[config];
  const WkPlan pl = make_wk_plan(*p, config, sms_of(dev));
  if (!workspace_ok(pl.bytes(), workspace, ws_bytes, err, err_len)) return false;
  WkLaunch l{};
  WkParams& wp = l.params;
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  if (!encode_2d(&wp.tmap_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, p->b, static_cast<uint64_t>(p->k / 2),
                 static_cast<uint64_t>(p->n), static_cast<uint64_t>(p->ldb), kWkK / 2, kWkRows,
                 CU_TENSOR_MAP_SWIZZLE_128B)) {
    set_msg(err, err_len, "sm90: cuTensorMapEncodeTiled failed for B");
    return false;
  }
  wp.sfb = p->sfb;
  wp.alpha = p->alpha;
  wp.alpha2 = p->alpha2;
  wp.partial = pl.partial_bytes ? reinterpret_cast<float*>(ws) : nullptr;
  wp.counters = pl.partial_bytes ? reinterpret_cast<uint32_t*>(ws + pl.partial_bytes) : nullptr;
  wp.ldc = p->ldc;
  wp.n = static_cast<int>(p->n);
  wp.k = static_cast<int>(p->k);
  wp.sf_atoms = static_cast<int>(p->k / 64);
  wp.kblocks = pl.kblocks;
  wp.kb_per_cta = pl.kb;
  wp.splits = pl.splits;
  // A slot's counters (no reset launch): measured 1.9 us faster per call at (16, 4096, 14336) (docs/NOTES.md).
  wp.counter_slot = pl.partial_bytes ? split_counter_slot(pl.row_blocks, stream) : -1;
  wp.out_mult = 128.0f;  // B decoded with 2^7 folded into its scales (sm90_wk.cuh)
  wp.out_dtype = p->out_dtype;
  l.row_blocks = pl.row_blocks;
  l.stream = stream;
  // Float A quantized on the fly: each launch's rows are quantized into the workspace first, and the kernel
  // reads them as NVFP4 A (its e2m1 instantiation).
  const bool quant = quantizes_a(*p), a4 = quant || p->a_type == AType::kE2m1;
  uint8_t* const qa = ws + pl.partial_bytes + pl.counter_bytes;
  uint8_t* const qsf = qa + pl.qa_bytes;
  uint32_t* const dyn_words = reinterpret_cast<uint32_t*>(qsf + pl.qsf_bytes);
  // Dynamic scales: the grid reduction's words are a slot of this stream's (split_counters.cuh: this
  // translation unit's copy, used only by quant_a_wk_dynamic_kernel), or workspace words zeroed ahead.
  const int dyn_slot = dynamic_a(*p) ? split_counter_slot(3, stream) : -1;
  wp.b_early = quant ? kWkEarlyBStages : 0;
  const int64_t out_elem = p->out_dtype == OutDtype::kFloat32 ? 4 : 2;
  // Rows of A beyond TOKENS (a forced config at larger M) run as further launches of TOKENS rows each; TOKENS
  // divides 128, so a launch's rows never straddle two of A's 128-row scale blocks. (The quantization of the
  // next launch's rows waits for this launch to finish before it overwrites the workspace.)
  for (int64_t r0 = 0; r0 < p->m; r0 += c.tokens) {
    const int64_t rows = std::min<int64_t>(c.tokens, p->m - r0);
    const uint8_t* const a_rows = quant ? qa : p->a + r0 * p->lda;
    const int64_t lda = quant ? p->k / 2 : p->lda;
    const bool ok_a =
        a4 ? encode_2d(&wp.tmap_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, a_rows, static_cast<uint64_t>(p->k / 2),
                       static_cast<uint64_t>(rows), static_cast<uint64_t>(lda), kWkK / 2,
                       static_cast<uint32_t>(c.tokens), CU_TENSOR_MAP_SWIZZLE_128B)
           : encode_2d(&wp.tmap_a,
                       p->a_type == AType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                       p->a + r0 * p->lda, static_cast<uint64_t>(p->k), static_cast<uint64_t>(rows),
                       static_cast<uint64_t>(p->lda), 64, static_cast<uint32_t>(c.tokens), CU_TENSOR_MAP_SWIZZLE_128B);
    if (!ok_a) {
      set_msg(err, err_len, "sm90: cuTensorMapEncodeTiled failed for A");
      return false;
    }
    if (quant) {
      wp.sfa = qsf;
      wp.a_row0 = 0;
      if (dynamic_a(*p) && dyn_slot < 0) {
        if (const cudaError_t z = consumed(launch_zero_counters(dyn_words, 3, stream)); z != cudaSuccess) {
          if (err && err_len)
            std::snprintf(err, err_len, "sm90 %s: launching the scale-reduction reset failed: %s", c.name,
                          cudaGetErrorString(z));
          return false;
        }
      }
      if (const cudaError_t e = consumed(launch_quant_a_wk(*p, r0, static_cast<int>(rows), c.tokens, qa, qsf, dyn_slot,
                                                           dyn_words, stream));
          e != cudaSuccess) {
        if (err && err_len)
          std::snprintf(err, err_len, "sm90 %s: launching the quantization of A failed: %s", c.name,
                        cudaGetErrorString(e));
        return false;
      }
    } else if (a4) {
      wp.sfa = p->sfa + (r0 / 128) * (p->k / 64) * kSfAtomBytes;
      wp.a_row0 = static_cast<int>(r0 % 128);
    }
    wp.c = static_cast<uint8_t*>(p->c) + r0 * p->ldc * out_elem;
    wp.m = static_cast<int>(rows);
    if (wp.splits > 1 && wp.counter_slot < 0) {  // the kernel overlaps this one (PDL), see sm90_wk.cuh
      if (const cudaError_t z = consumed(launch_zero_counters(wp.counters, pl.row_blocks, stream)); z != cudaSuccess) {
        if (err && err_len)
          std::snprintf(err, err_len, "sm90 %s: launching the split-counter reset failed: %s", c.name,
                        cudaGetErrorString(z));
        return false;
      }
    }
#ifdef NVFP4_GEMM_DIAGNOSTICS
    wp.trace = trace_buffer_for_launch(pl.row_blocks * wp.splits, stream);
#endif
    if (const cudaError_t e = consumed(kWkLaunch[config - kNumWgmma - kNumSmallM][a4 ? 0 : static_cast<int>(p->a_type)](l));
        e != cudaSuccess) {
      if (err && err_len)
        std::snprintf(err, err_len, "sm90 %s: launch failed (grid %d x %d, %d bytes of shared memory): %s", c.name,
                      l.row_blocks, wp.splits, wk_smem_bytes(c.tokens, c.stages, a4), cudaGetErrorString(e));
      return false;
    }
#ifdef NVFP4_GEMM_DIAGNOSTICS
    if (wp.trace) {
      char header[256];
      std::snprintf(header, sizeof(header), "%s m=%d n=%d k=%d grid=%d splits=%d kb=%d", c.name, wp.m, wp.n, wp.k,
                    pl.row_blocks * wp.splits, wp.splits, pl.kb);
      write_trace(wp.trace, pl.row_blocks * wp.splits, header, stream);
    }
#endif
  }
  return true;
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
  if (p->a_type != AType::kE2m1 && !is_a16(*p) && !quantizes_a(*p)) {
    set_msg(why, why_len, "sm90 takes NVFP4, float16 or bfloat16 a; float32 a runs on the generic path");
    return false;
  }
  if (p->alpha2 != nullptr && p->alpha == nullptr) {
    set_msg(why, why_len, "sm90: alpha2 needs alpha");
    return false;
  }
  if (dynamic_a(*p) && kConfigs[config].family == Family::kSmallM) {
    if (why && why_len)
      std::snprintf(why, why_len, "%s does not form dynamic input scales itself (the K-sliced and wgmma configs do)",
                    kConfigs[config].name);
    return false;
  }
  if (kConfigs[config].family == Family::kWarpK) {
    // Float A quantized on the fly runs as NVFP4 A (run_wk quantizes it into the workspace first).
    const bool a4 = p->a_type == AType::kE2m1 || quantizes_a(*p);
    if (dynamic_a(*p)) {  // one launch whose quantization grid meets at a grid-wide barrier (run_wk)
      const int sms = sms_of(dev);
      const int tokens = kConfigs[config].tokens;
      if (p->m > tokens || quant_a_wk_blocks(tokens, p->k) > sms) {
        if (why && why_len)
          std::snprintf(why, why_len, "%s forms dynamic input scales for M <= %d and K <= %lld on this device; got "
                        "M=%lld K=%lld", kConfigs[config].name, tokens,
                        static_cast<long long>(int64_t{sms} * 256 * 16 / tokens), static_cast<long long>(p->m),
                        static_cast<long long>(p->k));
        return false;
      }
    }
    if (p->a_type == AType::kE2m1 && (reinterpret_cast<uintptr_t>(p->a) % 16 != 0 || p->lda % 16 != 0 ||
               reinterpret_cast<uintptr_t>(p->sfa) % 16 != 0)) {
      if (why && why_len)
        std::snprintf(why, why_len, "%s takes NVFP4 a with 16-byte aligned rows and sfa (TMA and bulk copies); got "
                      "a at %p, row stride %lld bytes, sfa at %p", kConfigs[config].name, static_cast<const void*>(p->a),
                      static_cast<long long>(p->lda), static_cast<const void*>(p->sfa));
      return false;
    }
    if (p->k % kWkK != 0 || p->m > INT_MAX || p->n > (int64_t{1} << 30) || p->k > (int64_t{1} << 30)) {
      if (why && why_len)
        std::snprintf(why, why_len, "%s takes K %% 256 == 0, M <= 2^31 - 1 and N, K <= 2^30; got M=%lld N=%lld K=%lld",
                      kConfigs[config].name, static_cast<long long>(p->m), static_cast<long long>(p->n),
                      static_cast<long long>(p->k));
      return false;
    }
    if (reinterpret_cast<uintptr_t>(p->sfb) % 16 != 0) {
      set_msg(why, why_len, "sm90: sfb must be 16-byte aligned (bulk copies of the scale atoms)");
      return false;
    }
    const int smem = wk_smem_bytes(kConfigs[config].tokens, kConfigs[config].stages, a4);
    if (dev && dev->smem_optin < smem) {
      if (why && why_len)
        std::snprintf(why, why_len, "%s needs %d bytes of shared memory per block, the device allows %lld",
                      kConfigs[config].name, smem, static_cast<long long>(dev->smem_optin));
      return false;
    }
    return true;
  }
  if (kConfigs[config].family == Family::kSmallM) {
    if (p->m > INT_MAX || p->n > (int64_t{1} << 30) || p->k > (int64_t{1} << 30)) {  // 32-bit row / K indices
      if (why && why_len)
        std::snprintf(why, why_len, "%s takes M <= 2^31 - 1 and N, K <= 2^30; got M=%lld N=%lld K=%lld",
                      kConfigs[config].name, static_cast<long long>(p->m), static_cast<long long>(p->n),
                      static_cast<long long>(p->k));
      return false;
    }
    const SmallMPlan pl = make_small_m_plan(*p, config, sms_of(dev));
    const int64_t limit = std::min<int64_t>(kSmallMMaxSmem, dev ? dev->smem_optin : kSmallMMaxSmem);
    if (pl.smem > limit) {
      if (why && why_len)
        std::snprintf(why, why_len, "%s: %d K blocks per CTA need %d bytes of shared memory for decoded A, the "
                      "limit is %lld (fewer forced splits, or a wgmma config)", kConfigs[config].name, pl.kb, pl.smem,
                      static_cast<long long>(limit));
      return false;
    }
    if (reinterpret_cast<uintptr_t>(p->sfa) % 2 != 0 || reinterpret_cast<uintptr_t>(p->sfb) % 2 != 0) {
      set_msg(why, why_len, "sm90: sfa and sfb must be 2-byte aligned (16-bit scale loads)");
      return false;
    }
    if (kConfigs[config].ring > 0 && reinterpret_cast<uintptr_t>(p->sfb) % 4 != 0) {
      set_msg(why, why_len, "sm90: the ring small-M configs need sfb 4-byte aligned (32-bit scale copies)");
      return false;
    }
    return true;
  }
  const int smem =
      smem_bytes(kConfigs[config].tokens, kConfigs[config].kt, kConfigs[config].stages, kConfigs[config].rows / 64);
  if (dev && dev->smem_optin < smem) {
    if (why && why_len)
      std::snprintf(why, why_len, "%s needs %d bytes of shared memory per block, the device allows %lld",
                    kConfigs[config].name, smem, static_cast<long long>(dev->smem_optin));
    return false;
  }
  if (dynamic_a(*p) && max_chunk_rows(*p, config) < p->m) {
    if (why && why_len)
      std::snprintf(why, why_len, "%s forms dynamic input scales over all of A in one launch; M=%lld K=%lld needs "
                    "more than the bounded decode workspace", kConfigs[config].name, static_cast<long long>(p->m),
                    static_cast<long long>(p->k));
    return false;
  }
  if (round_up(p->k, 64) * 2 * kConfigs[config].tokens > kMaxADecBytes) {
    if (why && why_len)
      std::snprintf(why, why_len, "sm90: K = %lld too large for the bounded decode workspace",
                    static_cast<long long>(p->k));
    return false;
  }
  if (reinterpret_cast<uintptr_t>(p->sfb) % 16 != 0 || reinterpret_cast<uintptr_t>(p->sfa) % 4 != 0) {
    set_msg(why, why_len, "sm90: sfb must be 16-byte aligned and sfa 4-byte aligned (TMA / word loads)");
    return false;
  }
  // M, N and the (tile, K tile) units of one launch are 32-bit in the kernel.
  const int64_t units = ceil_div(p->n, int64_t{kConfigs[config].rows}) *
                        ceil_div(std::min(p->m, max_chunk_rows(*p, config)), kConfigs[config].tokens) *
                        ceil_div(p->k, kConfigs[config].kt);
  if (p->m > INT_MAX || p->n > INT_MAX || units > INT_MAX) {
    if (why && why_len)
      std::snprintf(why, why_len, "%s takes M, N <= 2^31 - 1 and at most 2^31 - 1 (tile, K tile) units per "
                    "launch; got M=%lld N=%lld K=%lld (%lld units)", kConfigs[config].name,
                    static_cast<long long>(p->m), static_cast<long long>(p->n), static_cast<long long>(p->k),
                    static_cast<long long>(units));
    return false;
  }
  return true;
}

// The A form of a problem, as the rules name it (configs.h Mode).
unsigned mode_of(const Problem& p) {
  if (dynamic_a(p)) return kModeDynamic;
  if (quantizes_a(p)) return kModeStatic;
  if (p.a_type == AType::kE2m1) return kModeW4a4;
  return p.a_type == AType::kFloat32 ? kModeW4a16F32 : kModeW4a16;
}

// Whether a rule of the table applies to this problem (its config aside).
bool rule_applies(const Rule& r, const Problem& p, unsigned mode) {
  return r.kind == Kind::kDense && rule_covers(r, p.m) && (r.modes & mode) != 0;
}

// select's cost model of a wgmma config on `p` (the least-cost rules): the split planner's cost of its launches
// (split_plan.h, each launch's best split), with the K tile's time from the config's measured MMA rate a SM
// (KernelConfig::rate) or its B bytes at the SM's share of 3 TB/s, and a wave's fixed time from its wave_us. Both
// were fitted to forced times of the five configs at 44 shapes (docs/NOTES.md section 10). The planner's own split
// choices keep the uniform rate (k_tile_seconds) under which they were measured.
double modeled_seconds(const Problem& p, int config, int sms) {
  const KernelConfig& c = kConfigs[config];
  const Plan pl = make_plan(p, config, sms);
  const bool bf16 = mma_bf16(p);
  auto launch = [&](int64_t rows) {
    SplitInputs in = split_inputs(p, pl, tiles_of(pl, rows), config, sms);
    in.t_tile = k_tile_seconds(pl.tokens, pl.kt, pl.rows, in.sms, c.rate * 1e12, 0);
    in.wave_seconds = c.wave_us * 1e-6;
    double cost = 0.0;
    plan_split(in, config, bf16, &cost);
    return cost;
  };
  const int64_t full = p.m / pl.chunk_rows, rest = p.m % pl.chunk_rows;
  return static_cast<double>(full) * launch(pl.chunk_rows) + (rest ? launch(rest) : 0.0);
}

// The config of the least-cost rules that apply to `p` whose modeled time is least among those that can run it
// (the first in table order on a tie), -1 if none can.
int least_cost_config(const Problem& p, const DeviceInfo* dev) {
  const unsigned mode = mode_of(p);
  const int sms = sms_of(dev);
  int pick = -1;
  double best = 0.0;
  for (const Rule& r : kRules) {
    if (r.when != When::kLeastCost || !rule_applies(r, p, mode) || !can_run(&p, r.config, dev, nullptr, 0)) continue;
    const double t = modeled_seconds(p, r.config, sms);
    if (pick < 0 || t < best) {
      pick = r.config;
      best = t;
    }
  }
  return pick;
}

// least_cost_config's answer, kept per problem: the model costs ~17 us of host time a problem (five configs' plans,
// each asking the cluster capacity once per cluster size), which eager calls would pay per GEMM (bench_model M = 64:
// 1.99x fp16's host time a forward without this). The answer depends on the device (its index and SM count) and on
// M, N, K, the A form, the MMA type and a forced split only: what else can_run checks (pointers, alpha) refuses every
// wgmma config alike, and such a refusal is not kept.
int least_cost_config_cached(const Problem& p, const DeviceInfo* dev) {
  struct Key {
    int64_t m, n, k;
    int dev, sms, forced;
    unsigned mode;
    bool bf16;
    bool operator==(const Key& o) const {
      return m == o.m && n == o.n && k == o.k && dev == o.dev && sms == o.sms && forced == o.forced && mode == o.mode &&
             bf16 == o.bf16;
    }
  };
  struct Hash {
    size_t operator()(const Key& q) const {
      uint64_t h = 1469598103934665603ull;
      for (const uint64_t v : {static_cast<uint64_t>(q.m), static_cast<uint64_t>(q.n), static_cast<uint64_t>(q.k),
                               static_cast<uint64_t>(q.dev) << 32 | static_cast<uint32_t>(q.forced),
                               static_cast<uint64_t>(q.sms) << 32 | q.mode << 1 | q.bf16})
        h = (h ^ v) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  static std::mutex mutex;
  static std::unordered_map<Key, int, Hash> known;
  const Key key{p.m, p.n, p.k, dev->index, dev->num_sms, p.forced_splits, mode_of(p), mma_bf16(p)};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) return it->second;
  }
  const int pick = least_cost_config(p, dev);
  if (pick < 0) return pick;  // refused for what the key does not hold (pointers, alpha): not an answer for the shape
  std::lock_guard<std::mutex> lock(mutex);
  if (known.size() >= 16384) known.clear();  // bounded: a server sees a few thousand distinct shapes at most
  known.emplace(key, pick);
  return pick;
}

// A rule's extra condition (configs.h When; generate.py WHEN). `least`: least_cost_config's answer, computed on
// first need (-2 until then).
bool rule_holds(const Rule& r, const Problem& p, const DeviceInfo* dev, int* least) {
  switch (r.when) {
    case When::kAlways:
      return true;
    case When::kLeastCost:
      if (*least == -2) *least = least_cost_config_cached(p, dev);
      return r.config == *least;
    case When::kUnsplitSmallM8: {
      // The 8-token small-M config would run unsplit with more K blocks per CTA than its depth, and the rule's
      // config holds every row block in one wave.
      const int small8 = config_index(Family::kSmallM, 8);
      const int sms = sms_of(dev);
      const SmallMPlan pl = make_small_m_plan(p, small8, sms);
      return pl.splits == 1 && pl.kb > kConfigs[small8].stages &&
             pl.row_blocks <= static_cast<int64_t>(kConfigs[r.config].ctas_per_sm) * sms;
    }
  }
  return false;
}

// Automatic dispatch hands the problem to the generic path where a generic rule covers it.
bool prefers_generic(const Problem* p, const DeviceInfo*) {
  const unsigned mode = mode_of(*p);
  for (const Rule& r : kRules)
    if (r.config == kGenericConfig && rule_applies(r, *p, mode)) return true;
  return false;
}

// The table's rules in order: the first that applies, whose condition holds and whose config can run the problem
// gives the config; a refusal rule ends the walk. `why`: the last refusal of a rule not marked `prefer`.
int32_t select(const Problem* p, const DeviceInfo* dev, char* why, size_t why_len) {
  const unsigned mode = mode_of(*p);
  int least = -2;
  for (const Rule& r : kRules) {
    if (!rule_applies(r, *p, mode) || r.config == kGenericConfig) continue;
    if (r.config == kRefuseConfig) return -1;
    if (!rule_holds(r, *p, dev, &least)) continue;
    if (can_run(p, r.config, dev, r.prefer ? nullptr : why, r.prefer ? 0 : why_len)) return r.config;
  }
  return -1;
}

size_t workspace_bytes(const Problem* p, int32_t config, const DeviceInfo* dev) {
  const int sms = sms_of(dev);
  if (config >= 0 && config < kNumConfigs && kConfigs[config].family == Family::kSmallM) {
    const SmallMPlan pl = make_small_m_plan(*p, config, sms);
    return static_cast<size_t>(pl.partial_bytes + pl.counter_bytes);
  }
  if (config >= 0 && config < kNumConfigs && kConfigs[config].family == Family::kWarpK) {
    return static_cast<size_t>(make_wk_plan(*p, config, sms).bytes());
  }
  return static_cast<size_t>(make_plan(*p, config, sms).bytes());
}

bool run(const Problem* p, int32_t config, const DeviceInfo* dev, void* workspace, size_t ws_bytes,
         cudaStream_t stream, char* err, size_t err_len) {
  if (config < 0 || config >= kNumConfigs) {
    set_msg(err, err_len, "sm90: config index out of range");
    return false;
  }
  if (kConfigs[config].family == Family::kSmallM)
    return run_small_m(p, config, dev, workspace, ws_bytes, stream, err, err_len);
  if (kConfigs[config].family == Family::kWarpK)
    return run_wk(p, config, dev, workspace, ws_bytes, stream, err, err_len);
  const int sms = sms_of(dev);
  const Plan pl = make_plan(*p, config, sms);
  if (!workspace_ok(pl.bytes(), workspace, ws_bytes, err, err_len)) return false;
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  auto* a_dec = reinterpret_cast<__half*>(ws);
  const int64_t out_elem = p->out_dtype == OutDtype::kFloat32 ? 4 : 2;
  const int sf_atoms_per_row = static_cast<int>(ceil_div(p->k / kSfVecSize, kSfAtomCols));

  LaunchArgs args{};
  GemmParams& gp = args.params;
  if (!encode_2d(&gp.tmap_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, p->b, static_cast<uint64_t>(p->k / 2),
                 static_cast<uint64_t>(p->n), static_cast<uint64_t>(p->ldb), static_cast<uint32_t>(pl.kt / 2),
                 static_cast<uint32_t>(pl.rows), pl.kt == 128 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B)) {
    set_msg(err, err_len, "sm90: cuTensorMapEncodeTiled failed for B");
    return false;
  }
  gp.sfb = p->sfb;
  // Scales as rows of 256 bytes (half an atom): a stage's kNB atoms of a 128-row block are 2 * kNB consecutive rows,
  // one box (a 256-row tile loads two, gemm_kernel's load_b).
  const int64_t sf_rows = ceil_div(p->n, kSfAtomRows) * sf_atoms_per_row * 2;
  if (!encode_2d(&gp.tmap_sf, CU_TENSOR_MAP_DATA_TYPE_UINT8, p->sfb, 256, static_cast<uint64_t>(sf_rows), 256, 256,
                 static_cast<uint32_t>(2 * pl.kt / 64), CU_TENSOR_MAP_SWIZZLE_NONE)) {
    set_msg(err, err_len, "sm90: cuTensorMapEncodeTiled failed for B's scales");
    return false;
  }
  // Decoded A is re-read by every CTA of its token tile: keep it (EVICT_LAST); B streams through once
  // when there is one token tile (EVICT_FIRST); otherwise EVICT_NORMAL.
  constexpr uint64_t kEvictNormal = 0x1000000000000000ull, kEvictFirst = 0x12F0000000000000ull,
                     kEvictLast = 0x14F0000000000000ull;
  gp.hint_a = kEvictLast;
  gp.alpha = p->alpha;
  gp.alpha2 = p->alpha2;
  gp.partial = pl.partial_bytes ? reinterpret_cast<float4*>(ws + pl.a_bytes) : nullptr;
  gp.counters = pl.counter_bytes ? reinterpret_cast<uint32_t*>(ws + pl.a_bytes + pl.partial_bytes) : nullptr;
  gp.ldc = p->ldc;
  gp.n = static_cast<int>(p->n);
  gp.k = static_cast<int>(p->k);
  gp.sf_atoms_per_row = sf_atoms_per_row;
  gp.ktiles = pl.ktiles;
  gp.tiles_w = pl.tiles_w;
  gp.out_dtype = p->out_dtype;
  // Powers of two folded into the decodes (sm90_gemm.cuh, numerics): NVFP4 A x 2^7 x 2^7 (A_dec = e2m1 x
  // e4m3 exactly; 16-bit A is taken as it is), B's scales x 2^7; the sums then carry 2^-7, which the
  // epilogue multiplies back.
  constexpr uint32_t kHalf2Two7 = 0x58005800u;  // fp16x2 {128, 128}
  const uint32_t a_fold = kHalf2Two7, a_post = kHalf2Two7;
  gp.out_mult = 128.0f;
  const bool a16 = is_a16(*p), bf16 = mma_bf16(*p);  // quantized A is fp16 once decoded
  args.stream = stream;

  for (int64_t r0 = 0; r0 < p->m; r0 += pl.chunk_rows) {
    const int64_t rows = std::min(pl.chunk_rows, p->m - r0);
    gp.tiles = tiles_of(pl, rows);
    const SplitInputs in = split_inputs(*p, pl, gp.tiles, config, sms);
    const Split sp = plan_split(in, config, bf16);
    gp.grid = sp.grid;
    gp.cluster = sp.cluster;
    gp.cluster_groups = sp.groups;
    gp.total = static_cast<int64_t>(gp.tiles) * pl.ktiles;
    gp.hint_b = gp.tiles == pl.tiles_w ? kEvictFirst : kEvictNormal;
    const int n_counters = static_cast<int>(split_counters(in, sp));
    const int64_t threads = std::max<int64_t>(rows * (pl.kp / 64) * 8, n_counters);
#ifdef NVFP4_GEMM_DIAGNOSTICS
    gp.trace = trace_buffer_for_launch(gp.grid, stream);
#endif
    const unsigned blocks = static_cast<unsigned>(ceil_div(threads, 256));
    if (dynamic_a(*p)) {  // one chunk (can_run): the scales come from all of A
      // The grid-reduction words: this stream's slot (backend.cu's copy of split_counters.cuh, which the
      // K-sliced dynamic kernel shares on the stream), or workspace words zeroed ahead.
      const int slot = split_counter_slot(3, stream);
      uint32_t* const words = reinterpret_cast<uint32_t*>(ws + pl.a_bytes + pl.partial_bytes + pl.counter_bytes);
      if (slot < 0) {
        if (const cudaError_t z = consumed(launch_zero_counters(words, 3, stream)); z != cudaSuccess) {
          if (err && err_len)
            std::snprintf(err, err_len, "sm90 %s: launching the scale-reduction reset failed: %s",
                          kConfigs[config].name, cudaGetErrorString(z));
          return false;
        }
      }
      const int64_t need = ceil_div(rows * (pl.kp / 64) * 4, 256);
      quant_a_dynamic_kernel<<<static_cast<unsigned>(std::min<int64_t>(need, sms)), 256, 0, stream>>>(
          p->a + r0 * p->lda, p->lda, p->a_type, static_cast<int>(rows), static_cast<int>(p->k), p->a_dynamic_ws2,
          p->a_dynamic_out, slot, words, a_dec, static_cast<int>(pl.kp), gp.counters, n_counters, a_fold, a_post);
    } else if (quantizes_a(*p)) {
      const int64_t qthreads = std::max<int64_t>(rows * (pl.kp / 64) * 4, n_counters);
      quant_a_kernel<<<static_cast<unsigned>(ceil_div(qthreads, 256)), 256, 0, stream>>>(
          p->a + r0 * p->lda, p->lda, p->a_type, static_cast<int>(rows), static_cast<int>(p->k), p->a_scale,
          p->a_scale_is_decode, a_dec, static_cast<int>(pl.kp), gp.counters, n_counters, a_fold, a_post);
    } else if (a16) {
      order_a16_kernel<<<blocks, 256, 0, stream>>>(p->a + r0 * p->lda, p->lda, static_cast<int>(rows),
                                                   static_cast<int>(p->k), reinterpret_cast<uint16_t*>(a_dec),
                                                   static_cast<int>(pl.kp), gp.counters, n_counters);
    } else {
      decode_a_kernel<<<blocks, 256, 0, stream>>>(
          p->a + r0 * p->lda, p->lda, p->sfa, static_cast<int>(r0), static_cast<int>(rows), static_cast<int>(p->k),
          sf_atoms_per_row, a_dec, static_cast<int>(pl.kp), gp.counters, n_counters, a_fold, a_post, gp.trace);
    }
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {  // read once: this also clears it
      if (err && err_len)
        std::snprintf(err, err_len, "sm90 %s: launching the A prepass failed: %s", kConfigs[config].name,
                      cudaGetErrorString(e));
      return false;
    }
    if (!encode_2d(&gp.tmap_a, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, a_dec,
                   static_cast<uint64_t>(pl.kp),
                   static_cast<uint64_t>(round_up(rows, int64_t{pl.tokens})), static_cast<uint64_t>(pl.kp * 2), 64,
                   static_cast<uint32_t>(pl.tokens), CU_TENSOR_MAP_SWIZZLE_128B)) {
      set_msg(err, err_len, "sm90: cuTensorMapEncodeTiled failed for decoded A");
      return false;
    }
    gp.c = static_cast<uint8_t*>(p->c) + r0 * p->ldc * out_elem;
    // 16-byte stores of staged rows: every row of C starts 16-byte aligned.
    gp.staged_c = reinterpret_cast<uintptr_t>(gp.c) % 16 == 0 && (p->ldc * out_elem) % 16 == 0;
    gp.m = static_cast<int>(rows);
    if (const cudaError_t e = consumed(kLaunch[config][bf16 ? 1 : 0](args)); e != cudaSuccess) {
      if (err && err_len)
        std::snprintf(err, err_len, "sm90 %s: launch failed (grid %d, %d bytes of shared memory): %s",
                      kConfigs[config].name, gp.grid, smem_bytes(pl.tokens, pl.kt, kConfigs[config].stages, pl.rows / 64),
                      cudaGetErrorString(e));
      return false;
    }
#ifdef NVFP4_GEMM_DIAGNOSTICS
    if (gp.trace) write_trace(gp, kConfigs[config].name, stream);
#endif
  }
  return true;
}

}  // namespace

// A_dec, decoded exactly like B (value * 2^-14, see decode_word) in the permuted K order the B fragments
// use: in each 64-K block, 16-byte vector v = 2s + h holds decode_word<s>(word h of scale group q) for
// q = 0..3. One thread per vector, so a warp stores 512 contiguous bytes (one thread per block
// storing 128 bytes each ran at 0.7 TB/s: 57 us at M = 2304, K = 7168). Threads 0.. also zero the
// split arrival counters of the GEMM that follows on the stream.
__global__ void __launch_bounds__(256) decode_a_kernel(const uint8_t* __restrict__ a, int64_t lda,
                                                       const uint8_t* __restrict__ sfa, int row_begin, int rows,
                                                       int k, int sf_atoms_per_row, __half* __restrict__ out,
                                                       int kp, uint32_t* counters, int n_counters, uint32_t a_fold,
                                                       uint32_t a_post, uint64_t* trace) {
  cudaTriggerProgrammaticLaunchCompletion();  // the GEMM may launch now; it waits for our writes itself
  if (kDiagnostics && trace && threadIdx.x == 0) {  // diagnostics builds: when the first and last block start
    if (blockIdx.x == 0) trace[0] = global_ns();
    atomicMax(reinterpret_cast<unsigned long long*>(trace + 1), static_cast<unsigned long long>(global_ns()));
  }
  const int kblocks = kp / 64;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx < n_counters) counters[idx] = 0;
  if (idx >= static_cast<int64_t>(rows) * kblocks * 8) return;
  const int v = static_cast<int>(idx & 7);
  const int64_t blk = idx >> 3;
  const int r = static_cast<int>(blk / kblocks), kb = static_cast<int>(blk % kblocks);
  const uint8_t* src = a + static_cast<int64_t>(r) * lda + kb * 32;
  const uint4 lo = __ldg(reinterpret_cast<const uint4*>(src));  // K % 32 == 0: the first 32 K always exist
  const uint4 hi = (kb * 64 + 64 <= k) ? __ldg(reinterpret_cast<const uint4*>(src + 16)) : make_uint4(0, 0, 0, 0);
  const int rg = row_begin + r;
  const uint32_t sw = __ldg(reinterpret_cast<const uint32_t*>(sfa + blocked_sf_word_offset(rg, kb, sf_atoms_per_row)));
  reinterpret_cast<uint4*>(out + static_cast<int64_t>(r) * kp + kb * 64)[v] = decode_a_vector(lo, hi, sw, v, a_fold, a_post);
}

// 16-bit A (fp16 or bf16, the weight-only form) in the same permuted K order as decode_a_kernel writes:
// vector v = 2s + h of a 64-K block holds, for q = 0..3, elements {16q + 8h + s, 16q + 8h + s + 4} (what
// decode_word<s> makes of word h of scale group q). One thread per output vector; the four 16-byte
// source chunks it picks from are shared by the 4 threads of equal h (L1 serves the repeats). K past the
// end (K % 64 == 32) is zero. Threads 0.. zero the split counters, as decode_a_kernel does.
__global__ void __launch_bounds__(256) order_a16_kernel(const uint8_t* __restrict__ a, int64_t lda, int rows, int k,
                                                        uint16_t* __restrict__ out, int kp, uint32_t* counters,
                                                        int n_counters) {
  cudaTriggerProgrammaticLaunchCompletion();  // the GEMM may launch now; it waits for our writes itself
  const int kblocks = kp / 64;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx < n_counters) counters[idx] = 0;
  if (idx >= static_cast<int64_t>(rows) * kblocks * 8) return;
  const int v = static_cast<int>(idx & 7), s = v >> 1, h = v & 1;
  const int64_t blk = idx >> 3;
  const int r = static_cast<int>(blk / kblocks), kb = static_cast<int>(blk % kblocks);
  const uint8_t* src = a + static_cast<int64_t>(r) * lda + (kb * 64 + 8 * h) * 2;
  const bool full = kb * 64 + 64 <= k;  // K % 32 == 0: groups 0, 1 always exist, 2, 3 only in a full block
  uint32_t pick[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 c = (q < 2 || full) ? __ldg(reinterpret_cast<const uint4*>(src + 32 * q)) : make_uint4(0, 0, 0, 0);
    const uint32_t lo = s < 2 ? c.x : c.y, hi = s < 2 ? c.z : c.w;  // elements {s, s+4}: word s/2 of each half
    pick[q] = __byte_perm(lo, hi, (s & 1) ? 0x7632 : 0x5410);
  }
  reinterpret_cast<uint4*>(out + static_cast<int64_t>(r) * kp + kb * 64)[v] = make_uint4(pick[0], pick[1], pick[2], pick[3]);
}

// Group q of a (row, 64-K block) of A_dec from its quantized codes: decoded exactly as decode_a_kernel decodes
// packed A (the same words, scale byte and half-precision products); the block's four threads (consecutive
// lanes, slot `local` of the CTA's `stage`) meet in shared memory, so that each stores two whole 16-byte vectors
// (vector v = 2s + h holds group q's pair {8h + s, 8h + s + 4} at q). `live`: the thread has a block to write.
__device__ __forceinline__ void store_a_dec_group(uint32_t* stage, int local, int q, bool live, uint8_t s8,
                                                  const uint32_t (&w)[2], uint32_t a_fold, uint32_t a_post,
                                                  __half* block_out) {
  const __half2_raw sr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(s8 | (s8 << 8)), __NV_E4M3);
  const __half2 fold = *reinterpret_cast<const __half2*>(&a_fold), post = *reinterpret_cast<const __half2*>(&a_post);
  const __half2 sc = __hmul2(*reinterpret_cast<const __half2*>(&sr), fold);
#pragma unroll
  for (int v = 0; v < 8; ++v)
    stage[(local * 8 + v) * 4 + q] = hmul2_u32(hmul2_u32(decode_word_rt(w[v & 1], v >> 1), sc), post);
  __syncwarp();
  if (!live) return;
  const uint4* src = reinterpret_cast<const uint4*>(stage) + local * 8;
  uint4* dst = reinterpret_cast<uint4*>(block_out);
  dst[2 * q] = src[2 * q];
  dst[2 * q + 1] = src[2 * q + 1];
}

// Float A quantized on the fly, then decoded exactly as decode_a_kernel decodes packed A, so the GEMM that
// follows sees bit for bit the A_dec of quantize + mm. One thread per (row, 64-K block, scale group q): it
// quantizes its 16 values (recipe.h) and makes the 8 fp16 pairs of its group (store_a_dec_group).
__global__ void __launch_bounds__(256) quant_a_kernel(const uint8_t* __restrict__ x, int64_t ldx, AType xt, int rows,
                                                      int k, const float* __restrict__ a_scale, bool is_decode,
                                                      __half* __restrict__ out, int kp, uint32_t* counters,
                                                      int n_counters, uint32_t a_fold, uint32_t a_post) {
  cudaTriggerProgrammaticLaunchCompletion();
  __shared__ __align__(16) uint32_t stage[64 * 8 * 4];  // [block of this CTA][vector][q]
  const int kblocks = kp / 64;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (idx < n_counters) counters[idx] = 0;
  const bool live = idx < static_cast<int64_t>(rows) * kblocks * 4;
  const int q = static_cast<int>(idx & 3);
  const int64_t blk = idx >> 2;
  const int r = static_cast<int>(blk / kblocks), kb = static_cast<int>(blk % kblocks);
  const int kg = kb * 64 + 16 * q;
  uint8_t s8 = 0;
  uint32_t w[2] = {0, 0};
  if (live && kg < k) {
    quantize_group(xt, x + static_cast<int64_t>(r) * ldx + static_cast<int64_t>(kg) * elem_bytes(xt),
                   encode_scale_of(a_scale, is_decode), s8, w[0], w[1]);
  }
  store_a_dec_group(stage, threadIdx.x >> 2, q, live, s8, w, a_fold, a_post,
                    out + static_cast<int64_t>(r) * kp + kb * 64);
}

// Dynamic scales (Problem::a_dynamic_ws2) for the wgmma configs: the encode scale formed first from the
// finite amax of all of A, as the input-scales kernel forms it (csrc/quant/input_scales.cu; recipe.h
// dynamic_input_scales), then quant_a_kernel's work with it. A persistent grid of at most one CTA per SM
// (run), so that all of it is resident: each CTA takes the max over its share of the groups' finite |values|,
// the grid meets at grid_dynamic_encode's barrier (CTA 0 writes {encode, decode, alpha} to `out`, where the
// GEMM reads its alpha after its grid-dependency wait), then each CTA quantizes its share again from memory (L2:
// A is read twice).
__global__ void __launch_bounds__(256) quant_a_dynamic_kernel(
    const uint8_t* __restrict__ x, int64_t ldx, AType xt, int rows, int k, const float* __restrict__ ws2,
    float* __restrict__ out, int slot, uint32_t* ws_words, __half* __restrict__ a_dec, int kp, uint32_t* counters,
    int n_counters, uint32_t a_fold, uint32_t a_post) {
  cudaTriggerProgrammaticLaunchCompletion();  // the GEMM launches once every CTA here has started
  __shared__ __align__(16) uint32_t stage[64 * 8 * 4];
  __shared__ uint32_t s_max;
  __shared__ float s_encode;
  if (threadIdx.x == 0) s_max = 0;
  __syncthreads();
  const int kblocks = kp / 64;
  const int64_t units = static_cast<int64_t>(rows) * kblocks * 4;  // (row, 64-K block, group) triples
  const int64_t stride = static_cast<int64_t>(gridDim.x) * 256;    // a multiple of 4: a block's groups stay together
  const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  for (int64_t i = first; i < n_counters; i += stride) counters[i] = 0;
  auto group_of = [&](int64_t u, int& r, int& kb, int& kg) {
    const int64_t blk = u >> 2;
    r = static_cast<int>(blk / kblocks);
    kb = static_cast<int>(blk % kblocks);
    kg = kb * 64 + 16 * static_cast<int>(u & 3);
  };
  uint32_t finite_max = 0;
  for (int64_t u = first; u < units; u += stride) {
    int r, kb, kg;
    group_of(u, r, kb, kg);
    if (kg >= k) continue;
    uint32_t raw[16];
    load_group(xt, x + static_cast<int64_t>(r) * ldx + static_cast<int64_t>(kg) * elem_bytes(xt), raw);
    finite_max = max(finite_max, group_finite_max(xt, raw));
  }
  const float encode = grid_dynamic_encode(finite_max, s_max, s_encode, slot, ws_words, ws2, out);
  const int64_t iters = (units + stride - 1) / stride;  // the same for every thread: each meets every __syncwarp
  for (int64_t it = 0; it < iters; ++it) {
    const int64_t u = first + it * stride;
    const bool live = u < units;
    int r = 0, kb = 0, kg = k;
    if (live) group_of(u, r, kb, kg);
    uint8_t s8 = 0;
    uint32_t w[2] = {0, 0};
    if (live && kg < k)
      quantize_group(xt, x + static_cast<int64_t>(r) * ldx + static_cast<int64_t>(kg) * elem_bytes(xt), encode, s8,
                     w[0], w[1]);
    __syncwarp();  // the previous round's reads of `stage` are done
    store_a_dec_group(stage, threadIdx.x >> 2, static_cast<int>(u & 3), live, s8, w, a_fold, a_post,
                      a_dec + static_cast<int64_t>(r) * kp + kb * 64);
  }
}

const char* dispatch_rules() { return kRulesText; }

const BackendApi& backend_api() {
  static const BackendApi api = {
      kBackendAbiVersion, "sm90", "sm_90a", kNumConfigs, config_names(), &supports_sm, &select, &can_run,
      &workspace_bytes,   &run,    &prefers_generic, &dispatch_rules,
  };
  return api;
}

}  // namespace nvfp4_gemm::sm90
