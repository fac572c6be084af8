// CUTLASS's host reference GEMM for block-scaled operands (cutlass/util/reference/host/gett.hpp), fed
// through the SM120 launcher's make_operands (operands.h: the strides, SF layouts, operand roles and alpha
// the kernels get), on inputs written by tests/test_sm120_host.py. Writes D and CUTLASS's element-wise view
// of both operands; the Python side compares them with nvfp4_gemm.reference_mm / dequantize. Host only.
//
//   reference_test DIR   reads DIR/{meta.txt,a.bin,b.bin,sfa.bin,sfb.bin,alpha.bin}
//                        writes DIR/d.bin (C as [m, ldc] of out dtype), DIR/deq_a.bin, DIR/deq_b.bin
//                        ([rows, K] float32: e2m1 element times its scale, as CUTLASS's tensors read them)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cutlass/bfloat16.h"
#include "cutlass/half.h"
#include "cutlass/util/reference/host/gett.hpp"

#include "sm120/operands.h"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::sm120;

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

// CUTLASS's reading of one operand: element (r, k) times scale (r, k), as float.
template <class TA, class TS>
static std::vector<float> dequantized(const TA& t, const TS& sf, int rows, int k) {
  std::vector<float> out(size_t(rows) * k);
  for (int r = 0; r < rows; ++r)
    for (int kk = 0; kk < k; ++kk) out[size_t(r) * k + kk] = float(DataType(t(r, kk, 0))) * float(sf(r, kk, 0));
  return out;
}

template <class ElementD>
static void run(const std::string& dir, const Problem& p, float alpha) {
  using namespace cute;
  const Operands o = make_operands(p, &alpha);
  // float_e2m1_t is sub-byte: cute's subbyte iterator gives element (row, k) of the packed bytes.
  auto tA = make_tensor(recast_ptr<DataType>(const_cast<DataType*>(o.a)), make_layout(make_shape(o.m, o.k, 1), o.stride_a));
  auto tB = make_tensor(recast_ptr<DataType>(const_cast<DataType*>(o.b)), make_layout(make_shape(o.n, o.k, 1), o.stride_b));
  auto tSFA = make_tensor(o.sfa, o.layout_sfa);
  auto tSFB = make_tensor(o.sfb, o.layout_sfb);
  std::vector<ElementD> d(size_t(p.m) * p.ldc, ElementD(0.0f));
  auto tD = make_tensor(d.data(), make_layout(make_shape(o.m, o.n, 1), o.stride_d));

  cutlass::reference::host::GettBlockScalingMainloopParams<float, decltype(tA), decltype(tSFA), decltype(tB),
                                                           decltype(tSFB)>
      mainloop{tA, tSFA, tB, tSFB};
  // beta = 0 as in the kernels (no C operand); C aliases the zeroed D so 0 * C stays 0.
  cutlass::reference::host::GettBlockScalingEpilogueParams<float, float, float, decltype(tD), decltype(tD)> epilogue{
      *o.alpha, 0.0f, tD, tD};
  cutlass::reference::host::Gemm3x(mainloop, epilogue);
  write_file(dir + "/d.bin", d.data(), d.size() * sizeof(ElementD));

  auto deq_a = dequantized(tA, tSFA, o.m, o.k);
  auto deq_b = dequantized(tB, tSFB, o.n, o.k);
  write_file(dir + "/deq_a.bin", deq_a.data(), deq_a.size() * sizeof(float));
  write_file(dir + "/deq_b.bin", deq_b.data(), deq_b.size() * sizeof(float));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  long long m, n, k, lda, ldb, ldc;
  int dtype;
  std::ifstream meta(dir + "/meta.txt");
  if (!(meta >> m >> n >> k >> lda >> ldb >> ldc >> dtype) || dtype < 0 || dtype > 2) {
    std::fprintf(stderr, "bad %s/meta.txt\n", dir.c_str());
    return 2;
  }
  auto a = read_file(dir + "/a.bin"), b = read_file(dir + "/b.bin");
  auto sfa = read_file(dir + "/sfa.bin"), sfb = read_file(dir + "/sfb.bin");
  auto alpha_bytes = read_file(dir + "/alpha.bin");
  float alpha;
  if (alpha_bytes.size() != sizeof(float) || a.size() < size_t(m * lda) || b.size() < size_t(n * ldb) ||
      sfa.size() != size_t(round_up(m, 128) * round_up(k / 16, 4)) ||
      sfb.size() != size_t(round_up(n, 128) * round_up(k / 16, 4))) {
    std::fprintf(stderr, "input sizes do not match meta.txt\n");
    return 2;
  }
  std::memcpy(&alpha, alpha_bytes.data(), sizeof(float));
  Problem p{a.data(), b.data(), sfa.data(), sfb.data(), nullptr, nullptr, m, n, k, lda, ldb, ldc,
            static_cast<OutDtype>(dtype)};
  switch (p.out_dtype) {
    case OutDtype::kFloat16: run<cutlass::half_t>(dir, p, alpha); break;
    case OutDtype::kBFloat16: run<cutlass::bfloat16_t>(dir, p, alpha); break;
    case OutDtype::kFloat32: run<float>(dir, p, alpha); break;
  }
  return 0;
}
