// The SM120 dispatch rule and config list, CUTLASS-free (built by the host compiler, linked by the
// host tests without any kernel).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace nvfp4_gemm::sm120 {

struct ConfigInfo {
  const char* name;
  int64_t m_max;  // chosen for M <= m_max, first match in table order; -1: no bound
  int tile_m, tile_n, tile_k;
};

inline constexpr ConfigInfo kConfigs[] = {
#define NVFP4_SM120_CONFIG(name, m_max, tm, tn, tk) {#name, m_max, tm, tn, tk},
#include "sm120/generated/table.inc"
};
inline constexpr int32_t kNumConfigs = static_cast<int32_t>(sizeof(kConfigs) / sizeof(kConfigs[0]));

// The warp-level block-scaled MMA (mma.sync kind::mxf4nvf4) of the sm_120f family: GeForce RTX 50 and
// RTX PRO 6000 (12.0), DGX Spark GB10 (12.1). One sm_120f cubin serves both. SM100 / 103 have tcgen05
// instead and their own module.
constexpr bool supports_sm(int32_t sm) { return sm == 120 || sm == 121; }

// The table's pick for this problem (never -1 on a supported SM: the last entry is unbounded).
int32_t select_config(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len);

// The table (generate.py's TABLE, via generated/table.inc) as text, one line per M range.
const char* dispatch_rules();

}  // namespace nvfp4_gemm::sm120
