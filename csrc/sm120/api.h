#pragma once

#include "common/problem.h"

namespace nvfp4_gemm::sm120 {

// The table the binding layer calls through (see common/problem.h); module.cpp registers it.
const BackendApi& backend_api();

}  // namespace nvfp4_gemm::sm120
