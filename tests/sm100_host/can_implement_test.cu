// Verification (e): every dispatch-table entry is accepted by CUTLASS's can_implement on the shapes the
// table sends to it, and a refusal comes back through the BackendApi as a message naming the kernel.
//
// This links the real api.cpp and select.cpp and instantiates, for every config in generated/table.inc,
// the same CutlassLauncher<Kernel<...>>::check / ::workspace the generated TUs export -- but no run(), so no
// device code is compiled and nothing needs a GPU.
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sm100/api.h"
#include "sm100/select.h"
#include "sm100/sm100_gemm.cuh"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::sm100;

namespace nvfp4_gemm::sm100 {
const float* device_one(int) { return nullptr; }  // api.cpp's run() path, never taken here

template <class K>
constexpr KernelOps host_ops() {
  return KernelOps{&CutlassLauncher<K>::check, &CutlassLauncher<K>::workspace, nullptr};
}

#define NVFP4_SM100_CONFIG(name, m_max, tm, tn, cm, cn, two_sm, stream_k, swap_ab)                      \
  extern const KernelOps kOps_##name[3] = {                                                            \
      host_ops<Kernel<tm, tn, cm, cn, two_sm != 0, stream_k != 0, swap_ab != 0, cutlass::half_t>>(),    \
      host_ops<Kernel<tm, tn, cm, cn, two_sm != 0, stream_k != 0, swap_ab != 0, cutlass::bfloat16_t>>(), \
      host_ops<Kernel<tm, tn, cm, cn, two_sm != 0, stream_k != 0, swap_ab != 0, float>>(),              \
  };
#include "sm100/generated/table.inc"
}  // namespace nvfp4_gemm::sm100

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
  std::vector<DeviceInfo> devices = {{100, 148, 232448}, {103, 148, 232448}, {100, 132, 232448}};
  // (N, K): GPU MODE nvfp4_gemm benchmark shapes, LLM projections (Llama 3 8B/70B, DeepSeek-V3,
  // Qwen), and edge cases (N = 8, K = 32, K/16 not a multiple of 4).
  std::vector<std::pair<int64_t, int64_t>> nk = {
      {7168, 16384}, {4096, 7168}, {7168, 2048}, {4096, 4096}, {14336, 4096}, {4096, 14336},
      {6144, 4096},  {8192, 8192}, {28672, 8192}, {8192, 28672}, {10240, 8192}, {2112, 7168},
      {24576, 1536}, {32768, 512}, {7168, 18432}, {18432, 7168}, {8, 32}, {8, 96},
      {136, 160},    {264, 1056}, {3072, 1024}, {256, 256}};
  std::vector<int64_t> ms;
  for (int64_t m = 1; m <= 300; ++m) ms.push_back(m);
  for (int64_t m = 301; m <= 4096; m += 37) ms.push_back(m);
  for (int64_t m : {384, 512, 640, 768, 1000, 1023, 1024, 1025, 2048, 4096, 8192, 16384}) ms.push_back(m);

  std::vector<long> chosen(kNumConfigs, 0);
  long checked = 0;
  char why[512];
  for (const DeviceInfo& dev : devices) {
    for (auto [n, k] : nk) {
      for (int64_t m : ms) {
        for (OutDtype dt : {OutDtype::kFloat16, OutDtype::kBFloat16, OutDtype::kFloat32}) {
          Problem p = problem(m, n, k, dt);
          why[0] = 0;
          int32_t c = api.select(&p, &dev, why, sizeof(why));
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
    std::printf("  %-45s chosen %ld times\n", kConfigs[c].name, chosen[c]);
    if (chosen[c] == 0) {
      ++failures;
      std::printf("FAIL %s is never chosen\n", kConfigs[c].name);
    }
  }

  // Workspace is sized on the host from the SM count alone (no device query): shown for the GPU MODE
  // benchmark shapes and decode, on 148 SMs.
  for (auto [m, n, k] : {std::array<int64_t, 3>{128, 7168, 16384}, {128, 4096, 7168}, {128, 7168, 2048},
                         {1, 7168, 16384}, {16, 4096, 2048}, {512, 7168, 2048}, {4096, 7168, 16384}}) {
    Problem p = problem(m, n, k, OutDtype::kFloat16);
    int32_t c = api.select(&p, &devices[0], why, sizeof(why));
    if (c < 0) continue;
    std::printf("  M=%-5lld N=%-5lld K=%-5lld -> %-42s workspace %zu bytes\n", (long long)m, (long long)n,
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
  for (const Bad& bad : {Bad{"K=48", misaligned_k, "can_implement refused"},
                         Bad{"N=4", narrow_n, "can_implement refused"}}) {
    for (int32_t c = 0; c < kNumConfigs; ++c) {
      why[0] = 0;
      bool ok = api.can_run(&bad.p, c, &devices[0], why, sizeof(why));
      std::string msg = why;
      if (ok || msg.find(bad.expect) == std::string::npos || msg.find(kConfigs[c].name) == std::string::npos) {
        ++failures;
        std::printf("FAIL %s on %s: can_run=%d, message \"%s\"\n", bad.what, kConfigs[c].name, ok, why);
      } else if (c == 0) {
        std::printf("  refusal (%s): %s\n", bad.what, why);
      }
    }
  }
  // Not a Blackwell datacenter part (SM 120, SM 90): the module refuses and says why, nothing traps.
  for (int32_t sm : {90, 120}) {
    DeviceInfo other{sm, 84, 101376};
    Problem p = problem(128, 4096, 4096, OutDtype::kFloat16);
    why[0] = 0;
    if (api.supports_sm(sm) || api.select(&p, &other, why, sizeof(why)) >= 0 || !std::strstr(why, "SM")) {
      ++failures;
      std::printf("FAIL SM %d accepted or refused without a reason (\"%s\")\n", sm, why);
    } else {
      std::printf("  SM %d: %s\n", sm, why);
    }
  }

  if (failures) {
    std::printf("can_implement_test: %d failures over %ld problems\n", failures, checked);
    return 1;
  }
  std::printf("can_implement_test: OK, %ld problems: every one selected a config CUTLASS accepts\n", checked);
  return 0;
}
