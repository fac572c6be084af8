// What a CUTLASS arch module's grouped kernel TUs export to its GroupedBackendApi (common/cutlass_grouped_backend.h),
// and the grouped table's entries. CUTLASS-free and CUDA-free, so the kernels' TUs, the dispatch code and the host
// tests share it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/grouped.h"

namespace nvfp4_gemm {

// What one compiled grouped kernel (config x output dtype) exports; the CUTLASS TUs fill it.
struct GroupedKernelOps {
  // CUTLASS's can_implement on the arguments run() would build (with one representative group of the host-known
  // shape, the form in which CUTLASS checks alignment); false: `why` says what was refused.
  bool (*check)(const GroupedProblem& p, const DeviceInfo& dev, char* why, size_t why_len);
  // CUTLASS's workspace plus the per-group argument arrays the builder writes.
  size_t (*workspace)(const GroupedProblem& p, const DeviceInfo& dev);
  // The builder launch and the GEMM launch on `stream`. `one` is a device 1.0f (alpha when p.alpha is null).
  bool (*run)(const GroupedProblem& p, const DeviceInfo& dev, const float* one, void* workspace,
              size_t workspace_bytes, cudaStream_t stream, char* err, size_t err_len);
};

// One grouped config of a table: its name and the bound on the average rows per group (ceil(T / G), what the
// host knows of the routing) up to which it is chosen, first match in table order; -1: no bound.
struct GroupedConfigInfo {
  const char* name;
  int64_t rows_max;
};

}  // namespace nvfp4_gemm
