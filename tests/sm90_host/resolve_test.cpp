// The binding layer's resolver (csrc/bindings/resolve.h) over two fake dense arch tables and a fake grouped one,
// without torch or a GPU: the same forced-config and forced-backend behaviour for every op (an error naming why,
// or, for an op's optional fused form, a decline), names checked before anything runs, the automatic order, and
// the grouped table under the same rules and wording (a forced dense config does not apply to it).
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

// Grouped "sm90": two configs; config 0 runs only T <= 100 ("too many tokens" otherwise); select picks 1 where
// T > 8 G, else 0, and nothing at G = 999; only on SM 90.
const char* const kGroupedNames90[] = {"g90_t8", "g90_t16"};
bool grouped_can_run90(const GroupedProblem* p, int32_t c, const DeviceInfo*, char* why, size_t len) {
  if (c == 0 && p->t > 100) {
    std::snprintf(why, len, "too many tokens");
    return false;
  }
  return true;
}
int32_t grouped_select90(const GroupedProblem* p, const DeviceInfo*, char* why, size_t len) {
  if (p->g == 999) {
    std::snprintf(why, len, "no grouped row for 999 groups");
    return -1;
  }
  return p->t > 8 * p->g ? 1 : 0;
}
const GroupedBackendApi kGrouped90 = {kGroupedAbiVersion, "sm90", "sm_90a", 2, kGroupedNames90,
                                      [](int32_t sm) { return sm == 90; }, &grouped_select90, &grouped_can_run90,
                                      nullptr, nullptr, nullptr};

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

struct GroupedResult {
  std::string err;
  Choice<GroupedBackendApi> c;
};

// As grouped_mm resolves (bindings/cuda/grouped_cuda.cpp): the forcing for the grouped table, with the dense
// tables as the other kind, then resolve() over the grouped tables.
GroupedResult run_grouped(int64_t t, int64_t g, const Forcing& f, int sm = 90, bool with_grouped = true) {
  const std::vector<const GroupedBackendApi*> apis =
      with_grouped ? std::vector<const GroupedBackendApi*>{&kGrouped90} : std::vector<const GroupedBackendApi*>{};
  const std::vector<const BackendApi*> dense{&kApi100, &kApi90};
  GroupedProblem p{};
  p.t = t;
  p.n = 128;
  p.k = 256;
  p.g = g;
  GroupedResult r;
  r.err = resolve(p, DeviceInfo{sm, 132, 232448}, apis, for_table(f, apis, dense), false,
                  [t, g] { return "T=" + std::to_string(t) + " G=" + std::to_string(g); }, &r.c);
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

  // The grouped table under the same rules and wording. Automatic: its pick on SM 90, the generic path elsewhere.
  GroupedResult g = run_grouped(64, 4, Forcing{});
  EXPECT(g.err.empty() && g.c.api == &kGrouped90 && g.c.config == 1, "grouped automatic: %s", g.err.c_str());
  g = run_grouped(64, 4, Forcing{}, 100);
  EXPECT(g.err.empty() && g.c.api == nullptr && !g.c.declined, "grouped automatic on SM 100: generic");
  g = run_grouped(64, 999, Forcing{});
  EXPECT(g.err.empty() && g.c.api == nullptr, "grouped automatic, nothing selected: generic");
  // A forced grouped config: runs where it can, else an error naming why.
  g = run_grouped(64, 4, config("g90_t8"));
  EXPECT(g.err.empty() && g.c.api == &kGrouped90 && g.c.config == 0, "forced grouped config: %s", g.err.c_str());
  g = run_grouped(200, 4, config("g90_t8"));
  EXPECT(has(g.err, "NVFP4_GEMM_CONFIG=g90_t8 cannot run T=200 G=4: too many tokens"), "%s", g.err.c_str());
  g = run_grouped(64, 4, config("g90_t8"), 100);
  EXPECT(has(g.err, "NVFP4_GEMM_CONFIG=g90_t8 belongs to backend sm90 (sm_90a), which cannot run on this SM 10.0 "
                    "device"), "%s", g.err.c_str());
  // A forced dense config does not apply to the grouped GEMM: it follows the forced backend / automatic dispatch.
  g = run_grouped(64, 4, config("cfg90_big"));
  EXPECT(g.err.empty() && g.c.api == &kGrouped90 && g.c.config == 1, "dense config, grouped auto: %s",
         g.err.c_str());
  Forcing dense_config_generic = config("cfg100");
  dense_config_generic.backend = "generic";
  g = run_grouped(64, 4, dense_config_generic);
  EXPECT(g.err.empty() && g.c.api == nullptr, "dense config, grouped forced generic: %s", g.err.c_str());
  Forcing dense_config_sm90 = config("cfg90_small");
  dense_config_sm90.backend = "sm90";
  g = run_grouped(200, 4, dense_config_sm90);
  EXPECT(g.err.empty() && g.c.api == &kGrouped90 && g.c.config == 1, "dense config, grouped forced sm90: %s",
         g.err.c_str());
  // ... but a name of no table is an error, as for mm; and mm keeps its stricter rule for a grouped config's name.
  g = run_grouped(64, 4, config("nope"));
  EXPECT(has(g.err, "NVFP4_GEMM_CONFIG=nope names no compiled grouped kernel config; "
                    "nvfp4_gemm.grouped.grouped_configs() lists them"), "%s", g.err.c_str());
  r = run(8, config("g90_t8"), false);
  EXPECT(has(r.err, "NVFP4_GEMM_CONFIG=g90_t8 names no compiled kernel config; nvfp4_gemm.configs() lists them"),
         "%s", r.err.c_str());
  // Forced backends: unknown, not compiled, not for this device, nothing selected.
  g = run_grouped(64, 4, backend("sm75"));
  EXPECT(has(g.err, "NVFP4_GEMM_BACKEND must be one of auto, generic, sm90, sm100, sm120 (cpu is chosen by putting "
                    "the tensors on the CPU), got 'sm75'"), "%s", g.err.c_str());
  g = run_grouped(64, 4, backend("sm100"), 100);
  EXPECT(has(g.err, "NVFP4_GEMM_BACKEND=sm100 but that backend was not compiled into this build; rebuild with "
                    "NVFP4_GEMM_CUDA_ARCHS=10.0f"), "%s", g.err.c_str());
  g = run_grouped(64, 4, backend("sm90"), 90, false);
  EXPECT(has(g.err, "NVFP4_GEMM_BACKEND=sm90 but that backend was not compiled into this build; rebuild with "
                    "NVFP4_GEMM_CUDA_ARCHS=9.0a"), "%s", g.err.c_str());
  g = run_grouped(64, 4, backend("sm90"), 100);
  EXPECT(has(g.err, "NVFP4_GEMM_BACKEND=sm90 (sm_90a) cannot run on this SM 10.0 device"), "%s", g.err.c_str());
  g = run_grouped(64, 999, backend("sm90"));
  EXPECT(has(g.err, "NVFP4_GEMM_BACKEND=sm90 has no grouped kernel for T=64 G=999: no grouped row for 999 groups"),
         "%s", g.err.c_str());
  g = run_grouped(64, 4, backend("sm90"));
  EXPECT(g.err.empty() && g.c.api == &kGrouped90 && g.c.config == 1, "grouped forced sm90: %s", g.err.c_str());
  g = run_grouped(64, 4, backend("generic"));
  EXPECT(g.err.empty() && g.c.api == nullptr && !g.c.declined, "grouped forced generic");

  if (failures) return 1;
  std::printf("resolve_test: ok\n");
  return 0;
}
