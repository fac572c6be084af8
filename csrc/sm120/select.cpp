#include "sm120/select.h"

#include <cstdio>
#include <string>

namespace nvfp4_gemm::sm120 {

int32_t select_config(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len) {
  if (!supports_sm(dev.sm)) {
    std::snprintf(why, why_len,
                  "the sm120 module's kernels (sm_120f: warp-level block-scaled MMA) run on SM 120 / 121, "
                  "not on SM %d", dev.sm);
    return -1;
  }
  for (int32_t i = 0; i < kNumConfigs; ++i) {
    if (kConfigs[i].m_max < 0 || p.m <= kConfigs[i].m_max) return i;
  }
  // generate.py asserts the last entry is unbounded.
  std::snprintf(why, why_len, "internal error: the sm120 dispatch table has no entry for M=%lld", (long long)p.m);
  return -1;
}

const char* dispatch_rules() {
  static const std::string text = [] {
    std::string t;
    long long lo = 1;
    for (const ConfigInfo& c : kConfigs) {
      char line[256];
      if (c.m_max >= 0)
        std::snprintf(line, sizeof(line), "M %lld..%lld: %s\n", lo, static_cast<long long>(c.m_max), c.name);
      else
        std::snprintf(line, sizeof(line), "M >= %lld: %s\n", lo, c.name);
      t += line;
      lo = static_cast<long long>(c.m_max) + 1;
    }
    return t;
  }();
  return text.c_str();
}

}  // namespace nvfp4_gemm::sm120
