// The binding layer's resolver (csrc/bindings/resolve.h) over two fake arch tables, without torch or a GPU: the
// same forced-config and forced-backend behaviour for every op (an error naming why, or, for an op's optional
// fused form, a decline), names checked before anything runs, and the automatic order.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/resolve.h"

using namespace nvfp4_gemm;

namespace {

int failures = 0;
#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      ++failures;                                           \
      std::printf("FAIL line %d: ", __LINE__);              \
      std::printf(__VA_ARGS__);                             \
      std::printf("\n");                                    \
    }                                                       \
  } while (0)

// "sm90": two configs; config 1 runs only M <= 16 ("too many rows" otherwise); select picks 1 at M <= 16, else 0,
// and nothing at M = 999; prefers the generic path at M >= 2048.
const char* const kNames90[] = {"cfg90_big", "cfg90_small"};
bool can_run90(const Problem* p, int32_t c, const DeviceInfo*, char* why, size_t len) {
  if (c == 1 && p->m > 16) {
    if (why) std::snprintf(why, len, "too many rows");
    return false;
  }
  return true;
}
int32_t select90(const Problem* p, const DeviceInfo*, char* why, size_t len) {
  if (p->m == 999) {
    std::snprintf(why, len, "no row for 999");
    return -1;
  }
  return p->m <= 16 ? 1 : 0;
}
bool prefers90(const Problem* p, const DeviceInfo*) { return p->m >= 2048; }
const BackendApi kApi90 = {kBackendAbiVersion, "sm90", "sm_90a", 2, kNames90, [](int32_t sm) { return sm == 90; },
                           &select90, &can_run90, nullptr, nullptr, &prefers90, nullptr};

// "sm100": one config, runs anything; only on SM 100.
const char* const kNames100[] = {"cfg100"};
const BackendApi kApi100 = {
    kBackendAbiVersion, "sm100", "sm_100f", 1, kNames100, [](int32_t sm) { return sm == 100; },
    [](const Problem*, const DeviceInfo*, char*, size_t) -> int32_t { return 0; },
    [](const Problem*, int32_t, const DeviceInfo*, char*, size_t) { return true; }, nullptr, nullptr, nullptr,
    nullptr};

Problem problem(int64_t m) {
  Problem p{};
  p.m = m;
  p.n = 128;
  p.k = 256;
  return p;
}

struct Result {
  std::string err;
  Choice<BackendApi> c;
};

Result run(int64_t m, const Forcing& f, bool optional, int sm = 90, bool with100 = true) {
  const std::vector<const BackendApi*> apis =
      with100 ? std::vector<const BackendApi*>{&kApi100, &kApi90} : std::vector<const BackendApi*>{&kApi90};
  Result r;
  r.err = resolve(problem(m), DeviceInfo{sm, 132, 232448}, apis, f, optional, [m] { return "M=" + std::to_string(m); },
                  &r.c);
  return r;
}

Forcing config(const char* name) {
  Forcing f;
  f.config = name;
  return f;
}

Forcing backend(const char* name) {
  Forcing f;
  f.backend = name;
  return f;
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

int main() {
  // Automatic: the first backend for the device that selects; the generic path where it prefers it.
  Result r = run(8, Forcing{}, false);
  EXPECT(r.err.empty() && r.c.api == &kApi90 && r.c.config == 1, "automatic M=8: %s", r.err.c_str());
  r = run(4096, Forcing{}, false);
  EXPECT(r.err.empty() && r.c.api == nullptr && !r.c.declined, "automatic M=4096 goes generic");
  r = run(4096, Forcing{}, true);
  EXPECT(r.err.empty() && r.c.api == nullptr && r.c.declined, "optional automatic M=4096 declines");
  r = run(999, Forcing{}, false);
  EXPECT(r.err.empty() && r.c.api == nullptr, "automatic, nothing selected: generic");
  r = run(8, Forcing{}, false, 100);
  EXPECT(r.err.empty() && r.c.api == &kApi100, "automatic on SM 100: sm100");

  // A forced config that cannot run: an error naming why, for every op; an optional form declines.
  r = run(100, config("cfg90_small"), false);
  EXPECT(has(r.err, "NVFP4_GEMM_CONFIG=cfg90_small cannot run M=100: too many rows"), "%s", r.err.c_str());
  r = run(100, config("cfg90_small"), true);
  EXPECT(r.err.empty() && r.c.api == nullptr && r.c.declined, "optional forced config declines: %s", r.err.c_str());
  r = run(8, config("cfg90_small"), true);
  EXPECT(r.err.empty() && r.c.api == &kApi90 && r.c.config == 1, "forced config runs: %s", r.err.c_str());
  r = run(4096, config("cfg90_big"), false);
  EXPECT(r.err.empty() && r.c.api == &kApi90 && r.c.config == 0, "a forced config overrides prefers_generic");
  // Names that are wrong anywhere are errors in both forms.
  for (const bool optional : {false, true}) {
    r = run(8, config("nope"), optional);
    EXPECT(has(r.err, "NVFP4_GEMM_CONFIG=nope names no compiled kernel config"), "%s", r.err.c_str());
    r = run(8, config("cfg100"), optional);
    EXPECT(has(r.err, "NVFP4_GEMM_CONFIG=cfg100 belongs to backend sm100 (sm_100f), which cannot run on this SM 9.0"),
           "%s", r.err.c_str());
    r = run(8, backend("sm75"), optional);
    EXPECT(has(r.err, "NVFP4_GEMM_BACKEND must be one of auto, generic, sm90, sm100, sm120 (cpu is chosen by putting the "
                      "tensors on the CPU), got 'sm75'"), "%s", r.err.c_str());
    r = run(8, backend("sm100"), optional);
    EXPECT(has(r.err, "NVFP4_GEMM_BACKEND=sm100 (sm_100f) cannot run on this SM 9.0 device"), "%s", r.err.c_str());
    r = run(8, backend("sm100"), optional, 100, false);
    EXPECT(has(r.err, "NVFP4_GEMM_BACKEND=sm100 but that backend was not compiled into this build; rebuild with "
                      "NVFP4_GEMM_CUDA_ARCHS=10.0f"), "%s", r.err.c_str());
  }
  // A forced backend: its table's pick, even where automatic dispatch would go generic; nothing selected is an
  // error, or a decline for an optional form.
  r = run(4096, backend("sm90"), false);
  EXPECT(r.err.empty() && r.c.api == &kApi90 && r.c.config == 0, "forced sm90 at M=4096: %s", r.err.c_str());
  r = run(999, backend("sm90"), false);
  EXPECT(has(r.err, "NVFP4_GEMM_BACKEND=sm90 has no kernel for M=999: no row for 999"), "%s", r.err.c_str());
  r = run(999, backend("sm90"), true);
  EXPECT(r.err.empty() && r.c.declined, "optional forced backend declines");
  r = run(8, backend("generic"), false);
  EXPECT(r.err.empty() && r.c.api == nullptr && !r.c.declined, "forced generic");
  r = run(8, backend("generic"), true);
  EXPECT(r.err.empty() && r.c.api == nullptr && r.c.declined, "forced generic declines a fused form");
  r = run(8, backend("auto"), false);
  EXPECT(r.err.empty() && r.c.api == &kApi90, "auto is automatic");
  // Where the names came from shows in the message.
  Forcing f = config("nope");
  f.config_from = "forced config";
  r = run(8, f, false);
  EXPECT(has(r.err, "forced config=nope names no compiled kernel config"), "%s", r.err.c_str());

  if (failures) return 1;
  std::printf("resolve_test: ok\n");
  return 0;
}
