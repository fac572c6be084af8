// The SM100 block-scaled NVFP4 GEMM, one template for every entry of the dispatch table.
//
// Generated TUs (csrc/sm100/generated/, rendered by generate.py) instantiate Kernel<...> for one config
// and export its KernelOps. Everything here is torch-free; the binding layer reaches it through api.cpp.
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
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"

#include "common/cutlass_launcher.cuh"
#include "sm100/kernel_ops.h"
#include "sm100/operands.h"

namespace nvfp4_gemm::sm100 {

template <int TileM_, int TileN_, int ClusterM_, int ClusterN_, bool TwoSm_, bool StreamK_, bool SwapAB_,
          class ElementD_>
struct Kernel {
  static constexpr int TileM = TileM_, TileN = TileN_, ClusterM = ClusterM_, ClusterN = ClusterN_;
  static constexpr bool TwoSm = TwoSm_, StreamK = StreamK_, SwapAB = SwapAB_;
  using ElementD = ElementD_;

  // tcgen05 block-scaled NVFP4 MMA: K = 64 per instruction, four per 256-wide k-block (one 128x4 SF
  // atom column per row block). 2SM tiles are 256 rows split over the CTA pair.
  using MmaTileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::_256>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  static_assert(!TwoSm || (TileM == 256 && ClusterM % 2 == 0), "2SM MMA needs a 256-row tile on an even cluster M");
  static_assert(TwoSm || TileM == 128, "1SM block-scaled MMA is 128 rows");
  static_assert(TileN == 64 || TileN == 128 || TileN == 192 || TileN == 256, "block-scaled MMA N");

  static constexpr int AlignmentAB = 32;  // 16 bytes of e2m1: TMA's minimum
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using LayoutD = LayoutDTag<SwapAB>;

  using MainloopSchedule = cute::conditional_t<TwoSm, cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100,
                                               cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100>;
  using EpilogueSchedule = cute::conditional_t<TwoSm, cutlass::epilogue::TmaWarpSpecialized2Sm,
                                               cutlass::epilogue::TmaWarpSpecialized1Sm>;

  // No C operand (void): beta is 0, and the epilogue never loads C.
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, AlignmentD, ElementD,
      LayoutD, AlignmentD, EpilogueSchedule>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementOperand, LayoutATag, AlignmentAB,
      ElementOperand, LayoutBTag, AlignmentAB, float, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using TileScheduler = cute::conditional_t<StreamK, cutlass::gemm::StreamKScheduler, void>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // operands.h is what the host tests check; it must describe this kernel exactly.
  static_assert(cute::is_same_v<typename GemmKernel::StrideA, StrideA>);
  static_assert(cute::is_same_v<typename GemmKernel::StrideB, StrideB>);
  static_assert(cute::is_same_v<typename GemmKernel::StrideD, StrideD<SwapAB>>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::Sm1xxBlkScaledConfig, SfConfig>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::LayoutSFA, LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::LayoutSFB, LayoutSF>);
  static_assert(cute::is_same_v<typename CollectiveMainloop::ElementSF, ScaleType>);

  static typename Gemm::Arguments make_arguments(const Problem& p, const float* alpha, int sm_count) {
    const Operands<SwapAB> o = make_operands<SwapAB>(p, alpha);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {o.mk, o.nk, o.k, 1},
        {o.a, o.stride_a, o.b, o.stride_b, o.sfa, o.layout_sfa, o.sfb, o.layout_sfb},
        {{}, nullptr, o.stride_d, static_cast<ElementD*>(o.d), o.stride_d}};
    args.epilogue.thread.alpha_ptr = o.alpha;
    args.epilogue.thread.beta = 0.0f;
    // Stream-K sizes its workspace and decomposition from the SM count; a fixed count (never 0, which
    // makes CUTLASS query the device) keeps workspace_bytes() and run() in agreement.
    args.hw_info.sm_count = sm_count;
    if constexpr (StreamK) args.scheduler.splits = split_k(o.mk, o.nk, o.k, sm_count);
    return args;
  }

  // CUTLASS's stream-K heuristic splits K when fewer than half the SMs get a tile, but never when a tile
  // has <= 8 k-blocks (K <= 2048). The GPU MODE shape (128, 7168, 2048) is exactly that: 56 tiles for
  // 148 SMs. There, split K (each part keeps >= 4 k-blocks = 1024 of K; 56 -> 112 CTAs for that shape)
  // so that most SMs stream B; 1 leaves the decision to CUTLASS.
  static int split_k(int64_t mk, int64_t nk, int64_t k, int sm_count) {
    const int64_t ctas = ceil_div(mk, TileM) * (TileM / 128) * ceil_div(nk, TileN);
    const int64_t k_blocks = ceil_div(k, 256);
    if (k_blocks > 8 || 2 * ctas > sm_count) return 1;
    const int64_t splits = std::min<int64_t>(sm_count / ctas, k_blocks / 4);
    return splits > 1 ? static_cast<int>(splits) : 1;
  }
};

template <class K>
constexpr KernelOps ops_of() {
  return KernelOps{&CutlassLauncher<K>::check, &CutlassLauncher<K>::workspace, &CutlassLauncher<K>::run};
}

}  // namespace nvfp4_gemm::sm100
