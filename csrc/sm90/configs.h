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
// (choose_grid in backend.cu), not per config.
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

// The small-M streaming kernel (sm90_small_m.cuh): mma.sync m16n8k16 with B streamed from global memory
// through registers, 128 B rows x a K split per CTA. X(TOKENS, KBMAX, DEPTH): TOKENS = 8 x n-tiles;
// KBMAX = the most 256-K blocks per CTA the automatic split picks (more K per CTA = fewer fp32 partials
// to write and re-read; decoded A in shared memory is KB x TOKENS x 576 bytes); DEPTH = K blocks of B
// in flight per lane (18 registers each).
#define NVFP4_SM90_SMALL_M_CONFIGS(X) \
  X(8, 8, 4)                          \
  X(16, 8, 4)                         \
  X(32, 4, 3)

namespace nvfp4_gemm::sm90 {

// select() takes the small-M kernel up to this M: where it measured faster (docs/SM90_NOTES.md, v6, H200):
// M = 1 42.0 vs 43.0 us at (7168, 16384), 18.1 vs 21.5 us at (4096, 7168); M = 8 47.1 vs 43.2, M = 16
// 22.2 vs 22.3, M = 32 29.8 vs 23.6 (slower or equal there: the t8/t16/t32 entries stay forceable).
inline constexpr int kSmallMMaxM = 1;

// Automatic dispatch hands M >= this to the generic path (decode + cuBLAS), which measured faster there
// on the H100 (benchmarks/RESULTS.md, commit 71a8664): M = 2304 (N 4608, K 7168) 259.7 us generic vs
// 272.1 us here; at M = 512 this kernel is ahead (69.0 vs 78.0 us). A forced sm90 still runs any M.
inline constexpr int64_t kPreferGenericFromM = 2048;

enum class Kind : int { kWgmma = 0, kSmallM = 1 };

struct KernelConfig {
  const char* name;
  Kind kind;
  int tokens;  // wgmma N (rows of A per CTA tile) / tokens per small-M CTA (8 per mma n-tile)
  int kt;      // K per pipeline stage (wgmma); K blocks of 256 per CTA at most (small-M)
  int stages;  // TMA pipeline depth (wgmma); B blocks in flight per lane (small-M)
  int ctas_per_sm;
};

#define NVFP4_SM90_NAME(T, KT, S, B) "sm90_nvfp4_w128xt" #T "xk" #KT "_s" #S "_b" #B "_ws_rs"
#define NVFP4_SM90_SMALL_M_NAME(T, KB, D) "sm90_nvfp4_smallm_w128xt" #T "_kb" #KB "_d" #D "_mma16816"
#define NVFP4_SM90_ENTRY(T, KT, S, B) KernelConfig{NVFP4_SM90_NAME(T, KT, S, B), Kind::kWgmma, T, KT, S, B},
#define NVFP4_SM90_SMALL_M_ENTRY(T, KB, D) KernelConfig{NVFP4_SM90_SMALL_M_NAME(T, KB, D), Kind::kSmallM, T, KB, D, 2},
// wgmma entries first, then the small-M ones: indices are what select / run / NVFP4_GEMM_CONFIG use.
inline constexpr KernelConfig kConfigs[] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_ENTRY)
                                                NVFP4_SM90_SMALL_M_CONFIGS(NVFP4_SM90_SMALL_M_ENTRY)};
#undef NVFP4_SM90_ENTRY
#undef NVFP4_SM90_SMALL_M_ENTRY
inline constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

}  // namespace nvfp4_gemm::sm90
