// Timeline traces of the sm90 kernels (diagnostics builds only: NVFP4_GEMM_DIAGNOSTICS=1 at build time,
// docs/SM90_NOTES.md). A traced launch writes %globaltimer stamps (ns) to a device buffer of kTraceHeader
// words, then kTraceSlots words per CTA; backend.cu appends them to NVFP4_GEMM_SM90_TRACE=<file>, and each
// kernel names its own slots. In any other build the kernels' trace pointer is a constant nullptr and every
// stamp compiles away.
#pragma once

#include <cstdint>

namespace nvfp4_gemm::sm90 {

#ifdef NVFP4_GEMM_DIAGNOSTICS
inline constexpr bool kDiagnostics = true;
#else
inline constexpr bool kDiagnostics = false;
#endif

inline constexpr int kTraceHeader = 16, kTraceSlots = 16;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __forceinline__ void trace_at(uint64_t* trace, int cta, int slot, uint64_t v) {
  if (trace) trace[kTraceHeader + cta * kTraceSlots + slot] = v;
}

}  // namespace nvfp4_gemm::sm90
