#include "bindings/registry.h"

#include <mutex>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

namespace nvfp4_gemm {
namespace {

std::mutex g_mutex;
std::vector<const BackendApi*> g_backends;

}  // namespace

std::vector<std::string> register_backends() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<const BackendApi*> found;
  std::vector<std::string> names;
  for (const ArchBackendName& arch : kArchBackends) {
    const char* name = arch.name;
    const std::string op = std::string("nvfp4_gemm::_backend_api_") + name;
    auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
    if (!handle.has_value()) continue;
    const int64_t addr = handle->typed<int64_t()>().call();
    const auto* api = reinterpret_cast<const BackendApi*>(static_cast<intptr_t>(addr));
    TORCH_CHECK(api != nullptr && api->abi_version == kBackendAbiVersion, "nvfp4_gemm: arch module '", name,
                "' was built against backend ABI ", api ? api->abi_version : -1, ", this core expects ",
                kBackendAbiVersion, "; rebuild the package");
    found.push_back(api);
    names.emplace_back(name);
  }
  g_backends = std::move(found);
  return names;
}

const std::vector<const BackendApi*>& backends() { return g_backends; }

const BackendApi* find_backend(const std::string& name) {
  for (const BackendApi* api : g_backends) {
    if (name == api->name) return api;
  }
  return nullptr;
}

}  // namespace nvfp4_gemm
