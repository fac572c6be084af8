// Entry point of the SM90 backend for module.cpp: the BackendApi table (common/problem.h).
#pragma once

#include "common/problem.h"

namespace nvfp4_gemm::sm90 {
const BackendApi& backend_api();

// The dispatch rules (generated/table.inc, rendered by generate.py) as text, one line per rule.
const char* dispatch_rules();

// Tests and benchmarks: forces the split count of every following call in this process (0: automatic,
// the default unless NVFP4_GEMM_SM90_SPLITS was set at the first call). Returns the previous value.
int set_forced_splits(int splits);
}  // namespace nvfp4_gemm::sm90
