// Entry point of the SM90 backend for module.cpp: the BackendApi table (common/problem.h).
#pragma once

#include "common/problem.h"

namespace nvfp4_gemm::sm90 {
const BackendApi& backend_api();

// The dispatch rules (generated/table.inc, rendered by generate.py) as text, one line per rule.
const char* dispatch_rules();
}  // namespace nvfp4_gemm::sm90
