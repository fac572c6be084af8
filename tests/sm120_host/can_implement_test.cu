// Every SM120 dispatch-table entry is accepted by CUTLASS's can_implement on the shapes the table sends
// to it, and a refusal comes back through the BackendApi as a message naming the kernel.
//
// This links the real api.cpp and select.cpp and instantiates, for every config in generated/table.inc,
// the same CutlassLauncher<Kernel<...>>::check / ::workspace the generated TUs export -- but no run(), so no
// kernel is compiled and nothing needs a GPU.
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sm120/api.h"
#include "sm120/select.h"
#include "sm120/sm120_gemm.cuh"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::sm120;

namespace nvfp4_gemm::sm120 {
const float* device_one(int) { return nullptr; }  // api.cpp's run() path, never taken here

template <class K>
constexpr KernelOps host_ops() {
  return KernelOps{&CutlassLauncher<K>::check, &CutlassLauncher<K>::workspace, nullptr};
}

#define NVFP4_SM120_CONFIG(name, m_max, tm, tn, tk)                                                   \
  extern const KernelOps kOps_##name[3] = {host_ops<Kernel<tm, tn, tk, cutlass::half_t>>(),           \
                                           host_ops<Kernel<tm, tn, tk, cutlass::bfloat16_t>>(),       \
                                           host_ops<Kernel<tm, tn, tk, float>>()};
#include "sm120/generated/table.inc"
}  // namespace nvfp4_gemm::sm120

static int failures = 0;

static Problem problem(int64_t m, int64_t n, int64_t k, OutDtype dt) {
  // Distinct 16-byte-aligned fake device addresses: can_implement inspects shapes, strides, alignment.
  Problem p{};
  p.a = reinterpret_cast<const uint8_t*>(uintptr_t(1) << 32);
  p.b = reinterpret_cast<const uint8_t*>(uintptr_t(2) << 32);
  p.sfa = reinterpret_cast<const uint8_t*>(uintptr_t(3) << 32);
  p.sfb = reinterpret_cast<const uint8_t*>(uintptr_t(4) << 32);
  p.c = reinterpret_cast<void*>(uintptr_t(5) << 32);
  p.alpha = reinterpret_cast<const float*>(uintptr_t(6) << 32);
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k / 2;
  p.ldb = k / 2;
  p.ldc = n;
  p.out_dtype = dt;
  return p;
}

int main() {
  const BackendApi& api = backend_api();
  // RTX 5090 (170 SMs), RTX PRO 6000 Blackwell (188), DGX Spark GB10 (SM 12.1, 48); 99 KB opt-in smem.
  const std::vector<DeviceInfo> devices = {{120, 170, 101376}, {120, 188, 101376}, {121, 48, 101376}};
  // (N, K): LLM projections (Llama 3 8B/70B, Qwen, DeepSeek-V3), the GPU MODE shapes, and edge cases
  // (N = 8, K = 32, K/16 not a multiple of 4).
  const std::vector<std::pair<int64_t, int64_t>> nk = {
      {7168, 16384}, {4096, 7168}, {7168, 2048}, {4096, 4096}, {14336, 4096}, {4096, 14336}, {6144, 4096},
      {8192, 8192},  {28672, 8192}, {10240, 8192}, {2112, 7168}, {24576, 1536}, {8, 32}, {8, 96},
      {136, 160},    {264, 1056}, {3072, 1024}, {256, 256}};
  std::vector<int64_t> ms;
  for (int64_t m = 1; m <= 300; ++m) ms.push_back(m);
  for (int64_t m = 301; m <= 4096; m += 37) ms.push_back(m);
  for (int64_t m : {384, 512, 1024, 2048, 4096, 8192, 16384}) ms.push_back(m);

  std::vector<long> chosen(kNumConfigs, 0);
  long checked = 0;
  char why[512];
  for (const DeviceInfo& dev : devices) {
    for (auto [n, k] : nk) {
      for (int64_t m : ms) {
        for (OutDtype dt : {OutDtype::kFloat16, OutDtype::kBFloat16, OutDtype::kFloat32}) {
          Problem p = problem(m, n, k, dt);
          why[0] = 0;
          const int32_t c = api.select(&p, &dev, why, sizeof(why));
          ++checked;
          if (c < 0) {
            if (failures++ < 20)
              std::printf("FAIL SM %d M=%lld N=%lld K=%lld dtype=%d: no config: %s\n", dev.sm, (long long)m,
                          (long long)n, (long long)k, int(dt), why);
            continue;
          }
          ++chosen[c];
          const ConfigInfo& ci = kConfigs[c];
          if (!(ci.m_max < 0 || m <= ci.m_max) || (c > 0 && kConfigs[c - 1].m_max >= m)) {
            if (failures++ < 20) std::printf("FAIL M=%lld went to %s against the table\n", (long long)m, ci.name);
          }
        }
      }
    }
  }
  for (int32_t c = 0; c < kNumConfigs; ++c) {
    std::printf("  %-32s chosen %ld times\n", kConfigs[c].name, chosen[c]);
    if (chosen[c] == 0) {
      ++failures;
      std::printf("FAIL %s is never chosen\n", kConfigs[c].name);
    }
  }

  // What each entry compiled to (f16 output): pipeline depth and the dynamic shared memory it launches with.
#define NVFP4_SM120_CONFIG(name, m_max, tm, tn, tk)                                                   \
  std::printf("  %-28s %d stages, %d bytes of shared memory\n", #name,                                \
              Kernel<tm, tn, tk, cutlass::half_t>::kStages, Kernel<tm, tn, tk, cutlass::half_t>::kSmemBytes);
#include "sm120/generated/table.inc"

  // Workspace is sized on the host from the SM count alone (no device query).
  for (auto [m, n, k] : {std::array<int64_t, 3>{1, 4096, 4096}, {16, 14336, 4096}, {128, 7168, 16384},
                         {256, 4096, 7168}, {4096, 7168, 16384}}) {
    Problem p = problem(m, n, k, OutDtype::kFloat16);
    const int32_t c = api.select(&p, &devices[0], why, sizeof(why));
    if (c < 0) continue;
    std::printf("  M=%-5lld N=%-5lld K=%-5lld -> %-28s workspace %zu bytes\n", (long long)m, (long long)n,
                (long long)k, kConfigs[c].name, api.workspace_bytes(&p, c, &devices[0]));
  }

  // Refusals become messages naming the kernel and the CUTLASS status.
  struct Bad {
    const char* what;
    Problem p;
    const char* expect;
  };
  Problem misaligned_k = problem(128, 4096, 48, OutDtype::kFloat16);  // K % 32 != 0: 24-byte rows
  Problem narrow_n = problem(128, 4, 512, OutDtype::kFloat16);       // 8-byte fp16 output rows
  Problem weight_only = problem(16, 4096, 4096, OutDtype::kFloat16);
  weight_only.a_type = AType::kFloat16;
  weight_only.sfa = nullptr;
  Problem two_alphas = problem(16, 4096, 4096, OutDtype::kFloat16);
  two_alphas.alpha2 = two_alphas.alpha;
  for (const Bad& bad : {Bad{"K=48", misaligned_k, "can_implement refused"},
                         Bad{"N=4", narrow_n, "can_implement refused"},
                         Bad{"weight-only", weight_only, "generic path"},
                         Bad{"alpha2", two_alphas, "no alpha2"}}) {
    for (int32_t c = 0; c < kNumConfigs; ++c) {
      why[0] = 0;
      const bool ok = api.can_run(&bad.p, c, &devices[0], why, sizeof(why));
      const std::string msg = why;
      if (ok || msg.find(bad.expect) == std::string::npos || msg.find(kConfigs[c].name) == std::string::npos) {
        ++failures;
        std::printf("FAIL %s on %s: can_run=%d, message \"%s\"\n", bad.what, kConfigs[c].name, ok, why);
      } else if (c == 0) {
        std::printf("  refusal (%s): %s\n", bad.what, why);
      }
    }
  }
  // Not the SM120 family (datacenter Blackwell, Hopper): the module refuses and says why, nothing traps.
  for (int32_t sm : {90, 100, 103}) {
    const DeviceInfo other{sm, 132, 232448};
    Problem p = problem(128, 4096, 4096, OutDtype::kFloat16);
    why[0] = 0;
    if (api.supports_sm(sm) || api.select(&p, &other, why, sizeof(why)) >= 0 || !std::strstr(why, "SM")) {
      ++failures;
      std::printf("FAIL SM %d accepted or refused without a reason (\"%s\")\n", sm, why);
    } else {
      std::printf("  SM %d: %s\n", sm, why);
    }
  }
  if (!api.supports_sm(120) || !api.supports_sm(121) || std::strcmp(api.compiled_for, "sm_120f") != 0) {
    ++failures;
    std::printf("FAIL the module must take SM 120 and 121 and say sm_120f, says %s\n", api.compiled_for);
  }

  if (failures) {
    std::printf("can_implement_test: %d failures over %ld problems\n", failures, checked);
    return 1;
  }
  std::printf("can_implement_test: OK, %ld problems: every one selected a config CUTLASS accepts\n", checked);
  return 0;
}
