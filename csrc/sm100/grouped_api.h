// The SM100 grouped (mixture-of-experts) GEMM's table and config list, CUTLASS-free (built by the host compiler,
// linked by the host tests without any kernel).
#pragma once

#include <cstdint>

#include "common/cutlass_grouped_ops.h"
#include "common/grouped.h"

namespace nvfp4_gemm::sm100 {

inline constexpr GroupedConfigInfo kGroupedConfigs[] = {
#define NVFP4_SM100_GROUPED_CONFIG(name, rows_max, tm, tn, swap_ab) {#name, rows_max},
#include "sm100/generated/grouped_table.inc"
};
inline constexpr int32_t kNumGroupedConfigs =
    static_cast<int32_t>(sizeof(kGroupedConfigs) / sizeof(kGroupedConfigs[0]));

// The GroupedBackendApi the binding layer calls through (common/grouped.h); module.cpp registers it.
const GroupedBackendApi& grouped_api();

}  // namespace nvfp4_gemm::sm100
