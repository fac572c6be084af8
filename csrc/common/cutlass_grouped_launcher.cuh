// The host side of a CUTLASS ptr-array grouped block-scaled GEMM (SM100 and SM120, each arch's grouped_gemm.cuh
// defines the kernel): its Gemm::Arguments over the workspace's argument arrays, and check / workspace / run for
// the GroupedKernelOps the generated TUs export.
#pragma once

#include <algorithm>
#include <cstdio>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/gemm.h"

#include "common/cutlass_grouped.h"
#include "common/cutlass_grouped_builder.cuh"
#include "common/cutlass_grouped_ops.h"
#include "common/cutlass_launcher.cuh"

namespace nvfp4_gemm::grouped {

// `hint`: one representative group of the host-known shape for can_implement (CUTLASS checks TMA alignment on host
// problem shapes only); nullptr for the launch, whose group shapes only the device knows (CUTLASS then runs one
// persistent CTA per SM and reads each group's shape from arr.shapes).
template <class Gemm, class ElementD, bool SwapAB>
typename Gemm::Arguments make_grouped_arguments(const GroupedProblem& p, const ArgArrays<SwapAB>& arr,
                                                const GroupShape* hint, int sm_count) {
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {hint ? 1 : static_cast<int>(p.g), arr.shapes, hint};
  args.mainloop = {arr.a, arr.stride_a, arr.b, arr.stride_b, arr.sfa, arr.layout_sfa, arr.sfb, arr.layout_sfb};
  args.epilogue.ptr_C = nullptr;  // no C operand: beta is 0 and the epilogue never loads C
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = reinterpret_cast<ElementD**>(arr.d);
  args.epilogue.dD = arr.stride_d;
  auto& fusion = args.epilogue.thread;
  fusion.alpha_ptr_array = arr.alpha;  // group g: *alpha[g]
  fusion.dAlpha = {cute::_0{}, cute::_0{}, 1};
  fusion.beta = 0.0f;
  // The persistent grid and the tensormap workspace are sized from the SM count; a fixed count (never 0, which
  // makes CUTLASS query the device) keeps workspace_bytes() and run() in agreement.
  args.hw_info.sm_count = sm_count;
  return args;
}

// The hint: one group of every row (at least one), on the kernel's side of the swap.
template <bool SwapAB>
GroupShape hint_of(const GroupedProblem& p) {
  const int rows = static_cast<int>(std::max<int64_t>(p.t, 1));
  return SwapAB ? GroupShape{static_cast<int>(p.n), rows, static_cast<int>(p.k)}
                : GroupShape{rows, static_cast<int>(p.n), static_cast<int>(p.k)};
}

// check / workspace / run for one kernel K (K::Gemm, K::Arrays, K::SwapAB, K::AlignmentD, K::make_arguments,
// K::hint_of).
template <class K>
struct GroupedLauncher {
  using Gemm = typename K::Gemm;
  using Arrays = typename K::Arrays;

  // Our arrays after CUTLASS's workspace (whose tensormaps want its alignment at the base).
  static size_t cutlass_bytes(const GroupedProblem& p, const DeviceInfo& dev) {
    return static_cast<size_t>(round_up(
        static_cast<int64_t>(Gemm::get_workspace_size(K::make_arguments(p, Arrays{}, nullptr, dev.num_sms))),
        Arrays::kAlign));
  }

  static bool check(const GroupedProblem& p, const DeviceInfo& dev, char* why, size_t why_len) {
    const GroupShape hint = K::hint_of(p);
    cutlass::Status s = Gemm::can_implement(K::make_arguments(p, Arrays{}, &hint, dev.num_sms));
    if (s == cutlass::Status::kSuccess) s = Gemm::can_implement(K::make_arguments(p, Arrays{}, nullptr, dev.num_sms));
    if (s != cutlass::Status::kSuccess) {
      char shape[160];
      std::snprintf(shape, sizeof(shape), "T=%lld N=%lld K=%lld G=%lld (lda=%lld ldb=%lld bytes, ldc=%lld)",
                    (long long)p.t, (long long)p.n, (long long)p.k, (long long)p.g, (long long)p.lda,
                    (long long)p.ldb, (long long)p.ldc);
      can_implement_refusal(why, why_len, shape, s, K::AlignmentD);
      return false;
    }
    return true;
  }

  static size_t workspace(const GroupedProblem& p, const DeviceInfo& dev) {
    return cutlass_bytes(p, dev) + static_cast<size_t>(Arrays::carve(nullptr, p.g, nullptr));
  }

  static bool run(const GroupedProblem& p, const DeviceInfo& dev, const float* one, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream, char* err, size_t err_len) {
    const size_t need = GroupedLauncher::workspace(p, dev);
    if (workspace == nullptr || workspace_bytes < need) {
      std::snprintf(err, err_len, "workspace of %zu bytes given, the kernel needs %zu", workspace_bytes, need);
      return false;
    }
    Arrays arr{};
    Arrays::carve(static_cast<uint8_t*>(workspace) + cutlass_bytes(p, dev), p.g, &arr);
    auto args = K::make_arguments(p, arr, nullptr, dev.num_sms);
    cutlass::Status s = Gemm::can_implement(args);
    if (s != cutlass::Status::kSuccess) {
      check(p, dev, err, err_len);
      return false;
    }
    const int blocks = builder_blocks(p, dev.num_sms);
    if (const cudaError_t e = launch_builder<K::SwapAB>(p, arr, one, blocks, stream); e != cudaSuccess) {
      std::snprintf(err, err_len, "the grouped argument builder failed to launch (%d blocks): %s", blocks,
                    cudaGetErrorString(e));
      return false;
    }
    char context[64];
    std::snprintf(context, sizeof(context), "grid from %d SMs, G=%lld", dev.num_sms, (long long)p.g);
    return initialize_and_run<Gemm>(args, workspace, stream, context, err, err_len);
  }
};

}  // namespace nvfp4_gemm::grouped
