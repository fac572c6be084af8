// The torch-free contract of the grouped (mixture-of-experts) GEMM between the binding layer and the
// GPU backends, beside problem.h's dense one.
//
// Row t of group g:  C[t, :] = alpha[g] * A_dq[t, :] @ B_dq[g]^T
// with the rows of group g being [offs[g-1], offs[g]) (offs[-1] = 0). offs, alpha and the token counts
// live on the device and are read there only: a grouped GEMM captured in a CUDA graph stays valid when
// the routing changes between replays. T, N, K and G come from the shapes (host-known).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace nvfp4_gemm {

// Guaranteed by the binding layer before any backend sees it:
//   t >= 0, g >= 1, n % 8 == 0, k % 32 == 0; a, b, c 16-byte aligned; lda, ldb multiples of 16 bytes;
//   ldc * sizeof(out) a multiple of 16 bytes; b_group_bytes a multiple of 16.
//   sfb holds g * round_up(n,128) * round_up(k/16,4) bytes (each group's blocked N x K/16 scales, in order).
//   sfa (e2m1 A only) is the grouped blocked layout: group j's m_j rows are blocked on their own and start
//   at padded row P_j = sum_{i<j} round_up(m_i, 128), so logical scale (row t of group j, s) lives at
//   blocked_sf_offset(P_j + (t - start_j), s, k/16). Its capacity is sfa_rows padded rows (a multiple of
//   128, >= the sum for every routing of t rows over g groups: t + g*127 rounded, or what the caller gives).
//   offs is int32 [g], non-decreasing, offs[g-1] == t: the binding cannot check values without a host
//   sync, so backends clamp every offset read to [0, t] and treat a decrease as an empty group (garbage
//   routing then gives garbage rows, never an out-of-bounds access).
struct GroupedProblem {
  const uint8_t* a;      // kE2m1: [t, k/2] packed; else [t, k] of a_type; rows lda bytes apart
  const uint8_t* b;      // [g, n, k/2] packed; rows ldb bytes apart, groups b_group_bytes apart
  const uint8_t* sfa;    // grouped blocked e4m3 scales of A (kE2m1 only; nullptr otherwise)
  const uint8_t* sfb;    // [g] blocked e4m3 scales of B, round_up(n,128) * round_up(k/16,4) bytes each
  const int32_t* offs;   // [g] cumulative row ends on the device
  const float* alpha;    // [g] on the device, or nullptr for 1
  void* c;               // [t, n] of out_dtype, rows ldc elements apart
  int64_t t, n, k, g;
  int64_t lda, ldb;      // bytes
  int64_t b_group_bytes; // bytes between consecutive groups of b
  int64_t ldc;           // elements
  int64_t sfa_rows;      // padded rows the sfa buffer holds (kE2m1 only)
  OutDtype out_dtype;
  AType a_type = AType::kE2m1;
  // 1: the binding's promise that offs, b and sfb were final when the kernel ahead of this GEMM on the stream started
  // waiting for its own predecessor: that kernel (the grouped quantization of A, launched just before by the same
  // call) writes A, sfa and alpha only, and waits for the kernels before it before it lets this grid launch. A
  // backend may then read offs and start loading B before its grid dependency resolves. 0: any input may be the
  // kernel ahead's output.
  int32_t offs_ready = 0;
};

// What an arch module adds for the grouped GEMM. Same conventions as BackendApi: plain C function
// pointers, `why` / `err` filled on refusal. The binding layer picks a config through the same resolver as the
// dense GEMM's (bindings/resolve.h).
// v2: compiled_for and supports_sm, as BackendApi has them (the resolver's device check and messages).
// v3: GroupedProblem::offs_ready.
inline constexpr int32_t kGroupedAbiVersion = 3;

struct GroupedBackendApi {
  int32_t abi_version;               // kGroupedAbiVersion
  const char* name;                  // the owning backend's name ("sm90", "sm100", ...)
  const char* compiled_for;          // e.g. "sm_90a": the owning backend's dense table's
  int32_t num_configs;
  const char* const* config_names;   // procedural kernel names, one per grouped config
  // Whether these kernels can run on a device of this SM version (the owning backend's dense table's rule).
  bool (*supports_sm)(int32_t sm);
  int32_t (*select)(const GroupedProblem* p, const DeviceInfo* dev, char* why, size_t why_len);
  bool (*can_run)(const GroupedProblem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len);
  size_t (*workspace_bytes)(const GroupedProblem* p, int32_t config, const DeviceInfo* dev);
  bool (*run)(const GroupedProblem* p, int32_t config, const DeviceInfo* dev, void* workspace,
              size_t workspace_bytes, cudaStream_t stream, char* err, size_t err_len);
  const char* (*dispatch_rules)();
};

}  // namespace nvfp4_gemm
