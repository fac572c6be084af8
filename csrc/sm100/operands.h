// Problem -> CUTLASS operand description for the SM100 block-scaled GEMM (host code, no kernel).
//
// The launcher (sm100_gemm.cuh) builds its Gemm::Arguments from exactly this struct, and the host tests
// (tests/sm100_host/) feed the same struct to CUTLASS's host reference and to a layout-conformance check,
// so what those tests prove about strides, scale-factor layouts, operand roles and the A/B swap is what
// the kernels are given. sm100_gemm.cuh static_asserts that these types equal the kernel's.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/float_subbyte.h"
#include "cutlass/float8.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/layout/matrix.h"

#include "common/problem.h"

namespace nvfp4_gemm::sm100 {

using DataType = cutlass::float_e2m1_t;     // packed two per byte, element 2i in the low nibble
using ScaleType = cutlass::float_ue4m3_t;   // e4m3 bit pattern; docs/CONTRACT.md's scales are never negative
using ElementOperand = cutlass::nv_float4_t<DataType>;
using SfConfig = cutlass::detail::Sm1xxBlockScaledConfig<int(kSfVecSize)>;
using LayoutSF = decltype(SfConfig::deduce_layoutSFA());

// Both operands are K-major: A (M x K) row-major, B (N x K) read as a K x N column-major matrix.
using LayoutATag = cutlass::layout::RowMajor;
using LayoutBTag = cutlass::layout::ColumnMajor;
using StrideA = cutlass::gemm::TagToStrideA_t<LayoutATag>;
using StrideB = cutlass::gemm::TagToStrideB_t<LayoutBTag>;

// Swapping computes D = B_dq @ A_dq^T (an N x M matrix) and stores it column-major, which is C row-major.
// The MMA's M side is 128 or 256 rows while its N side goes down to 64, so a small M belongs on N.
template <bool SwapAB>
using LayoutDTag = cute::conditional_t<SwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
template <bool SwapAB>
using StrideD = cutlass::gemm::TagToStrideC_t<LayoutDTag<SwapAB>>;

template <bool SwapAB>
struct Operands {
  int mk, nk, k;                 // the kernel's problem: (mk, nk) = (m, n), or (n, m) when swapped
  const DataType* a;             // the kernel's A operand (our B when swapped)
  StrideA stride_a;
  const DataType* b;
  StrideB stride_b;
  const ScaleType* sfa;
  LayoutSF layout_sfa;
  const ScaleType* sfb;
  LayoutSF layout_sfb;
  StrideD<SwapAB> stride_d;
  void* d;
  const float* alpha;            // never null: the launcher substitutes a device 1.0f first
};

// Strides are in elements of the operand type: one e2m1 element is half a byte, so a row of `ld` bytes
// is 2 * ld elements apart. L (batch) is 1; its stride is irrelevant but kept consistent. M, N, K are
// narrowed to CUTLASS's int problem shape: api.cpp refuses any past INT_MAX before this runs.
template <bool SwapAB>
Operands<SwapAB> make_operands(const Problem& p, const float* alpha) {
  using namespace cute;
  Operands<SwapAB> o{};
  const int64_t m = SwapAB ? p.n : p.m;
  const int64_t n = SwapAB ? p.m : p.n;
  const int64_t lda = 2 * (SwapAB ? p.ldb : p.lda);
  const int64_t ldb = 2 * (SwapAB ? p.lda : p.ldb);
  o.mk = static_cast<int>(m);
  o.nk = static_cast<int>(n);
  o.k = static_cast<int>(p.k);
  o.a = reinterpret_cast<const DataType*>(SwapAB ? p.b : p.a);
  o.b = reinterpret_cast<const DataType*>(SwapAB ? p.a : p.b);
  o.sfa = reinterpret_cast<const ScaleType*>(SwapAB ? p.sfb : p.sfa);
  o.sfb = reinterpret_cast<const ScaleType*>(SwapAB ? p.sfa : p.sfb);
  o.stride_a = StrideA{lda, Int<1>{}, lda * m};
  o.stride_b = StrideB{ldb, Int<1>{}, ldb * n};
  // The caller's blocked buffers are exactly CUTLASS's SF atom tiled over (rows, K) row-block major.
  auto shape = make_shape(o.mk, o.nk, o.k, 1);
  o.layout_sfa = SfConfig::tile_atom_to_shape_SFA(shape);
  o.layout_sfb = SfConfig::tile_atom_to_shape_SFB(shape);
  if constexpr (SwapAB) {
    o.stride_d = StrideD<true>{Int<1>{}, p.ldc, p.ldc * p.m};
  } else {
    o.stride_d = StrideD<false>{p.ldc, Int<1>{}, p.ldc * p.m};
  }
  o.d = p.c;
  o.alpha = alpha;
  return o;
}

}  // namespace nvfp4_gemm::sm100
