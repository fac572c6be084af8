// The SM120 / SM121 block-scaled NVFP4 GEMM, one template for every entry of the dispatch table.
//
// Generated TUs (csrc/sm120/generated/, rendered by generate.py) instantiate Kernel<...> for one config
// and export its KernelOps. Everything here is torch-free; the binding layer reaches it through api.cpp.
#pragma once

#include <cstdio>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"

#include "common/cutlass_launcher.cuh"
#include "sm120/kernel_ops.h"
#include "sm120/operands.h"

namespace nvfp4_gemm::sm120 {

template <int TileM_, int TileN_, int TileK_, class ElementD_>
struct Kernel {
  static constexpr int TileM = TileM_, TileN = TileN_, TileK = TileK_;
  using ElementD = ElementD_;

  // Warp-level block-scaled MMA, m16n8k64 per instruction; the cooperative schedule puts 8 MMA warps
  // (4 along M, 2 along N) on a tile. SM120 has no multicast: the cluster is one CTA.
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static_assert(TileM % 128 == 0 && TileN % 128 == 0, "tiles cover whole 128-row scale-factor atoms");
  static_assert(TileK == 128 || TileK == 256, "k-block: two or four 64-deep MMAs (one SF atom column per 64)");

  static constexpr int AlignmentAB = 32;  // 16 bytes of e2m1: TMA's minimum
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;

  // No C operand (void): beta is 0, and the epilogue never loads C. Auto picks the cooperative schedule
  // and the TMA epilogue, as CUTLASS's SM120 NVFP4 examples do.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassBlockScaledTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutDTag, AlignmentD, ElementD,
      LayoutDTag, AlignmentD, cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassBlockScaledTensorOp, ElementOperand, LayoutATag, AlignmentAB,
      ElementOperand, LayoutBTag, AlignmentAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // operands.h is what the host tests check; it must describe this kernel exactly.
  static_assert(cute::is_same_v<typename GemmKernel::StrideA, StrideA>);
  static_assert(cute::is_same_v<typename GemmKernel::StrideB, StrideB>);
  static_assert(cute::is_same_v<typename GemmKernel::StrideD, StrideD>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::Sm1xxBlkScaledConfig, SfConfig>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::LayoutSFA, LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::LayoutSFB, LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::ElementSF, ScaleType>);
  static_assert(CollectiveMainloop::DispatchPolicy::Stages >= 2, "the mainloop needs a double-buffered pipeline");
  // The launch sets this much dynamic shared memory; past the 99 KB a CTA may opt into on SM120 / SM121
  // it would fail at run time, so it is proven here.
  static constexpr int kSmemBytes = static_cast<int>(GemmKernel::SharedStorageSize);
  static_assert(kSmemBytes <= cutlass::arch::sm120_smem_capacity_bytes, "tile does not fit SM120's 99 KB");
  static constexpr int kStages = CollectiveMainloop::DispatchPolicy::Stages;

  static typename Gemm::Arguments make_arguments(const Problem& p, const float* alpha, int sm_count) {
    const Operands o = make_operands(p, alpha);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {o.m, o.n, o.k, 1},
        {o.a, o.stride_a, o.b, o.stride_b, o.sfa, o.layout_sfa, o.sfb, o.layout_sfb},
        {{}, nullptr, o.stride_d, static_cast<ElementD*>(o.d), o.stride_d}};
    args.epilogue.thread.alpha_ptr = o.alpha;
    args.epilogue.thread.beta = 0.0f;
    // A fixed count (never 0, which makes CUTLASS query the device) keeps workspace_bytes() and run() in
    // agreement.
    args.hw_info.sm_count = sm_count;
    return args;
  }
};

template <class K>
constexpr KernelOps ops_of() {
  return KernelOps{&CutlassLauncher<K>::check, &CutlassLauncher<K>::workspace, &CutlassLauncher<K>::run};
}

}  // namespace nvfp4_gemm::sm120
