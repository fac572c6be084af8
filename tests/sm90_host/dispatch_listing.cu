// Lists the SM90 backend's dispatch decision over a fixed grid of problems, without a GPU: for each (mode, output
// dtype, SM count, M, N, K), what automatic dispatch runs (a config name, or "generic"), what a forced sm90
// backend runs (select), and the workspace the chosen config asks for (its split plan in bytes). Linked against
// the backend's own translation units and nothing else: the kernels are never launched.
//
// The grid: every M 1..40 and the boundaries of the M rows around powers of two up to 8192; the projections of
// Llama 3 8B and 70B, of MoE experts (Qwen3-30B-A3B, Qwen3-235B-A22B, gpt-oss) and of the GPU MODE problems; K
// not a multiple of 256 too; weight-only fp16 / bf16 / fp32 activations, packed NVFP4 A, and linear's static and dynamic W4A4
// (the fused problem first, then the packed one linear falls back to); fp16 / bf16 / fp32 outputs; an H100 SXM
// (132 SMs) and an H100 PCIe (114 SMs). Automatic and forced choices go through the binding layer's resolver.
//
// tests/test_sm90_host.py builds it and compares its output with tests/sm90_host/dispatch_listing.txt, which a
// refactor of the dispatch code must leave unchanged.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bindings/resolve.h"
#include "common/problem.h"
#include "sm90/backend.h"

using namespace nvfp4_gemm;

namespace {

// Fake, 256-byte aligned device addresses: the backend only checks their alignment.
const uint8_t* addr(uintptr_t v) { return reinterpret_cast<const uint8_t*>(v); }
float* faddr(uintptr_t v) { return reinterpret_cast<float*>(v); }

enum class Mode { kW16, kBf16, kF32, kW4A4, kStatic, kDynamic };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kW16: return "w4a16-f16";
    case Mode::kBf16: return "w4a16-bf16";
    case Mode::kF32: return "w4a16-f32";
    case Mode::kW4A4: return "w4a4";
    case Mode::kStatic: return "static";
    default: return "dynamic";
  }
}

Problem packed_problem(int64_t m, int64_t n, int64_t k, OutDtype out) {
  Problem p{};
  p.a = addr(0x10000000);
  p.b = addr(0x20000000);
  p.sfa = addr(0x30000000);
  p.sfb = addr(0x40000000);
  p.alpha = faddr(0x50000000);
  p.c = reinterpret_cast<void*>(0x60000000);
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k / 2;
  p.ldb = k / 2;
  p.ldc = n;
  p.out_dtype = out;
  p.a_type = AType::kE2m1;
  return p;
}

Problem float_a_problem(int64_t m, int64_t n, int64_t k, OutDtype out, AType t) {
  Problem p = packed_problem(m, n, k, out);
  p.sfa = nullptr;
  p.a_type = t;
  p.lda = k * (t == AType::kFloat32 ? 4 : 2);
  return p;
}

// Config names without the common "sm90_nvfp4_" prefix, to keep the listing short.
std::string short_name(const BackendApi& api, int cfg) {
  const std::string name = api.config_names[cfg];
  return name.rfind("sm90_nvfp4_", 0) == 0 ? name.substr(11) : name;
}

// What automatic dispatch runs on this device, through the binding layer's resolver (bindings/resolve.h), as
// mm_cuda does: a config name, or "generic".
std::string automatic(const BackendApi& api, const Problem& p, const DeviceInfo& dev, int* cfg_out) {
  Choice<BackendApi> c;
  const std::string err =
      resolve(p, dev, std::vector<const BackendApi*>{&api}, Forcing{}, false, [] { return std::string(); }, &c);
  *cfg_out = err.empty() && c.api ? c.config : -1;
  return *cfg_out >= 0 ? short_name(api, c.config) : "generic";
}

// What a forced sm90 backend runs, or "none" (the forced call is refused).
std::string forced(const BackendApi& api, const Problem& p, const DeviceInfo& dev) {
  Choice<BackendApi> c;
  Forcing f;
  f.backend = "sm90";
  const std::string err =
      resolve(p, dev, std::vector<const BackendApi*>{&api}, f, false, [] { return std::string(); }, &c);
  return err.empty() ? short_name(api, c.config) : "none";
}

std::string workspace(const BackendApi& api, const Problem& p, int cfg, const DeviceInfo& dev) {
  return cfg >= 0 ? std::to_string(api.workspace_bytes(&p, cfg, &dev)) : "-";
}

// One problem's decisions: for mm (weight-only and packed modes), automatic + workspace + forced; for linear's
// W4A4 modes on CUDA (linear_cuda.cpp), per activation dtype the fused problem (x quantized by the kernel;
// dynamic first with the kernel's own scales, then the static form after the input-scales kernel), and the
// packed problem linear falls back to after quantize.
std::string decide(const BackendApi& api, Mode mode, OutDtype out, const DeviceInfo& dev, int64_t m, int64_t n,
                   int64_t k) {
  int cfg = -1;
  if (mode != Mode::kStatic && mode != Mode::kDynamic) {
    const Problem p = mode == Mode::kW4A4 ? packed_problem(m, n, k, out)
                      : float_a_problem(m, n, k, out,
                                        mode == Mode::kW16    ? AType::kFloat16
                                        : mode == Mode::kBf16 ? AType::kBFloat16
                                                              : AType::kFloat32);
    const std::string a = automatic(api, p, dev, &cfg);
    return a + " ws=" + workspace(api, p, cfg, dev) + " | forced: " + forced(api, p, dev);
  }
  std::string path;
  for (const AType xt : {AType::kFloat16, AType::kBFloat16, AType::kFloat32}) {
    const Problem f = float_a_problem(m, n, k, out, xt);
    std::string step;
    int c = -1;
    if (mode == Mode::kDynamic) {
      Problem d = f;
      d.a_dynamic_ws2 = faddr(0x70000000);
      d.a_dynamic_out = faddr(0x70000100);
      d.alpha = faddr(0x70000108);
      const std::string a = automatic(api, d, dev, &c);
      step += "dyn:" + a + " ws=" + workspace(api, d, c, dev) + " forced=" + forced(api, d, dev) + " ";
    }
    Problem s = f;
    s.a_scale = faddr(0x70000200);
    s.a_scale_is_decode = mode == Mode::kStatic;
    if (mode == Mode::kStatic) s.alpha2 = faddr(0x70000300);
    const std::string a = automatic(api, s, dev, &c);
    step += "q:" + a + " ws=" + workspace(api, s, c, dev) + " forced=" + forced(api, s, dev);
    path += std::string(path.empty() ? "" : " / ") +
            (xt == AType::kFloat16 ? "x16 " : xt == AType::kBFloat16 ? "xbf16 " : "x32 ") + step;
  }
  const Problem pk = packed_problem(m, n, k, out);
  const std::string a = automatic(api, pk, dev, &cfg);
  return path + " | packed: " + a + " ws=" + workspace(api, pk, cfg, dev);
}

}  // namespace

int main() {
  const BackendApi& api = sm90::backend_api();
  static const int64_t kM[] = {1,    2,    3,    4,    5,    6,    7,    8,    9,    10,   11,   12,   13,   14,
                               15,   16,   17,   18,   19,   20,   21,   22,   23,   24,   25,   26,   27,   28,
                               29,   30,   31,   32,   33,   34,   35,   36,   37,   38,   39,   40,   48,   63,
                               64,   65,   96,   127,  128,  129,  192,  255,  256,  257,  384,  511,  512,  513,
                               1000, 1024, 1500, 2047, 2048, 2049, 3000, 4096, 5000, 8191, 8192};
  static const int64_t kNK[][2] = {
      {6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336},      // Llama 3 8B: qkv, o, gate_up, down
      {10240, 8192}, {8192, 8192}, {57344, 8192}, {8192, 28672},     // Llama 3 70B
      {1536, 2048}, {2048, 768}, {3072, 4096}, {4096, 1536},        // MoE experts: Qwen3-30B-A3B, Qwen3-235B-A22B
      {5760, 2880}, {2880, 2880},                                    // gpt-oss experts (K % 256 == 64)
      {7168, 16384}, {4096, 7168}, {7168, 2048}, {4608, 7168},       // GPU MODE, DeepSeek
      {256, 96}, {8, 32}, {1032, 160}, {2048, 4128}, {24, 1088},     // K % 256 != 0, small N
  };
  static const OutDtype kOut[] = {OutDtype::kFloat16, OutDtype::kBFloat16, OutDtype::kFloat32};
  static const char* kOutName[] = {"f16", "bf16", "f32"};
  static const Mode kModes[] = {Mode::kW16, Mode::kBf16, Mode::kF32, Mode::kW4A4, Mode::kStatic, Mode::kDynamic};
  static const int kSms[] = {132, 114};
  std::printf("# sm90 dispatch listing (tests/sm90_host/dispatch_listing.cu); backend %s, %d configs\n", api.name,
              api.num_configs);
  for (int i = 0; i < api.num_configs; ++i) std::printf("# config %d: %s\n", i, api.config_names[i]);
  for (const int sms : kSms) {
    const DeviceInfo dev{90, sms, 232448};
    for (const Mode mode : kModes) {
      for (const auto& nk : kNK) {
        for (const int64_t m : kM) {
          // One line where every output dtype decides alike (the usual case), else one line per dtype.
          std::string d[3];
          for (int o = 0; o < 3; ++o) d[o] = decide(api, mode, kOut[o], dev, m, nk[0], nk[1]);
          const bool alike = d[0] == d[1] && d[1] == d[2];
          for (int o = 0; o < (alike ? 1 : 3); ++o)
            std::printf("%s out=%s sms=%d m=%lld n=%lld k=%lld: %s\n", mode_name(mode), alike ? "*" : kOutName[o],
                        sms, static_cast<long long>(m), static_cast<long long>(nk[0]), static_cast<long long>(nk[1]),
                        d[o].c_str());
        }
      }
    }
  }
  // A refusal for what the least-cost cache's key does not hold (here sfb's alignment) is not remembered for the
  // shape: the same shape with aligned pointers still gets its config (a shape outside the grid, so first seen here).
  {
    const DeviceInfo dev{90, 132, 232448};
    char why[256] = {0};
    Problem p = packed_problem(320, 6144, 4096, OutDtype::kFloat16);
    p.sfb = addr(0x40000004);
    const int refused = api.select(&p, &dev, why, sizeof(why));
    p.sfb = addr(0x40000000);
    const int chosen = api.select(&p, &dev, why, sizeof(why));
    std::printf("w4a4 m=320 n=6144 k=4096, sfb 4-byte aligned then 16: %s, then %s\n",
                refused < 0 ? "refused" : api.config_names[refused], chosen < 0 ? "refused" : api.config_names[chosen]);
  }
  return 0;
}
