// GroupedProblem -> the per-group arguments of CUTLASS's ptr-array grouped block-scaled GEMM (SM100 and SM120),
// host and device code alike.
//
// offs lives on the device, so the per-group problem shapes, pointers, strides, scale-factor layouts and alpha
// pointers CUTLASS's grouped arguments take are built there, by one small kernel (cutlass_grouped_builder.cuh)
// that runs describe_group() for every group. The host tests (tests/sm100_host/grouped_*.cu, tests/sm120_host/)
// run the same describe_group() on the host through describe_groups_host() and hand its result to CUTLASS's
// host reference and layout functions, so what they prove is what the kernels are given. Each arch's
// grouped_gemm.cuh static_asserts that these types equal its kernel's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/float8.h"
#include "cutlass/float_subbyte.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/layout/matrix.h"

#include "common/grouped.h"

namespace nvfp4_gemm::grouped {

using DataType = cutlass::float_e2m1_t;     // packed two per byte, element 2i in the low nibble
using ScaleType = cutlass::float_ue4m3_t;   // e4m3 bit pattern
using ElementOperand = cutlass::nv_float4_t<DataType>;
// SM100 and SM120 share the scale-factor description: 128x4 atoms of 512 bytes, row-block major.
using SfConfig = cutlass::detail::Sm1xxBlockScaledConfig<int(kSfVecSize)>;
using LayoutSF = decltype(SfConfig::deduce_layoutSFA());

// Both operands K-major, as in the dense kernels; the grouped kernels take pointer layout tags (one stride per
// group, L mode static 0).
using LayoutATag = cutlass::layout::RowMajor;
using LayoutBTag = cutlass::layout::ColumnMajor;
using StrideA = cute::remove_pointer_t<cutlass::gemm::TagToStrideA_t<LayoutATag*>>;
using StrideB = cute::remove_pointer_t<cutlass::gemm::TagToStrideB_t<LayoutBTag*>>;
// Swapped (SM100's small-group config): D = B_g @ A_g^T, an N x m_g matrix stored column-major, which is the
// group's rows of C row-major.
template <bool SwapAB>
using LayoutDTag = cute::conditional_t<SwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
template <bool SwapAB>
using StrideD = cute::remove_pointer_t<cutlass::gemm::TagToStrideC_t<LayoutDTag<SwapAB>*>>;

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using GroupShape = ProblemShape::UnderlyingProblemShape;  // the kernel's (M, N, K) of one group

// Rows [start, start + m) of group i: offsets clamped to [0, t], a decrease read as an empty group (the rule of
// every CUDA backend, common/grouped.h).
struct GroupRows {
  int64_t start, m;
};

CUTE_HOST_DEVICE GroupRows group_rows(const int32_t* offs, int64_t i, int64_t t) {
  const auto clamp = [t](int64_t v) { return v < 0 ? int64_t{0} : v > t ? t : v; };
  const int64_t lo = i == 0 ? 0 : clamp(offs[i - 1]);
  const int64_t hi = clamp(offs[i]);
  return GroupRows{lo, hi > lo ? hi - lo : 0};
}

// The group's padded rows in the grouped blocked sfa layout (its scales start at a 128-row boundary).
CUTE_HOST_DEVICE int64_t padded_rows(int64_t m) { return round_up(m, kSfAtomRows); }

CUTE_HOST_DEVICE int64_t out_bytes(OutDtype dt) { return dt == OutDtype::kFloat32 ? 4 : 2; }

// What the kernel gets for one group.
template <bool SwapAB>
struct GroupOperands {
  GroupShape shape;            // the kernel's (M, N, K): (rows, N, K), or (N, rows, K) swapped; rows may be 0
  const DataType* a;           // the kernel's A (our B_g when swapped)
  StrideA stride_a;
  const DataType* b;
  StrideB stride_b;
  const ScaleType* sfa;
  LayoutSF layout_sfa;
  const ScaleType* sfb;
  LayoutSF layout_sfb;
  StrideD<SwapAB> stride_d;
  void* d;
  const float* alpha;          // alpha + i, or the device 1.0f
  int64_t rows;                // rows of the group the kernel computes: all, less those whose scales lie past sfa
  int64_t nan_begin, nan_end;  // rows of C the builder fills with NaN instead (scales past sfa), else empty
};

// Group i with rows r whose scales start at padded row pad_row of sfa. Strides count e2m1 elements (two per
// byte); M, N, K fit CUTLASS's int problem shape (can_run refuses T, N, K past INT_MAX). Rows whose padded row
// lies at or past p.sfa_rows are not computed but filled with NaN, as the generic CUDA path gives them (a routing
// needing more padded rows than sfa holds); so no read leaves sfa whatever offs holds.
template <bool SwapAB>
CUTE_HOST_DEVICE GroupOperands<SwapAB> describe_group(const GroupedProblem& p, int64_t i, GroupRows r,
                                                       int64_t pad_row, const float* one) {
  using namespace cute;
  GroupOperands<SwapAB> o{};
  const int64_t sp = round_up(p.k / kSfVecSize, kSfAtomCols);
  const int64_t room = p.sfa_rows > pad_row ? p.sfa_rows - pad_row : 0;
  const int64_t rows = r.m < room ? r.m : room;
  const uint8_t* a = p.a + r.start * p.lda;
  const uint8_t* sfa = rows > 0 ? p.sfa + pad_row * sp : p.sfa;
  const uint8_t* b = p.b + i * p.b_group_bytes;
  const uint8_t* sfb = p.sfb + i * round_up(p.n, kSfAtomRows) * sp;
  const int m_kernel = static_cast<int>(SwapAB ? p.n : rows);
  const int n_kernel = static_cast<int>(SwapAB ? rows : p.n);
  const int k = static_cast<int>(p.k);
  o.shape = GroupShape{m_kernel, n_kernel, k};
  o.a = reinterpret_cast<const DataType*>(SwapAB ? b : a);
  o.b = reinterpret_cast<const DataType*>(SwapAB ? a : b);
  o.sfa = reinterpret_cast<const ScaleType*>(SwapAB ? sfb : sfa);
  o.sfb = reinterpret_cast<const ScaleType*>(SwapAB ? sfa : sfb);
  o.stride_a = StrideA{2 * (SwapAB ? p.ldb : p.lda), Int<1>{}, Int<0>{}};
  o.stride_b = StrideB{2 * (SwapAB ? p.lda : p.ldb), Int<1>{}, Int<0>{}};
  // The group's blocked scales are CUTLASS's SF atom tiled over (rows, K) row-block major, from its first
  // padded row on (tests/sm100_host/grouped_layout_test.cu proves it against common/problem.h's offsets).
  const auto shape = make_shape(m_kernel, n_kernel, k, 1);
  o.layout_sfa = SfConfig::tile_atom_to_shape_SFA(shape);
  o.layout_sfb = SfConfig::tile_atom_to_shape_SFB(shape);
  if constexpr (SwapAB) {
    o.stride_d = StrideD<true>{Int<1>{}, p.ldc, Int<0>{}};
  } else {
    o.stride_d = StrideD<false>{p.ldc, Int<1>{}, Int<0>{}};
  }
  o.d = static_cast<uint8_t*>(p.c) + r.start * p.ldc * out_bytes(p.out_dtype);
  o.alpha = p.alpha != nullptr ? p.alpha + i : one;
  o.rows = rows;
  o.nan_begin = r.start + rows;
  o.nan_end = r.start + r.m;
  return o;
}

// The argument arrays in the workspace, one entry per group, each 256-byte aligned.
template <bool SwapAB>
struct ArgArrays {
  GroupShape* shapes;
  const DataType** a;
  StrideA* stride_a;
  const DataType** b;
  StrideB* stride_b;
  const ScaleType** sfa;
  LayoutSF* layout_sfa;
  const ScaleType** sfb;
  LayoutSF* layout_sfb;
  void** d;
  StrideD<SwapAB>* stride_d;
  const float** alpha;

  static constexpr int64_t kAlign = 256;

  // Lays the arrays out from `base` (nullptr: only counts); returns the bytes they take.
  static int64_t carve(void* base, int64_t g, ArgArrays* out) {
    int64_t at = 0;
    const auto take = [&](auto*& ptr, int64_t elem_bytes) {
      using T = std::remove_reference_t<decltype(ptr)>;
      ptr = base ? reinterpret_cast<T>(static_cast<uint8_t*>(base) + at) : nullptr;
      at += round_up(g * elem_bytes, kAlign);
    };
    ArgArrays a{};
    take(a.shapes, sizeof(GroupShape));
    take(a.a, sizeof(void*));
    take(a.stride_a, sizeof(StrideA));
    take(a.b, sizeof(void*));
    take(a.stride_b, sizeof(StrideB));
    take(a.sfa, sizeof(void*));
    take(a.layout_sfa, sizeof(LayoutSF));
    take(a.sfb, sizeof(void*));
    take(a.layout_sfb, sizeof(LayoutSF));
    take(a.d, sizeof(void*));
    take(a.stride_d, sizeof(StrideD<SwapAB>));
    take(a.alpha, sizeof(void*));
    if (out) *out = a;
    return at;
  }

  CUTE_HOST_DEVICE void store(int64_t i, const GroupOperands<SwapAB>& o) const {
    shapes[i] = o.shape;
    a[i] = o.a;
    stride_a[i] = o.stride_a;
    b[i] = o.b;
    stride_b[i] = o.stride_b;
    sfa[i] = o.sfa;
    layout_sfa[i] = o.layout_sfa;
    sfb[i] = o.sfb;
    layout_sfb[i] = o.layout_sfb;
    d[i] = o.d;
    stride_d[i] = o.stride_d;
    alpha[i] = o.alpha;
  }
};

// The builder's work done serially on the host, for the host tests: every group's description from host offs
// (p.offs must point to host memory here). The device builder computes the same padded-row prefix sums in
// parallel (cub::BlockScan over chunks of groups) and calls describe_group() with them.
template <bool SwapAB>
std::vector<GroupOperands<SwapAB>> describe_groups_host(const GroupedProblem& p, const float* one) {
  std::vector<GroupOperands<SwapAB>> out;
  int64_t pad_row = 0;
  for (int64_t i = 0; i < p.g; ++i) {
    const GroupRows r = group_rows(p.offs, i, p.t);
    out.push_back(describe_group<SwapAB>(p, i, r, pad_row, one));
    pad_row += padded_rows(r.m);
  }
  return out;
}

// Padded rows of sfa that no routing of t rows into g groups exceeds (nvfp4_gemm.grouped_sfa_rows): with at
// least this many, a valid routing never needs the NaN fill.
constexpr int64_t worst_sfa_rows(int64_t t, int64_t g) {
  return (t + (g < t ? g : t) * (kSfAtomRows - 1)) / kSfAtomRows * kSfAtomRows;
}

}  // namespace nvfp4_gemm::grouped
