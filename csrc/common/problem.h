// The torch-free contract between the binding layer and every GPU backend.
//
// Kernel translation units include this header (and CUDA / CUTLASS), never torch. The binding layer
// (csrc/bindings/) validates tensors once, fills a Problem, picks a backend and config, allocates the
// workspace the backend asks for, and calls BackendApi::run on the current stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

// cudaStream_t exactly as the CUDA runtime declares it, so that CPU-only builds need no CUDA headers.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace nvfp4_gemm {

enum class OutDtype : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

// What A holds. kE2m1: packed NVFP4 with blocked scales sfa (W4A4). The others: the weight-only form
// (W4A16), A a plain [m, k] matrix of that type and sfa nullptr, C = alpha * A @ (B * sfb)^T.
enum class AType : int32_t { kE2m1 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat32 = 3 };

inline constexpr int64_t kSfVecSize = 16;       // e2m1 elements per e4m3 scale
inline constexpr int64_t kSfAtomRows = 128;     // blocked-layout atom: 128 rows ...
inline constexpr int64_t kSfAtomCols = 4;       // ... x 4 scale columns = 512 bytes
inline constexpr int64_t kSfAtomBytes = kSfAtomRows * kSfAtomCols;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// A backend's error or refusal text into the caller's buffer (either may be absent: buf nullptr or len 0).
inline void set_msg(char* buf, size_t len, const char* msg) {
  if (buf && len) std::snprintf(buf, len, "%s", msg);
}

// Byte offset of logical scale (r, s) in the blocked layout of a matrix with `sf_cols` = K/16 columns
// (docs/CONTRACT.md: 128x4 atoms, row-block major; inside an atom (r%32)*16 + ((r%128)/32)*4 + s%4).
constexpr int64_t blocked_sf_offset(int64_t r, int64_t s, int64_t sf_cols) {
  return ((r / kSfAtomRows) * ceil_div(sf_cols, kSfAtomCols) + s / kSfAtomCols) * kSfAtomBytes +
         (r % 32) * 16 + ((r % kSfAtomRows) / 32) * 4 + s % kSfAtomCols;
}

// C[m, n] = alpha * sum_k (e2m1(A[m,k]) * sfa[m,k/16]) * (e2m1(B[n,k]) * sfb[n,k/16]).
// All pointers are device pointers. Guaranteed by the binding layer before any backend sees it:
//   m >= 1, n % 8 == 0, k % 32 == 0; a, b, c 16-byte aligned; lda, ldb multiples of 16 bytes;
//   ldc * sizeof(out) a multiple of 16 bytes; sfa / sfb hold the full padded blocked layout
//   (round_up(m,128) x round_up(k/16,4) bytes, resp. n), contiguous.
struct Problem {
  const uint8_t* a;    // kE2m1: [m, k/2] packed e2m1, element 2i in the low nibble; else [m, k] of a_type;
                       // rows lda bytes apart
  const uint8_t* b;    // [n, k/2] likewise, rows ldb bytes apart
  const uint8_t* sfa;  // blocked e4m3 scales of A (kE2m1 only; nullptr otherwise)
  const uint8_t* sfb;  // blocked e4m3 scales of B
  const float* alpha;  // one float on the device, or nullptr for 1
  void* c;             // [m, n] of out_dtype, rows ldc elements apart
  int64_t m, n, k;
  int64_t lda, ldb;    // bytes
  int64_t ldc;         // elements
  OutDtype out_dtype;
  AType a_type = AType::kE2m1;
  // Quantize on the fly (a_type a float type and a_scale set): A holds float activations that the backend
  // quantizes to NVFP4 exactly as nvfp4_gemm::quantize does (csrc/quant/recipe.h) with the encode scale
  // *a_scale (1 / *a_scale, IEEE division, when a_scale_is_decode), then multiplies NVFP4 x NVFP4: the same
  // numbers as quantize followed by mm, without the packed copy of A. Backends that cannot refuse in can_run.
  const float* a_scale = nullptr;
  bool a_scale_is_decode = false;
  // A second factor of alpha, nullptr for none: the GEMM scales by fl(*alpha * *alpha2) (alpha must be set).
  const float* alpha2 = nullptr;
  // Dynamic quantization on the fly (a_type a float type, a_dynamic_ws2 set, a_scale nullptr): the backend
  // forms the per-tensor scales itself, exactly as nvfp4_gemm's input-scales kernel does (the finite amax of
  // A, then recipe.h's dynamic_input_scales(amax, *a_dynamic_ws2)), writes {encode, decode, alpha} to
  // a_dynamic_out (quant::InputScale order), quantizes A with that encode scale and scales the product by
  // that alpha (alpha = a_dynamic_out + 2, alpha2 nullptr): the numbers of the input-scales kernel, quantize
  // and mm. Only a backend whose can_run says so takes it (sm90's K-sliced configs).
  const float* a_dynamic_ws2 = nullptr;
  float* a_dynamic_out = nullptr;
  // Tests: the K split count of the split kernels (sm90), set by the binding layer's resolver from
  // nvfp4_gemm.testing.forced(splits=...); 0: the backend's own plan. workspace_bytes and run see the same value.
  int32_t forced_splits = 0;
};

inline bool dynamic_a(const Problem& p) { return p.a_dynamic_ws2 != nullptr && p.a_type != AType::kE2m1; }
inline bool quantizes_a(const Problem& p) {
  return (p.a_scale != nullptr || p.a_dynamic_ws2 != nullptr) && p.a_type != AType::kE2m1;
}

// What a backend needs to know of the device a problem runs on: filled once per device by the binding layer
// (its one per-device cache) and handed to every call, so that no backend queries the device per call.
struct DeviceInfo {
  int32_t sm;              // major * 10 + minor, e.g. 90, 100, 103
  int32_t num_sms;
  int64_t smem_optin;      // max dynamic shared memory per block after opt-in, bytes
  int32_t index = 0;       // the CUDA device index (the current device of the call)
};

// The table an arch module (nvfp4_gemm._C_sm90, _C_sm100, ...) hands to the binding layer. Plain C
// function pointers: the modules are separate shared objects, each built with only its own -gencode.
// v4: Problem::a_type (the weight-only form reaches the arch modules; each can_run refuses what it lacks).
// v5: Problem::a_dynamic_ws2 / a_dynamic_out (dynamic quantization on the fly).
// v6: run takes the DeviceInfo; Problem::forced_splits; DeviceInfo::index.
inline constexpr int32_t kBackendAbiVersion = 6;

struct BackendApi {
  int32_t abi_version;          // kBackendAbiVersion
  const char* name;             // "sm90", "sm100": a name of bindings/resolve.h's kArchBackends
  const char* compiled_for;     // e.g. "sm_90a" or "sm_100f"
  int32_t num_configs;
  const char* const* config_names;  // procedural kernel names, one per config
  // Whether this module's kernels can run on a device of this SM version.
  bool (*supports_sm)(int32_t sm);
  // The config the dispatch table picks for this problem, or -1 if none applies (then `why` says why).
  int32_t (*select)(const Problem* p, const DeviceInfo* dev, char* why, size_t why_len);
  // Whether `config` can run this problem (for forced configs). false: `why` says why.
  bool (*can_run)(const Problem* p, int32_t config, const DeviceInfo* dev, char* why, size_t why_len);
  // Device workspace the config needs for this problem (0 if none). Zeroing is the backend's job.
  size_t (*workspace_bytes)(const Problem* p, int32_t config, const DeviceInfo* dev);
  // Enqueue the GEMM on `stream` (on device dev->index, the current one). Returns true on a successful launch;
  // false: `err` says why.
  bool (*run)(const Problem* p, int32_t config, const DeviceInfo* dev, void* workspace, size_t workspace_bytes,
              cudaStream_t stream, char* err, size_t err_len);
  // Optional (nullptr: never). True where the generic path measured faster than this backend's pick:
  // automatic dispatch then moves on (to the next backend, then generic); a forced backend still runs.
  bool (*prefers_generic)(const Problem* p, const DeviceInfo* dev);
  // The dispatch table as text, one rule a line ("M 1..32: <config>"): what runs for which shape, listed
  // by nvfp4_gemm.configs() / info(). Static storage.
  const char* (*dispatch_rules)();
};

}  // namespace nvfp4_gemm
