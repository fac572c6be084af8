// Entry point of the SM90 backend for module.cpp: the BackendApi table (common/problem.h).
#pragma once

#include "common/problem.h"

namespace nvfp4_gemm::sm90 {
const BackendApi& backend_api();

// The dispatch table (configs.h, kDispatch) as text, one line per M range.
const char* dispatch_rules();

// Tests and benchmarks: forces the split count of every following call in this process (0: automatic,
// the default unless NVFP4_GEMM_SM90_SPLITS was set at the first call). Returns the previous value.
int set_forced_splits(int splits);

// Tests: whether the small-M kernel may sum its K splits in a thread block cluster (true, the default) or
// always uses the workspace. Returns the previous value.
bool set_small_m_cluster(bool enabled);
}  // namespace nvfp4_gemm::sm90
