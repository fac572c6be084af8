// nvfp4_gemm::_moe_topk (the top-k of a mixture-of-experts router): input checks and outputs shared by the CPU
// implementation (csrc/bindings/moe_topk.cpp) and the CUDA one (csrc/bindings/cuda/moe_topk_cuda.cpp).
//
//   _moe_topk(logits [T, E] float32 / float16 / bfloat16, k, normalize) -> (weights [T, k] logits' dtype,
//                                                                         ids [T, k] int64)
//
// What transformers' softmax top-k routers (Qwen3-MoE, Qwen2-MoE, Mixtral) compute after their logits GEMM,
// per token t, every step in float32:
//   m     = max_j logits[t, j]
//   e_j   = exp(logits[t, j] - m)
//   s     = sum_j e_j          lane l of a 32-lane warp adds e_l, e_{l+32}, ... in order from 0, then the 32 lane
//                              sums meet in a butterfly (xor 16, 8, 4, 2, 1): torch's CUDA softmax order for
//                              E <= 1024 (a narrower warp of torch's, for E < 32, adds the same sums: the
//                              missing lanes hold 0)
//   p_j   = e_j / s
//   ids   the k experts of largest p, in descending p; equal p: the lower expert id first; NaN above +inf
//   w_i   = p[ids_i];  normalize: w_i / (the sum of the k w, slot i on lane i, by the same butterfly)
//   weights = w rounded to nearest even to logits' dtype
// A row holding a NaN, +inf, or only -inf logits has NaN for every p (as torch's softmax), so its ids are
// 0..k-1 and its weights NaN. The CPU takes exp from the C library (expf), CUDA its own expf (what torch's
// CUDA softmax calls): the two agree to a few float32 ulps, which is the only difference between them.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace nvfp4_gemm {

// The most experts (E) and slots (k) taken: one warp holds a row, each lane at most 16 logits; the k
// selected weights sit one per lane. (Current routers: E up to a few hundred, k up to 8.)
inline constexpr int64_t kMoeTopkMaxExperts = 512;
inline constexpr int64_t kMoeTopkMaxK = 32;

struct MoeTopkShape {
  int64_t t, e, k;
};

// Checks logits (2-D [T, E], float32 / float16 / bfloat16, 1 <= E <= kMoeTopkMaxExperts) and k
// (1 <= k <= min(E, kMoeTopkMaxK)); throws c10::Error naming the argument, expected against actual.
MoeTopkShape check_moe_topk_inputs(const at::Tensor& logits, int64_t k);

// weights [T, k] of logits' dtype, ids [T, k] int64 on logits' device, uninitialized.
std::tuple<at::Tensor, at::Tensor> empty_moe_topk_outputs(const at::Tensor& logits, const MoeTopkShape& s);

}  // namespace nvfp4_gemm
