// Grouped verification (e): every grouped table entry is accepted by CUTLASS's can_implement (with the host-known
// shape hint, and in the launch's form without host problem shapes) on the shapes the table sends to it, the
// workspace is sized on the host, and refusals come back through the GroupedBackendApi as messages.
//
// This links the real grouped_api.cpp and select.cpp and instantiates, for every config in
// generated/grouped_table.inc, the same GroupedLauncher<GroupedKernel<...>>::check / ::workspace the generated TUs
// export -- but no run(), so nothing needs a GPU. The self-check (which runs a kernel) is never reached here.
#include <cstdio>
#include <vector>

#include "sm100/grouped_api.h"
#include "sm100/grouped_gemm.cuh"
#include "sm100/select.h"
#include "grouped_table_checks.h"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::sm100;

namespace nvfp4_gemm::sm100 {
const float* device_one(int) { return nullptr; }  // grouped_api.cpp's run() path, never taken here

template <class K>
constexpr GroupedKernelOps host_ops() {
  return GroupedKernelOps{&grouped::GroupedLauncher<K>::check, &grouped::GroupedLauncher<K>::workspace, nullptr};
}

#define NVFP4_SM100_GROUPED_CONFIG(name, rows_max, tm, tn, swap_ab)                 \
  extern const GroupedKernelOps kGroupedOps_##name[3] = {                           \
      host_ops<GroupedKernel<tm, tn, swap_ab != 0, cutlass::half_t>>(),            \
      host_ops<GroupedKernel<tm, tn, swap_ab != 0, cutlass::bfloat16_t>>(),        \
      host_ops<GroupedKernel<tm, tn, swap_ab != 0, float>>(),                      \
  };
#include "sm100/generated/grouped_table.inc"
}  // namespace nvfp4_gemm::sm100

int main() {
  const GroupedBackendApi& api = grouped_api();
  std::vector<DeviceInfo> devices = {{100, 148, 232448}, {103, 148, 232448}, {100, 132, 232448}};
  const long checked = grouped_host::check_table(api, "sm100", kGroupedConfigs, kNumGroupedConfigs, devices);
  if (checked < 0) return 1;
  // CUTLASS's own can_implement (the kernels' check, below the table's rules) is not vacuous: it refuses the same
  // misalignments when asked directly.
#define NVFP4_SM100_GROUPED_CONFIG(name, ...) grouped_host::check_cutlass_refuses(#name, kGroupedOps_##name, devices[0]);
#include "sm100/generated/grouped_table.inc"
  // Not SM 100 / 103: refused with a reason, nothing traps.
  grouped_host::check_other_sms(api, {DeviceInfo{90, 84, 101376}, DeviceInfo{120, 84, 101376}});
  return grouped_host::finish(api, checked);
}
