// The one table of SM90 kernel configurations. Dispatch (select), the config-name listing
// (BackendApi::config_names), the forced-config path and the generated instantiation files
// (csrc/sm90/generated/, written by csrc/sm90/generate.py from the X-macro below) all come from it.
//
// Every config computes a 128-row slice of B (the weights: 2 consumer warpgroups x wgmma M = 64) against
// a tile of TOKENS rows of A (wgmma N), K in stages of 128. What varies is the token tile (the wgmma N:
// small M wastes no MMA work on padding rows, large M reuses each decoded B fragment over more tokens)
// and the pipeline depth (as many stages as fit in 227 KB: the small-M configs are bandwidth-bound and
// need bytes in flight). Split-K is chosen per problem at run time (plan.h), not per config.
#pragma once

#include <cstdint>

// X(TOKENS, STAGES). Stage bytes = TOKENS * 256 (decoded A, fp16) + 8192 (packed B) + 1024 (scales).
#define NVFP4_SM90_CONFIGS(X) \
  X(8, 16)                    \
  X(16, 16)                   \
  X(32, 12)                   \
  X(64, 8)                    \
  X(128, 5)                   \
  X(256, 3)

namespace nvfp4_gemm::sm90 {

struct KernelConfig {
  const char* name;
  int tokens;  // wgmma N: rows of A per CTA tile
  int stages;  // TMA pipeline depth
};

#define NVFP4_SM90_NAME(T, S) "sm90_nvfp4_w128xt" #T "xk128_s" #S "_ws_rs"
#define NVFP4_SM90_ENTRY(T, S) KernelConfig{NVFP4_SM90_NAME(T, S), T, S},
inline constexpr KernelConfig kConfigs[] = {NVFP4_SM90_CONFIGS(NVFP4_SM90_ENTRY)};
#undef NVFP4_SM90_ENTRY
inline constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);

}  // namespace nvfp4_gemm::sm90
