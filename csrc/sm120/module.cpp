// nvfp4_gemm._C_sm120: registers the sm120 BackendApi (common/backend_module.h) and GroupedBackendApi
// (common/grouped_module.h) with the op.
#include "common/backend_module.h"
#include "common/grouped_module.h"
#include "sm120/api.h"
#include "sm120/grouped_api.h"

NVFP4_GEMM_BACKEND_MODULE(_C_sm120, sm120, nvfp4_gemm::sm120::backend_api())
NVFP4_GEMM_GROUPED_API(sm120, nvfp4_gemm::sm120::grouped_api())
