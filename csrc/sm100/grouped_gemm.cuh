// The SM100 grouped (mixture-of-experts) block-scaled NVFP4 GEMM: CUTLASS's ptr-array grouped GemmUniversal
// (KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100), one template for every entry of the grouped table.
//
// A call is two launches on the stream: the builder (common/cutlass_grouped_builder.cuh) writes each group's
// problem shape, pointers, strides, scale-factor layouts and alpha pointer into the workspace from offs, then the
// persistent grouped kernel (one CTA per SM: CUTLASS sizes its grid from the SM count when the host does not
// know the group shapes) walks the groups' tiles, rewriting its TMA descriptors per group on the device. Groups
// of zero rows have no tiles. Generated TUs (csrc/sm100/generated/, rendered by generate.py) instantiate
// GroupedKernel<...> for one config and export its GroupedKernelOps. Torch-free.
#pragma once

#include <algorithm>
#include <cstdio>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "common/cutlass_grouped.h"
#include "common/cutlass_grouped_ops.h"
#include "common/cutlass_grouped_builder.cuh"

namespace nvfp4_gemm::sm100 {

template <int TileM_, int TileN_, bool SwapAB_, class ElementD_>
struct GroupedKernel {
  static constexpr int TileM = TileM_, TileN = TileN_;
  static constexpr bool SwapAB = SwapAB_;
  using ElementD = ElementD_;

  // 1SM tcgen05 block-scaled MMA, 256-deep k-blocks, as the dense 1SM entries; no cluster (the grouped kernels
  // rewrite TMA descriptors per group, and a 1x1 cluster keeps every tile's groups local to one CTA).
  using MmaTileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::_256>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static_assert(TileM == 128, "1SM block-scaled MMA is 128 rows");
  static_assert(TileN == 64 || TileN == 128 || TileN == 192 || TileN == 256, "block-scaled MMA N");

  static constexpr int AlignmentAB = 32;  // 16 bytes of e2m1: TMA's minimum
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using LayoutD = grouped::LayoutDTag<SwapAB>;

  // No C operand (void): beta is 0, and the epilogue never loads C. Per-group alpha through a pointer array.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, AlignmentD, ElementD, LayoutD*,
      AlignmentD, cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, grouped::ElementOperand, grouped::LayoutATag*,
      AlignmentAB, grouped::ElementOperand, grouped::LayoutBTag*, AlignmentAB, float, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<grouped::ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // common/cutlass_grouped.h is what the host tests check; it must describe this kernel exactly.
  static_assert(cute::is_same_v<typename GemmKernel::InternalStrideA, grouped::StrideA>);
  static_assert(cute::is_same_v<typename GemmKernel::InternalStrideB, grouped::StrideB>);
  static_assert(cute::is_same_v<typename GemmKernel::InternalStrideD, grouped::StrideD<SwapAB>>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::Sm1xxBlkScaledConfig, grouped::SfConfig>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::InternalLayoutSFA, grouped::LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::InternalLayoutSFB, grouped::LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::ElementSF, grouped::ScaleType>);
  static_assert(GemmKernel::IsGroupedGemmKernel, "the ptr-array kernel in its grouped form");

  using Arrays = grouped::ArgArrays<SwapAB>;

  // `hint`: one representative group of the host-known shape for can_implement (CUTLASS checks TMA alignment on
  // host problem shapes only); nullptr for the launch, whose group shapes only the device knows.
  static typename Gemm::Arguments make_arguments(const GroupedProblem& p, const Arrays& arr,
                                                 const grouped::GroupShape* hint, int sm_count) {
    typename Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {hint ? 1 : static_cast<int>(p.g), arr.shapes, hint};
    args.mainloop = {arr.a, arr.stride_a, arr.b, arr.stride_b, arr.sfa, arr.layout_sfa, arr.sfb, arr.layout_sfb};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = reinterpret_cast<ElementD**>(arr.d);
    args.epilogue.dD = arr.stride_d;
    auto& fusion = args.epilogue.thread;
    fusion.alpha_ptr_array = arr.alpha;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 1};
    fusion.beta = 0.0f;
    // The persistent grid and the tensormap workspace are sized from the SM count; a fixed count (never 0, which
    // makes CUTLASS query the device) keeps workspace_bytes() and run() in agreement.
    args.hw_info.sm_count = sm_count;
    return args;
  }

  // The hint: a group of every row (at least one), as the swap puts it on the kernel's side.
  static grouped::GroupShape hint_of(const GroupedProblem& p) {
    const int rows = static_cast<int>(std::max<int64_t>(p.t, 1));
    return SwapAB ? grouped::GroupShape{static_cast<int>(p.n), rows, static_cast<int>(p.k)}
                  : grouped::GroupShape{rows, static_cast<int>(p.n), static_cast<int>(p.k)};
  }
};

// check / workspace / run for one kernel; the generated TUs hand these to GroupedKernelOps.
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
    const grouped::GroupShape hint = K::hint_of(p);
    cutlass::Status s = Gemm::can_implement(K::make_arguments(p, Arrays{}, &hint, dev.num_sms));
    if (s == cutlass::Status::kSuccess) s = Gemm::can_implement(K::make_arguments(p, Arrays{}, nullptr, dev.num_sms));
    if (s != cutlass::Status::kSuccess) {
      std::snprintf(why, why_len,
                    "CUTLASS can_implement refused T=%lld N=%lld K=%lld G=%lld (lda=%lld ldb=%lld bytes, ldc=%lld): "
                    "%s; this kernel needs K %% 32 == 0 (16-byte rows of e2m1) and N %% %d == 0 (16-byte rows of the "
                    "output)",
                    (long long)p.t, (long long)p.n, (long long)p.k, (long long)p.g, (long long)p.lda,
                    (long long)p.ldb, (long long)p.ldc, cutlassGetStatusString(s), K::AlignmentD);
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
    const int blocks = grouped::builder_blocks(p, dev.num_sms);
    if (const cudaError_t e = grouped::launch_builder<K::SwapAB>(p, arr, one, blocks, stream); e != cudaSuccess) {
      std::snprintf(err, err_len, "the grouped argument builder failed to launch (%d blocks): %s", blocks,
                    cudaGetErrorString(e));
      return false;
    }
    Gemm gemm;
    s = gemm.initialize(args, workspace, stream);
    const bool initialized = s == cutlass::Status::kSuccess;
    if (initialized) s = gemm.run(stream);
    if (s != cutlass::Status::kSuccess) {
      // CUTLASS reads (and so clears) the CUDA error of a failed attribute set or launch itself; what is left
      // here is only an error it did not see. Read once, so nothing is left for the next call.
      const cudaError_t e = cudaGetLastError();
      std::snprintf(err, err_len, "CUTLASS %s failed: %s; CUDA error: %s (grid from %d SMs, G=%lld)",
                    initialized ? "launch" : "initialize", cutlassGetStatusString(s),
                    e != cudaSuccess ? cudaGetErrorString(e) : "none left (CUTLASS consumed it)", dev.num_sms,
                    (long long)p.g);
      return false;
    }
    return true;
  }
};

template <class K>
constexpr GroupedKernelOps grouped_ops_of() {
  return GroupedKernelOps{&GroupedLauncher<K>::check, &GroupedLauncher<K>::workspace, &GroupedLauncher<K>::run};
}

}  // namespace nvfp4_gemm::sm100
