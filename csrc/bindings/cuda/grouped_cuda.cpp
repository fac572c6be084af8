// CUDA implementation of nvfp4_gemm::grouped_mm / grouped_mm_out and of the grouped quantization's row kernel:
// validate once, describe the problem (GroupedProblem), pick a backend (forced by NVFP4_GEMM_BACKEND /
// NVFP4_GEMM_CONFIG, else the first arch module whose grouped table takes the problem on this device, else the
// generic path), allocate its workspace through torch, launch on the current stream. offs and alpha stay on
// the device: no host sync anywhere on this path, so the calls can be captured in a CUDA graph whose routing
// changes between replays.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "bindings/cuda/mm_cuda.h"
#include "bindings/grouped.h"
#include "bindings/registry.h"
#include "bindings/resolve.h"
#include "cuda/grouped.h"
#include "quant/quantize_grouped.h"

namespace nvfp4_gemm {
namespace {

constexpr size_t kErrLen = 512;
constexpr const char* kOp = "nvfp4_gemm.grouped_mm";


std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

struct Choice {
  const GroupedBackendApi* api = nullptr;  // nullptr: the generic path
  int32_t config = -1;
};

std::string choice_name(const Choice& c) {
  return c.api ? std::string(c.api->name) + ":" + c.api->config_names[c.config] : "generic:grouped_simt_64x64";
}

// Whether the arch module behind a grouped table runs on this SM (its dense table says; a grouped table without
// a dense one in this build is trusted to refuse in select / can_run).
bool runs_here(const GroupedBackendApi* api, const DeviceInfo& dev) {
  const BackendApi* dense = find_backend(api->name);
  return dense == nullptr || dense->supports_sm(dev.sm);
}

std::string shape_text(const GroupedProblem& p) {
  return "T=" + std::to_string(p.t) + " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) +
         " G=" + std::to_string(p.g);
}

Choice choose(const GroupedProblem& p, const DeviceInfo& dev) {
  char why[kErrLen] = {0};
  // The same forcing as mm and linear (resolve.h: nvfp4_gemm.testing.forced, else the environment). A forced
  // dense config names no grouped kernel: the grouped call then follows the forced backend / auto.
  const Forcing f = current_forcing();
  const std::string& forced_config = f.config;
  const std::string& forced = f.backend;
  if (!forced_config.empty()) {
    for (const GroupedBackendApi* api : grouped_backends()) {
      for (int32_t i = 0; i < api->num_configs; ++i) {
        if (forced_config != api->config_names[i]) continue;
        TORCH_CHECK(runs_here(api, dev), "nvfp4_gemm: NVFP4_GEMM_CONFIG=", forced_config, " belongs to backend ",
                    api->name, ", which cannot run on this SM ", dev.sm / 10, ".", dev.sm % 10, " device");
        TORCH_CHECK(api->can_run(&p, i, &dev, why, kErrLen), "nvfp4_gemm: NVFP4_GEMM_CONFIG=", forced_config,
                    " cannot run the grouped problem ", shape_text(p), ": ", why);
        return Choice{api, i};
      }
    }
  }
  if (forced == "generic") return Choice{};
  if (!forced.empty() && forced != "auto") {
    bool known = false;
    std::string valid = "auto, generic";
    for (const auto& b : kArchBackends) {
      known = known || forced == b.name;
      valid += std::string(", ") + b.name;
    }
    TORCH_CHECK(known, "nvfp4_gemm: NVFP4_GEMM_BACKEND must be one of ", valid,
                " (cpu is chosen by putting the tensors on the CPU), got '", forced, "'");
    const GroupedBackendApi* api = nullptr;
    for (const GroupedBackendApi* g : grouped_backends())
      if (forced == g->name) api = g;
    TORCH_CHECK(api != nullptr, "nvfp4_gemm: NVFP4_GEMM_BACKEND=", forced, " but this build has no grouped kernels "
                "of that backend (registered grouped backends: ", grouped_backends().size(), "); unset it or use "
                "generic for grouped_mm");
    TORCH_CHECK(runs_here(api, dev), "nvfp4_gemm: NVFP4_GEMM_BACKEND=", forced, " cannot run on this SM ",
                dev.sm / 10, ".", dev.sm % 10, " device");
    const int32_t cfg = api->select(&p, &dev, why, kErrLen);
    TORCH_CHECK(cfg >= 0, "nvfp4_gemm: NVFP4_GEMM_BACKEND=", forced, " has no grouped kernel for ", shape_text(p),
                ": ", why);
    return Choice{api, cfg};
  }
  for (const GroupedBackendApi* api : grouped_backends()) {
    if (!runs_here(api, dev)) continue;
    const int32_t cfg = api->select(&p, &dev, why, kErrLen);
    if (cfg >= 0) return Choice{api, cfg};
  }
  return Choice{};
}

// NVFP4_GEMM_PRINT_CONFIGS=1 prints each (backend, config, shape) choice once, as mm does.
void maybe_print(const Choice& c, const GroupedProblem& p) {
  static const bool enabled = !env_or_empty("NVFP4_GEMM_PRINT_CONFIGS").empty();
  if (!enabled) return;
  static std::mutex mutex;
  static std::set<std::string> seen;
  static constexpr const char* kATypeNames[] = {"e2m1", "f16", "bf16", "f32"};
  const std::string key = "grouped " + choice_name(c) + " a=" + kATypeNames[static_cast<int>(p.a_type)] + " " +
                          shape_text(p) + " out=" + std::to_string(static_cast<int>(p.out_dtype));
  std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(key).second) std::fprintf(stderr, "[nvfp4_gemm] %s\n", key.c_str());
}

OutDtype out_type(at::ScalarType t) {
  return t == at::kFloat ? OutDtype::kFloat32 : t == at::kBFloat16 ? OutDtype::kBFloat16 : OutDtype::kFloat16;
}

void grouped_into(const GroupedShape& s, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                  const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                  const at::Tensor& c) {
  const int device_index = a.get_device();
  const DeviceInfo& dev = device_info(device_index);
  TORCH_CHECK(dev.sm >= 80, kOp, ": no usable kernel for this GPU (SM ", dev.sm / 10, ".", dev.sm % 10,
              "): the CUDA backends need SM >= 8.0; move the tensors to the CPU to use the CPU backend");
  GroupedProblem p{};
  p.a = static_cast<const uint8_t*>(a.data_ptr());
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.sfa = s.weight_only ? nullptr : static_cast<const uint8_t*>(sfa->data_ptr());
  p.sfb = static_cast<const uint8_t*>(sfb.data_ptr());
  p.offs = offs.data_ptr<int32_t>();
  p.alpha = alpha.has_value() ? alpha->data_ptr<float>() : nullptr;
  p.c = c.data_ptr();
  p.t = s.t;
  p.n = s.n;
  p.k = s.k;
  p.g = s.g;
  p.lda = s.t > 1 ? a.stride(0) * static_cast<int64_t>(a.element_size())
                  : (s.weight_only ? s.k * static_cast<int64_t>(a.element_size()) : s.k / 2);
  p.ldb = s.n > 1 ? b.stride(1) : s.k / 2;
  p.b_group_bytes = s.g > 1 ? b.stride(0) : s.n * p.ldb;
  p.ldc = s.t > 1 ? c.stride(0) : s.n;
  p.sfa_rows = s.sfa_rows;
  p.out_dtype = out_type(s.out_dtype);
  p.a_type = !s.weight_only                     ? AType::kE2m1
             : a.scalar_type() == at::kHalf     ? AType::kFloat16
             : a.scalar_type() == at::kBFloat16 ? AType::kBFloat16
                                                : AType::kFloat32;
  const Choice choice = choose(p, dev);
  maybe_print(choice, p);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  char err[kErrLen] = {0};
  if (choice.api == nullptr) {
    const size_t ws_bytes = generic::grouped_workspace_bytes(p.g);
    at::Tensor ws = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
    TORCH_CHECK(generic::grouped_run(p, ws.data_ptr(), ws_bytes, stream, err, kErrLen), kOp, " (generic CUDA path, SM ",
                dev.sm / 10, ".", dev.sm % 10, ", ", shape_text(p), "): ", err);
    return;
  }
  const size_t ws_bytes = choice.api->workspace_bytes(&p, choice.config, &dev);
  at::Tensor ws;
  if (ws_bytes > 0) ws = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
  const bool ok = choice.api->run(&p, choice.config, &dev, ws_bytes ? ws.data_ptr() : nullptr, ws_bytes, stream, err,
                                  kErrLen);
  TORCH_CHECK(ok, kOp, " (", choice.api->name, " config ", choice.api->config_names[choice.config], ", ", shape_text(p),
              "): ", err);
}

at::Tensor grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                           const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                           std::optional<at::ScalarType> out_dtype) {
  const GroupedShape s = check_grouped_inputs(a, b, sfa, sfb, offs, alpha, out_dtype, nullptr, /*gpu_rules=*/true);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor c = at::empty({s.t, s.n}, a.options().dtype(s.out_dtype));
  if (s.t > 0 && s.n > 0) grouped_into(s, a, b, sfa, sfb, offs, alpha, c);
  return c;
}

void grouped_mm_out_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                         const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                         std::optional<at::ScalarType> out_dtype, const at::Tensor& out) {
  const GroupedShape s = check_grouped_inputs(a, b, sfa, sfb, offs, alpha, out_dtype, &out, /*gpu_rules=*/true);
  const c10::cuda::CUDAGuard guard(a.device());
  if (s.t > 0 && s.n > 0) grouped_into(s, a, b, sfa, sfb, offs, alpha, out);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_grouped_cuda(const at::Tensor& x_in, const at::Tensor& offs,
                                                                     const std::optional<at::Tensor>& input_scale,
                                                                     int64_t sfa_rows) {
  check_quantize_grouped(x_in, offs, input_scale, sfa_rows);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const int64_t t = x_in.size(0), k = x_in.size(1), g = offs.numel();
  at::Tensor packed = at::empty({t, k / 2}, x_in.options().dtype(at::kByte));
  at::Tensor sf = at::empty({sfa_rows * round_up(k / kSfVecSize, kSfAtomCols)}, x_in.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor decode = at::empty({g}, x_in.options().dtype(at::kFloat));
  const int sm = device_info(x_in.get_device()).sm;
  TORCH_CHECK(sm >= 80, "nvfp4_gemm.quantize_grouped: the CUDA kernels need SM >= 8.0, this GPU is SM ", sm / 10, ".",
              sm % 10, "; move the tensors to the CPU");
  // The kernels read 16-byte chunks: unit stride along K, 16-byte aligned rows and base; anything else is copied
  // once (a fresh allocation is 16-byte aligned).
  at::Tensor x = x_in;
  const int64_t esize = static_cast<int64_t>(x.element_size());
  const auto aligned = [&](const at::Tensor& v) {
    return v.stride(1) == 1 && (t <= 1 || (v.stride(0) * esize) % 16 == 0) &&
           reinterpret_cast<uintptr_t>(v.data_ptr()) % 16 == 0;
  };
  if (t > 0 && !aligned(x)) x = x.clone(at::MemoryFormat::Contiguous);
  const quant::InDtype dt = x.scalar_type() == at::kFloat  ? quant::InDtype::kFloat32
                            : x.scalar_type() == at::kHalf ? quant::InDtype::kFloat16
                                                           : quant::InDtype::kBFloat16;
  at::Tensor ws = at::empty({static_cast<int64_t>(quant::quantize_grouped_workspace_bytes(g))},
                            x_in.options().dtype(at::kByte));
  char err[kErrLen] = {0};
  TORCH_CHECK(quant::quantize_grouped_cuda(x.data_ptr(), dt, t, k, t > 1 ? x.stride(0) : k, offs.data_ptr<int32_t>(), g,
                                           input_scale.has_value() ? input_scale->data_ptr<float>() : nullptr,
                                           sfa_rows, ws.data_ptr(), packed.data_ptr<uint8_t>(),
                                           static_cast<uint8_t*>(sf.data_ptr()), decode.data_ptr<float>(),
                                           at::cuda::getCurrentCUDAStream(), err, kErrLen),
              "nvfp4_gemm.quantize_grouped (CUDA): ", err);
  return {packed, sf, decode};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) {
  m.impl("grouped_mm", &nvfp4_gemm::grouped_mm_cuda);
  m.impl("grouped_mm_out", &nvfp4_gemm::grouped_mm_out_cuda);
  m.impl("_quantize_grouped", &nvfp4_gemm::quantize_grouped_cuda);
}
