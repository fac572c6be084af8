// The CUDA top-k of a mixture-of-experts router (nvfp4_gemm::_moe_topk, semantics in bindings/moe_topk.h):
// softmax over the E logits of a token in float32, its k largest, optionally renormalized, cast. Torch-free; the
// binding layer (csrc/bindings/cuda/moe_topk_cuda.cpp) validates the tensors and allocates the outputs.
//
// One launch, one warp per token (4 tokens per CTA): lane l holds experts l, l + 32, ... (at most 16 of them,
// in registers), so the max and the sum are a lane's own loop then a 5-step butterfly, which is torch's CUDA
// softmax's order; then k rounds of a warp argmax over 64-bit keys (p's bits, then the complement of the id:
// larger p first, the lower id on ties), the winning lane marking its expert taken. Each lane keeps the winner of
// its own round index, so lanes 0..k-1 hold the k slots: the renormalizing sum is one more butterfly over them,
// and they write the row's outputs at once. The taken bits are per lane, in a register; nothing goes to shared
// memory. No host sync: T, E and k are shapes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace nvfp4_gemm::generic {

// Enqueues the top-k of t >= 1 rows of e logits (contiguous [t, e], dtype: float16 / bfloat16 / float32, the
// weights' dtype too), 1 <= e <= 512, 1 <= k <= min(e, 32): weights [t, k], ids [t, k] int64. Returns false
// with `err` filled on a launch failure.
bool moe_topk(const void* logits, OutDtype dtype, int64_t t, int64_t e, int64_t k, bool normalize, void* weights,
              int64_t* ids, cudaStream_t stream, char* err, size_t err_len);

}  // namespace nvfp4_gemm::generic
