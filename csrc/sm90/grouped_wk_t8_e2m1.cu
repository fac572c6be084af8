// One instantiation of the grouped K-sliced kernel (grouped_wk.cuh): 8 tokens, e2m1 A. One file per config and
// A type (NVFP4_SM90_GROUPED_CONFIGS in grouped.h) so that the build compiles them in parallel.
#include "sm90/grouped_wk.cuh"

namespace nvfp4_gemm::sm90 {
template cudaError_t launch_gwk<8, AType::kE2m1>(const GwkLaunch&);
template int gwk_ctas_per_sm<8, AType::kE2m1>(int);
}  // namespace nvfp4_gemm::sm90
