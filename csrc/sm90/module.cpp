// nvfp4_gemm._C_sm90: registers the SM90 BackendApi table with the core module (see backend_module.h).
#include "common/backend_module.h"
#include "sm90/backend.h"

NVFP4_GEMM_BACKEND_MODULE(_C_sm90, sm90, nvfp4_gemm::sm90::backend_api())
