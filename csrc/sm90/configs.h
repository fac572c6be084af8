// The one table of SM90 kernel configurations. Dispatch (select), the config-name listing
// (BackendApi::config_names), the forced-config path and the generated instantiation files
// (csrc/sm90/generated/, written by csrc/sm90/generate.py from the X-macro below) all come from it.
//
// Every config computes a 128-row slice of B (the weights: 2 consumer warpgroups x wgmma M = 64) against
// a tile of TOKENS rows of A (wgmma N), K in stages of KT. What varies:
//  - the token tile (the wgmma N): small M wastes no MMA work on padding rows, large M reuses each
//    decoded B fragment over more tokens;
//  - KT: 256 where B bandwidth rules (M <= 64): 128-byte B row segments per stage instead of 64 (v2 at
//    KT = 128 read B at 1.2-1.5 TB/s, half the copy rate), and half the barrier round trips per byte;
//    128 at 128 / 256 tokens, where decoded A (tokens x KT x 2 bytes) would leave room for 2 stages only;
//  - the pipeline depth: as many stages as fit in 227 KB.
// The grid (one CTA per tile, or a balanced split over whole waves) is chosen per problem at run time
// (choose_split in split_plan.h), not per config.
#pragma once

#include <cstdint>

// X(TOKENS, KT, STAGES, CTAS_PER_SM). Stage bytes = TOKENS * KT * 2 (decoded A, fp16) + 64 * KT (packed B)
// + 8 * KT (scales). CTAS_PER_SM = 2 (M <= 16) measured no faster at M = 1 and slower at M = 16
// (docs/SM90_NOTES.md, v5), so every entry runs one CTA per SM.
#define NVFP4_SM90_CONFIGS(X) \
  X(8, 256, 10, 1)            \
  X(16, 256, 8, 1)            \
  X(32, 256, 6, 1)            \
  X(64, 256, 4, 1)            \
  X(128, 128, 5, 1)           \
  X(256, 128, 3, 1)

// The small-M streaming kernel (sm90_small_m.cuh): mma.sync m16n8k16, 128 B rows x a K split per CTA, B
// streamed from global memory either through registers or through a per-thread shared-memory ring.
// X(TOKENS, KBMAX, DEPTH, CTAS, RING): TOKENS = 8 x n-tiles; KBMAX = the most 256-K blocks per CTA the
// automatic split picks (decoded A in shared memory is KB x tokens x 576 bytes, kept small enough for CTAS
// CTAs per SM); CTAS = CTAs per SM (the launch bound: 128 registers a thread at 2, 80 at 3); RING = 0: B
// through a register buffer of DEPTH K blocks per lane (18 registers each); RING = R: B through an R-stage
// cp.async ring (DEPTH unused), A staged for the live tokens only, splits of up to kMaxClusterSplits reduced in
// a cluster. Measured (H100, graph per call, docs/NOTES.md "v3"): the ring with 16 tokens, 2 stages, 2 CTAs
// per SM took (1, 28672, 4096) 29.2-31.5 us against 34.4-34.6 for the 8-token register config and 36.2-36.6
// for the 16-token one, and (16, 6144, 4096) 14.4 against 16.4; at (1, 1024 .. 6144, 4096) and (1, 4096, 14336)
// the 8-token register config stays ahead (6.4 vs 7.8, 10.0 vs 10.7, 19.4 vs 21.4 us). 8-token rings (2-4
// CTAs, 2-3 stages) lost to it on most shapes (docs/NOTES.md). Earlier (SM90_NOTES.md v10): 8 tokens, 3
// CTAs of DEPTH 2 beat 2 of DEPTH 4 (40.7 vs 42.4 us at (1, 7168, 16384)) and 4 of DEPTH 1 (42.2).
#define NVFP4_SM90_SMALL_M_CONFIGS(X) \
  X(8, 16, 2, 3, 0)                   \
  X(16, 7, 0, 2, 2)                   \
  X(32, 6, 3, 2, 0)

// The K-sliced kernel (sm90_wk.cuh): 128 B rows per CTA, 256-K stages through a TMA pipeline, each stage's K
// split across the 8 consumer warps; NVFP4 or fp16 / bf16 A with K % 256 == 0.
// X(TOKENS, STAGES, CTAS_PER_SM): stage bytes = 16 KB of B + 2 KB of scales + A: TOKENS x 512 (16-bit A) or
// TOKENS x 128 + 2 KB of scales (NVFP4 A).
#define NVFP4_SM90_WK_CONFIGS(X) \
  X(8, 4, 2)                     \
  X(16, 4, 2)

namespace nvfp4_gemm::sm90 {

enum class Kind : int { kWgmma = 0, kSmallM = 1, kWarpK = 2 };

struct KernelConfig {
  const char* name;
  Kind kind;
  int tokens;  // wgmma N (rows of A per CTA tile) / tokens per small-M CTA (8 per mma n-tile)
  int kt;      // K per pipeline stage (wgmma); K blocks of 256 per CTA at most (small-M)
  int stages;  // TMA pipeline depth (wgmma); B blocks in flight per lane (small-M)
  int ctas_per_sm;
  int ring = 0;  // small-M: stages of the shared-memory B ring, 0 for the register buffer
};

#define NVFP4_SM90_NAME(T, KT, S, B) "sm90_nvfp4_w128xt" #T "xk" #KT "_s" #S "_b" #B "_ws_rs"
#define NVFP4_SM90_SMALL_M_NAME(T, KB, D, B, R) "sm90_nvfp4_smallm_w128xt" #T "_kb" #KB "_d" #D "_b" #B "_r" #R "_mma16816"
#define NVFP4_SM90_WK_NAME(T, S, B) "sm90_nvfp4_wk_w128xt" #T "xk256_s" #S "_b" #B "_tma_mma16816"
#define NVFP4_SM90_ENTRY(T, KT, S, B) KernelConfig{NVFP4_SM90_NAME(T, KT, S, B), Kind::kWgmma, T, KT, S, B},
#define NVFP4_SM90_SMALL_M_ENTRY(T, KB, D, B, R) KernelConfig{NVFP4_SM90_SMALL_M_NAME(T, KB, D, B, R), Kind::kSmallM, T, KB, D, B, R},
#define NVFP4_SM90_WK_ENTRY(T, S, B) KernelConfig{NVFP4_SM90_WK_NAME(T, S, B), Kind::kWarpK, T, 256, S, B},
// wgmma entries first, then the small-M ones, then the K-sliced ones: indices are what select / run /
// NVFP4_GEMM_CONFIG use.
inline constexpr KernelConfig kConfigs[] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_ENTRY)
                                                NVFP4_SM90_SMALL_M_CONFIGS(NVFP4_SM90_SMALL_M_ENTRY)
                                                    NVFP4_SM90_WK_CONFIGS(NVFP4_SM90_WK_ENTRY)};
#undef NVFP4_SM90_ENTRY
#undef NVFP4_SM90_SMALL_M_ENTRY
#undef NVFP4_SM90_WK_ENTRY
inline constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);


// ---------------------------------------------------------------------------------------------------
// Dispatch: which config runs which M, in one place. select() takes the first row whose m_max >= M and
// runs its config if can_run accepts the problem, else the row's fallback; prefers_generic() reads the
// same row. Measurements behind the bounds (H100; docs/SM90_NOTES.md, benchmarks/RESULTS.md):
//  - kSmallMMaxM: the small-M kernel measured faster than the wgmma config of the same token tile up to
//    M = 32 (v10, do_bench us, small-M vs wgmma): (1, 7168, 16384) 40.7 vs 45.6, (8, 7168, 16384) 41.0 vs
//    45.2, (16, 4096, 7168) 22.0 vs 24.2, (32, 4096, 7168) 23.8 vs 25.2, (1, 4096, 7168) 19.6 vs 23.4. Its
//    fallback is for problems whose decoded A does not fit in shared memory.
//  - kPreferGenericFromM: from here automatic dispatch hands the problem to the generic path (decode +
//    cuBLAS), measured faster there (commit 71a8664): M = 2304 (N 4608, K 7168) 259.7 us generic vs 272.1
//    us here; at M = 512 this backend is ahead (69.0 vs 78.0 us). A forced sm90 still runs the row's config.
//  - Otherwise the wgmma config whose token tile is the smallest >= M (at most 256).
inline constexpr int64_t kSmallMMaxM = 32;
inline constexpr int64_t kPreferGenericFromM = 2048;

struct Pick {
  Kind kind;
  int tokens;  // 0: none
};
inline constexpr Pick kNoPick{Kind::kWgmma, 0};

// One exception to the rows below (select in backend.cu): where the 8-token small-M config would run
// unsplit (many row blocks, e.g. an MLP up-projection N = 28672 at K = 4096) and the 16-token one holds every
// row block in one wave, the 16-token (ring) config runs instead: it stages only the live tokens and streams
// B through its shared-memory ring (29.2-31.5 vs 34.4-34.6 us at (1, 28672, 4096), above).
inline constexpr Pick kDeepSmallM{Kind::kSmallM, 16};

// The K-sliced kernel (sm90_wk.cuh) takes NVFP4, 16-bit and float A quantized on the fly (linear's W4A4:
// quantized into the workspace by the call, then run as NVFP4 A) at every M <= 16 with K % 256 == 0: 8 tokens
// at M 1..8, 16 at M 9..16. W4A4 (bench_model 8B stack, H100, docs/NOTES.md v8): static / dynamic 0.45 / 0.48
// of fp16 at M = 1 and 0.52 / 0.57 at M = 16, against 0.52 / 0.58 and 0.83 / 0.89 on the small-M kernels
// (seventh session). For the weight-only form: since its producer fills the pipeline only after the first
// stage has landed (docs/NOTES.md v6; H100, weight-only fp16, graph per call, same run) it is ahead of the
// small-M configs on every decode shape measured: (1, 6144, 4096) 10.4 us vs 12.7 for the register config, (16, 6144, 4096) 12.3
// vs 15.6 and (16, 4096, 4096) 9.6 vs 10.9 for the ring config, (16, 1024, 4096) 6.7 vs 7.2.
inline constexpr Pick kWkPick{Kind::kWarpK, 16};
inline constexpr Pick kWkPick8{Kind::kWarpK, 8};
inline constexpr int64_t kWkMaxM = 16;

struct DispatchRow {
  int64_t m_max;  // the row takes M <= m_max (first match in order); -1: every M left
  Pick config;
  Pick fallback;  // where `config` cannot run the problem (can_run says why); kNoPick: none
  bool prefer_generic;
};

inline constexpr DispatchRow kDispatch[] = {
    // M <=                  config                 fallback              generic first
    {8,                      {Kind::kSmallM, 8},    {Kind::kWgmma, 8},    false},
    {16,                     {Kind::kSmallM, 16},   {Kind::kWgmma, 16},   false},
    {kSmallMMaxM,            {Kind::kSmallM, 32},   {Kind::kWgmma, 32},   false},
    {64,                     {Kind::kWgmma, 64},    kNoPick,              false},
    {128,                    {Kind::kWgmma, 128},   kNoPick,              false},
    {kPreferGenericFromM - 1, {Kind::kWgmma, 256},  kNoPick,              false},
    {-1,                     {Kind::kWgmma, 256},   kNoPick,              true},
};
inline constexpr int kNumDispatchRows = sizeof(kDispatch) / sizeof(kDispatch[0]);

constexpr const DispatchRow& dispatch_row(int64_t m) {
  for (int i = 0; i + 1 < kNumDispatchRows; ++i)
    if (m <= kDispatch[i].m_max) return kDispatch[i];
  return kDispatch[kNumDispatchRows - 1];
}

// The kConfigs index of a pick (wgmma: the one-CTA-per-SM entry of that token tile), -1 if none.
constexpr int config_index(Pick pick) {
  if (pick.tokens == 0) return -1;
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].kind == pick.kind && kConfigs[i].tokens == pick.tokens &&
        (pick.kind != Kind::kWgmma || kConfigs[i].ctas_per_sm == 1))
      return i;
  return -1;
}

constexpr bool dispatch_table_is_valid() {
  for (int i = 0; i < kNumDispatchRows; ++i) {
    const DispatchRow& r = kDispatch[i];
    if (config_index(r.config) < 0 || (r.fallback.tokens != 0 && config_index(r.fallback) < 0)) return false;
    if ((i + 1 < kNumDispatchRows) != (r.m_max >= 1)) return false;  // bounded rows, then one unbounded
    if (i > 0 && i + 1 < kNumDispatchRows && r.m_max <= kDispatch[i - 1].m_max) return false;
    if (r.config.tokens < 256 && r.m_max > r.config.tokens) return false;  // a token tile covers its rows in one tile
  }
  return true;
}
static_assert(dispatch_table_is_valid(), "every row names compiled configs; rows ascend in M, the last is unbounded");
static_assert(config_index(kWkPick) >= 0 && kConfigs[config_index(kWkPick)].kind == Kind::kWarpK &&
                  config_index(kWkPick8) >= 0 && kConfigs[config_index(kWkPick8)].kind == Kind::kWarpK,
              "kWkPick / kWkPick8 name compiled K-sliced configs");
static_assert(kDispatch[0].config.kind == Kind::kSmallM && kDispatch[0].config.tokens == 8 &&
                  kDeepSmallM.kind == Kind::kSmallM && kDeepSmallM.tokens == 16,
              "kDeepSmallM stands in for the first row's 8-token small-M config (select, dispatch_rules)");
static_assert(kConfigs[config_index(dispatch_row(1).config)].kind == Kind::kSmallM &&
                  kConfigs[config_index(dispatch_row(33).config)].tokens == 64 &&
                  dispatch_row(kPreferGenericFromM).prefer_generic &&
                  !dispatch_row(kPreferGenericFromM - 1).prefer_generic,
              "dispatch_row follows the table");

}  // namespace nvfp4_gemm::sm90
