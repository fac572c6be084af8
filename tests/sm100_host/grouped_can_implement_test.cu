// Grouped verification (e): every grouped table entry is accepted by CUTLASS's can_implement (with the host-known
// shape hint, and in the launch's form without host problem shapes) on the shapes the table sends to it, the
// workspace is sized on the host, and refusals come back through the GroupedBackendApi as messages.
//
// This links the real grouped_api.cpp and select.cpp and instantiates, for every config in
// generated/grouped_table.inc, the same GroupedLauncher<GroupedKernel<...>>::check / ::workspace the generated TUs
// export -- but no run(), so nothing needs a GPU. The self-check (which runs a kernel) is never reached here.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sm100/grouped_api.h"
#include "sm100/grouped_gemm.cuh"
#include "sm100/select.h"

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

static int failures = 0;

static GroupedProblem problem(int64_t t, int64_t n, int64_t k, int64_t g, OutDtype dt) {
  // Distinct 16-byte-aligned fake device addresses: can_implement inspects shapes, strides, alignment.
  GroupedProblem p{};
  p.a = reinterpret_cast<const uint8_t*>(uintptr_t(1) << 32);
  p.b = reinterpret_cast<const uint8_t*>(uintptr_t(2) << 32);
  p.sfa = reinterpret_cast<const uint8_t*>(uintptr_t(3) << 32);
  p.sfb = reinterpret_cast<const uint8_t*>(uintptr_t(4) << 32);
  p.c = reinterpret_cast<void*>(uintptr_t(5) << 32);
  p.offs = reinterpret_cast<const int32_t*>(uintptr_t(6) << 32);
  p.alpha = reinterpret_cast<const float*>(uintptr_t(7) << 32);
  p.t = t, p.n = n, p.k = k, p.g = g;
  p.lda = k / 2, p.ldb = k / 2, p.b_group_bytes = n * (k / 2), p.ldc = n;
  p.sfa_rows = (t + std::min(t, g) * 127) / 128 * 128;
  if (p.sfa_rows < 128) p.sfa_rows = 128;
  p.out_dtype = dt;
  return p;
}

int main() {
  const GroupedBackendApi& api = grouped_api();
  if (api.abi_version != kGroupedAbiVersion || std::string(api.name) != "sm100" || api.num_configs != kNumGroupedConfigs) {
    std::printf("FAIL the table's header: abi %d, name %s, %d configs\n", api.abi_version, api.name, api.num_configs);
    return 1;
  }
  std::vector<DeviceInfo> devices = {{100, 148, 232448}, {103, 148, 232448}, {100, 132, 232448}};
  // (N, K) of MoE expert projections (Qwen3-30B-A3B, Qwen3-235B, DeepSeek-V3, Mixtral, gpt-oss), and edges
  // (N = 8, K = 32, K/16 not a multiple of 4).
  std::vector<std::pair<int64_t, int64_t>> nk = {{1536, 2048}, {2048, 768},  {3072, 4096}, {4096, 1536},
                                                 {4096, 7168}, {7168, 2048}, {14336, 4096}, {4096, 14336},
                                                 {5760, 2880}, {2880, 2880}, {8, 32},      {136, 160},
                                                 {264, 1056}};
  std::vector<int64_t> gs = {1, 2, 8, 64, 128, 256, 384};
  std::vector<int64_t> ts = {0, 1, 7, 64, 128, 129, 512, 4096, 16384, 65536};
  std::vector<long> chosen(kNumGroupedConfigs, 0);
  long checked = 0;
  char why[512];
  for (const DeviceInfo& dev : devices) {
    for (auto [n, k] : nk) {
      for (int64_t g : gs) {
        for (int64_t t : ts) {
          for (OutDtype dt : {OutDtype::kFloat16, OutDtype::kBFloat16, OutDtype::kFloat32}) {
            GroupedProblem p = problem(t, n, k, g, dt);
            why[0] = 0;
            const int32_t c = api.select(&p, &dev, why, sizeof(why));
            ++checked;
            if (c < 0) {
              if (failures++ < 20)
                std::printf("FAIL SM %d T=%lld N=%lld K=%lld G=%lld dtype=%d: no config: %s\n", dev.sm, (long long)t,
                            (long long)n, (long long)k, (long long)g, int(dt), why);
              continue;
            }
            ++chosen[c];
            const int64_t rows = g ? (t + g - 1) / g : t;
            const GroupedConfigInfo& ci = kGroupedConfigs[c];
            if (!(ci.rows_max < 0 || rows <= ci.rows_max) || (c > 0 && kGroupedConfigs[c - 1].rows_max >= rows)) {
              if (failures++ < 20)
                std::printf("FAIL T=%lld G=%lld went to %s against the table\n", (long long)t, (long long)g, ci.name);
            }
            // Every config runs every problem (forced by name): can_run agrees for all of them.
            for (int32_t other = 0; other < kNumGroupedConfigs; ++other) {
              if (!api.can_run(&p, other, &dev, why, sizeof(why))) {
                if (failures++ < 20)
                  std::printf("FAIL %s refuses T=%lld N=%lld K=%lld G=%lld: %s\n", kGroupedConfigs[other].name,
                              (long long)t, (long long)n, (long long)k, (long long)g, why);
              }
            }
            const size_t ws = api.workspace_bytes(&p, c, &dev);
            if (ws < static_cast<size_t>(g) * 8 * 6) {
              if (failures++ < 20) std::printf("FAIL workspace %zu bytes for G=%lld\n", ws, (long long)g);
            }
          }
        }
      }
    }
  }
  for (int32_t c = 0; c < kNumGroupedConfigs; ++c) {
    std::printf("  %-45s chosen %ld times\n", kGroupedConfigs[c].name, chosen[c]);
    if (chosen[c] == 0) {
      ++failures;
      std::printf("FAIL %s is never chosen\n", kGroupedConfigs[c].name);
    }
  }
  // Workspace on 148 SMs: CUTLASS's tensormaps per SM plus the per-group argument arrays.
  for (auto [t, n, k, g] : {std::array<int64_t, 4>{8, 4096, 7168, 8}, {256, 1536, 2048, 128}, {16384, 4096, 7168, 256}}) {
    GroupedProblem p = problem(t, n, k, g, OutDtype::kBFloat16);
    const int32_t c = api.select(&p, &devices[0], why, sizeof(why));
    if (c < 0) continue;
    std::printf("  T=%-6lld N=%-5lld K=%-5lld G=%-4lld -> %-42s workspace %zu bytes\n", (long long)t, (long long)n,
                (long long)k, (long long)g, kGroupedConfigs[c].name, api.workspace_bytes(&p, c, &devices[0]));
  }

  // Refusals become messages naming the kernel.
  struct Bad {
    const char* what;
    GroupedProblem p;
    const char* expect;
  };
  GroupedProblem k48 = problem(64, 4096, 48, 8, OutDtype::kFloat16);   // 24-byte rows
  GroupedProblem n4 = problem(64, 4, 512, 8, OutDtype::kFloat16);      // 8-byte fp16 output rows
  GroupedProblem wo = problem(64, 4096, 512, 8, OutDtype::kFloat16);   // weight-only A
  wo.a_type = AType::kBFloat16;
  GroupedProblem lda = problem(64, 4096, 512, 8, OutDtype::kFloat16);  // rows 8 bytes off 16
  lda.lda = 264;
  GroupedProblem sfa = problem(64, 4096, 512, 8, OutDtype::kFloat16);  // sfa not whole atoms
  sfa.sfa_rows = 100;
  GroupedProblem big = problem(int64_t(1) << 31, 4096, 512, 8, OutDtype::kFloat16);
  for (const Bad& bad : {Bad{"K=48", k48, "K % 32 == 0"}, Bad{"N=4", n4, "N % 8 == 0"},
                         Bad{"weight-only", wo, "weight-only"}, Bad{"lda=264", lda, "16-byte aligned"},
                         Bad{"sfa_rows=100", sfa, "multiple of 128"}, Bad{"T=2^31", big, "2^31 - 1"}}) {
    for (int32_t c = 0; c < kNumGroupedConfigs; ++c) {
      why[0] = 0;
      const bool ok = api.can_run(&bad.p, c, &devices[0], why, sizeof(why));
      const std::string msg = why;
      if (ok || msg.find(bad.expect) == std::string::npos || msg.find(kGroupedConfigs[c].name) == std::string::npos) {
        ++failures;
        std::printf("FAIL %s on %s: can_run=%d, message \"%s\"\n", bad.what, kGroupedConfigs[c].name, ok, why);
      } else if (c == 0) {
        std::printf("  refusal (%s): %s\n", bad.what, why);
      }
    }
  }
  // CUTLASS's own can_implement (the kernels' check, below the table's rules) is not vacuous: it refuses the same
  // misalignments when asked directly.
#define NVFP4_SM100_GROUPED_CONFIG(name, ...)                                                              \
  for (const GroupedProblem& q : {k48, n4}) {                                                           \
    why[0] = 0;                                                                                           \
    if (kGroupedOps_##name[0].check(q, devices[0], why, sizeof(why)) ||                                   \
        !std::strstr(why, "CUTLASS can_implement refused")) {                                             \
      ++failures;                                                                                         \
      std::printf("FAIL %s's CUTLASS check accepts K=%lld N=%lld (\"%s\")\n", #name, (long long)q.k,      \
                  (long long)q.n, why);                                                                   \
    }                                                                                                     \
  }
#include "sm100/generated/grouped_table.inc"
  // Not SM 100 / 103: refused with a reason, nothing traps.
  for (int32_t sm : {90, 120}) {
    DeviceInfo other{sm, 84, 101376};
    GroupedProblem p = problem(128, 4096, 4096, 8, OutDtype::kFloat16);
    why[0] = 0;
    if (api.select(&p, &other, why, sizeof(why)) >= 0 || !std::strstr(why, "SM")) {
      ++failures;
      std::printf("FAIL SM %d accepted or refused without a reason (\"%s\")\n", sm, why);
    } else {
      std::printf("  SM %d: %s\n", sm, why);
    }
  }
  std::printf("%s", api.dispatch_rules());

  if (failures) {
    std::printf("grouped_can_implement_test: %d failures over %ld problems\n", failures, checked);
    return 1;
  }
  std::printf("grouped_can_implement_test: OK, %ld problems: every one selected a config CUTLASS accepts, and every "
              "config accepts it\n", checked);
  return 0;
}
