// CUDA implementation of nvfp4_gemm::mm: validate once, describe the problem to the backends, pick one
// (forced by NVFP4_GEMM_BACKEND / NVFP4_GEMM_CONFIG, else the first arch module whose table takes the
// problem on this device, else the generic path), allocate its workspace through torch, launch on the
// current stream. No host sync anywhere.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "bindings/checks.h"
#include "bindings/registry.h"
#include "cuda/generic.h"

namespace nvfp4_gemm {
namespace {

constexpr size_t kErrLen = 512;

const DeviceInfo& device_info(int device) {
  static std::mutex mutex;
  static DeviceInfo cache[256];
  static bool filled[256] = {};
  TORCH_CHECK(device >= 0 && device < 256, "nvfp4_gemm: device index ", device, " out of range");
  std::lock_guard<std::mutex> lock(mutex);
  if (!filled[device]) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
    cache[device] = DeviceInfo{prop->major * 10 + prop->minor, prop->multiProcessorCount,
                               static_cast<int64_t>(prop->sharedMemPerBlockOptin)};
    filled[device] = true;
  }
  return cache[device];
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string arch_hint(const std::string& backend) {
  if (backend == "sm90") return "NVFP4_GEMM_CUDA_ARCHS=9.0a";
  if (backend == "sm100") return "NVFP4_GEMM_CUDA_ARCHS=10.0f";
  return "NVFP4_GEMM_CUDA_ARCHS=<arch>";
}

struct Choice {
  const BackendApi* api = nullptr;  // nullptr: the generic path
  int32_t config = -1;
};

// NVFP4_GEMM_PRINT_CONFIGS=1 prints each (backend, config, shape) choice once, to see what dispatch does.
void maybe_print(const Choice& c, const Problem& p) {
  static const bool enabled = !env_or_empty("NVFP4_GEMM_PRINT_CONFIGS").empty();
  if (!enabled) return;
  static std::mutex mutex;
  static std::set<std::string> seen;
  const std::string name = c.api ? std::string(c.api->name) + ":" + c.api->config_names[c.config] : "generic";
  const std::string key = name + " m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) +
                          " k=" + std::to_string(p.k) + " out=" + std::to_string(static_cast<int>(p.out_dtype));
  std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(key).second) std::fprintf(stderr, "[nvfp4_gemm] %s\n", key.c_str());
}

Choice choose(const Problem& p, const DeviceInfo& dev) {
  char why[kErrLen] = {0};
  const std::string forced_config = env_or_empty("NVFP4_GEMM_CONFIG");
  if (!forced_config.empty()) {
    for (const BackendApi* api : backends()) {
      for (int32_t i = 0; i < api->num_configs; ++i) {
        if (forced_config != api->config_names[i]) continue;
        TORCH_CHECK(api->supports_sm(dev.sm), "nvfp4_gemm: NVFP4_GEMM_CONFIG=", forced_config, " belongs to backend ",
                    api->name, " (", api->compiled_for, "), which cannot run on this SM ", dev.sm / 10, ".",
                    dev.sm % 10, " device");
        TORCH_CHECK(api->can_run(&p, i, &dev, why, kErrLen), "nvfp4_gemm: NVFP4_GEMM_CONFIG=", forced_config,
                    " cannot run M=", p.m, " N=", p.n, " K=", p.k, ": ", why);
        return Choice{api, i};
      }
    }
    TORCH_CHECK(false, "nvfp4_gemm: NVFP4_GEMM_CONFIG=", forced_config,
                " names no compiled kernel config; nvfp4_gemm.configs() lists them");
  }

  const std::string forced = env_or_empty("NVFP4_GEMM_BACKEND");
  if (forced == "generic") return Choice{};
  if (!forced.empty() && forced != "auto") {
    TORCH_CHECK(forced == "sm90" || forced == "sm100", "nvfp4_gemm: NVFP4_GEMM_BACKEND must be one of auto, "
                "generic, sm90, sm100 (cpu is chosen by putting the tensors on the CPU), got '", forced, "'");
    const BackendApi* api = find_backend(forced);
    TORCH_CHECK(api != nullptr, "nvfp4_gemm: NVFP4_GEMM_BACKEND=", forced,
                " but that backend was not compiled into this build; rebuild with ", arch_hint(forced));
    TORCH_CHECK(api->supports_sm(dev.sm), "nvfp4_gemm: NVFP4_GEMM_BACKEND=", forced, " (", api->compiled_for,
                ") cannot run on this SM ", dev.sm / 10, ".", dev.sm % 10, " device");
    const int32_t cfg = api->select(&p, &dev, why, kErrLen);
    TORCH_CHECK(cfg >= 0, "nvfp4_gemm: NVFP4_GEMM_BACKEND=", forced, " has no kernel for M=", p.m, " N=", p.n,
                " K=", p.k, ": ", why);
    return Choice{api, cfg};
  }

  for (const BackendApi* api : backends()) {
    if (!api->supports_sm(dev.sm)) continue;
    if (api->prefers_generic != nullptr && api->prefers_generic(&p, &dev)) continue;
    const int32_t cfg = api->select(&p, &dev, why, kErrLen);
    if (cfg >= 0) return Choice{api, cfg};
  }
  return Choice{};
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sfa, const at::Tensor& sfb,
                   const std::optional<at::Tensor>& alpha, std::optional<at::ScalarType> out_dtype) {
  const MmShape s = check_mm_inputs(a, b, sfa, sfb, alpha, out_dtype, /*gpu_rules=*/true);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor c = at::empty({s.m, s.n}, a.options().dtype(s.out_dtype));
  if (s.m == 0 || s.n == 0) return c;

  const DeviceInfo& dev = device_info(a.get_device());
  TORCH_CHECK(dev.sm >= 80, "nvfp4_gemm.mm: no usable kernel for this GPU (SM ", dev.sm / 10, ".", dev.sm % 10,
              "): the CUDA backends need SM >= 8.0; move the tensors to the CPU to use the CPU backend");

  const Problem p{static_cast<const uint8_t*>(a.data_ptr()),
                  static_cast<const uint8_t*>(b.data_ptr()),
                  static_cast<const uint8_t*>(sfa.data_ptr()),
                  static_cast<const uint8_t*>(sfb.data_ptr()),
                  alpha.has_value() ? alpha->data_ptr<float>() : nullptr,
                  c.data_ptr(),
                  s.m, s.n, s.k,
                  s.m > 1 ? a.stride(0) : s.k / 2,
                  s.n > 1 ? b.stride(0) : s.k / 2,
                  s.n,
                  to_out_dtype(s.out_dtype)};
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Choice choice = choose(p, dev);
  maybe_print(choice, p);
  char err[kErrLen] = {0};

  if (choice.api == nullptr) {
    TORCH_CHECK(s.m < INT32_MAX && s.n < INT32_MAX && s.k < INT32_MAX, "nvfp4_gemm.mm: the generic path takes "
                "dimensions below 2^31, got M=", s.m, " N=", s.n, " K=", s.k);
    const at::ScalarType op = generic::decode_to_bf16(p.out_dtype) ? at::kBFloat16 : at::kHalf;
    at::Tensor a_dq = at::empty({s.m, s.k}, a.options().dtype(op));
    at::Tensor b_dq = at::empty({s.n, s.k}, a.options().dtype(op));
    const bool ok = generic::run(p, at::cuda::getCurrentCUDABlasHandle(), a_dq.data_ptr(), b_dq.data_ptr(), stream,
                                 err, kErrLen);
    TORCH_CHECK(ok, "nvfp4_gemm.mm (generic CUDA path, SM ", dev.sm, "): ", err);
    return c;
  }

  const size_t ws_bytes = choice.api->workspace_bytes(&p, choice.config, &dev);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
  const bool ok = choice.api->run(&p, choice.config, ws_bytes ? workspace.data_ptr() : nullptr, ws_bytes, stream,
                                  err, kErrLen);
  TORCH_CHECK(ok, "nvfp4_gemm.mm (", choice.api->name, " config ", choice.api->config_names[choice.config],
              ", M=", s.m, " N=", s.n, " K=", s.k, "): ", err);
  return c;
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) { m.impl("mm", &nvfp4_gemm::mm_cuda); }
