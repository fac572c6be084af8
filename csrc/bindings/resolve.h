// The one resolver of the binding layer: which backend and config run a GEMM problem, for every op that launches
// one (mm / mm_out, linear's fused forms, grouped_mm / grouped_mm_out), written once over the API type: the dense
// table (BackendApi) and the grouped one (GroupedBackendApi) each answer the questions below through a few small
// overloads. Torch-free, so that host tools can call it.
//
// Rules, the same for every op:
//  - a forced config (by name) runs where it can run the problem; otherwise it is an error naming why;
//  - a forced backend runs the config its table selects, "generic" the generic path; where its table selects
//    nothing, it is an error naming why;
//  - automatic: the first arch backend (newest first) whose kernels run on this device, that does not prefer the
//    generic path for the problem and whose table selects a config; else the generic path.
// An op with an alternative form (linear's fused quantization, whose unfused form is quantize then mm) resolves
// its fused problem with `optional`: a forced choice that cannot take that form then declines without an error,
// and the unfused problem is resolved under the same forcing, where a refusal is the error. Names that are not
// valid anywhere (an unknown backend or config, a backend not compiled or not for this device) are errors in both
// cases.
// One forcing covers both kinds of table: a forced config that names a kernel of the other kind only (a dense
// config, for grouped_mm) does not apply to the op, which follows the forced backend / automatic dispatch
// (`for_table` below), so that a model's dense GEMMs can be pinned to one config while its grouped ones still
// run. The dense ops keep the stricter rule: a grouped config's name is not one of their tables' names.
#pragma once

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "common/grouped.h"
#include "common/problem.h"

namespace nvfp4_gemm {

// Backend names, spelled once: what NVFP4_GEMM_BACKEND and nvfp4_gemm.testing.forced(backend=...) accept. The
// arch backends, in the order automatic dispatch prefers them (newest architecture first), with the build
// setting that compiles each.
inline constexpr const char* kAutoBackend = "auto";
inline constexpr const char* kGenericBackend = "generic";
struct ArchBackendName {
  const char* name;
  const char* archs;  // NVFP4_GEMM_CUDA_ARCHS value that builds it
};
inline constexpr ArchBackendName kArchBackends[] = {
    {"sm120", "12.0f"}, {"sm100", "10.0f"}, {"sm90", "9.0a"}};

// What the caller forces. Empty strings: nothing forced.
struct Forcing {
  std::string backend;  // "", "auto", "generic" or an arch backend's name
  std::string config;   // a config name of some arch backend's table
  int32_t splits = 0;   // tests: the K split count of the split kernels (0: the plan's own)
  // Where the two names came from, for error messages ("NVFP4_GEMM_CONFIG=<name> cannot run ...").
  const char* backend_from = "NVFP4_GEMM_BACKEND";
  const char* config_from = "NVFP4_GEMM_CONFIG";
};

// The forcing in effect for a call: the process-wide override of torch.ops.nvfp4_gemm._force (set by
// nvfp4_gemm.testing.forced), each name it leaves empty taken from NVFP4_GEMM_BACKEND / NVFP4_GEMM_CONFIG, read per
// call so that a process may change them between calls (a getenv is ~50 ns).
Forcing current_forcing();

// Sets the override (empty names and zero splits: none); returns the previous one.
Forcing set_forcing_override(const Forcing& f);

// The environment variable `name`, or "" where it is unset.
std::string env_or_empty(const char* name);

// What each op ran, one line a call (e.g. "sm90:<config> m=1 n=4096 k=4096 out=0", "grouped generic:... T=..."):
// printed once per distinct line to stderr under NVFP4_GEMM_PRINT_CONFIGS=1, and recorded in call order while a
// test records (torch.ops.nvfp4_gemm._record_choices, nvfp4_gemm.testing.recorded_choices). noting_choices():
// whether either wants lines, so that a call builds its line only then.
bool noting_choices();
void note_choice_line(const std::string& line);

template <typename Api>
struct Choice {
  const Api* api = nullptr;  // nullptr: the generic path (dense), or nothing chosen (`declined`)
  int32_t config = -1;
  bool declined = false;     // `optional` resolution: nothing takes this form; the caller uses its other form
};

// What the resolver asks of an API type beyond select / can_run / the names: whether its kernels run on this
// device, whether automatic dispatch should leave a problem to the generic path, and how its messages name it.
inline bool runs_on(const BackendApi& api, const DeviceInfo& dev) { return api.supports_sm(dev.sm); }
inline bool prefers_generic(const BackendApi& api, const Problem& p, const DeviceInfo& dev) {
  return api.prefers_generic != nullptr && api.prefers_generic(&p, &dev);
}
inline bool runs_on(const GroupedBackendApi& api, const DeviceInfo& dev) { return api.supports_sm(dev.sm); }
inline bool prefers_generic(const GroupedBackendApi&, const GroupedProblem&, const DeviceInfo&) { return false; }

struct TableKind {
  const char* kernel;     // what the messages call one config ("kernel", "grouped kernel")
  const char* listed_by;  // the Python call that lists the configs by name
};
inline TableKind table_kind(const BackendApi*) { return {"kernel", "nvfp4_gemm.configs()"}; }
inline TableKind table_kind(const GroupedBackendApi*) {
  return {"grouped kernel", "nvfp4_gemm.grouped.grouped_configs()"};
}

template <typename Api>
bool names_config(const std::vector<const Api*>& apis, const std::string& config) {
  for (const Api* api : apis)
    for (int32_t i = 0; i < api->num_configs; ++i)
      if (config == api->config_names[i]) return true;
  return false;
}

// The forcing `f` as it applies to an op over `apis`: a forced config that names none of their configs but one of
// `others` (the other kind of table: the dense configs, for grouped_mm) is dropped, so that the op follows the
// forced backend / automatic dispatch. A name of no table stays, and resolve() reports it.
template <typename Api, typename Other>
Forcing for_table(Forcing f, const std::vector<const Api*>& apis, const std::vector<const Other*>& others) {
  if (!f.config.empty() && !names_config(apis, f.config) && names_config(others, f.config)) f.config.clear();
  return f;
}

// Resolves `p` on `dev` over `apis` (registered, in preference order) under `f`. Returns "" and fills *out, or
// the error, which names the shape through `shape()` (e.g. "M=1 N=4096 K=4096"; called on errors only, so that
// the automatic path builds no string).
template <typename Api, typename Prob, typename ShapeText>
std::string resolve(const Prob& p, const DeviceInfo& dev, const std::vector<const Api*>& apis, const Forcing& f,
                    bool optional, ShapeText&& shape, Choice<Api>* out) {
  constexpr size_t kWhyLen = 512;
  char why[kWhyLen] = {0};
  *out = Choice<Api>{};
  if (f.config.empty() && (f.backend.empty() || f.backend == kAutoBackend)) {
    for (const Api* api : apis) {
      if (!runs_on(*api, dev) || prefers_generic(*api, p, dev)) continue;
      const int32_t cfg = api->select(&p, &dev, why, kWhyLen);
      if (cfg >= 0) {
        *out = Choice<Api>{api, cfg, false};
        return "";
      }
    }
    out->declined = optional;
    return "";
  }
  const TableKind kind = table_kind(static_cast<const Api*>(nullptr));
  const std::string sm = std::to_string(dev.sm / 10) + "." + std::to_string(dev.sm % 10);
  const std::string config = std::string(f.config_from) + "=" + f.config;
  const std::string backend = std::string(f.backend_from) + "=" + f.backend;
  if (!f.config.empty()) {
    for (const Api* api : apis) {
      for (int32_t i = 0; i < api->num_configs; ++i) {
        if (f.config != api->config_names[i]) continue;
        if (!runs_on(*api, dev))
          return config + " belongs to backend " + api->name + " (" + api->compiled_for +
                 "), which cannot run on this SM " + sm + " device";
        if (api->can_run(&p, i, &dev, why, kWhyLen)) {
          *out = Choice<Api>{api, i, false};
          return "";
        }
        if (optional) {
          out->declined = true;
          return "";
        }
        return config + " cannot run " + shape() + ": " + why;
      }
    }
    return config + " names no compiled " + kind.kernel + " config; " + kind.listed_by + " lists them";
  }
  if (f.backend == kGenericBackend) {
    out->declined = optional;  // the generic path has no fused forms
    return "";
  }
  {  // a forced arch backend
    const ArchBackendName* arch = nullptr;
    std::string valid = std::string(kAutoBackend) + ", " + kGenericBackend;
    for (int i = static_cast<int>(std::size(kArchBackends)) - 1; i >= 0; --i) {  // oldest first
      valid += std::string(", ") + kArchBackends[i].name;
      if (f.backend == kArchBackends[i].name) arch = &kArchBackends[i];
    }
    if (arch == nullptr)
      return std::string(f.backend_from) + " must be one of " + valid +
             " (cpu is chosen by putting the tensors on the CPU), got '" + f.backend + "'";
    const Api* api = nullptr;
    for (const Api* a : apis)
      if (f.backend == a->name) api = a;
    if (api == nullptr)
      return backend + " but that backend was not compiled into this build; rebuild with NVFP4_GEMM_CUDA_ARCHS=" +
             arch->archs;
    if (!runs_on(*api, dev))
      return backend + " (" + api->compiled_for + ") cannot run on this SM " + sm + " device";
    const int32_t cfg = api->select(&p, &dev, why, kWhyLen);
    if (cfg >= 0) {
      *out = Choice<Api>{api, cfg, false};
      return "";
    }
    if (optional) {
      out->declined = true;
      return "";
    }
    return backend + " has no " + kind.kernel + " for " + shape() + ": " + why;
  }
}

}  // namespace nvfp4_gemm
