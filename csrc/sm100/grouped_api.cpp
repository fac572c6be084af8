// The sm100 GroupedBackendApi: the grouped table in generated/grouped_table.inc and the kernels it names, served
// through common/cutlass_grouped_backend.h. Torch-free and CUTLASS-free.
#include "sm100/grouped_api.h"

#include "common/cutlass_grouped_backend.h"
#include "sm100/select.h"

namespace nvfp4_gemm::sm100 {

const float* device_one(int device);  // one.cu

#define NVFP4_SM100_GROUPED_CONFIG(name, ...) extern const GroupedKernelOps kGroupedOps_##name[3];
#include "sm100/generated/grouped_table.inc"

namespace {

// [config][OutDtype]: each generated TU exports its config's kernels, one per output dtype.
const GroupedKernelOps* const kGroupedOps[] = {
#define NVFP4_SM100_GROUPED_CONFIG(name, ...) kGroupedOps_##name,
#include "sm100/generated/grouped_table.inc"
};
static_assert(sizeof(kGroupedOps) / sizeof(kGroupedOps[0]) == kNumGroupedConfigs);

struct GroupedArch {
  static constexpr const char* kName = "sm100";
  static constexpr const char* kTarget = "sm_100f";
  static constexpr const char* kSms = "SM 100 / 103";
  static constexpr int32_t kNumConfigs = kNumGroupedConfigs;
  static constexpr const GroupedConfigInfo* kConfigs = kGroupedConfigs;
  static const GroupedKernelOps& ops(int32_t config, OutDtype dt) { return kGroupedOps[config][static_cast<int>(dt)]; }
  static bool supports_sm(int32_t sm) { return ::nvfp4_gemm::sm100::supports_sm(sm); }
  static const float* device_one(int device) { return ::nvfp4_gemm::sm100::device_one(device); }
  static selfcheck::Verdicts& verdicts() {
    static selfcheck::Verdicts* v = new selfcheck::Verdicts();  // never destroyed: calls may come at exit
    return *v;
  }
};

}  // namespace

const GroupedBackendApi& grouped_api() { return CutlassGroupedBackend<GroupedArch>::api(); }

}  // namespace nvfp4_gemm::sm100
