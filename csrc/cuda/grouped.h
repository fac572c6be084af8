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

// Device workspace of grouped_run for g groups (bytes, 16-byte multiple): the routing below.
size_t grouped_workspace_bytes(int64_t g);

// The routing the prologue writes into that workspace (int64 arrays): tile_start[g + 1] (64-row tiles),
// pad_start[g] (first padded row of each group in the grouped blocked sfa), row_start[g], row_count[g].
struct GroupedRouting {
  const int64_t* tile_start;
  const int64_t* pad_start;
  const int64_t* row_start;
  const int64_t* row_count;
};

inline GroupedRouting grouped_routing_view(const void* workspace, int64_t g) {
  const int64_t* w = static_cast<const int64_t*>(workspace);
  return GroupedRouting{w, w + g + 1, w + 2 * g + 1, w + 3 * g + 1};
}

// Enqueues the one-block prologue alone (grouped_run does it first): offs [g] read on the device, offsets clamped
// to [0, t], a decrease read as an empty group. Returns false with `err` filled on a launch failure.
bool grouped_routing(const int32_t* offs, int64_t g, int64_t t, void* workspace, cudaStream_t stream, char* err,
                     size_t err_len);

// Enqueues the grouped GEMM of `p` (GroupedProblem's guarantees hold; t >= 1, n >= 1). Offsets are clamped to
// [0, t] and a decrease reads as an empty group, so any offs gives in-bounds accesses; a row whose scale
// would lie past p.sfa_rows padded rows reads a NaN scale (its outputs are NaN) instead. Returns false with
// `err` filled on a launch failure.
bool grouped_run(const GroupedProblem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream, char* err,
                 size_t err_len);

}  // namespace nvfp4_gemm::generic
