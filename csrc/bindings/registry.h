// The arch modules (_C_sm90, _C_sm100) that Python has imported, as BackendApi tables.
#pragma once

#include <string>
#include <vector>

#include "bindings/resolve.h"
#include "common/problem.h"

namespace nvfp4_gemm {

// Looks up `nvfp4_gemm::_backend_api_<name>` for every name of kArchBackends (resolve.h) and keeps the tables found.
// Called by Python after importing the arch modules; returns the names found.
std::vector<std::string> register_backends();

// Registered tables, in preference order.
const std::vector<const BackendApi*>& backends();

// The registered table called `name`, or nullptr.
const BackendApi* find_backend(const std::string& name);

}  // namespace nvfp4_gemm
