// SM90 grouped (mixture-of-experts) GEMM: the GroupedBackendApi table (common/grouped.h) over the grouped
// K-sliced kernel (grouped_wk.cuh). Torch-free. One launch per call, whatever the routing: the work list is
// built on the device from offs, so the launch path reads nothing back and a captured graph follows the routing
// of each replay.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "common/grouped.h"
#include "common/pdl.h"
#include "common/stream_slots.h"
#include "sm90/backend.h"
#include "sm90/grouped.h"
#include "sm90/grouped_wk.cuh"
#include "sm90/tensor_map.h"

namespace nvfp4_gemm::sm90 {

#define NVFP4_SM90_GROUPED_EXTERN(T, S, B)                                                \
  static_assert(S == gwk_stages(T) && B == gwk_ctas(T),                                   \
                "NVFP4_SM90_GROUPED_CONFIGS names the kernel's depth and CTAs per SM");   \
  extern template cudaError_t launch_gwk<T, AType::kE2m1>(const GwkLaunch&);              \
  extern template cudaError_t launch_gwk<T, AType::kFloat16>(const GwkLaunch&);           \
  extern template cudaError_t launch_gwk<T, AType::kBFloat16>(const GwkLaunch&);          \
  extern template int gwk_ctas_per_sm<T, AType::kE2m1>(int);                              \
  extern template int gwk_ctas_per_sm<T, AType::kFloat16>(int);                           \
  extern template int gwk_ctas_per_sm<T, AType::kBFloat16>(int);
NVFP4_SM90_GROUPED_CONFIGS(NVFP4_SM90_GROUPED_EXTERN)
#undef NVFP4_SM90_GROUPED_EXTERN

namespace {

using GwkLaunchFn = cudaError_t (*)(const GwkLaunch&);
using GwkCtasFn = int (*)(int);
#define NVFP4_SM90_GROUPED_LAUNCH(T, S, B) \
  {&launch_gwk<T, AType::kE2m1>, &launch_gwk<T, AType::kFloat16>, &launch_gwk<T, AType::kBFloat16>},
constexpr GwkLaunchFn kGwkLaunch[][3] = {NVFP4_SM90_GROUPED_CONFIGS(NVFP4_SM90_GROUPED_LAUNCH)};
#undef NVFP4_SM90_GROUPED_LAUNCH
#define NVFP4_SM90_GROUPED_CTAS(T, S, B) \
  {&gwk_ctas_per_sm<T, AType::kE2m1>, &gwk_ctas_per_sm<T, AType::kFloat16>, &gwk_ctas_per_sm<T, AType::kBFloat16>},
constexpr GwkCtasFn kGwkCtas[][3] = {NVFP4_SM90_GROUPED_CONFIGS(NVFP4_SM90_GROUPED_CTAS)};
#undef NVFP4_SM90_GROUPED_CTAS
#define NVFP4_SM90_GROUPED_TOKENS(T, S, B) T,
constexpr int kGwkTokens[] = {NVFP4_SM90_GROUPED_CONFIGS(NVFP4_SM90_GROUPED_TOKENS)};
#undef NVFP4_SM90_GROUPED_TOKENS
constexpr int kNumGwk = sizeof(kGwkTokens) / sizeof(kGwkTokens[0]);
// The K-sliced configs, then the wgmma ones (grouped_wgmma.cu).
#define NVFP4_SM90_GROUPED_NAME_ENTRY(T, S, B) NVFP4_SM90_GROUPED_NAME(T, S, B),
#define NVFP4_SM90_GROUPED_WGMMA_NAME_ENTRY(T, KT, S, W) NVFP4_SM90_GROUPED_WGMMA_NAME(T, KT, S, W),
constexpr const char* kGroupedNames[] = {NVFP4_SM90_GROUPED_CONFIGS(NVFP4_SM90_GROUPED_NAME_ENTRY)
                                             NVFP4_SM90_GROUPED_WGMMA_CONFIGS(NVFP4_SM90_GROUPED_WGMMA_NAME_ENTRY)};
#undef NVFP4_SM90_GROUPED_NAME_ENTRY
#undef NVFP4_SM90_GROUPED_WGMMA_NAME_ENTRY
constexpr int kNumGrouped = sizeof(kGroupedNames) / sizeof(kGroupedNames[0]);
static_assert(kNumGrouped == kNumGwk + kNumGroupedWgmma, "the wgmma configs after the K-sliced ones");
// The wgmma configs by tile: the 128-row ones, then the 256-row 80- and 128-token ones (grouped.h's order).
constexpr int kWgmma64 = kNumGwk, kWgmma128 = kNumGwk + 1, kWgmma80 = kNumGwk + 2, kWgmma256 = kNumGwk + 3,
              kWgmma160 = kNumGwk + 4, kWgmma32 = kNumGwk + 5, kWgmmaW256x80 = kNumGwk + 6,
              kWgmmaW256x128 = kNumGwk + 7;
constexpr bool is_wgmma(int config) { return config >= kNumGwk; }
static_assert(static_cast<int>(AType::kE2m1) == 0 && static_cast<int>(AType::kFloat16) == 1 &&
                  static_cast<int>(AType::kBFloat16) == 2,
              "the launch tables' columns are AType values");

// Rows per group (on average, over all groups: what the host knows without reading offs) from which the
// 16-token config runs. A work item decodes its weight tile once for up to TOKENS rows of its group, so a group
// of m rows costs ceil(m / TOKENS) decodes of each of its tiles: at 8 rows per group on average about half the
// groups of a random routing hold more than 8 and would need two 8-token chunks. Below that the 8-token config's
// deeper pipeline wins. Measured (H200, MoE layer gate_up + down, bf16 A, each config forced): 4 rows per group
// 110.5 vs 128.1 us (Qwen3-30B-A3B, 64 tokens) and 1410 vs 1695 (DeepSeek-V3, 64) for the 8-token config; 8 rows
// 2105 vs 2401 (DeepSeek-V3, 256) and 16 rows 203.3 vs 247.0 (Qwen3, 256) for the 16-token one. A 32-token
// config (one CTA per SM) lost to the 16-token one at 16, 64 and 128 rows per group (275.4 / 735.3 / 6865 us
// against 203.3 / 596.1 / 5404) and was removed.
constexpr int64_t kGwk16FromRowsPerGroup = 8;
// Rows per group (on average) from which the wgmma configs run, each B tile decoded once per 64 or
// 128 rows of a group instead of once per 16. The K-sliced 16-token config against the 64-token wgmma one (H200, MoE
// layer gate_up + down, each config forced, layer us, bf16 / e2m1 A; since the wgmma producer's lookup decode):
//    8 rows  142.3 /  150.6 vs  236.8 /  239.8 (Qwen3-30B-A3B, 128 tokens)   2053 / 2192 vs 3793 / 3578 (DeepSeek-V3)
//   16 rows  204.8 /  221.9 vs  238.8 /  243.2 (Qwen3, 256)                   3228 / 3422 vs 3953 / 3837 (DeepSeek-V3)
//            459.9 /  499.6 vs  444.6 /  446.2 (Mixtral-8x7B, 64)
//   20 rows  248.9 /  267.2 vs  242.1 /  245.0 (Qwen3, 320)                   4070 / 4222 vs 3954 / 3754 (DeepSeek-V3)
//            502.6 /  549.2 vs  446.1 /  448.1 (Mixtral, 80)
//   24 rows  281.2 (bf16) vs 239.6 (Qwen3, 384), 4583 vs 3957 (DeepSeek-V3, 768), 555.0 vs 447.3 (Mixtral, 96)
//   32 rows  336.4 vs 242.6 (Qwen3, 512), 5383 vs 4867 (DeepSeek-V3, 1024), 719.5 vs 447.7 (Mixtral, 128)
// (the 16-token one's decode per 16 rows grows with the rows, the 64-token one's time stays flat until its tile
// fills). Under skew (bench_moe's Zipf routing, w4a16, us, 16-token / 64-token): 20 rows 249.9 / 260.2 (Qwen3),
// 498.3 / 446.6 (Mixtral), 3885 / 4707 (DeepSeek-V3, where the many small groups each pay a 64-row tile); 24 rows
// 277.2 / 278.0, 528.8 / 565.6, 4446 / 4400; 32 rows 344.4 / 295.3, 720.9 / 566.0, 5393 / 4803. So the 64-token
// one from 24 rows: uniform routing gains 9-37% from there; skew costs up to 7% at 24 and gains 11-21% from 32
// (the 32-token tile below has since taken 20-28).
// Before that decode (history): 16-token / 64-token / 128-token config:
// 32 rows 5240 / 5353 / 8571 (DeepSeek-V3, 1024); 64 rows 596.3 / 442.4 / 488.1 (Qwen3, 1024) and 1208 / 693.5 /
// 808.4 (Mixtral-8x7B, 256); 128 rows 18071 / 13150 / 13920 (DeepSeek-V3, 4096); 256 rows 2168 / 1296 / 1191
// (Qwen3, 4096) and 4346 / 2231 / 2264 (Mixtral, 1024); 1024 rows 16964 / 8429 / 7570 (Mixtral, 4096).
// The 80-token config (a tile that holds a group of ~64 rows whole, where 64-row tiles need two for half the groups)
// against the 64-token one, same run: 64 rows 332.4 / 450.8 (Qwen3, 1024) and 563.2 / 737.4 (Mixtral, 256); 128
// rows 649.7 / 745.3 (Qwen3, 2048); 256 rows 2166 / 2308 (Mixtral, 1024, where the 128-token config took 2264); 512
// rows 4322 / 4654 (Mixtral, 2048). It takes over from 56 rows per group (where about one group in seven outgrows a
// 64-row tile; 40-56 not measured).
// The 256-token config (the dense large-M pipeline: each decoded B fragment feeds 256 rows of a group), against the
// 80-token and 128-token ones in the same runs (layer us, bf16 A, t80 / t128 / t256; groups of a uniform routing
// hold their average +- a few sqrt(average) rows):
//    64 rows  280.8 /   352.3 /   489.5 (Qwen3, 1024 tokens)
//    80 rows  399.5 /   360.0 /   492.3 (Qwen3, 1280)      721.1 /  653.8 /  946.5 (Mixtral, 320)
//    96 rows  553.3 /   383.3 /   509.1 (Qwen3, 1536)      952.8 /  653.2 /  954.3 (Mixtral, 384)
//             9590 /   7056 /  10764 (DeepSeek-V3, 3072)
//   112 rows  575.2 /   424.0 /   526.9 (Qwen3, 1792)     1047.2 /  717.4 /  948.0 (Mixtral, 448)
//   128 rows  592.6 /   580.2 /   548.4 (Qwen3, 2048)     1008.1 / 1016.0 /  938.5 (Mixtral, 512)
//             9986 /  11415 /  12267 (DeepSeek-V3, 4096)
//   192 rows 1484.2 /  1460.2 /   958.5 (Mixtral, 768)
//   256 rows 1131.2 /      - /   999.5 (Qwen3, 4096)     2000.8 / 2041.4 / 1712.1 (Mixtral, 1024)
//   512 rows 3756.1 /  3471.1 /  2650.4 (Mixtral, 2048)
//  1024 rows 8268.1 /  7109.8 /  5145.4 (Mixtral, 4096)
// So the 128-token tile from 80 rows, where a group needs one of it and two of 80; near 128 rows, where half the
// groups spill a few rows into a second 128-row tile, two 80-row tiles hold a group whole (DeepSeek-V3's long-K
// experts, MMA-bound, lose 14% in the spill; Qwen3 and Mixtral are within 8% either way): the 80-token config again
// from 120; the 256-token one from 160, where every group needs two 128-row tiles or one of 256, and decoding B once
// for all of them wins.
// The 160-token tile (a group of 128 + 2 sqrt(128) rows whole, one decode of each B tile a group) then took 120-160
// from the 80-token one. Same run, t128 / t80 / t256 / t160, bf16 A, layer us:
//   112 rows  424.6 /  581.8 /  531.8 /  436.8 (Qwen3, 1792)    657.9 /  966.4 /  940.7 /  786.8 (Mixtral, 448)
//   128 rows  576.3 /  591.3 /  552.1 /  466.2 (Qwen3, 2048)   1058.4 / 1027.8 /  960.8 /  825.0 (Mixtral, 512)
//                      10149 (t80) / 8621 (t160) (DeepSeek-V3, 4096; e2m1 A 10229 / 9473)
//   144 rows  766.5 /  622.6 /  568.4 /  522.1 (Qwen3, 2304)   1363.7 / 1031.4 /  947.7 /  773.5 (Mixtral, 576)
// And the 32-token tile (K 256 a stage, 6 deep) between the 16-token K-sliced config and the 64-token tile, where
// a group of ~24 rows fits one 32-row tile (t16 / t64 / t32, bf16 A):
//    16 rows  203.8 /  235.6 /  213.2 (Qwen3, 256)   466.6 / 451.7 / 406.4 (Mixtral, 64)   3172 / 3852 / 3258 (DS-V3)
//    24 rows  282.7 /  239.8 /  228.6 (Qwen3, 384)   562.2 / 454.6 / 406.1 (Mixtral, 96)   4532 / 4066 / 3471
//    32 rows  336.0 /  242.4 /  295.6 (Qwen3, 512)   718.0 / 443.6 / 583.1 (Mixtral, 128)  5374 / 4534 / 4847
// so the 32-token tile from 20 rows (16 rows: within 5% of the 16-token config, 24: 5-15% ahead of the 64-token one)
// and the 64-token one from 28 (at 32 rows half the groups need a second 32-row tile).
// The 80- and 128-token tiles over 256 weight rows (four consumer warpgroups) against the same tiles over 128 rows and
// the 160-token one (H200, 2026-11-30, bf16 A, layer us; w128 t80 / w256 t80 / w128 t128 / w256 t128 / w128 t160):
//    48 rows  266.0 / 244.3 /     - / 286.2 / 370.2 (Qwen3, 768)
//    64 rows  285.9 / 252.7 / 351.5 / 297.4 / 384.0 (Qwen3, 1024)   493.1 / 470.7 / - / 548.4 / 712.3 (Mixtral, 256)
//             5090 / 4290 / - / 5346 / 7574 (DeepSeek-V3, 2048)
//    96 rows  549.8 / 471.1 /     - / 315.2 / 408.6 (Qwen3, 1536; the 128-row t128 took 383.3 in the table above)
//   128 rows  586.4 / 487.3 / 575.4 / 458.2 / 460.8 (Qwen3, 2048)   965.0 / 946.4 / - / 961.4 / 749.5 (Mixtral, 512)
//             10479 / 8717 / - / 7552 / 8615 (DeepSeek-V3, 4096)
//   256 rows  Mixtral 1024: w128 t128 1752.8, w256 t128 1635.5, t160 1506.3
// So each 256-row tile takes its 128-row counterpart's band (a weight tile of 256 rows needs N > 128 to be full),
// and the 160-token tile keeps 120-160, where Mixtral's spill of ~128-row groups into a second 128-token tile costs
// the 256-row tile 28% (Qwen3 and DeepSeek-V3, whose tiles are many more, are level or ahead there).
constexpr int64_t kWgmma32FromRowsPerGroup = 20;
constexpr int64_t kWgmma64FromRowsPerGroup = 28;
constexpr int64_t kWgmma80FromRowsPerGroup = 56;
constexpr int64_t kWgmma128FromRowsPerGroup = 80;
constexpr int64_t kWgmma160FromRowsPerGroup = 120;
constexpr int64_t kWgmma256FromRowsPerGroup = 160;

// A failed runtime call's error, also taken out of the thread's last-error slot.
cudaError_t consumed(cudaError_t e) {
  if (e != cudaSuccess) cudaGetLastError();
  return e;
}

bool a4_of(const GroupedProblem& p) { return p.a_type == AType::kE2m1; }

int smem_of(const GroupedProblem& p, int config) {
  return gwk_smem_bytes(kGwkTokens[config], a4_of(p), static_cast<int>(p.g));
}

// One wave: the SMs times the CTAs each holds with this problem's shared memory (8 and 16 tokens: two up to ~460
// and ~1200 groups).
int grid_of(const GroupedProblem& p, int config, const DeviceInfo* dev) {
  const int ctas = kGwkCtas[config][static_cast<int>(p.a_type)](smem_of(p, config));
  return std::max(1, dev->num_sms) * std::clamp(ctas, 1, 2);
}

struct Layout {
  int64_t partial_bytes = 0;  // [grid][TOKENS][128] fp32
  int64_t counter_bytes = 0;  // kSplitCounterRows words, where no counter slot is free
  int64_t bytes() const { return partial_bytes + counter_bytes; }
};

Layout layout_of(const GroupedProblem& p, int config, const DeviceInfo* dev) {
  Layout l;
  l.partial_bytes = round_up(static_cast<int64_t>(grid_of(p, config, dev)) * kGwkTokens[config] * kWkRows * 4, 256);
  l.counter_bytes = round_up(int64_t{kSplitCounterRows} * 4, 256);
  return l;
}

bool check(const GroupedProblem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len) {
  auto no = [&](const char* fmt, auto... args) {
    if (why && why_len) std::snprintf(why, why_len, fmt, args...);
    return false;
  };
  if (config < 0 || config >= kNumGrouped)
    return no("sm90 grouped: config %d out of range [0, %d)", static_cast<int>(config), kNumGrouped);
  if (dev == nullptr || dev->sm != 90)
    return no("sm90 grouped: needs an SM 9.0 device (sm_90a code), got SM %d", dev ? static_cast<int>(dev->sm) : -1);
  if (p->a_type != AType::kE2m1 && p->a_type != AType::kFloat16 && p->a_type != AType::kBFloat16)
    return no("sm90 grouped: A must be packed NVFP4, float16 or bfloat16 (float32 activations: cast them, or use the "
              "generic backend), got a_type %d", static_cast<int>(p->a_type));
  if (p->k % kWkK != 0 || p->k <= 0)
    return no("sm90 grouped: K must be a positive multiple of 256, got %lld", static_cast<long long>(p->k));
  if (p->g < 1 || p->g > kGwkMaxGroups)
    return no("sm90 grouped: at most %d groups, got %lld", kGwkMaxGroups, static_cast<long long>(p->g));
  if (p->t < 0 || p->t > (int64_t{1} << 30) || p->n < 8 || p->n > (int64_t{1} << 30) || p->k > (int64_t{1} << 30))
    return no("sm90 grouped: T and N must be within 2^30 (32-bit indexing), got T %lld, N %lld",
              static_cast<long long>(p->t), static_cast<long long>(p->n));
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(p->a) || misaligned(p->b) || misaligned(p->sfb) || p->lda % 16 != 0 || p->ldb % 16 != 0 ||
      p->b_group_bytes % 16 != 0 || (a4_of(*p) && p->t > 0 && misaligned(p->sfa)))
    return no("sm90 grouped: a, b, sfb (and sfa) must be 16-byte aligned with rows and groups 16 bytes apart (TMA "
              "and bulk copies); got lda %lld, ldb %lld, b_group_bytes %lld", static_cast<long long>(p->lda),
              static_cast<long long>(p->ldb), static_cast<long long>(p->b_group_bytes));
  if (p->ldb < p->k / 2 || p->b_group_bytes < p->n * p->ldb)
    return no("sm90 grouped: b's rows must not overlap (ldb %lld >= K/2, b_group_bytes %lld >= N x ldb)",
              static_cast<long long>(p->ldb), static_cast<long long>(p->b_group_bytes));
  if (is_wgmma(config)) return grouped_wgmma_check(*p, config - kNumGwk, why, why_len);
  const int64_t tokens = kGwkTokens[config];
  const int64_t max_tiles = (ceil_div(p->t, tokens) + p->g) * ceil_div(p->n, kWkRows);
  if (max_tiles > (int64_t{1} << 30) / kGwkMaxSplits)
    return no("sm90 grouped: (T / %lld + G) x N / 128 = %lld work items exceed the kernel's 32-bit work indices",
              static_cast<long long>(tokens), static_cast<long long>(max_tiles));
  if (a4_of(*p) && p->t > 0) {  // T = 0 writes nothing and reads no scale
    if (p->sfa == nullptr || p->sfa_rows < kSfAtomRows || p->sfa_rows % kSfAtomRows != 0)
      return no("sm90 grouped: NVFP4 A needs sfa with a positive multiple of 128 padded rows, got %lld",
                static_cast<long long>(p->sfa_rows));
    if (p->sfa_rows / kSfAtomRows > INT_MAX)
      return no("sm90 grouped: sfa_rows %lld too large", static_cast<long long>(p->sfa_rows));
  }
  if (smem_of(*p, config) > dev->smem_optin)
    return no("sm90 grouped: %d bytes of shared memory needed for %lld groups, the device allows %lld",
              smem_of(*p, config), static_cast<long long>(p->g), static_cast<long long>(dev->smem_optin));
  return true;
}

int32_t select(const GroupedProblem* p, const DeviceInfo* dev, char* why, size_t why_len) {
  const bool wide = p->n > 128;  // a 256-row weight tile holds more than one 128-row block of N
  for (const auto& [config, from] : {std::pair{kWgmma256, kWgmma256FromRowsPerGroup},
                                     std::pair{kWgmma160, kWgmma160FromRowsPerGroup},
                                     std::pair{wide ? kWgmmaW256x128 : kWgmma128, kWgmma128FromRowsPerGroup},
                                     std::pair{wide ? kWgmmaW256x80 : kWgmma80, kWgmma80FromRowsPerGroup},
                                     std::pair{kWgmma64, kWgmma64FromRowsPerGroup},
                                     std::pair{kWgmma32, kWgmma32FromRowsPerGroup}})
    if (p->t >= from * p->g && check(p, config, dev, nullptr, 0)) return config;
  const int config = p->t >= kGwk16FromRowsPerGroup * p->g ? 1 : 0;
  static_assert(std::size(kGwkTokens) == 2 && kGwkTokens[0] == 8 && kGwkTokens[1] == 16,
                "select names the 8- and 16-token configs");
  return check(p, config, dev, why, why_len) ? config : -1;
}

bool can_run(const GroupedProblem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len) {
  return check(p, config, dev, why, why_len);
}

size_t workspace_bytes(const GroupedProblem* p, int32_t config, const DeviceInfo* dev) {
  if (config < 0 || config >= kNumGrouped || dev == nullptr) return 0;
  if (is_wgmma(config)) return grouped_wgmma_workspace(*p);
  return static_cast<size_t>(layout_of(*p, config, dev).bytes());
}

// Tests (torch.ops.nvfp4_gemm._sm90_grouped_workspace_counters): every following split launch counts on
// workspace counters zeroed ahead of it, the path a process takes once its per-stream slots run out.
std::atomic<bool>& workspace_counters_forced() {
  static std::atomic<bool> v{false};
  return v;
}

// Split-counter slots per stream (split_counters.cuh: each config unit keeps its own counters, zero between
// launches); -1 where none is free: the launch then counts on workspace counters zeroed ahead of it.
int counter_slot(cudaStream_t stream) {
  static StreamSlots* slots = new StreamSlots(kSplitCounterSlots);  // never destroyed: launches may come at exit
  if (workspace_counters_forced().load(std::memory_order_relaxed)) return -1;
  int index = -1;
  if (slots->get(stream, &index) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return index;
}

// Tests and benchmarks (torch.ops.nvfp4_gemm._sm90_grouped_force_splits): the split count of every following
// grouped launch in this process, where the buffers allow it (0: automatic).
std::atomic<int>& forced_grouped_splits() {
  static std::atomic<int> v{0};
  return v;
}

bool run(const GroupedProblem* p, int32_t config, const DeviceInfo* dev, void* workspace, size_t ws_bytes,
         cudaStream_t stream, char* err, size_t err_len) {
  if (!check(p, config, dev, err, err_len)) return false;
  if (p->t == 0) return true;  // no rows: nothing to write
  if (is_wgmma(config))
    return grouped_wgmma_run(*p, config - kNumGwk, *dev, workspace, ws_bytes, stream, err, err_len);
  const Layout lay = layout_of(*p, config, dev);
  if (ws_bytes < static_cast<size_t>(lay.bytes()) || workspace == nullptr) {
    set_msg(err, err_len, "sm90 grouped: workspace smaller than workspace_bytes() asked for");
    return false;
  }
  const int tokens = kGwkTokens[config];
  const bool a4 = a4_of(*p);
  GwkLaunch l{};
  GwkParams& gp = l.params;
  // A: all T rows; a chunk's box starts at its first row, rows past T read as zero.
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(a4 ? p->k / 2 : p->k), static_cast<cuuint64_t>(p->t)};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(p->lda)};
  const cuuint32_t a_box[2] = {a4 ? static_cast<cuuint32_t>(kWkK / 2) : 64u, static_cast<cuuint32_t>(tokens)};
  const CUtensorMapDataType a_dtype = a4 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                      : p->a_type == AType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if (!encode_map(&gp.tmap_a, a_dtype, 2, p->a, a_dims, a_strides, a_box, CU_TENSOR_MAP_SWIZZLE_128B)) {
    set_msg(err, err_len, "sm90 grouped: cuTensorMapEncodeTiled failed for A");
    return false;
  }
  // B: [g][n][k/2] bytes, one (group, 128-row block, 256-K stage) box at a time; rows past N read as zero.
  const cuuint64_t b_dims[3] = {static_cast<cuuint64_t>(p->k / 2), static_cast<cuuint64_t>(p->n),
                                static_cast<cuuint64_t>(p->g)};
  const cuuint64_t b_strides[2] = {static_cast<cuuint64_t>(p->ldb), static_cast<cuuint64_t>(p->b_group_bytes)};
  const cuuint32_t b_box[3] = {kWkK / 2, kWkRows, 1};
  if (!encode_map(&gp.tmap_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, p->b, b_dims, b_strides, b_box, CU_TENSOR_MAP_SWIZZLE_128B)) {
    set_msg(err, err_len, "sm90 grouped: cuTensorMapEncodeTiled failed for B");
    return false;
  }
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  l.grid = grid_of(*p, config, dev);
  l.smem = smem_of(*p, config);
  l.stream = stream;
  gp.sfb = p->sfb;
  gp.sfa = a4 ? p->sfa : nullptr;
  gp.offs = p->offs;
  gp.alpha = p->alpha;
  gp.c = p->c;
  gp.partial = reinterpret_cast<float*>(ws);
  gp.counters = reinterpret_cast<uint32_t*>(ws + lay.partial_bytes);
  gp.counter_slot = counter_slot(stream);
  gp.ldc = p->ldc;
  gp.row_blocks = static_cast<int>(ceil_div(p->n, kWkRows));
  gp.sf_atoms = static_cast<int>(p->k / 64);
  gp.sfb_group_bytes = static_cast<int64_t>(gp.row_blocks) * gp.sf_atoms * kSfAtomBytes;
  gp.t = static_cast<int>(p->t);
  gp.n = static_cast<int>(p->n);
  gp.k = static_cast<int>(p->k);
  gp.g = static_cast<int>(p->g);
  gp.kblocks = static_cast<int>(p->k / kWkK);
  gp.sfa_blocks = a4 ? static_cast<int>(p->sfa_rows / kSfAtomRows) : 1;
  gp.max_items = l.grid;
  gp.forced_splits = forced_grouped_splits().load(std::memory_order_relaxed);
  gp.offs_ready = p->offs_ready;
  gp.out_mult = 128.0f;  // B decoded with 2^7 folded into its scales (sm90_wk.cuh)
  gp.out_dtype = p->out_dtype;
  if (gp.counter_slot < 0) {  // graph-capturable; only when the stream's slots have run out
    if (const cudaError_t e = consumed(cudaMemsetAsync(gp.counters, 0, lay.counter_bytes, stream)); e != cudaSuccess) {
      if (err && err_len) std::snprintf(err, err_len, "sm90 grouped: zeroing the split counters failed: %s",
                                        cudaGetErrorString(e));
      return false;
    }
  }
  if (const cudaError_t e = consumed(kGwkLaunch[config][static_cast<int>(p->a_type)](l)); e != cudaSuccess) {
    if (err && err_len)
      std::snprintf(err, err_len, "sm90 grouped %s: launch failed (grid %d, %d bytes of shared memory): %s",
                    kGroupedNames[config], l.grid, l.smem, cudaGetErrorString(e));
    return false;
  }
  return true;
}

const char* grouped_dispatch_rules() {
  return "T < 8 x G (average rows per group < 8): " NVFP4_SM90_GROUPED_NAME(8, 4, 2) "\n"
         "T >= 8 x G: " NVFP4_SM90_GROUPED_NAME(16, 3, 2) "\n"
         "T >= 20 x G, G <= 512: " NVFP4_SM90_GROUPED_WGMMA_NAME(32, 256, 6, 128) "\n"
         "T >= 28 x G, G <= 512: " NVFP4_SM90_GROUPED_WGMMA_NAME(64, 256, 4, 128) "\n"
         "T >= 56 x G, G <= 512: " NVFP4_SM90_GROUPED_WGMMA_NAME(80, 128, 5, 256) " where N > 128, else "
         NVFP4_SM90_GROUPED_WGMMA_NAME(80, 256, 3, 128) "\n"
         "T >= 80 x G, G <= 512: " NVFP4_SM90_GROUPED_WGMMA_NAME(128, 128, 4, 256) " where N > 128, else "
         NVFP4_SM90_GROUPED_WGMMA_NAME(128, 128, 5, 128) "\n"
         "T >= 120 x G, G <= 512: " NVFP4_SM90_GROUPED_WGMMA_NAME(160, 128, 4, 128) "\n"
         "T >= 160 x G, G <= 512: " NVFP4_SM90_GROUPED_WGMMA_NAME(256, 128, 3, 128) "\n"
         "K % 256 != 0, float32 A or G > 4096: not on sm90 (refused with the reason)\n";
}

}  // namespace

int set_forced_grouped_splits(int splits) { return forced_grouped_splits().exchange(splits); }
bool set_workspace_counters_forced(bool on) { return workspace_counters_forced().exchange(on); }

const GroupedBackendApi& grouped_api() {
  // The device rule and target are the dense table's: one module, one -gencode.
  static const GroupedBackendApi api = {kGroupedAbiVersion, "sm90", backend_api().compiled_for, kNumGrouped,
                                        kGroupedNames, backend_api().supports_sm, &select, &can_run,
                                        &workspace_bytes, &run, &grouped_dispatch_rules};
  return api;
}

}  // namespace nvfp4_gemm::sm90
