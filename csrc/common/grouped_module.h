// The grouped GEMM's entry in an arch module (beside backend_module.h's dense one): registers the op
// `nvfp4_gemm::_grouped_api_<backend>() -> int`, which returns the address of the module's GroupedBackendApi
// table (common/grouped.h); the core module (_C) looks it up by name once Python has imported the module.
// Use it in one .cpp of the module, next to NVFP4_GEMM_BACKEND_MODULE (which alone defines PyInit).
#pragma once

#include <torch/library.h>

#include <cstdint>

#include "common/grouped.h"

#define NVFP4_GEMM_GROUPED_BACKEND_MODULE(backend_name, api_expr)                 \
  TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {                                         \
    m.def("_grouped_api_" #backend_name "() -> int", []() -> int64_t {           \
      const ::nvfp4_gemm::GroupedBackendApi& api = (api_expr);                    \
      return static_cast<int64_t>(reinterpret_cast<intptr_t>(&api));             \
    });                                                                           \
  }
