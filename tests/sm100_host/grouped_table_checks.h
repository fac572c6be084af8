// The architecture-independent part of the grouped can_implement host programs (sm100_host and sm120_host
// grouped_can_implement_test.cu): the table walk over MoE shapes, the workspace, the refusal messages and the
// other-SM refusals, over a module's GroupedBackendApi and its GroupedConfigInfo rows. Each program adds what
// names its kernels (CUTLASS's own can_implement on each config, asked directly).
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/cutlass_grouped_ops.h"
#include "common/grouped.h"

namespace grouped_host {
using namespace nvfp4_gemm;

inline int failures = 0;

inline GroupedProblem problem(int64_t t, int64_t n, int64_t k, int64_t g, OutDtype dt) {
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

// Two problems the table's rules and CUTLASS's own check both refuse: 24-byte rows (K = 48) and 8-byte fp16
// output rows (N = 4).
inline GroupedProblem k48() { return problem(64, 4096, 48, 8, OutDtype::kFloat16); }
inline GroupedProblem n4() { return problem(64, 4, 512, 8, OutDtype::kFloat16); }

// The table walk; returns the problems checked, or -1 if the table's header is not `name`'s.
inline long check_table(const GroupedBackendApi& api, const char* name, const GroupedConfigInfo* configs,
                        int32_t num_configs, const std::vector<DeviceInfo>& devices) {
  if (api.abi_version != kGroupedAbiVersion || std::string(api.name) != name || api.num_configs != num_configs) {
    std::printf("FAIL the table's header: abi %d, name %s, %d configs\n", api.abi_version, api.name, api.num_configs);
    ++failures;
    return -1;
  }
  // (N, K) of MoE expert projections (Qwen3-30B-A3B, Qwen3-235B, DeepSeek-V3, Mixtral, gpt-oss), and edges
  // (N = 8, K = 32, K/16 not a multiple of 4).
  std::vector<std::pair<int64_t, int64_t>> nk = {{1536, 2048}, {2048, 768},  {3072, 4096}, {4096, 1536},
                                                 {4096, 7168}, {7168, 2048}, {14336, 4096}, {4096, 14336},
                                                 {5760, 2880}, {2880, 2880}, {8, 32},      {136, 160},
                                                 {264, 1056}};
  std::vector<int64_t> gs = {1, 2, 8, 64, 128, 256, 384};
  std::vector<int64_t> ts = {0, 1, 7, 64, 128, 129, 512, 4096, 16384, 65536};
  std::vector<long> chosen(num_configs, 0);
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
            const GroupedConfigInfo& ci = configs[c];
            if (!(ci.rows_max < 0 || rows <= ci.rows_max) || (c > 0 && configs[c - 1].rows_max >= rows)) {
              if (failures++ < 20)
                std::printf("FAIL T=%lld G=%lld went to %s against the table\n", (long long)t, (long long)g, ci.name);
            }
            // Every config runs every problem (forced by name): can_run agrees for all of them.
            for (int32_t other = 0; other < num_configs; ++other) {
              if (!api.can_run(&p, other, &dev, why, sizeof(why))) {
                if (failures++ < 20)
                  std::printf("FAIL %s refuses T=%lld N=%lld K=%lld G=%lld: %s\n", configs[other].name,
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
  for (int32_t c = 0; c < num_configs; ++c) {
    std::printf("  %-45s chosen %ld times\n", configs[c].name, chosen[c]);
    if (chosen[c] == 0) {
      ++failures;
      std::printf("FAIL %s is never chosen\n", configs[c].name);
    }
  }
  // Workspace on the first device's SMs: CUTLASS's tensormaps per SM plus the per-group argument arrays.
  for (auto [t, n, k, g] : {std::array<int64_t, 4>{8, 4096, 7168, 8}, {256, 1536, 2048, 128}, {16384, 4096, 7168, 256}}) {
    GroupedProblem p = problem(t, n, k, g, OutDtype::kBFloat16);
    const int32_t c = api.select(&p, &devices[0], why, sizeof(why));
    if (c < 0) continue;
    std::printf("  T=%-6lld N=%-5lld K=%-5lld G=%-4lld -> %-42s workspace %zu bytes\n", (long long)t, (long long)n,
                (long long)k, (long long)g, configs[c].name, api.workspace_bytes(&p, c, &devices[0]));
  }

  // Refusals become messages naming the kernel.
  struct Bad {
    const char* what;
    GroupedProblem p;
    const char* expect;
  };
  GroupedProblem wo = problem(64, 4096, 512, 8, OutDtype::kFloat16);   // weight-only A
  wo.a_type = AType::kBFloat16;
  GroupedProblem lda = problem(64, 4096, 512, 8, OutDtype::kFloat16);  // rows 8 bytes off 16
  lda.lda = 264;
  GroupedProblem sfa = problem(64, 4096, 512, 8, OutDtype::kFloat16);  // sfa not whole atoms
  sfa.sfa_rows = 100;
  GroupedProblem big = problem(int64_t(1) << 31, 4096, 512, 8, OutDtype::kFloat16);
  for (const Bad& bad : {Bad{"K=48", k48(), "K % 32 == 0"}, Bad{"N=4", n4(), "N % 8 == 0"},
                         Bad{"weight-only", wo, "weight-only"}, Bad{"lda=264", lda, "16-byte aligned"},
                         Bad{"sfa_rows=100", sfa, "multiple of 128"}, Bad{"T=2^31", big, "2^31 - 1"}}) {
    for (int32_t c = 0; c < num_configs; ++c) {
      why[0] = 0;
      const bool ok = api.can_run(&bad.p, c, &devices[0], why, sizeof(why));
      const std::string msg = why;
      if (ok || msg.find(bad.expect) == std::string::npos || msg.find(configs[c].name) == std::string::npos) {
        ++failures;
        std::printf("FAIL %s on %s: can_run=%d, message \"%s\"\n", bad.what, configs[c].name, ok, why);
      } else if (c == 0) {
        std::printf("  refusal (%s): %s\n", bad.what, why);
      }
    }
  }
  return checked;
}

// CUTLASS's own can_implement (the kernels' check, below the table's rules) refuses the misaligned problems when
// asked directly: it is not vacuous. `ops` is a config's GroupedKernelOps row.
inline void check_cutlass_refuses(const char* name, const GroupedKernelOps* ops, const DeviceInfo& dev) {
  char why[512];
  for (const GroupedProblem& q : {k48(), n4()}) {
    why[0] = 0;
    if (ops[0].check(q, dev, why, sizeof(why)) || !std::strstr(why, "CUTLASS can_implement refused")) {
      ++failures;
      std::printf("FAIL %s's CUTLASS check accepts K=%lld N=%lld (\"%s\")\n", name, (long long)q.k, (long long)q.n,
                  why);
    }
  }
}

// Devices of other SMs: refused with a reason, nothing traps.
inline void check_other_sms(const GroupedBackendApi& api, std::initializer_list<DeviceInfo> others) {
  char why[512];
  for (const DeviceInfo& other : others) {
    GroupedProblem p = problem(128, 4096, 4096, 8, OutDtype::kFloat16);
    why[0] = 0;
    if (api.select(&p, &other, why, sizeof(why)) >= 0 || !std::strstr(why, "SM")) {
      ++failures;
      std::printf("FAIL SM %d accepted or refused without a reason (\"%s\")\n", other.sm, why);
    } else {
      std::printf("  SM %d: %s\n", other.sm, why);
    }
  }
}

inline int finish(const GroupedBackendApi& api, long checked) {
  std::printf("%s", api.dispatch_rules());
  if (failures) {
    std::printf("grouped_can_implement_test: %d failures over %ld problems\n", failures, checked);
    return 1;
  }
  std::printf("grouped_can_implement_test: OK, %ld problems: every one selected a config CUTLASS accepts, and every "
              "config accepts it\n", checked);
  return 0;
}

}  // namespace grouped_host
