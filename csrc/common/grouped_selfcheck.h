// The first-use self-check of a grouped kernel that this project has compiled and verified on the host but never
// run (sm100 and sm120, common/cutlass_grouped_backend.h): once per (device, config, output dtype) and process, the
// kernel multiplies a fixed small grouped problem (an empty group, a one-row group, per-group alpha) and the result
// is compared with an exact host computation of docs/CONTRACT.md's definition (the CPU backend's numbers). A
// mismatch fails that call with the details and takes the config out of selection for the rest of the process, so
// the binding's generic grouped path serves the following calls; a kernel that cannot even launch fails the same
// way. NVFP4_GEMM_SELFCHECK=0 turns it off (as for the dense kernels, bindings/cuda/mm_cuda.cpp).
//
// Torch-free and CUTLASS-free: the arch modules' grouped_api.cpp include it; the host tests compile the case
// and its reference (selfcheck_case / selfcheck_reference) without a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/e2m1.h"
#include "common/grouped.h"

namespace nvfp4_gemm::selfcheck {

// The fixed problem: G = 5 groups of {100, 0, 1, 36, 120} rows (T = 257), N = 256, K = 512, per-group alpha of
// both signs. sfa holds exactly the routing's padded rows (4 x 128). Values: uniform bytes (all 16 e2m1 codes),
// e4m3 scales with biased exponents 1..8 (2^-6 .. 2^1 x 1.875), so no output nears the fp16 range.
struct Case {
  int64_t t = 257, n = 256, k = 512, g = 5, sfa_rows = 512;
  std::vector<int32_t> offs;
  std::vector<float> alpha;
  std::vector<uint8_t> a, b, sfa, sfb;
};

inline Case selfcheck_case() {
  Case c;
  const int64_t counts[] = {100, 0, 1, 36, 120};
  int32_t end = 0;
  for (int64_t m : counts) c.offs.push_back(end += static_cast<int32_t>(m));
  c.alpha = {0.5f, 2.0f, -1.0f, 1.25f, 0.75f};
  uint64_t s = 0x5EEDull;
  const auto next = [&s]() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint8_t>(s >> 56);
  };
  const int64_t sp = round_up(c.k / kSfVecSize, kSfAtomCols);
  c.a.resize(c.t * c.k / 2);
  c.b.resize(c.g * c.n * c.k / 2);
  c.sfa.resize(c.sfa_rows * sp);
  c.sfb.resize(c.g * round_up(c.n, kSfAtomRows) * sp);
  for (auto& v : c.a) v = next();
  for (auto& v : c.b) v = next();
  for (auto* sf : {&c.sfa, &c.sfb})
    for (auto& v : *sf) v = static_cast<uint8_t>(8 + next() % 64);
  return c;
}

// C = alpha[g] * A_g @ B_g^T per group, exact products summed in double, as float [T, N].
inline std::vector<float> selfcheck_reference(const Case& c) {
  const int64_t sf_cols = c.k / kSfVecSize, sp = round_up(sf_cols, kSfAtomCols);
  const auto value = [&](const uint8_t* rows, const uint8_t* sf, int64_t r, int64_t sf_row, int64_t kk) {
    const uint8_t byte = rows[r * (c.k / 2) + kk / 2];
    return static_cast<double>(e2m1_to_float(kk % 2 ? byte >> 4 : byte & 0xF)) *
           e4m3_to_float(sf[blocked_sf_offset(sf_row, kk / kSfVecSize, sf_cols)]);
  };
  std::vector<float> out(c.t * c.n, 0.0f);
  int64_t start = 0, pad = 0;
  std::vector<double> arow(c.k);
  for (int64_t g = 0; g < c.g; ++g) {
    const int64_t end = c.offs[g];
    const uint8_t* bg = c.b.data() + g * c.n * (c.k / 2);
    const uint8_t* sfb = c.sfb.data() + g * round_up(c.n, kSfAtomRows) * sp;
    for (int64_t r = start; r < end; ++r) {
      for (int64_t kk = 0; kk < c.k; ++kk) arow[kk] = value(c.a.data(), c.sfa.data(), r, pad + r - start, kk);
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) acc += arow[kk] * value(bg, sfb, j, j, kk);
        out[r * c.n + j] = static_cast<float>(acc * c.alpha[g]);
      }
    }
    pad += round_up(end - start, kSfAtomRows);
    start = end;
  }
  return out;
}

// fp16 / bf16 / fp32 bits -> float.
inline float out_value(const uint8_t* p, OutDtype dt) {
  if (dt == OutDtype::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  uint32_t bits;
  if (dt == OutDtype::kBFloat16) {
    bits = static_cast<uint32_t>(h) << 16;
  } else {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F) {
      bits = sign | 0x7F800000u | (man << 13);
    } else if (exp == 0) {
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    } else {
      bits = sign | ((exp + 112) << 23) | (man << 13);
    }
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Outputs that differ from the reference beyond the output's rounding (4 units relative plus 2^-10 of the
// largest |reference|: both sides sum exact products in at least fp32, only the order and the final rounding
// differ), or are NaN. Returns their count; `detail` describes the first.
inline int64_t selfcheck_mismatches(const std::vector<float>& want, const uint8_t* got, OutDtype dt, int64_t n,
                                    std::string& detail) {
  const double u = dt == OutDtype::kFloat32 ? 0x1p-24 : dt == OutDtype::kBFloat16 ? 0x1p-8 : 0x1p-11;
  double max_ref = 0;
  for (float w : want) max_ref = std::fmax(max_ref, std::fabs(w));
  const int64_t esize = dt == OutDtype::kFloat32 ? 4 : 2;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], v = out_value(got + i * esize, dt);
    if (std::isnan(v) || std::fabs(v - w) > 4 * u * std::fabs(w) + max_ref * 0x1p-10) {
      if (bad++ == 0) {
        char buf[256];
        std::snprintf(buf, sizeof(buf), "first at row %lld col %lld: %g, expected %g (max |ref| %g)",
                      static_cast<long long>(i / n), static_cast<long long>(i % n), v, w, max_ref);
        detail = buf;
      }
    }
  }
  return bad;
}

// Whether the check applies: on unless NVFP4_GEMM_SELFCHECK=0.
inline bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("NVFP4_GEMM_SELFCHECK");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

enum class Verdict { kUnknown, kPass, kFail };

// Verdicts per (device, config, output dtype) of one grouped table, with what a failure found.
class Verdicts {
 public:
  Verdict get(int device, int32_t config, OutDtype dt, std::string* detail = nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = map_.find(std::make_tuple(device, config, static_cast<int>(dt)));
    if (it == map_.end()) return Verdict::kUnknown;
    if (detail) *detail = it->second.second;
    return it->second.first;
  }
  void set(int device, int32_t config, OutDtype dt, Verdict v, const std::string& detail) {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[std::make_tuple(device, config, static_cast<int>(dt))] = {v, detail};
  }
  std::mutex& check_mutex() { return check_mutex_; }

 private:
  std::mutex mutex_, check_mutex_;
  std::map<std::tuple<int, int32_t, int>, std::pair<Verdict, std::string>> map_;
};

// Runs the case through `run` (the config's own launch path, with the workspace it asks for) on `stream`, which
// must not be capturing, and compares. Returns kPass / kFail with `detail`; kUnknown (with `detail`) where the
// check itself could not run (device memory), which fails the call but records nothing.
template <typename WorkspaceFn, typename RunFn>
Verdict run_selfcheck(OutDtype dt, const DeviceInfo& dev, cudaStream_t stream, WorkspaceFn workspace_of, RunFn run,
                      std::string& detail) {
  static const Case c = selfcheck_case();
  static const std::vector<float> want = selfcheck_reference(c);
  const int64_t esize = dt == OutDtype::kFloat32 ? 4 : 2;
  const size_t sizes[] = {c.a.size(), c.b.size(), c.sfa.size(), c.sfb.size(), c.offs.size() * 4, c.alpha.size() * 4,
                          static_cast<size_t>(c.t * c.n * esize)};
  size_t offsets[7], total = 0;
  for (int i = 0; i < 7; ++i) {
    offsets[i] = total;
    total += (sizes[i] + 255) / 256 * 256;
  }
  GroupedProblem p{};
  p.t = c.t, p.n = c.n, p.k = c.k, p.g = c.g;
  p.lda = c.k / 2, p.ldb = c.k / 2, p.b_group_bytes = c.n * c.k / 2, p.ldc = c.n, p.sfa_rows = c.sfa_rows;
  p.out_dtype = dt;
  p.a_type = AType::kE2m1;
  uint8_t* buf = nullptr;
  void* ws = nullptr;
  const auto fail = [&](const char* what, cudaError_t e) {
    detail = std::string(what) + ": " + cudaGetErrorString(e);
    cudaGetLastError();
    return Verdict::kUnknown;
  };
  if (const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&buf), total); e != cudaSuccess)
    return fail("the self-check could not allocate its operands", e);
  p.a = buf + offsets[0];
  p.b = buf + offsets[1];
  p.sfa = buf + offsets[2];
  p.sfb = buf + offsets[3];
  p.offs = reinterpret_cast<const int32_t*>(buf + offsets[4]);
  p.alpha = reinterpret_cast<const float*>(buf + offsets[5]);
  p.c = buf + offsets[6];
  const size_t ws_bytes = workspace_of(p);
  Verdict v = Verdict::kUnknown;
  std::vector<uint8_t> got(sizes[6]);
  const void* host[] = {c.a.data(), c.b.data(), c.sfa.data(), c.sfb.data(), c.offs.data(), c.alpha.data()};
  char err[512] = {0};
  cudaError_t e = ws_bytes ? cudaMalloc(&ws, ws_bytes) : cudaSuccess;
  if (e != cudaSuccess) {
    v = fail("the self-check could not allocate its workspace", e);
  } else {
    for (int i = 0; i < 6 && e == cudaSuccess; ++i)
      e = cudaMemcpyAsync(buf + offsets[i], host[i], sizes[i], cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(buf + offsets[6], 0xFF, sizes[6], stream);  // NaN in every dtype
    if (e != cudaSuccess) {
      v = fail("the self-check could not upload its operands", e);
    } else if (!run(p, ws, ws_bytes, err, sizeof(err))) {
      detail = std::string("the kernel refused or failed to launch: ") + err;
      v = Verdict::kFail;
    } else if ((e = cudaMemcpyAsync(got.data(), p.c, sizes[6], cudaMemcpyDeviceToHost, stream)) != cudaSuccess ||
               (e = cudaStreamSynchronize(stream)) != cudaSuccess) {
      detail = std::string("the kernel faulted: ") + cudaGetErrorString(e);
      cudaGetLastError();
      v = Verdict::kFail;
    } else {
      std::string first;
      const int64_t bad = selfcheck_mismatches(want, got.data(), dt, c.n, first);
      if (bad == 0) {
        v = Verdict::kPass;
      } else {
        detail = std::to_string(bad) + " of " + std::to_string(c.t * c.n) + " outputs of the T=257 N=256 K=512 G=5 " +
                 "check differ from the exact reference, " + first;
        v = Verdict::kFail;
      }
    }
  }
  if (ws) cudaFree(ws);
  cudaFree(buf);
  return v;
}

}  // namespace nvfp4_gemm::selfcheck
