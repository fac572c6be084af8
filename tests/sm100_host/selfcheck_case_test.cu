// The grouped first-use self-check's own parts, on the host (common/grouped_selfcheck.h): writes its fixed case and
// exact reference for tests/test_sm100_grouped_host.py to compare with nvfp4_gemm.grouped_mm on CPU tensors, and
// checks that its comparison flags what it must (a changed output, a NaN, a row nothing wrote) in every output
// dtype and passes the reference itself rounded to each. Host only: the check's kernel launch needs the GPU.
//
//   selfcheck_case_test DIR   writes DIR/{meta.txt,a.bin,b.bin,sfa.bin,sfb.bin,offs.bin,alpha.bin,ref.bin}
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cutlass/bfloat16.h"
#include "cutlass/half.h"

#include "common/grouped_selfcheck.h"

using namespace nvfp4_gemm;
using namespace nvfp4_gemm::selfcheck;

static void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

template <class T>
static std::vector<uint8_t> rounded(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  for (size_t i = 0; i < v.size(); ++i) reinterpret_cast<T*>(out.data())[i] = T(v[i]);
  return out;
}

static int failures = 0;

static void expect_count(const char* what, const std::vector<float>& want, const std::vector<uint8_t>& got,
                         OutDtype dt, int64_t n, int64_t expected) {
  std::string detail;
  const int64_t bad = selfcheck_mismatches(want, got.data(), dt, n, detail);
  if (bad != expected) {
    ++failures;
    std::printf("FAIL %s (dtype %d): %lld mismatches, expected %lld (%s)\n", what, int(dt), (long long)bad,
                (long long)expected, detail.c_str());
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const Case c = selfcheck_case();
  const std::vector<float> want = selfcheck_reference(c);
  std::ofstream(dir + "/meta.txt") << c.t << " " << c.n << " " << c.k << " " << c.g << " " << c.sfa_rows << "\n";
  write_file(dir + "/a.bin", c.a.data(), c.a.size());
  write_file(dir + "/b.bin", c.b.data(), c.b.size());
  write_file(dir + "/sfa.bin", c.sfa.data(), c.sfa.size());
  write_file(dir + "/sfb.bin", c.sfb.data(), c.sfb.size());
  write_file(dir + "/offs.bin", c.offs.data(), c.offs.size() * 4);
  write_file(dir + "/alpha.bin", c.alpha.data(), c.alpha.size() * 4);
  write_file(dir + "/ref.bin", want.data(), want.size() * 4);

  for (OutDtype dt : {OutDtype::kFloat16, OutDtype::kBFloat16, OutDtype::kFloat32}) {
    std::vector<uint8_t> got = dt == OutDtype::kFloat16    ? rounded<cutlass::half_t>(want)
                               : dt == OutDtype::kBFloat16 ? rounded<cutlass::bfloat16_t>(want)
                                                           : rounded<float>(want);
    expect_count("the reference rounded to the output dtype", want, got, dt, c.n, 0);
    const int64_t esize = dt == OutDtype::kFloat32 ? 4 : 2;
    std::vector<uint8_t> off = got;  // one output scaled by 1.5
    const size_t i = 12345;
    std::vector<float> one_changed(1, want[i] * 1.5f + 1.0f);
    std::vector<uint8_t> bits = dt == OutDtype::kFloat16    ? rounded<cutlass::half_t>(one_changed)
                                : dt == OutDtype::kBFloat16 ? rounded<cutlass::bfloat16_t>(one_changed)
                                                            : rounded<float>(one_changed);
    std::memcpy(off.data() + i * esize, bits.data(), esize);
    expect_count("one output changed", want, off, dt, c.n, 1);
    std::vector<uint8_t> row = got;  // one row never written (the poison: all bits set, NaN)
    std::memset(row.data() + 200 * c.n * esize, 0xFF, c.n * esize);
    expect_count("a row left unwritten", want, row, dt, c.n, c.n);
  }
  // The values are far from every output range: no inf in fp16.
  double max_ref = 0;
  for (float w : want) max_ref = std::fmax(max_ref, std::fabs(w));
  if (!(max_ref > 1.0 && max_ref < 30000.0)) {
    ++failures;
    std::printf("FAIL the case's largest |output| is %g\n", max_ref);
  }
  if (failures) {
    std::printf("selfcheck_case_test: %d failures\n", failures);
    return 1;
  }
  std::printf("selfcheck_case_test: OK, T=%lld N=%lld K=%lld G=%lld case written (max |ref| %g); the comparison "
              "flags changed, NaN and unwritten outputs in fp16, bf16 and fp32\n", (long long)c.t, (long long)c.n,
              (long long)c.k, (long long)c.g, max_ref);
  return 0;
}
