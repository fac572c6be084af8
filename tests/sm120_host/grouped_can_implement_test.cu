// Grouped verification (e): every grouped table entry is accepted by CUTLASS's can_implement (with the host-known
// shape hint, and in the launch's form without host problem shapes) on the shapes the table sends to it, the
// workspace is sized on the host, and refusals come back through the GroupedBackendApi as messages.
//
// This links the real grouped_api.cpp and select.cpp and instantiates, for every config in
// generated/grouped_table.inc, the same GroupedLauncher<GroupedKernel<...>>::check / ::workspace the generated TUs
// export -- but no run(), so nothing needs a GPU. The self-check (which runs a kernel) is never reached here.
#include <cstdio>
#include <vector>

#include "sm120/grouped_api.h"
#include "sm120/grouped_gemm.cuh"
#include "sm120/select.h"
#include "../sm100_host/grouped_table_checks.h"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::sm120;

namespace nvfp4_gemm::sm120 {
const float* device_one(int) { return nullptr; }  // grouped_api.cpp's run() path, never taken here

template <class K>
constexpr GroupedKernelOps host_ops() {
  return GroupedKernelOps{&grouped::GroupedLauncher<K>::check, &grouped::GroupedLauncher<K>::workspace, nullptr};
}

#define NVFP4_SM120_GROUPED_CONFIG(name, rows_max, tm, tn, tk)                      \
  extern const GroupedKernelOps kGroupedOps_##name[3] = {                           \
      host_ops<GroupedKernel<tm, tn, tk, cutlass::half_t>>(),                      \
      host_ops<GroupedKernel<tm, tn, tk, cutlass::bfloat16_t>>(),                  \
      host_ops<GroupedKernel<tm, tn, tk, float>>(),                                \
  };
#include "sm120/generated/grouped_table.inc"
// Each config's pipeline depth and shared memory (proven <= 99 KB at compile time), printed.
#define NVFP4_SM120_GROUPED_CONFIG(name, rows_max, tm, tn, tk)                                              \
  static void print_##name() {                                                                             \
    using K = GroupedKernel<tm, tn, tk, cutlass::bfloat16_t>;                                               \
    std::printf("  %-36s %d stages, %d bytes of shared memory\n", #name, K::kStages, K::kSmemBytes);        \
  }
#include "sm120/generated/grouped_table.inc"
}  // namespace nvfp4_gemm::sm120

int main() {
  const GroupedBackendApi& api = grouped_api();
  // RTX 5090 (170 SMs), RTX PRO 6000 (188), DGX Spark GB10 (SM 12.1, 48).
  std::vector<DeviceInfo> devices = {{120, 170, 101376}, {120, 188, 101376}, {121, 48, 101376}};
  const long checked = grouped_host::check_table(api, "sm120", kGroupedConfigs, kNumGroupedConfigs, devices);
  if (checked < 0) return 1;
  // CUTLASS's own can_implement (the kernels' check, below the table's rules) is not vacuous: it refuses the same
  // misalignments when asked directly.
#define NVFP4_SM120_GROUPED_CONFIG(name, ...) grouped_host::check_cutlass_refuses(#name, kGroupedOps_##name, devices[0]);
#include "sm120/generated/grouped_table.inc"
  // Not SM 120 / 121: refused with a reason, nothing traps.
  grouped_host::check_other_sms(api, {DeviceInfo{90, 132, 232448}, DeviceInfo{100, 132, 232448}});
#define NVFP4_SM120_GROUPED_CONFIG(name, ...) print_##name();
#include "sm120/generated/grouped_table.inc"
  return grouped_host::finish(api, checked);
}
