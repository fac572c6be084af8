// The SM120 / SM121 grouped (mixture-of-experts) block-scaled NVFP4 GEMM: CUTLASS's ptr-array grouped
// GemmUniversal with the SM120 block-scaled collective (MainloopSm120ArrayTmaWarpSpecializedBlockScaled, the
// cooperative schedule of CUTLASS's example 79d), one template for every entry of the grouped table.
//
// A call is two launches on the stream: the builder (common/cutlass_grouped_builder.cuh) writes each group's problem
// shape, pointers, strides, scale-factor layouts and alpha pointer into the workspace from offs, then the persistent
// grouped kernel (one CTA per SM: CUTLASS sizes its grid from the SM count when the host does not know the group
// shapes) walks the groups' tiles, rewriting its TMA descriptors per group on the device. Groups of zero rows have
// no tiles. Generated TUs (csrc/sm120/generated/, rendered by generate.py) instantiate GroupedKernel<...> for one
// config and export its GroupedKernelOps (common/cutlass_grouped_launcher.cuh's check / workspace / run, shared
// with SM100). Torch-free.
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
#include "common/cutlass_grouped_launcher.cuh"
#include "common/cutlass_grouped_ops.h"

namespace nvfp4_gemm::sm120 {

template <int TileM_, int TileN_, int TileK_, class ElementD_>
struct GroupedKernel {
  static constexpr int TileM = TileM_, TileN = TileN_, TileK = TileK_;
  static constexpr bool SwapAB = false;  // no 64-wide N side on SM120: swapping buys nothing
  using ElementD = ElementD_;

  // Warp-level block-scaled MMA (m16n8k64), cooperative schedule; SM120 has no multicast: 1x1x1 clusters.
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static_assert(TileM % 128 == 0 && TileN % 128 == 0, "tiles cover whole 128-row scale-factor atoms");
  static_assert(TileK == 128 || TileK == 256, "k-block: two or four 64-deep MMAs (one SF atom column per 64)");

  static constexpr int AlignmentAB = 32;  // 16 bytes of e2m1: TMA's minimum
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using LayoutD = grouped::LayoutDTag<false>;

  // No C operand (void): beta is 0, and the epilogue never loads C. Per-group alpha through a pointer array.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassBlockScaledTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, AlignmentD, ElementD, LayoutD*,
      AlignmentD, cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassBlockScaledTensorOp, grouped::ElementOperand, grouped::LayoutATag*,
      AlignmentAB, grouped::ElementOperand, grouped::LayoutBTag*, AlignmentAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<grouped::ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // common/cutlass_grouped.h is what the host tests check; it must describe this kernel exactly.
  static_assert(cute::is_same_v<typename GemmKernel::InternalStrideA, grouped::StrideA>);
  static_assert(cute::is_same_v<typename GemmKernel::InternalStrideB, grouped::StrideB>);
  static_assert(cute::is_same_v<typename GemmKernel::InternalStrideD, grouped::StrideD<false>>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::Sm1xxBlkScaledConfig, grouped::SfConfig>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::InternalLayoutSFA, grouped::LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::InternalLayoutSFB, grouped::LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::ElementSF, grouped::ScaleType>);
  static_assert(CollectiveMainloop::DispatchPolicy::Stages >= 2, "the mainloop needs a double-buffered pipeline");
  // The launch sets this much dynamic shared memory; past the 99 KB a CTA may opt into on SM120 / SM121 it would
  // fail at run time, so it is proven here.
  static constexpr int kSmemBytes = static_cast<int>(GemmKernel::SharedStorageSize);
  static_assert(kSmemBytes <= cutlass::arch::sm120_smem_capacity_bytes, "tile does not fit SM120's 99 KB");
  static constexpr int kStages = CollectiveMainloop::DispatchPolicy::Stages;

  using Arrays = grouped::ArgArrays<false>;

  static typename Gemm::Arguments make_arguments(const GroupedProblem& p, const Arrays& arr,
                                                 const grouped::GroupShape* hint, int sm_count) {
    return grouped::make_grouped_arguments<Gemm, ElementD>(p, arr, hint, sm_count);
  }

  static grouped::GroupShape hint_of(const GroupedProblem& p) { return grouped::hint_of<false>(p); }
};

template <class K>
constexpr GroupedKernelOps grouped_ops_of() {
  return GroupedKernelOps{&grouped::GroupedLauncher<K>::check, &grouped::GroupedLauncher<K>::workspace,
                          &grouped::GroupedLauncher<K>::run};
}

}  // namespace nvfp4_gemm::sm120
