// nvfp4_gemm._C_sm90: registers the SM90 BackendApi table with the core module (see backend_module.h),
// and the test hook _sm90_force_splits.
#include "common/backend_module.h"
#include "sm90/backend.h"

NVFP4_GEMM_BACKEND_MODULE(_C_sm90, sm90, nvfp4_gemm::sm90::backend_api())

// torch.ops.nvfp4_gemm._sm90_force_splits(n): the split count of every following sm90 call in this process
// (0: automatic); returns the previous one. For tests and benchmarks that compare split paths in one
// process, where an environment variable read once cannot change.
TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_sm90_force_splits(int splits) -> int", [](int64_t splits) -> int64_t {
    TORCH_CHECK(splits >= 0 && splits <= (1 << 20), "nvfp4_gemm._sm90_force_splits: splits must be in [0, 2^20] "
                "(0: automatic), got ", splits);
    return nvfp4_gemm::sm90::set_forced_splits(static_cast<int>(splits));
  });
}
