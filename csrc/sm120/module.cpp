// nvfp4_gemm._C_sm120: registers the sm120 BackendApi with the op (common/backend_module.h).
#include "common/backend_module.h"
#include "sm120/api.h"

NVFP4_GEMM_BACKEND_MODULE(_C_sm120, sm120, nvfp4_gemm::sm120::backend_api())
