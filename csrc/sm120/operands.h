// Problem -> CUTLASS operand description for the SM120 block-scaled GEMM (host code, no kernel).
//
// The launcher (sm120_gemm.cuh) builds its Gemm::Arguments from exactly this struct, and the host tests
// (tests/sm120_host/) feed the same struct to CUTLASS's host reference and to a layout-conformance check,
// so what those tests prove about strides and scale-factor layouts is what the kernels are given.
// sm120_gemm.cuh static_asserts that these types equal the kernel's.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/float_subbyte.h"
#include "cutlass/float8.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/layout/matrix.h"

#include "common/problem.h"

namespace nvfp4_gemm::sm120 {

using DataType = cutlass::float_e2m1_t;     // packed two per byte, element 2i in the low nibble
using ScaleType = cutlass::float_ue4m3_t;   // e4m3 bit pattern; docs/CONTRACT.md's scales are never negative
using ElementOperand = cutlass::nv_float4_t<DataType>;
// The SM120 collective uses the same scale-factor description as SM100 (Sm1xx...): 128x4 atoms of
// 512 bytes, row-block major. tests/sm120_host/layout_test.cu proves it equals docs/CONTRACT.md's offsets.
using SfConfig = cutlass::detail::Sm1xxBlockScaledConfig<int(kSfVecSize)>;
using LayoutSF = decltype(SfConfig::deduce_layoutSFA());

// The SM120 block-scaled MMA takes TN only: A (M x K) row-major, B (N x K) read as K x N column-major;
// D row-major.
using LayoutATag = cutlass::layout::RowMajor;
using LayoutBTag = cutlass::layout::ColumnMajor;
using LayoutDTag = cutlass::layout::RowMajor;
using StrideA = cutlass::gemm::TagToStrideA_t<LayoutATag>;
using StrideB = cutlass::gemm::TagToStrideB_t<LayoutBTag>;
using StrideD = cutlass::gemm::TagToStrideC_t<LayoutDTag>;

struct Operands {
  int m, n, k;
  const DataType* a;
  StrideA stride_a;
  const DataType* b;
  StrideB stride_b;
  const ScaleType* sfa;
  LayoutSF layout_sfa;
  const ScaleType* sfb;
  LayoutSF layout_sfb;
  StrideD stride_d;
  void* d;
  const float* alpha;            // never null: the launcher substitutes a device 1.0f first
};

// Strides are in elements of the operand type: one e2m1 element is half a byte, so a row of `ld` bytes
// is 2 * ld elements apart. L (batch) is 1. M, N, K are narrowed to CUTLASS's int problem shape: api.cpp
// refuses any past INT_MAX before this runs.
inline Operands make_operands(const Problem& p, const float* alpha) {
  using namespace cute;
  Operands o{};
  o.m = static_cast<int>(p.m);
  o.n = static_cast<int>(p.n);
  o.k = static_cast<int>(p.k);
  o.a = reinterpret_cast<const DataType*>(p.a);
  o.b = reinterpret_cast<const DataType*>(p.b);
  o.sfa = reinterpret_cast<const ScaleType*>(p.sfa);
  o.sfb = reinterpret_cast<const ScaleType*>(p.sfb);
  o.stride_a = StrideA{2 * p.lda, Int<1>{}, 2 * p.lda * p.m};
  o.stride_b = StrideB{2 * p.ldb, Int<1>{}, 2 * p.ldb * p.n};
  // The caller's blocked buffers are exactly CUTLASS's SF atom tiled over (rows, K) row-block major.
  auto shape = make_shape(o.m, o.n, o.k, 1);
  o.layout_sfa = SfConfig::tile_atom_to_shape_SFA(shape);
  o.layout_sfb = SfConfig::tile_atom_to_shape_SFB(shape);
  o.stride_d = StrideD{p.ldc, Int<1>{}, p.ldc * p.m};
  o.d = p.c;
  o.alpha = alpha;
  return o;
}

}  // namespace nvfp4_gemm::sm120
