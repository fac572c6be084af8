// One instantiation of the wgmma kernel's grouped form (grouped_wgmma.cu): 256-row weight tiles (four consumer
// warpgroups), 80 tokens, f16 A. One file per config and A type so that the build compiles them in parallel.
#include "sm90/sm90_gemm.cuh"

namespace nvfp4_gemm::sm90 {
template cudaError_t launch_gemm<80, 128, 5, 1, Elem::kHalf, true, 4>(const LaunchArgs&);
}  // namespace nvfp4_gemm::sm90
