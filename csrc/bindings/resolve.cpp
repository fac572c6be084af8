// The resolver's process-wide state (resolve.h): the forcing and its test hook torch.ops.nvfp4_gemm._force, and the
// notes of what each op ran with their test hook torch.ops.nvfp4_gemm._record_choices.
#include "bindings/resolve.h"

#include <torch/library.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <vector>

namespace nvfp4_gemm {
namespace {

std::mutex g_mutex;
Forcing g_override;  // process-wide: autograd runs backward in threads of its own

std::mutex g_record_mutex;
bool g_recording = false;
std::vector<std::string> g_recorded;

bool printing_choices() {
  static const bool enabled = !env_or_empty("NVFP4_GEMM_PRINT_CONFIGS").empty();
  return enabled;
}

// Returns the lines recorded since the last call, clears them and turns recording on or off.
std::vector<std::string> swap_recorded_choices(bool on) {
  std::lock_guard<std::mutex> lock(g_record_mutex);
  std::vector<std::string> out;
  out.swap(g_recorded);
  g_recording = on;
  return out;
}

}  // namespace

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

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

bool noting_choices() {
  if (printing_choices()) return true;
  std::lock_guard<std::mutex> lock(g_record_mutex);
  return g_recording;
}

void note_choice_line(const std::string& line) {
  {
    std::lock_guard<std::mutex> lock(g_record_mutex);
    if (g_recording) g_recorded.push_back(line);
  }
  if (!printing_choices()) return;
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mutex);
  if (seen.insert(line).second) std::fprintf(stderr, "[nvfp4_gemm] %s\n", line.c_str());
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

// torch.ops.nvfp4_gemm._record_choices(on): returns the choices recorded since the last call (one line each, as
// NVFP4_GEMM_PRINT_CONFIGS prints them: "<backend>:<config> m=.. n=.. k=.. out=..", "generic ...", "grouped ..."),
// clears them and turns recording on or off. For tests (nvfp4_gemm.testing.recorded_choices), in one process.
TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_record_choices(bool on) -> str[]", [](bool on) { return nvfp4_gemm::swap_recorded_choices(on); });
}
