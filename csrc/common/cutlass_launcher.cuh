// The host side of a CUTLASS block-scaled GemmUniversal kernel of an arch module (SM100 and SM120, each arch's
// <arch>_gemm.cuh defines the kernel and its arguments): check / workspace / run for the KernelOps the generated
// TUs export, every CUTLASS refusal or failure turned into a message.
#pragma once

#include <cstddef>
#include <cstdio>

#include "cutlass/cutlass.h"

#include "common/problem.h"

namespace nvfp4_gemm {

// Initializes and runs a CUTLASS device-level GEMM (GemmUniversalAdapter) on `stream`; a failure becomes
// "CUTLASS <initialize | launch> failed: <status>; CUDA error: <error> (<context>)" in err. Shared by the dense
// launcher below and the grouped one (cutlass_grouped_launcher.cuh).
template <class Gemm>
bool initialize_and_run(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream,
                        const char* context, char* err, size_t err_len) {
  Gemm gemm;
  cutlass::Status s = gemm.initialize(args, workspace, stream);
  const bool initialized = s == cutlass::Status::kSuccess;
  if (initialized) s = gemm.run(stream);
  if (s == cutlass::Status::kSuccess) return true;
  // CUTLASS reads (and so clears) the CUDA error of a failed attribute set or launch itself; what is left here
  // is only an error it did not see. Read once, so nothing is left for the next call.
  const cudaError_t e = cudaGetLastError();
  std::snprintf(err, err_len, "CUTLASS %s failed: %s; CUDA error: %s (%s)", initialized ? "launch" : "initialize",
                cutlassGetStatusString(s), e != cudaSuccess ? cudaGetErrorString(e) : "none left (CUTLASS consumed it)",
                context);
  return false;
}

// why = "CUTLASS can_implement refused <shape>: <status>; this kernel needs ..." for a kernel whose output rows
// align to alignment_d elements. Shared by the dense launcher below and the grouped one, each with its own shape text.
inline void can_implement_refusal(char* why, size_t why_len, const char* shape, cutlass::Status s, int alignment_d) {
  std::snprintf(why, why_len,
                "CUTLASS can_implement refused %s: %s; this kernel needs K %% 32 == 0 (16-byte rows of e2m1) and "
                "N %% %d == 0 (16-byte rows of the output)",
                shape, cutlassGetStatusString(s), alignment_d);
}

// check / workspace / run for one kernel K (K::Gemm a CUTLASS GemmUniversalAdapter, K::make_arguments(p, alpha,
// sm_count) its arguments, K::AlignmentD the output alignment in elements); the generated TUs hand these to
// KernelOps.
template <class K>
struct CutlassLauncher {
  using Gemm = typename K::Gemm;

  static bool check(const Problem& p, const DeviceInfo& dev, char* why, size_t why_len) {
    auto args = K::make_arguments(p, p.alpha, dev.num_sms);
    cutlass::Status s = Gemm::can_implement(args);
    if (s != cutlass::Status::kSuccess) {
      char shape[128];
      std::snprintf(shape, sizeof(shape), "M=%lld N=%lld K=%lld (lda=%lld ldb=%lld bytes, ldc=%lld)", (long long)p.m,
                    (long long)p.n, (long long)p.k, (long long)p.lda, (long long)p.ldb, (long long)p.ldc);
      can_implement_refusal(why, why_len, shape, s, K::AlignmentD);
      return false;
    }
    return true;
  }

  static size_t workspace(const Problem& p, const DeviceInfo& dev) {
    return Gemm::get_workspace_size(K::make_arguments(p, p.alpha, dev.num_sms));
  }

  static bool run(const Problem& p, const DeviceInfo& dev, const float* alpha, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, char* err, size_t err_len) {
    auto args = K::make_arguments(p, alpha, dev.num_sms);
    cutlass::Status s = Gemm::can_implement(args);
    if (s != cutlass::Status::kSuccess) {
      check(p, dev, err, err_len);
      return false;
    }
    const size_t need = Gemm::get_workspace_size(args);
    if (workspace_bytes < need) {
      std::snprintf(err, err_len, "workspace of %zu bytes given, the kernel needs %zu", workspace_bytes, need);
      return false;
    }
    char context[64];
    std::snprintf(context, sizeof(context), "grid from %d SMs, workspace %zu bytes", dev.num_sms, need);
    return initialize_and_run<Gemm>(args, workspace, stream, context, err, err_len);
  }
};

}  // namespace nvfp4_gemm
