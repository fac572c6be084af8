// What one compiled kernel (config x output dtype) exports to the dispatch layer. CUTLASS-free, so
// api.cpp and select.cpp build with the host compiler and the host tests link them without kernels.
#pragma once

#include <cstddef>

#include "common/problem.h"

namespace nvfp4_gemm::sm120 {

struct KernelOps {
  // CUTLASS's can_implement on the arguments run() would build; false: `why` says what was refused.
  bool (*check)(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len);
  size_t (*workspace)(const Problem& p, const DeviceInfo& dev);
  // `alpha` is never null here (api.cpp substitutes a device 1.0f).
  bool (*run)(const Problem& p, const DeviceInfo& dev, const float* alpha, void* workspace,
              size_t workspace_bytes, cudaStream_t stream, char* err, size_t err_len);
};

}  // namespace nvfp4_gemm::sm120
