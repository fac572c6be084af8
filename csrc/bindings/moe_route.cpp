// nvfp4_gemm::_moe_route: schema, input checks and the CPU implementation, the reference of the CUDA kernel
// (csrc/cuda/moe_route.cu). Semantics in bindings/moe_route.h.
#include "bindings/moe_route.h"

#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace nvfp4_gemm {
namespace {

constexpr const char* kOp = "nvfp4_gemm._moe_route";

}  // namespace

MoeRouteShape check_moe_route_inputs(const at::Tensor& top_k_index, int64_t num_experts) {
  TORCH_CHECK(top_k_index.dim() == 2, kOp, ": top_k_index must be 2-D [T, k] (tokens x expert slots), got shape ",
              top_k_index.sizes());
  const auto dt = top_k_index.scalar_type();
  TORCH_CHECK(dt == at::kLong || dt == at::kInt, kOp, ": top_k_index must be int64 or int32 expert ids, got ", dt);
  TORCH_CHECK(num_experts >= 1 && num_experts <= kMoeRouteMaxExperts, kOp, ": num_experts must be in [1, ",
              kMoeRouteMaxExperts, "], got ", num_experts);
  const int64_t t = top_k_index.size(0), k = top_k_index.size(1);
  TORCH_CHECK(t * k <= std::numeric_limits<int32_t>::max(), kOp, ": T * k = ", t, " * ", k,
              " pairs must be at most 2^31 - 1 (offs is int32)");
  return MoeRouteShape{t, k, t * k, num_experts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_moe_route_outputs(const at::Tensor& top_k_index,
                                                                       const MoeRouteShape& s) {
  return {at::empty({s.e}, top_k_index.options().dtype(at::kInt)),
          at::empty({s.s}, top_k_index.options().dtype(at::kLong)),
          at::empty({s.s}, top_k_index.options().dtype(at::kLong))};
}

namespace {

// A counting sort: stable because the second pass visits the pairs in order.
template <typename Id>
void route(const Id* ids, const MoeRouteShape& s, int32_t* offs, int64_t* row_token, int64_t* inverse) {
  const auto key = [&](int64_t p) -> int64_t {
    const int64_t v = static_cast<int64_t>(ids[p]);
    return v >= 0 && v < s.e ? v : s.e;  // ids outside [0, E): one key after every expert
  };
  std::vector<int64_t> start(static_cast<size_t>(s.e + 2), 0);  // start[x + 1]: count of key x, then rows before
  for (int64_t p = 0; p < s.s; ++p) ++start[key(p) + 1];
  for (int64_t x = 0; x <= s.e; ++x) start[x + 1] += start[x];
  for (int64_t x = 0; x < s.e; ++x) offs[x] = static_cast<int32_t>(start[x + 1]);
  offs[s.e - 1] = static_cast<int32_t>(start[s.e + 1]);  // ids outside [0, E) close the last group (dropped later)
  for (int64_t p = 0; p < s.s; ++p) {
    const int64_t row = start[key(p)]++;
    inverse[p] = row;
    row_token[row] = p / s.k;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_route_cpu(const at::Tensor& top_k_index, int64_t num_experts) {
  const MoeRouteShape s = check_moe_route_inputs(top_k_index, num_experts);
  auto [offs, row_token, inverse] = empty_moe_route_outputs(top_k_index, s);
  const at::Tensor ids = top_k_index.contiguous();
  if (ids.scalar_type() == at::kLong) {
    route(ids.data_ptr<int64_t>(), s, offs.data_ptr<int32_t>(), row_token.data_ptr<int64_t>(),
          inverse.data_ptr<int64_t>());
  } else {
    route(ids.data_ptr<int32_t>(), s, offs.data_ptr<int32_t>(), row_token.data_ptr<int64_t>(),
          inverse.data_ptr<int64_t>());
  }
  return {offs, row_token, inverse};
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_moe_route(Tensor top_k_index, int num_experts) -> (Tensor offs, Tensor row_token, Tensor inverse)");
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) { m.impl("_moe_route", &nvfp4_gemm::moe_route_cpu); }
