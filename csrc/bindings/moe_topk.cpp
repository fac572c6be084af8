// nvfp4_gemm::_moe_topk: schema, input checks and the CPU implementation, the reference of the CUDA kernel
// (csrc/cuda/moe_topk.cu). Semantics in bindings/moe_topk.h.
#include "bindings/moe_topk.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace nvfp4_gemm {
namespace {

constexpr const char* kOp = "nvfp4_gemm._moe_topk";
constexpr int kLanes = 32;  // the CUDA kernel's warp, whose summation order the CPU takes too

}  // namespace

MoeTopkShape check_moe_topk_inputs(const at::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.dim() == 2, kOp, ": logits must be 2-D [T, E] (tokens x experts), got shape ", logits.sizes());
  const auto dt = logits.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kHalf || dt == at::kBFloat16, kOp,
              ": logits must be float32, float16 or bfloat16, got ", dt);
  const int64_t t = logits.size(0), e = logits.size(1);
  TORCH_CHECK(e >= 1 && e <= kMoeTopkMaxExperts, kOp, ": logits must have 1 to ", kMoeTopkMaxExperts,
              " experts (E = logits.size(1)), got ", e);
  const int64_t k_max = std::min(e, kMoeTopkMaxK);
  TORCH_CHECK(k >= 1 && k <= k_max, kOp, ": k must be in [1, min(E, ", kMoeTopkMaxK, ") = ", k_max, "], got ", k);
  return MoeTopkShape{t, e, k};
}

std::tuple<at::Tensor, at::Tensor> empty_moe_topk_outputs(const at::Tensor& logits, const MoeTopkShape& s) {
  return {at::empty({s.t, s.k}, logits.options()), at::empty({s.t, s.k}, logits.options().dtype(at::kLong))};
}

namespace {

// Whether (p, id) comes before (q, jd) in the selection: larger first, NaN above everything, equal values
// (NaNs among themselves) by the lower id. (+0 and -0 are equal; a p is never -0: exp >= +0, s > 0 or NaN.)
bool before(float p, int64_t id, float q, int64_t jd) {
  const bool pn = std::isnan(p), qn = std::isnan(q);
  if (pn != qn) return pn;
  if (!pn && p != q) return p > q;
  return id < jd;
}

// The warp's xor butterfly (16, 8, 4, 2, 1) over 32 lane values: every lane ends with this sum.
float butterfly_sum(std::array<float, kLanes> lane) {
  for (int o = kLanes / 2; o > 0; o /= 2) {
    std::array<float, kLanes> next;
    for (int l = 0; l < kLanes; ++l) next[l] = lane[l] + lane[l ^ o];
    lane = next;
  }
  return lane[0];
}

template <typename In>
void topk_rows(const In* logits, const MoeTopkShape& s, bool normalize, In* weights, int64_t* ids) {
  std::vector<float> p(static_cast<size_t>(s.e));
  std::vector<int64_t> order(static_cast<size_t>(s.e));
  for (int64_t t = 0; t < s.t; ++t) {
    const In* x = logits + t * s.e;
    // (the max in the kernel's form: `m > v ? m : v`, so a NaN logit may or may not become m; either way the
    // row's p are all NaN below)
    float m = static_cast<float>(x[0]);
    for (int64_t j = 1; j < s.e; ++j) {
      const float v = static_cast<float>(x[j]);
      m = m > v ? m : v;
    }
    std::array<float, kLanes> lane{};
    for (int64_t j = 0; j < s.e; ++j) {
      p[j] = std::exp(static_cast<float>(x[j]) - m);
      lane[j % kLanes] += p[j];
    }
    const float sum = butterfly_sum(lane);
    for (int64_t j = 0; j < s.e; ++j) p[j] = p[j] / sum;
    for (int64_t j = 0; j < s.e; ++j) order[j] = j;
    std::partial_sort(order.begin(), order.begin() + s.k, order.end(),
                      [&](int64_t a, int64_t b) { return before(p[a], a, p[b], b); });
    std::array<float, kLanes> slot{};  // slot i on lane i, the other lanes 0: the same butterfly
    for (int64_t i = 0; i < s.k; ++i) slot[i] = p[order[i]];
    const float total = butterfly_sum(slot);
    for (int64_t i = 0; i < s.k; ++i) {
      const float w = p[order[i]];
      weights[t * s.k + i] = static_cast<In>(normalize ? w / total : w);
      ids[t * s.k + i] = order[i];
    }
  }
}

std::tuple<at::Tensor, at::Tensor> moe_topk_cpu(const at::Tensor& logits_in, int64_t k, bool normalize) {
  const MoeTopkShape s = check_moe_topk_inputs(logits_in, k);
  auto [weights, ids] = empty_moe_topk_outputs(logits_in, s);
  if (s.t == 0) return {weights, ids};
  const at::Tensor logits = logits_in.contiguous();
  int64_t* id = ids.data_ptr<int64_t>();
  switch (logits.scalar_type()) {
    case at::kFloat:
      topk_rows(logits.data_ptr<float>(), s, normalize, weights.data_ptr<float>(), id);
      break;
    case at::kHalf:
      topk_rows(logits.data_ptr<at::Half>(), s, normalize, weights.data_ptr<at::Half>(), id);
      break;
    default:
      topk_rows(logits.data_ptr<at::BFloat16>(), s, normalize, weights.data_ptr<at::BFloat16>(), id);
      break;
  }
  return {weights, ids};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_moe_topk(Tensor logits, int k, bool normalize) -> (Tensor weights, Tensor ids)");
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) { m.impl("_moe_topk", &nvfp4_gemm::moe_topk_cpu); }
