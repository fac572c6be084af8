// The sm100 BackendApi: the table in generated/table.inc, the kernels it names, and the checks that turn
// a kernel's refusal into a message. Torch-free and CUTLASS-free.
#include <climits>
#include <cstdio>

#include <cuda_runtime_api.h>

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

const char* const kNames[] = {
#define NVFP4_SM100_CONFIG(name, ...) #name,
#include "sm100/generated/table.inc"
};

const KernelOps& ops(int32_t config, OutDtype dt) { return kOps[config][static_cast<int>(dt)]; }

bool valid(int32_t config, OutDtype dt) {
  return config >= 0 && config < kNumConfigs && static_cast<int>(dt) >= 0 && static_cast<int>(dt) < 3;
}

// CUTLASS's problem shape is (int, int, int, int): operands.h narrows M, N, K only after this check.
bool dims_fit(const Problem& p) { return p.m <= INT_MAX && p.n <= INT_MAX && p.k <= INT_MAX; }

bool api_can_run(const Problem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len) {
  if (!valid(config, p->out_dtype)) {
    std::snprintf(why, why_len, "sm100 has no config #%d (it has %d) for out dtype %d", config, kNumConfigs,
                  static_cast<int>(p->out_dtype));
    return false;
  }
  if (!supports_sm(dev->sm)) {
    std::snprintf(why, why_len,
                  "%s is built for sm_100f (SM 100 / 103); this device is SM %d", kNames[config], dev->sm);
    return false;
  }
  if (p->alpha2 != nullptr) {
    std::snprintf(why, why_len, "%s takes one alpha pointer (no alpha2)", kNames[config]);
    return false;
  }
  if (p->a_type != AType::kE2m1) {
    std::snprintf(why, why_len, "%s multiplies NVFP4 x NVFP4 (W4A4); the weight-only form (16/32-bit a) runs on "
                  "the generic path", kNames[config]);
    return false;
  }
  if (!dims_fit(*p)) {
    std::snprintf(why, why_len,
                  "%s takes M, N, K <= 2^31 - 1 (CUTLASS's 32-bit problem shape); got M=%lld N=%lld K=%lld",
                  kNames[config], static_cast<long long>(p->m), static_cast<long long>(p->n),
                  static_cast<long long>(p->k));
    return false;
  }
  char inner[384];
  if (!ops(config, p->out_dtype).check(*p, *dev, inner, sizeof(inner))) {
    std::snprintf(why, why_len, "%s: %s", kNames[config], inner);
    return false;
  }
  return true;
}

int32_t api_select(const Problem* p, const DeviceInfo* dev, char* why, size_t why_len) {
  int32_t c = select_config(*p, *dev, why, why_len);
  if (c < 0) return -1;
  return api_can_run(p, c, dev, why, why_len) ? c : -1;
}

size_t api_workspace_bytes(const Problem* p, int32_t config, const DeviceInfo* dev) {
  if (!valid(config, p->out_dtype) || !dims_fit(*p)) return 0;  // can_run refuses these: run never sees them
  return ops(config, p->out_dtype).workspace(*p, *dev);
}

// The binding layer sized the workspace with the same DeviceInfo, so the split plan of run and workspace_bytes agree.
bool api_run(const Problem* p, int32_t config, const DeviceInfo* devp, void* workspace, size_t workspace_bytes,
             cudaStream_t stream, char* err, size_t err_len) {
  const DeviceInfo& dev = *devp;
  if (!api_can_run(p, config, &dev, err, err_len)) return false;
  const float* alpha = p->alpha;
  if (!alpha && !(alpha = device_one(dev.index))) {
    std::snprintf(err, err_len, "sm100: cannot get the device address of the constant 1.0f alpha");
    return false;
  }
  char inner[384];
  if (!ops(config, p->out_dtype).run(*p, dev, alpha, workspace, workspace_bytes, stream, inner, sizeof(inner))) {
    std::snprintf(err, err_len, "%s: %s", kNames[config], inner);
    return false;
  }
  return true;
}

}  // namespace

const BackendApi& backend_api() {
  static const BackendApi api{
      kBackendAbiVersion, "sm100", "sm_100f", kNumConfigs, kNames, &supports_sm, &api_select, &api_can_run,
      &api_workspace_bytes, &api_run, /*prefers_generic=*/nullptr, &dispatch_rules,
  };
  return api;
}

}  // namespace nvfp4_gemm::sm100
