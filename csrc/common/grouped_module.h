// What an arch module adds to export its grouped GEMM table (csrc/common/grouped.h), beside
// NVFP4_GEMM_BACKEND_MODULE (backend_module.h), e.g. in csrc/sm90/module.cpp:
//   NVFP4_GEMM_GROUPED_API(sm90, nvfp4_gemm::sm90::grouped_api())
// registers the op `nvfp4_gemm::_grouped_api_sm90() -> int` returning the table's address; the core module
// looks it up by name (nvfp4_gemm::register_grouped_backends) when Python has imported the arch modules.
#pragma once

#include <torch/library.h>

#include "common/grouped.h"

#define NVFP4_GEMM_GROUPED_API(backend_name, api_expr)                   \
  TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {                               \
    m.def("_grouped_api_" #backend_name "() -> int", []() -> int64_t { \
      const ::nvfp4_gemm::GroupedBackendApi& api = (api_expr);         \
      return static_cast<int64_t>(reinterpret_cast<intptr_t>(&api));   \
    });                                                                 \
  }
