// The op schema (defined once) and the core module's small introspection ops. Each backend's
// translation unit registers its own implementation: CPU in csrc/cpu/, CUDA in csrc/bindings/cuda/.
#include <Python.h>
#include <torch/library.h>

#include <sstream>

#include "bindings/registry.h"
#include "bindings/grouped.h"

namespace nvfp4_gemm {
namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// What the arch modules bring: {"sm90": {"compiled_for": "sm_90a", "configs": [...]}, ...}.
std::string backends_json() {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (const BackendApi* api : backends()) {
    os << (first ? "" : ", ") << "\"" << json_escape(api->name) << "\": {\"compiled_for\": \""
       << json_escape(api->compiled_for) << "\", \"configs\": [";
    for (int32_t i = 0; i < api->num_configs; ++i) {
      os << (i ? ", " : "") << "\"" << json_escape(api->config_names[i]) << "\"";
    }
    os << "], \"dispatch\": \"" << json_escape(api->dispatch_rules != nullptr ? api->dispatch_rules() : "")
       << "\"}";
    first = false;
  }
  os << "}";
  return os.str();
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY(nvfp4_gemm, m) {
  // sfa is None exactly when a holds float activations (the weight-only form). alpha and out_dtype are
  // positional too, in vLLM's cutlass_scaled_fp4_mm order. mm_out writes into a caller's tensor; it is a
  // separate op because a custom op may not return an alias of its mutated argument.
  m.def(
      "mm(Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor? alpha=None, ScalarType? out_dtype=None) -> Tensor");
  m.def(
      "mm_out(Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor? alpha=None, ScalarType? out_dtype=None, *, "
      "Tensor(a!) out) -> ()");
  // The exact decode of an NVFP4 weight (e2m1 * e4m3 block scale, no per-tensor scale) to a new [N, K]
  // tensor of `dtype`: what the backward through a frozen NVFP4 weight multiplies by (nvfp4_gemm/autograd.py).
  m.def("_decode(Tensor packed, Tensor sf, ScalarType dtype) -> Tensor");
  m.def("_register_backends() -> str[]", []() { return nvfp4_gemm::register_backends(); });
  m.def("_backends_json() -> str", []() { return nvfp4_gemm::backends_json(); });
  // Names of the registered arch backends whose kernels run on an SM of this version, preferred first.
  m.def("_backends_for_sm(int sm) -> str[]", [](int64_t sm) {
    std::vector<std::string> out;
    for (const nvfp4_gemm::BackendApi* api : nvfp4_gemm::backends()) {
      if (api->supports_sm(static_cast<int32_t>(sm))) out.emplace_back(api->name);
    }
    return out;
  });
  // The grouped (mixture-of-experts) GEMM, docs/CONTRACT.md "Grouped GEMM": b [G, N, K/2], offs int32 [G] cumulative row
  // ends read on the device, alpha float32 [G] or None. grouped_mm_out writes into a caller's [T, N] tensor.
  m.def(
      "grouped_mm(Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor offs, Tensor? alpha=None, "
      "ScalarType? out_dtype=None) -> Tensor");
  m.def(
      "grouped_mm_out(Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor offs, Tensor? alpha=None, "
      "ScalarType? out_dtype=None, *, Tensor(a!) out) -> ()");
  // Grouped quantization of tokens sorted by group (nvfp4_gemm.quantize_grouped): one per-tensor scale per group,
  // input_scale float32 [G] each group's static DECODE scale or None (dynamic: each group's finite amax), the
  // scales written in the grouped blocked layout of sfa_rows padded rows. Returns packed [T, K/2], sfa (flat e4m3)
  // and per group fl(decode * weight_scale_2) [G] (the grouped GEMM's alpha), or the decode scale where
  // weight_scale_2 is None.
  // one_scale (dynamic only): one scale for every group from the finite amax of all T rows.
  m.def("_quantize_grouped(Tensor x, Tensor offs, Tensor? input_scale, Tensor? weight_scale_2, int sfa_rows, "
        "bool one_scale=False) -> (Tensor, Tensor, Tensor)");
  // nvfp4_gemm.grouped_linear in W4A4: bit for bit _quantize_grouped(x, offs, input_scale, weight_scale_2) followed by
  // grouped_mm with its alpha (input_scale None: dynamic per-group scales), the GEMM launched behind the quantization
  // so that it streams its weights while A is quantized.
  m.def("_grouped_linear(Tensor x, Tensor b, Tensor sfb, Tensor offs, Tensor? input_scale, Tensor weight_scale_2, "
        "ScalarType? out_dtype=None, bool one_scale=False) -> Tensor");
  m.def("_register_grouped_backends() -> str[]", []() { return nvfp4_gemm::register_grouped_backends(); });
  m.def("_grouped_backends() -> str[]", []() {
    std::vector<std::string> out;
    for (const nvfp4_gemm::GroupedBackendApi* api : nvfp4_gemm::grouped_backends()) out.emplace_back(api->name);
    return out;
  });
  m.def("_grouped_configs(str backend) -> str[]", [](const std::string& backend) {
    std::vector<std::string> out;
    for (const nvfp4_gemm::GroupedBackendApi* api : nvfp4_gemm::grouped_backends()) {
      if (backend != api->name) continue;
      for (int32_t i = 0; i < api->num_configs; ++i) out.emplace_back(api->config_names[i]);
    }
    return out;
  });
}

// `import nvfp4_gemm._C` loads this library, which runs the registrations above. No pybind.
extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&def);
}
