// nvfp4_gemm._C_sm100: registers the sm100 BackendApi (common/backend_module.h) and GroupedBackendApi
// (common/grouped_module.h) with the op.
#include "common/backend_module.h"
#include "common/grouped_module.h"
#include "sm100/api.h"
#include "sm100/grouped_api.h"

NVFP4_GEMM_BACKEND_MODULE(_C_sm100, sm100, nvfp4_gemm::sm100::backend_api())
NVFP4_GEMM_GROUPED_API(sm100, nvfp4_gemm::sm100::grouped_api())
