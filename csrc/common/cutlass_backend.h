// The BackendApi of a CUTLASS arch module whose dispatch is "first config whose M bound holds" (sm100, sm120):
// the checks that turn a kernel's refusal into a message, the constant-1 alpha, the table's rule text. Each
// module's api.cpp supplies only what differs (its name, target, configs and kernels) through a traits type.
// Torch-free and CUTLASS-free.
#pragma once

#include <climits>
#include <cstdio>
#include <string>

#include "common/problem.h"

namespace nvfp4_gemm {

// The first config of `configs` (each with .name and .m_max, -1 unbounded) whose bound holds for p.m; -1 with a
// message off the module's SMs. The generators assert the last entry is unbounded.
template <typename Config, size_t N>
int32_t select_by_m(const Config (&configs)[N], bool sm_ok, const char* off_sm_text, const Problem& p,
                    const DeviceInfo& dev, char* why, size_t why_len) {
  if (!sm_ok) {
    std::snprintf(why, why_len, "%s, not on SM %d", off_sm_text, dev.sm);
    return -1;
  }
  for (size_t i = 0; i < N; ++i)
    if (configs[i].m_max < 0 || p.m <= configs[i].m_max) return static_cast<int32_t>(i);
  std::snprintf(why, why_len, "internal error: the dispatch table has no entry for M=%lld", (long long)p.m);
  return -1;
}

// The table as text, one line per M range ("M 1..128: <name>").
template <typename Config, size_t N>
std::string rules_by_m(const Config (&configs)[N]) {
  std::string t;
  long long lo = 1;
  for (const Config& c : configs) {
    char line[256];
    if (c.m_max >= 0)
      std::snprintf(line, sizeof(line), "M %lld..%lld: %s\n", lo, static_cast<long long>(c.m_max), c.name);
    else
      std::snprintf(line, sizeof(line), "M >= %lld: %s\n", lo, c.name);
    t += line;
    lo = static_cast<long long>(c.m_max) + 1;
  }
  return t;
}

// Arch provides: kName ("sm100"), kTarget ("sm_100f"), kSms ("SM 100 / 103"), kNumConfigs, kNames[],
// ops(config, out) -> a KernelOps with check / workspace / run, supports_sm(sm), select(p, dev, why, len),
// rules() (static text), device_one(device index) -> a device float 1.0f.
template <typename Arch>
struct CutlassBackend {
  static bool valid(int32_t config, OutDtype dt) {
    return config >= 0 && config < Arch::kNumConfigs && static_cast<int>(dt) >= 0 && static_cast<int>(dt) < 3;
  }
  // CUTLASS's problem shape is (int, int, int, int): the operands narrow M, N, K only after this check.
  static bool dims_fit(const Problem& p) { return p.m <= INT_MAX && p.n <= INT_MAX && p.k <= INT_MAX; }

  static bool can_run(const Problem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len) {
    if (!valid(config, p->out_dtype)) {
      std::snprintf(why, why_len, "%s has no config #%d (it has %d) for out dtype %d", Arch::kName, config,
                    Arch::kNumConfigs, static_cast<int>(p->out_dtype));
      return false;
    }
    const char* name = Arch::kNames[config];
    if (!Arch::supports_sm(dev->sm)) {
      std::snprintf(why, why_len, "%s is built for %s (%s); this device is SM %d", name, Arch::kTarget, Arch::kSms,
                    dev->sm);
      return false;
    }
    if (p->alpha2 != nullptr) {
      std::snprintf(why, why_len, "%s takes one alpha pointer (no alpha2)", name);
      return false;
    }
    if (p->a_type != AType::kE2m1) {
      std::snprintf(why, why_len, "%s multiplies NVFP4 x NVFP4 (W4A4); the weight-only form (16/32-bit a) runs on "
                    "the generic path", name);
      return false;
    }
    if (!dims_fit(*p)) {
      std::snprintf(why, why_len,
                    "%s takes M, N, K <= 2^31 - 1 (CUTLASS's 32-bit problem shape); got M=%lld N=%lld K=%lld", name,
                    static_cast<long long>(p->m), static_cast<long long>(p->n), static_cast<long long>(p->k));
      return false;
    }
    char inner[384];
    if (!Arch::ops(config, p->out_dtype).check(*p, *dev, inner, sizeof(inner))) {
      std::snprintf(why, why_len, "%s: %s", name, inner);
      return false;
    }
    return true;
  }

  static int32_t select(const Problem* p, const DeviceInfo* dev, char* why, size_t why_len) {
    const int32_t c = Arch::select(*p, *dev, why, why_len);
    if (c < 0) return -1;
    return can_run(p, c, dev, why, why_len) ? c : -1;
  }

  static size_t workspace_bytes(const Problem* p, int32_t config, const DeviceInfo* dev) {
    if (!valid(config, p->out_dtype) || !dims_fit(*p)) return 0;  // can_run refuses these: run never sees them
    return Arch::ops(config, p->out_dtype).workspace(*p, *dev);
  }

  // The binding layer sized the workspace with the same DeviceInfo, so run and workspace_bytes agree.
  static bool run(const Problem* p, int32_t config, const DeviceInfo* dev, void* workspace, size_t ws_bytes,
                  cudaStream_t stream, char* err, size_t err_len) {
    if (!can_run(p, config, dev, err, err_len)) return false;
    const float* alpha = p->alpha;
    if (!alpha && !(alpha = Arch::device_one(dev->index))) {
      std::snprintf(err, err_len, "%s: cannot get the device address of the constant 1.0f alpha", Arch::kName);
      return false;
    }
    char inner[384];
    if (!Arch::ops(config, p->out_dtype).run(*p, *dev, alpha, workspace, ws_bytes, stream, inner, sizeof(inner))) {
      std::snprintf(err, err_len, "%s: %s", Arch::kNames[config], inner);
      return false;
    }
    return true;
  }

  static const BackendApi& api() {
    static const BackendApi table{
        kBackendAbiVersion, Arch::kName, Arch::kTarget, Arch::kNumConfigs, Arch::kNames, &Arch::supports_sm,
        &select, &can_run, &workspace_bytes, &run, /*prefers_generic=*/nullptr, &Arch::rules,
    };
    return table;
  }
};

}  // namespace nvfp4_gemm
