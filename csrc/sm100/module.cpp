// nvfp4_gemm._C_sm100: registers the sm100 BackendApi with the op (common/backend_module.h).
#include "common/backend_module.h"
#include "sm100/api.h"

NVFP4_GEMM_BACKEND_MODULE(_C_sm100, sm100, nvfp4_gemm::sm100::backend_api())
