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
// through registers, 128 B rows x a K split per CTA. X(TOKENS, KBMAX, DEPTH, CTAS): TOKENS = 8 x n-tiles;
// KBMAX = the most 256-K blocks per CTA the automatic split picks (decoded A in shared memory is
// KB x TOKENS x 576 bytes, kept small enough for CTAS CTAs per SM); DEPTH = K blocks of B in flight per lane
// (18 registers each); CTAS = CTAs per SM (the launch bound: 128 registers a thread at 2, 80 at 3).
// Measured (H100, docs/SM90_NOTES.md v10): 8 tokens, 3 CTAs of DEPTH 2 beat 2 of DEPTH 4 (40.7 vs 42.4 us at
// (1, 7168, 16384)) and 4 of DEPTH 1 (42.2); 16 tokens, 2 CTAs of DEPTH 4 beat 3 (22.0 vs 22.5) and 4 (24.4).
#define NVFP4_SM90_SMALL_M_CONFIGS(X) \
  X(8, 16, 2, 3)                      \
  X(16, 12, 4, 2)                     \
  X(32, 6, 3, 2)

namespace nvfp4_gemm::sm90 {

// select() takes the small-M kernel up to this M, where it measured faster than the wgmma config of the same
// token tile (docs/SM90_NOTES.md, v10; H100, do_bench us, small-M vs wgmma): (1, 7168, 16384) 40.7 vs 45.6,
// (8, 7168, 16384) 41.0 vs 45.2, (16, 4096, 7168) 22.0 vs 24.2, (32, 4096, 7168) 23.8 vs 25.2,
// (1, 4096, 7168) 19.6 vs 23.4.
inline constexpr int kSmallMMaxM = 32;

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
#define NVFP4_SM90_SMALL_M_NAME(T, KB, D, B) "sm90_nvfp4_smallm_w128xt" #T "_kb" #KB "_d" #D "_b" #B "_mma16816"
#define NVFP4_SM90_ENTRY(T, KT, S, B) KernelConfig{NVFP4_SM90_NAME(T, KT, S, B), Kind::kWgmma, T, KT, S, B},
#define NVFP4_SM90_SMALL_M_ENTRY(T, KB, D, B) KernelConfig{NVFP4_SM90_SMALL_M_NAME(T, KB, D, B), Kind::kSmallM, T, KB, D, B},
// wgmma entries first, then the small-M ones: indices are what select / run / NVFP4_GEMM_CONFIG use.
inline constexpr KernelConfig kConfigs[] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_ENTRY)
                                                NVFP4_SM90_SMALL_M_CONFIGS(NVFP4_SM90_SMALL_M_ENTRY)};
#undef NVFP4_SM90_ENTRY
#undef NVFP4_SM90_SMALL_M_ENTRY
inline constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

}  // namespace nvfp4_gemm::sm90
