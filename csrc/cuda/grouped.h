// The generic CUDA grouped GEMM (any SM >= 8.0): exact, graph-safe, the fallback of every GPU without an arch
// module's grouped kernel. Torch-free; the binding layer (csrc/bindings/cuda/grouped_cuda.cpp) validates the
// tensors and allocates the workspace.
//
// Two launches on `stream`, no host sync: a one-block prologue reads offs on the device and writes each group's
// row range, its first padded row in sfa and its first row tile (prefix sums); then one grid of 64 x 64 output
// tiles over (row tile of any group, N tile) decodes its A and B tiles to fp32 in shared memory (every e2m1 x
// e4m3 value, and every fp16 / bf16 activation, is exact in fp32), accumulates with fp32 FMAs, scales by
// alpha[g] and rounds once to the output type. Tiles past the routing's last one exit at once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/grouped.h"

namespace nvfp4_gemm::generic {

// Device workspace of grouped_run for g groups (bytes, 16-byte multiple).
size_t grouped_workspace_bytes(int64_t g);

// Enqueues the grouped GEMM of `p` (GroupedProblem's guarantees hold; t >= 1, n >= 1). Offsets are clamped to
// [0, t] and a decrease reads as an empty group, so any offs gives in-bounds accesses; a row whose scale
// would lie past p.sfa_rows padded rows reads a NaN scale (its outputs are NaN) instead. Returns false with
// `err` filled on a launch failure.
bool grouped_run(const GroupedProblem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream, char* err,
                 size_t err_len);

}  // namespace nvfp4_gemm::generic
