// Entry point of the SM90 backend for module.cpp: the BackendApi table (common/problem.h).
#pragma once

#include "common/problem.h"

namespace nvfp4_gemm::sm90 {
const BackendApi& backend_api();

// The dispatch table (configs.h, kDispatch) as text, one line per M range.
const char* dispatch_rules();

// Tests and benchmarks: forces the split count of every following call in this process (0: automatic,
// the default unless NVFP4_GEMM_SM90_SPLITS was set at the first call). Returns the previous value.
int set_forced_splits(int splits);

// Experiment: the weights of a model's K-sliced GEMMs in run order (packed bytes, blocked scales, row stride in
// bytes, N, K); a K-sliced call on weight i prefetches the first pipeline stage of weight i + 1 into L2. count 0
// clears it. Pointers only: the caller keeps the tensors alive until it clears the chain. Returns count.
int set_prefetch_chain(const uint8_t* const* b, const uint8_t* const* sfb, const int64_t* ldb, const int64_t* n,
                       const int64_t* k, int count);
}  // namespace nvfp4_gemm::sm90
