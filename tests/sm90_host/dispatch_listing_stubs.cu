// The cluster-capacity query of each wgmma config (sm90_gemm.cuh, max_active_clusters) for the host-only
// dispatch listing: no device, so no cluster fits and the split planner takes its balanced split, as it does
// on a device whose clusters do not fit. Defined by name, so the listing links without the kernel TUs.
#include "sm90/fp4_decode.cuh"
#include "sm90/configs.h"

namespace nvfp4_gemm::sm90 {
template <int T, int KT, int S, int B, Elem E, int C>
int max_active_clusters(int) {
  return 0;
}
#define NVFP4_SM90_STUB(T, KT, S, B, C)                             \
  template int max_active_clusters<T, KT, S, B, Elem::kHalf, C>(int); \
  template int max_active_clusters<T, KT, S, B, Elem::kBf16, C>(int);
NVFP4_SM90_CONFIGS(NVFP4_SM90_STUB)
#undef NVFP4_SM90_STUB
}  // namespace nvfp4_gemm::sm90
