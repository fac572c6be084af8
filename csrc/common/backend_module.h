// The few lines that turn a set of torch-free kernel TUs into a loadable arch module.
//
// Each arch module (nvfp4_gemm._C_sm90, nvfp4_gemm._C_sm100) has one small module.cpp that includes this
// header and says NVFP4_GEMM_BACKEND_MODULE(_C_sm90, sm90, nvfp4_gemm::sm90::backend_api()). That
// registers the op `nvfp4_gemm::_backend_api_sm90() -> int`, which returns the address of the module's
// BackendApi table; the core module (_C) looks the op up by name when Python has imported the modules.
// No pybind: the Python module itself is an empty stub whose import runs the static registration.
#pragma once

#include <Python.h>
#include <torch/library.h>

#include "common/problem.h"

#define NVFP4_GEMM_BACKEND_MODULE(module_name, backend_name, api_expr)                          \
  TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {                                                      \
    m.def("_backend_api_" #backend_name "() -> int", []() -> int64_t {                        \
      const ::nvfp4_gemm::BackendApi& api = (api_expr);                                       \
      return static_cast<int64_t>(reinterpret_cast<intptr_t>(&api));                          \
    });                                                                                        \
  }                                                                                            \
  extern "C" PyMODINIT_FUNC PyInit_##module_name(void) {                                       \
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, #module_name, nullptr, -1, nullptr}; \
    return PyModule_Create(&def);                                                              \
  }
