#include "sm100/select.h"

#include <string>

#include "common/cutlass_backend.h"

namespace nvfp4_gemm::sm100 {

int32_t select_config(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len) {
  return select_by_m(kConfigs, supports_sm(dev.sm),
                     "the sm100 module's kernels (sm_100f: tcgen05 block-scaled MMA) run on SM 100 / 103", p, dev, why, why_len);
}

const char* dispatch_rules() {
  static const std::string text = rules_by_m(kConfigs);
  return text.c_str();
}

}  // namespace nvfp4_gemm::sm100
