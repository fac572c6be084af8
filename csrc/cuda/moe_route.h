// The CUDA routing of a mixture-of-experts forward (nvfp4_gemm::_moe_route, semantics in bindings/moe_route.h):
// the (token, slot) pairs sorted stably by expert, as row_token / inverse / offs. Torch-free; the binding layer
// (csrc/bindings/cuda/moe_route_cuda.cpp) validates the tensors and allocates the outputs and the workspace.
//
// Every pair is counted and placed by one warp walking a contiguous chunk of pairs in order, 32 at a time; the
// lanes holding the same key find each other with __match_any_sync and take consecutive rows in lane order.
// Between the counting and the placing walk, an exclusive scan over (key, chunk) turns the per-chunk counts
// into each chunk's first row within each key, so the order is the stable one by construction and the result
// is deterministic (no atomics). Two forms, the same device code:
//   * one launch for S <= kMoeRouteOneLaunchPairs (decode and moderate prefill): one CTA of one warp per 32
//     pairs, at most 32 warps (fewer where E is so large that their counts would not fit in 48 KiB of shared
//     memory: one warp at E = 4096), one chunk per warp, the counts in shared memory.
//   * three launches above: count (a grid of 8-warp CTAs, one chunk of >= 256 pairs per warp, at most ~1024
//     chunks, counts to the workspace), scan (one CTA of 1024 threads), place (the count grid again).
// No host sync: S and E are shapes, the ids are read on the device only, so a captured graph follows new ids.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace nvfp4_gemm::generic {

// The most pairs the one-launch form takes (1024 tokens at top-8).
inline constexpr int64_t kMoeRouteOneLaunchPairs = 8192;

// Device workspace of moe_route for s pairs and e experts (bytes, 16-byte multiple); 0 for the one-launch form.
size_t moe_route_workspace_bytes(int64_t s, int64_t e);

// Whether moe_route takes the one-launch form for s pairs and e experts (for tests and the notes).
bool moe_route_one_launch(int64_t s, int64_t e);

// Enqueues the routing of s >= 1 pairs ids [s] (int64 when ids_int64, else int32; contiguous) with k >= 1 slots
// per token into e >= 1 experts: offs [e] int32, row_token [s] and inverse [s] int64 (bindings/moe_route.h).
// s < 2^31. workspace: moe_route_workspace_bytes(s, e) bytes (nullptr when 0). Returns false with `err` filled on
// a launch failure.
bool moe_route(const void* ids, bool ids_int64, int64_t s, int64_t k, int64_t e, int32_t* offs, int64_t* row_token,
               int64_t* inverse, void* workspace, cudaStream_t stream, char* err, size_t err_len);

}  // namespace nvfp4_gemm::generic
