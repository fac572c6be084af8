#include "sm120/select.h"

#include <string>

#include "common/cutlass_backend.h"

namespace nvfp4_gemm::sm120 {

int32_t select_config(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len) {
  return select_by_m(kConfigs, supports_sm(dev.sm),
                     "the sm120 module's kernels (sm_120f: warp-level block-scaled MMA) run on SM 120 / 121", p, dev, why, why_len);
}

const char* dispatch_rules() {
  static const std::string text = rules_by_m(kConfigs);
  return text.c_str();
}

}  // namespace nvfp4_gemm::sm120
