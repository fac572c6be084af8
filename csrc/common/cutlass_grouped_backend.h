// The GroupedBackendApi (common/grouped.h) of a CUTLASS arch module's grouped kernels (sm100, sm120): the checks
// that turn a kernel's refusal into a message, the device 1.0f for "no alpha", the first-use self-check
// (grouped_selfcheck.h), the table's rule text. Each module's grouped_api.cpp supplies what differs (name,
// target, configs, their selection and kernels) through a traits type. Torch-free and CUTLASS-free.
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/cutlass_grouped_ops.h"
#include "common/grouped.h"
#include "common/grouped_selfcheck.h"

namespace nvfp4_gemm {

// Arch provides: kName ("sm100"), kTarget ("sm_100f"), kSms ("SM 100 / 103"), kNumConfigs, kConfigs[]
// (GroupedConfigInfo), ops(config, out) -> GroupedKernelOps, supports_sm(sm), device_one(device index) -> a
// device 1.0f, verdicts() -> a selfcheck::Verdicts of the module.
template <typename Arch>
struct CutlassGroupedBackend {
  static bool valid(int32_t config, OutDtype dt) {
    return config >= 0 && config < Arch::kNumConfigs && static_cast<int>(dt) >= 0 && static_cast<int>(dt) < 3;
  }

  static int64_t average_rows(const GroupedProblem& p) { return p.g > 0 ? ceil_div(p.t, p.g) : p.t; }

  // Everything the kernels assume beyond what the binding layer guarantees (common/grouped.h), then CUTLASS's
  // own can_implement. The binding's guarantees are checked again: the tables are also called by tests directly.
  static bool can_run(const GroupedProblem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len) {
    const auto no = [&](const char* fmt, auto... args) {
      if (why && why_len) std::snprintf(why, why_len, fmt, args...);
      return false;
    };
    if (!valid(config, p->out_dtype))
      return no("%s grouped has no config #%d (it has %d) for out dtype %d", Arch::kName, static_cast<int>(config),
                Arch::kNumConfigs, static_cast<int>(p->out_dtype));
    const char* name = Arch::kConfigs[config].name;
    if (dev == nullptr || !Arch::supports_sm(dev->sm))
      return no("%s is built for %s (%s); this device is SM %d", name, Arch::kTarget, Arch::kSms, dev ? dev->sm : -1);
    if (p->a_type != AType::kE2m1)
      return no("%s multiplies NVFP4 x NVFP4 (W4A4); the weight-only form (16/32-bit a) runs on the generic path",
                name);
    if (p->g < 1 || p->g > INT_MAX || p->t < 0 || p->t > INT_MAX || p->n < 1 || p->n > INT_MAX || p->k < 1 ||
        p->k > INT_MAX)
      return no("%s takes T, N, K, G <= 2^31 - 1 (CUTLASS's 32-bit problem shapes and group count); got T=%lld N=%lld "
                "K=%lld G=%lld", name, static_cast<long long>(p->t), static_cast<long long>(p->n),
                static_cast<long long>(p->k), static_cast<long long>(p->g));
    if (p->k % 32 != 0 || p->n % 8 != 0)
      return no("%s needs K %% 32 == 0 (16-byte rows of e2m1) and N %% 8 == 0 (16-byte rows of C), got N=%lld K=%lld",
                name, static_cast<long long>(p->n), static_cast<long long>(p->k));
    const auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
    const int64_t esize = p->out_dtype == OutDtype::kFloat32 ? 4 : 2;
    if (misaligned(p->a) || misaligned(p->b) || misaligned(p->sfb) || misaligned(p->c) ||
        (p->t > 0 && misaligned(p->sfa)) || p->lda % 16 != 0 || p->ldb % 16 != 0 || p->b_group_bytes % 16 != 0 ||
        (p->ldc * esize) % 16 != 0 || p->lda < p->k / 2 || p->ldb < p->k / 2 || p->ldc < p->n)
      return no("%s: TMA needs a, b, sfa, sfb, c 16-byte aligned and lda, ldb, b_group_bytes, ldc x %lld bytes "
                "multiples of 16 (rows not overlapping); got lda %lld, ldb %lld, b_group_bytes %lld, ldc %lld", name,
                static_cast<long long>(esize), static_cast<long long>(p->lda), static_cast<long long>(p->ldb),
                static_cast<long long>(p->b_group_bytes), static_cast<long long>(p->ldc));
    if (p->t > 0 && (p->sfa == nullptr || p->sfa_rows < kSfAtomRows || p->sfa_rows % kSfAtomRows != 0))
      return no("%s: NVFP4 A needs sfa with a positive multiple of 128 padded rows, got %lld", name,
                static_cast<long long>(p->sfa_rows));
    std::string failed;
    if (selfcheck::enabled() &&
        Arch::verdicts().get(dev->index, config, p->out_dtype, &failed) == selfcheck::Verdict::kFail)
      return no("%s failed its first-use self-check on cuda:%d in this process (%s); its grouped problems go to the "
                "generic path", name, dev->index, failed.c_str());
    char inner[384];
    if (!Arch::ops(config, p->out_dtype).check(*p, *dev, inner, sizeof(inner)))
      return no("%s: %s", name, inner);
    return true;
  }

  static int32_t select(const GroupedProblem* p, const DeviceInfo* dev, char* why, size_t why_len) {
    if (dev == nullptr || !Arch::supports_sm(dev->sm)) {
      if (why && why_len)
        std::snprintf(why, why_len, "the %s module's grouped kernels (%s) run on %s, not on SM %d", Arch::kName,
                      Arch::kTarget, Arch::kSms, dev ? dev->sm : -1);
      return -1;
    }
    const int64_t rows = average_rows(*p);
    int32_t c = Arch::kNumConfigs - 1;
    for (int32_t i = 0; i < Arch::kNumConfigs; ++i) {
      if (Arch::kConfigs[i].rows_max < 0 || rows <= Arch::kConfigs[i].rows_max) {
        c = i;
        break;
      }
    }
    return can_run(p, c, dev, why, why_len) ? c : -1;
  }

  static size_t workspace_bytes(const GroupedProblem* p, int32_t config, const DeviceInfo* dev) {
    if (!valid(config, p->out_dtype) || dev == nullptr || p->g < 1 || p->g > INT_MAX) return 0;
    return Arch::ops(config, p->out_dtype).workspace(*p, *dev);
  }

  // The first call of each (device, config, output dtype) runs the self-check on `stream` first (never during
  // graph capture, which it would break: that call is refused with the reason instead).
  static bool verified(const GroupedProblem& p, int32_t config, const DeviceInfo& dev, cudaStream_t stream,
                       const float* one, char* err, size_t err_len) {
    if (!selfcheck::enabled()) return true;
    selfcheck::Verdicts& verdicts = Arch::verdicts();
    const char* name = Arch::kConfigs[config].name;
    if (verdicts.get(dev.index, config, p.out_dtype) == selfcheck::Verdict::kPass) return true;
    std::lock_guard<std::mutex> lock(verdicts.check_mutex());
    std::string detail;
    const selfcheck::Verdict known = verdicts.get(dev.index, config, p.out_dtype, &detail);
    if (known == selfcheck::Verdict::kPass) return true;
    if (known == selfcheck::Verdict::kUnknown) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) cudaGetLastError();
      if (status != cudaStreamCaptureStatusNone) {
        std::snprintf(err, err_len, "%s has not passed its first-use self-check in this process and cannot run it "
                      "during CUDA-graph capture: make one eager call before capturing (NVFP4_GEMM_SELFCHECK=0 skips "
                      "the check)", name);
        return false;
      }
      const GroupedKernelOps& ops = Arch::ops(config, p.out_dtype);
      const auto workspace_of = [&](const GroupedProblem& q) { return ops.workspace(q, dev); };
      const auto run = [&](const GroupedProblem& q, void* ws, size_t ws_bytes, char* e, size_t e_len) {
        return ops.run(q, dev, one, ws, ws_bytes, stream, e, e_len);
      };
      const selfcheck::Verdict v = selfcheck::run_selfcheck(p.out_dtype, dev, stream, workspace_of, run, detail);
      if (v == selfcheck::Verdict::kUnknown) {
        std::snprintf(err, err_len, "%s: %s", name, detail.c_str());
        return false;
      }
      verdicts.set(dev.index, config, p.out_dtype, v, detail);
      if (v == selfcheck::Verdict::kPass) return true;
    }
    std::snprintf(err, err_len, "%s FAILED its first-use self-check on cuda:%d (SM %d): %s. Its grouped problems go "
                  "to the generic path from now on; please report this with the output of `python -m nvfp4_gemm "
                  "--selftest`", name, dev.index, dev.sm, detail.c_str());
    return false;
  }

  // The binding layer sized the workspace with the same DeviceInfo, so run and workspace_bytes agree.
  static bool run(const GroupedProblem* p, int32_t config, const DeviceInfo* dev, void* workspace, size_t ws_bytes,
                  cudaStream_t stream, char* err, size_t err_len) {
    if (!can_run(p, config, dev, err, err_len)) return false;
    if (p->t == 0) return true;  // no rows: nothing to write
    const float* one = Arch::device_one(dev->index);
    if (one == nullptr) {
      std::snprintf(err, err_len, "%s: cannot get the device address of the constant 1.0f alpha", Arch::kName);
      return false;
    }
    if (!verified(*p, config, *dev, stream, one, err, err_len)) return false;
    char inner[384];
    if (!Arch::ops(config, p->out_dtype).run(*p, *dev, one, workspace, ws_bytes, stream, inner, sizeof(inner))) {
      std::snprintf(err, err_len, "%s: %s", Arch::kConfigs[config].name, inner);
      return false;
    }
    return true;
  }

  // "T/G 1..64: <config>" lines (average rows per group), then the refusals.
  static std::string rules_text() {
    std::string t;
    long long lo = 1;
    for (int32_t i = 0; i < Arch::kNumConfigs; ++i) {
      const GroupedConfigInfo& c = Arch::kConfigs[i];
      char line[256];
      if (c.rows_max >= 0)
        std::snprintf(line, sizeof(line), "ceil(T/G) %lld..%lld: %s\n", lo, static_cast<long long>(c.rows_max), c.name);
      else
        std::snprintf(line, sizeof(line), "ceil(T/G) >= %lld: %s\n", lo, c.name);
      t += line;
      lo = static_cast<long long>(c.rows_max) + 1;
    }
    t += "weight-only (16/32-bit A), T/N/K/G >= 2^31 or a failed first-use self-check: not here (the generic path)\n";
    return t;
  }

  static const char* dispatch_rules() {
    static const std::string text = rules_text();
    return text.c_str();
  }

  static const char* const* names() {
    struct List {
      const char* names[Arch::kNumConfigs];
    };
    static const List list = [] {
      List l{};
      for (int32_t i = 0; i < Arch::kNumConfigs; ++i) l.names[i] = Arch::kConfigs[i].name;
      return l;
    }();
    return list.names;
  }

  static const GroupedBackendApi& api() {
    static const GroupedBackendApi table{kGroupedAbiVersion, Arch::kName,    Arch::kTarget,    Arch::kNumConfigs,
                                         names(),            &Arch::supports_sm, &select,         &can_run,
                                         &workspace_bytes,   &run,             &dispatch_rules};
    return table;
  }
};

}  // namespace nvfp4_gemm
