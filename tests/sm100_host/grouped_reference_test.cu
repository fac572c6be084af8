// Grouped verification (d), the C++ half: CUTLASS's host reference GEMM for block-scaled operands
// (cutlass/util/reference/host/gett.hpp), run group by group over exactly the arguments the grouped builder would
// give the kernel (common/cutlass_grouped.h's describe_group, through describe_groups_host: problem shapes,
// pointers, strides, scale-factor layouts, alpha pointers, swapped or not), on inputs written by
// tests/test_sm100_grouped_host.py; rows the builder fills with NaN (scales past sfa) are filled here the same way.
// Writes C; the Python side compares it with nvfp4_gemm.grouped_mm on CPU tensors. Host only. Shared by the SM120
// host tests (tests/sm120_host/ compiles this file too).
//
//   grouped_reference_test DIR   reads DIR/{meta.txt,a.bin,b.bin,sfa.bin,sfb.bin,offs.bin,alpha.bin}
//                                writes DIR/c.bin (C as [t, ldc] of the out dtype)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cutlass/bfloat16.h"
#include "cutlass/half.h"
#include "cutlass/util/reference/host/gett.hpp"

#include "common/cutlass_grouped.h"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::grouped;

static std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

static void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

template <class Ptr, class Layout>
static auto operand_tensor(Ptr p, const Layout& layout) {
  return cute::make_tensor(cute::recast_ptr<DataType>(const_cast<DataType*>(p)), layout);
}

template <bool Swap, class ElementD>
static void run(const GroupedProblem& p, std::vector<uint8_t>& c) {
  using namespace cute;
  const float one = 1.0f;
  const auto groups = describe_groups_host<Swap>(p, &one);
  for (const GroupOperands<Swap>& o : groups) {
    const int M = get<0>(o.shape), N = get<1>(o.shape), K = get<2>(o.shape);
    // The builder's NaN fill: rows of C whose scales lie past sfa.
    for (int64_t r = o.nan_begin; r < o.nan_end; ++r)
      for (int64_t j = 0; j < p.n; ++j)
        reinterpret_cast<ElementD*>(c.data())[r * p.ldc + j] = ElementD(std::nanf(""));
    if (M == 0 || N == 0) continue;  // an empty problem: the kernel has no tile of it
    auto tA = operand_tensor(o.a, make_layout(make_shape(M, K, 1), o.stride_a));
    auto tB = operand_tensor(o.b, make_layout(make_shape(N, K, 1), o.stride_b));
    auto tSFA = make_tensor(o.sfa, o.layout_sfa);
    auto tSFB = make_tensor(o.sfb, o.layout_sfb);
    auto tD = make_tensor(static_cast<ElementD*>(o.d), make_layout(make_shape(M, N, 1), o.stride_d));
    // beta = 0 as in the kernels (no C operand); C aliases D, zeroed so that 0 * C stays 0.
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) tD(i, j, 0) = ElementD(0.0f);
    cutlass::reference::host::GettBlockScalingMainloopParams<float, decltype(tA), decltype(tSFA), decltype(tB),
                                                             decltype(tSFB)>
        mainloop{tA, tSFA, tB, tSFB};
    cutlass::reference::host::GettBlockScalingEpilogueParams<float, float, float, decltype(tD), decltype(tD)> epilogue{
        *o.alpha, 0.0f, tD, tD};
    cutlass::reference::host::Gemm3x(mainloop, epilogue);
  }
}

template <bool Swap>
static void run_dtype(const GroupedProblem& p, std::vector<uint8_t>& c) {
  switch (p.out_dtype) {
    case OutDtype::kFloat16: return run<Swap, cutlass::half_t>(p, c);
    case OutDtype::kBFloat16: return run<Swap, cutlass::bfloat16_t>(p, c);
    case OutDtype::kFloat32: return run<Swap, float>(p, c);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  long long t, n, k, g, lda, ldb, bgb, ldc, sfa_rows;
  int swap, dtype, has_alpha;
  std::ifstream meta(dir + "/meta.txt");
  if (!(meta >> t >> n >> k >> g >> lda >> ldb >> bgb >> ldc >> sfa_rows >> swap >> dtype >> has_alpha)) {
    std::fprintf(stderr, "bad %s/meta.txt\n", dir.c_str());
    return 2;
  }
  auto a = read_file(dir + "/a.bin"), b = read_file(dir + "/b.bin");
  auto sfa = read_file(dir + "/sfa.bin"), sfb = read_file(dir + "/sfb.bin");
  auto offs_bytes = read_file(dir + "/offs.bin"), alpha_bytes = read_file(dir + "/alpha.bin");
  const int64_t sp = round_up(k / kSfVecSize, kSfAtomCols);
  if (a.size() < size_t(t * lda) || b.size() < size_t((g - 1) * bgb + n * ldb) || sfa.size() != size_t(sfa_rows * sp) ||
      sfb.size() != size_t(g * round_up(n, kSfAtomRows) * sp) || offs_bytes.size() != size_t(4 * g) ||
      (has_alpha && alpha_bytes.size() != size_t(4 * g))) {
    std::fprintf(stderr, "input sizes do not match meta.txt\n");
    return 2;
  }
  std::vector<int32_t> offs(g);
  std::memcpy(offs.data(), offs_bytes.data(), 4 * g);
  std::vector<float> alpha(g, 1.0f);
  if (has_alpha) std::memcpy(alpha.data(), alpha_bytes.data(), 4 * g);
  const int64_t esize = dtype == 2 ? 4 : 2;
  std::vector<uint8_t> c(static_cast<size_t>(t * ldc * esize), 0xFF);  // NaN: rows nothing writes stay NaN
  GroupedProblem p{};
  p.a = a.data();
  p.b = b.data();
  p.sfa = sfa.data();
  p.sfb = sfb.data();
  p.offs = offs.data();
  p.alpha = has_alpha ? alpha.data() : nullptr;
  p.c = c.data();
  p.t = t, p.n = n, p.k = k, p.g = g;
  p.lda = lda, p.ldb = ldb, p.b_group_bytes = bgb, p.ldc = ldc, p.sfa_rows = sfa_rows;
  p.out_dtype = static_cast<OutDtype>(dtype);
  if (swap) run_dtype<true>(p, c);
  else run_dtype<false>(p, c);
  write_file(dir + "/c.bin", c.data(), c.size());
  return 0;
}
