// Entry point of the SM90 backend for module.cpp: the BackendApi table (common/problem.h).
#pragma once

#include "common/problem.h"

namespace nvfp4_gemm::sm90 {
const BackendApi& backend_api();
}  // namespace nvfp4_gemm::sm90
