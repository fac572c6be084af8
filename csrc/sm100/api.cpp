// The sm100 BackendApi: the table in generated/table.inc and the kernels it names, served through
// common/cutlass_backend.h. Torch-free and CUTLASS-free.
#include "common/cutlass_backend.h"
#include "sm100/api.h"
#include "sm100/kernel_ops.h"
#include "sm100/select.h"

namespace nvfp4_gemm::sm100 {

const float* device_one(int device);  // one.cu

#define NVFP4_SM100_CONFIG(name, ...) extern const KernelOps kOps_##name[3];
#include "sm100/generated/table.inc"

namespace {

// [config][OutDtype]: each generated TU exports its config's kernels, one per output dtype.
const KernelOps* const kOps[] = {
#define NVFP4_SM100_CONFIG(name, ...) kOps_##name,
#include "sm100/generated/table.inc"
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kNumConfigs);

const char* const kConfigNames[] = {
#define NVFP4_SM100_CONFIG(name, ...) #name,
#include "sm100/generated/table.inc"
};

struct Arch {
  static constexpr const char* kName = "sm100";
  static constexpr const char* kTarget = "sm_100f";
  static constexpr const char* kSms = "SM 100 / 103";
  static constexpr int32_t kNumConfigs = ::nvfp4_gemm::sm100::kNumConfigs;
  static constexpr const char* const* kNames = kConfigNames;
  static const KernelOps& ops(int32_t config, OutDtype dt) { return kOps[config][static_cast<int>(dt)]; }
  static bool supports_sm(int32_t sm) { return ::nvfp4_gemm::sm100::supports_sm(sm); }
  static int32_t select(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len) {
    return select_config(p, dev, why, why_len);
  }
  static const char* rules() { return dispatch_rules(); }
  static const float* device_one(int device) { return ::nvfp4_gemm::sm100::device_one(device); }
};

}  // namespace

const BackendApi& backend_api() { return CutlassBackend<Arch>::api(); }

}  // namespace nvfp4_gemm::sm100
