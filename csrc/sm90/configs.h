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

namespace nvfp4_gemm::sm90 {

struct KernelConfig {
  const char* name;
  int tokens;  // wgmma N: rows of A per CTA tile
  int kt;      // K per pipeline stage
  int stages;  // TMA pipeline depth
  int ctas_per_sm;
};

#define NVFP4_SM90_NAME(T, KT, S, B) "sm90_nvfp4_w128xt" #T "xk" #KT "_s" #S "_b" #B "_ws_rs"
#define NVFP4_SM90_ENTRY(T, KT, S, B) KernelConfig{NVFP4_SM90_NAME(T, KT, S, B), T, KT, S, B},
inline constexpr KernelConfig kConfigs[] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_ENTRY)};
#undef NVFP4_SM90_ENTRY
inline constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

}  // namespace nvfp4_gemm::sm90
