// Entry point of the SM90 grouped (mixture-of-experts) GEMM for the module: the GroupedBackendApi table
// (common/grouped.h), and the grouped configs' X-macro, from which the names, the launch tables and the
// instantiation files (csrc/sm90/grouped_wk_t*.cu and grouped_wgmma_*.cu, one per config and A type) all come.
#pragma once

#include "common/grouped.h"

// The grouped K-sliced kernel (grouped_wk.cuh): X(TOKENS, STAGES, CTAS), 128 B rows x TOKENS rows of a group per
// work item, 256-K stages, CTAS per SM. STAGES and CTAS must equal gwk_stages(TOKENS) and gwk_ctas(TOKENS)
// (static_assert in grouped_backend.cu).
#define NVFP4_SM90_GROUPED_CONFIGS(X) \
  X(8, 4, 2)                          \
  X(16, 3, 2)

#define NVFP4_SM90_GROUPED_NAME(T, S, B) "sm90_nvfp4_grouped_wk_w128xt" #T "xk256_s" #S "_b" #B "_tma_mma16816"

// The grouped form of the wgmma kernel (sm90_gemm.cuh, GROUPED; grouped_wgmma.cu): X(TOKENS, KT, STAGES, W), W B rows x
// TOKENS rows of a group per tile, KT-wide stages, STAGES deep, one CTA per SM; W = 128 (two consumer warpgroups) or
// 256 (four: gemm_kernel's CONS = W / 64, four math warps a scheduler over the decode chain). The 128-row ones: the
// pipelines of the dense 64-, 128-, 256- and 32-token configs, an 80-token one that holds a group of ~64 rows in one
// tile and a 160-token one that holds a group of ~128 +- 11 rows in one; the 256-row ones of 80 and 128 tokens (the
// latter with one decoded-fragment set); fp16 / bf16 A, or NVFP4 A decoded by a grouped prepass. In the grouped table
// after the K-sliced ones, grouped configs 2..9 in this order; select (grouped_backend.cu) picks by average rows a
// group: 32 tokens from 20, 64 from 28, 80 from 56, 128 from 80, 160 from 120, 256 from 160, the 80- and 128-token
// tiles over 256 rows where N exceeds 128 (the 128-row ones only where it does not, or forced).
#define NVFP4_SM90_GROUPED_WGMMA_CONFIGS(X) \
  X(64, 256, 4, 128)                        \
  X(128, 128, 5, 128)                       \
  X(80, 256, 3, 128)                        \
  X(256, 128, 3, 128)                       \
  X(160, 128, 4, 128)                       \
  X(32, 256, 6, 128)                        \
  X(80, 128, 5, 256)                        \
  X(128, 128, 4, 256)

#define NVFP4_SM90_GROUPED_WGMMA_NAME(T, KT, S, W) "sm90_nvfp4_grouped_w" #W "xt" #T "xk" #KT "_s" #S "_b1_ws_rs"

namespace nvfp4_gemm::sm90 {
const GroupedBackendApi& grouped_api();

inline constexpr int kNumGroupedWgmma = 8;  // NVFP4_SM90_GROUPED_WGMMA_CONFIGS' entries

// A wgmma grouped config's own conditions (wgmma_config: its index in NVFP4_SM90_GROUPED_WGMMA_CONFIGS), beyond the
// grouped table's common ones (grouped_backend.cu check): true, or false with the reason in `why`.
bool grouped_wgmma_check(const GroupedProblem& p, int wgmma_config, char* why, size_t why_len);
// Their workspace: A in the kernel's K order, all T rows.
size_t grouped_wgmma_workspace(const GroupedProblem& p);
// A launch (the A prepass, then the kernel); p passed the checks.
bool grouped_wgmma_run(const GroupedProblem& p, int wgmma_config, const DeviceInfo& dev, void* workspace,
                       size_t ws_bytes, cudaStream_t stream, char* err, size_t err_len);

// Tests and benchmarks: forces the split count of every following grouped launch in this process where the
// kernel's buffers allow it (0: automatic, the default). Returns the previous value.
int set_forced_grouped_splits(int splits);
// Tests: split launches count on workspace counters zeroed ahead (true) instead of per-stream slots; the old value.
bool set_workspace_counters_forced(bool on);
}  // namespace nvfp4_gemm::sm90
