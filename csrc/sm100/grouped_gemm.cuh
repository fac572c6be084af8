// The SM100 grouped (mixture-of-experts) block-scaled NVFP4 GEMM: CUTLASS's ptr-array grouped GemmUniversal
// (KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100), one template for every entry of the grouped table.
//
// A call is two launches on the stream: the builder (common/cutlass_grouped_builder.cuh) writes each group's
// problem shape, pointers, strides, scale-factor layouts and alpha pointer into the workspace from offs, then the
// persistent grouped kernel (one CTA per SM: CUTLASS sizes its grid from the SM count when the host does not
// know the group shapes) walks the groups' tiles, rewriting its TMA descriptors per group on the device. Groups
// of zero rows have no tiles. Generated TUs (csrc/sm100/generated/, rendered by generate.py) instantiate
// GroupedKernel<...> for one config and export its GroupedKernelOps (common/cutlass_grouped_launcher.cuh's
// check / workspace / run, shared with SM120). Torch-free.
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

  static typename Gemm::Arguments make_arguments(const GroupedProblem& p, const Arrays& arr,
                                                 const grouped::GroupShape* hint, int sm_count) {
    return grouped::make_grouped_arguments<Gemm, ElementD>(p, arr, hint, sm_count);
  }

  static grouped::GroupShape hint_of(const GroupedProblem& p) { return grouped::hint_of<SwapAB>(p); }
};

template <class K>
constexpr GroupedKernelOps grouped_ops_of() {
  return GroupedKernelOps{&grouped::GroupedLauncher<K>::check, &grouped::GroupedLauncher<K>::workspace,
                          &grouped::GroupedLauncher<K>::run};
}

}  // namespace nvfp4_gemm::sm100
