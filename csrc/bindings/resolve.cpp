// The forcing state of the resolver (resolve.h) and its test hook torch.ops.nvfp4_gemm._force.
#include "bindings/resolve.h"

#include <torch/library.h>

#include <cstdlib>
#include <mutex>

namespace nvfp4_gemm {
namespace {

std::mutex g_mutex;
Forcing g_override;  // process-wide: autograd runs backward in threads of its own

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

Forcing current_forcing() {
  Forcing f;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    f = g_override;
  }
  // Each name the override leaves empty comes from the environment.
  if (f.backend.empty()) {
    f.backend = env_or_empty("NVFP4_GEMM_BACKEND");
  } else {
    f.backend_from = "forced backend";
  }
  if (f.config.empty()) {
    f.config = env_or_empty("NVFP4_GEMM_CONFIG");
  } else {
    f.config_from = "forced config";
  }
  return f;
}

Forcing set_forcing_override(const Forcing& f) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Forcing old = g_override;
  g_override = f;
  return old;
}

}  // namespace nvfp4_gemm

// torch.ops.nvfp4_gemm._force(backend, config, splits): the forcing of every following call in this process (an
// empty name: the environment's, if any; splits 0: the plan's own); returns the previous override as (backend,
// config, splits).
// For tests and benchmarks, through nvfp4_gemm.testing.forced.
TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_force(str backend, str config, int splits) -> (str, str, int)",
        [](std::string backend, std::string config, int64_t splits) {
          TORCH_CHECK(splits >= 0 && splits <= (1 << 20), "nvfp4_gemm._force: splits must be in [0, 2^20] "
                      "(0: the plan's own), got ", splits);
          const nvfp4_gemm::Forcing old = nvfp4_gemm::set_forcing_override(
              nvfp4_gemm::Forcing{std::move(backend), std::move(config), static_cast<int32_t>(splits)});
          return std::make_tuple(old.backend, old.config, static_cast<int64_t>(old.splits));
        });
}
