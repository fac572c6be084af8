// nvfp4_gemm::_moe_route (the routing of a mixture-of-experts forward): input checks and outputs shared by the
// CPU implementation (csrc/bindings/moe_route.cpp) and the CUDA one (csrc/bindings/cuda/moe_route_cuda.cpp).
//
//   _moe_route(top_k_index [T, k] int64 / int32, num_experts E) -> (offs int32 [E], row_token int64 [S],
//                                                                  inverse int64 [S]),  S = T * k
//
// Pair p = t * k + j is (token t, slot j) with expert id ids[p] = top_k_index[t, j]. The pairs are ordered by
// key (ids[p] where 0 <= ids[p] < E, else E), stably: within a key by ascending p. For ids in [0, E] that is
// exactly the order of torch.sort(ids, stable=True). Row r of that order is:
//   row_token[r]   the token of the pair at row r (p / k)
//   inverse[p]     the row of pair p (a permutation of 0..S-1)
//   offs[e]        rows of experts 0..e (inclusive cumulative counts): expert e's rows are offs[e-1]..offs[e]
// An id outside [0, E) (transformers' expert-parallel sentinel E, or anything else) belongs to no expert: its
// pairs take the rows offs[E-1]..S-1 after every expert's, in pair order, so offs[E-1] < S; row_token and
// inverse still cover them.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace nvfp4_gemm {

// The largest num_experts taken (the largest routed-expert count of current models is a few hundred).
inline constexpr int64_t kMoeRouteMaxExperts = 4096;

struct MoeRouteShape {
  int64_t t, k, s, e;
};

// Checks top_k_index (2-D [T, k], int64 or int32, T * k < 2^31) and num_experts (1..kMoeRouteMaxExperts);
// throws c10::Error naming the argument, expected against actual.
MoeRouteShape check_moe_route_inputs(const at::Tensor& top_k_index, int64_t num_experts);

// offs int32 [E], row_token int64 [S], inverse int64 [S] on top_k_index's device, uninitialized.
std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_moe_route_outputs(const at::Tensor& top_k_index,
                                                                       const MoeRouteShape& s);

}  // namespace nvfp4_gemm
