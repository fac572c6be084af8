// The SM100 dispatch rule and config list, CUTLASS-free (built by the host compiler, linked by the
// host tests without any kernel).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace nvfp4_gemm::sm100 {

struct ConfigInfo {
  const char* name;
  int64_t m_max;  // chosen for M <= m_max, first match in table order; -1: no bound
  int tile_m, tile_n, cluster_m, cluster_n;
  bool two_sm, stream_k, swap_ab;
};

inline constexpr ConfigInfo kConfigs[] = {
#define NVFP4_SM100_CONFIG(name, m_max, tm, tn, cm, cn, two_sm, stream_k, swap_ab) \
  {#name, m_max, tm, tn, cm, cn, two_sm != 0, stream_k != 0, swap_ab != 0},
#include "sm100/generated/table.inc"
};
inline constexpr int32_t kNumConfigs = static_cast<int32_t>(sizeof(kConfigs) / sizeof(kConfigs[0]));

// tcgen05 block-scaled MMA exists on the sm_100f family: B200/GB200 (10.0) and B300/GB300 (10.3).
// SM120 (RTX 50xx) has a different MMA and must take the generic path.
constexpr bool supports_sm(int32_t sm) { return sm == 100 || sm == 103; }

// The table's pick for this problem (never -1 on a supported SM: the last entry is unbounded).
int32_t select_config(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len);

// The table (generate.py's TABLE, via generated/table.inc) as text, one line per M range.
const char* dispatch_rules();

}  // namespace nvfp4_gemm::sm100
