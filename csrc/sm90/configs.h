// The types of the SM90 config table; the table itself (configs, rules, the rules' text) is rendered by
// csrc/sm90/generate.py into generated/table.inc, where every config and every selection rule has its reason.
// Dispatch (backend.cu select), the config-name listing (BackendApi::config_names), forcing a config by name and
// the instantiation files in generated/ all come from that one table.
//
// The grid of the wgmma configs (one CTA per tile, or a balanced split over whole waves) is chosen per problem at
// run time (choose_split in split_plan.h), not per config.
#pragma once

#include <cstdint>

namespace nvfp4_gemm::sm90 {

// The kernel family of a config (generate.py: Wgmma, SmallM, WarpK).
enum class Family : int { kWgmma = 0, kSmallM = 1, kWarpK = 2 };

struct KernelConfig {
  const char* name;
  Family family;
  int tokens;  // wgmma N (rows of A per CTA tile) / tokens per small-M or K-sliced CTA (8 per mma n-tile)
  int kt;      // K per pipeline stage (wgmma, K-sliced: 256); K blocks of 256 per CTA at most (small-M)
  int stages;  // TMA pipeline depth (wgmma, K-sliced); B blocks in flight per lane (small-M)
  int ctas_per_sm;
  int ring;    // small-M: stages of the shared-memory B ring, 0 for the register buffer
  int rows;    // B rows a CTA tile covers: 128, or 256 for the wgmma kernel of four consumer warpgroups (64 x CONS)
  double rate;     // select's cost model (least-cost rules): one SM's MMA rate, TFLOP/s; 0 where no such rule names it
  double wave_us;  // and a wave's fixed time, us
};

// What a rule dispatches: dense GEMMs today; grouped (MoE) GEMMs get rules of their own.
enum class Kind : int { kDense = 0, kGrouped = 1 };

// The A forms a rule may be limited to (bits, generate.py MODES; backend.cu mode_of).
enum Mode : unsigned {
  kModeW4a4 = 1u << 0,      // packed NVFP4 A
  kModeW4a16 = 1u << 1,     // fp16 / bf16 activations (the weight-only form)
  kModeW4a16F32 = 1u << 2,  // fp32 activations (the weight-only form)
  kModeStatic = 1u << 3,    // float A quantized on the fly with a given scale
  kModeDynamic = 1u << 4,   // float A quantized on the fly with scales the kernel forms
  kModeAll = (1u << 5) - 1,
};

// A rule's extra condition (backend.cu rule_holds; generate.py WHEN).
enum class When : int { kAlways = 0, kUnsplitSmallM8 = 1, kLeastCost = 2 };

inline constexpr int kGenericConfig = -1;  // automatic dispatch runs the generic path (select() skips the rule)
inline constexpr int kRefuseConfig = -2;   // select() gives no config

struct Rule {
  Kind kind;
  int64_t m_min, m_max;  // M in [m_min, m_max]; m_max -1: no bound
  unsigned modes;        // Mode bits
  When when;
  int config;            // a kConfigs index, kGenericConfig or kRefuseConfig
  bool prefer;           // tried before the rules below; its refusal is not the reason select() reports
};

#include "sm90/generated/table.inc"

inline constexpr int kNumConfigs = sizeof(kConfigs) / sizeof(kConfigs[0]);
inline constexpr int kNumRules = sizeof(kRules) / sizeof(kRules[0]);

constexpr bool rule_covers(const Rule& r, int64_t m) { return m >= r.m_min && (r.m_max < 0 || m <= r.m_max); }

// The kConfigs index of the config of `family` with `tokens` tokens over 128 rows of B, -1 if none.
constexpr int config_index(Family family, int tokens) {
  for (int i = 0; i < kNumConfigs; ++i)
    if (kConfigs[i].family == family && kConfigs[i].tokens == tokens && kConfigs[i].rows == 128) return i;
  return -1;
}

constexpr bool rules_are_valid() {
  for (const Rule& r : kRules)
    if (r.config >= kNumConfigs || r.config < kRefuseConfig || r.m_min < 1) return false;
  return true;
}
static_assert(rules_are_valid(), "every rule names a compiled config, the generic path or a refusal");

constexpr bool least_cost_rules_are_modeled() {
  for (const Rule& r : kRules)
    if (r.when == When::kLeastCost &&
        (r.config < 0 || kConfigs[r.config].family != Family::kWgmma || !(kConfigs[r.config].rate > 0.0)))
      return false;
  return true;
}
static_assert(least_cost_rules_are_modeled(), "a least-cost rule names a wgmma config with a measured rate");
static_assert(config_index(Family::kSmallM, 8) >= 0 && config_index(Family::kSmallM, 16) >= 0,
              "When::kUnsplitSmallM8 compares the 8-token small-M config with the 16-token one");

}  // namespace nvfp4_gemm::sm90
