// Split-K arrival counters that the small-M kernels keep zero themselves (the last CTA of a row block to
// arrive writes its counter back to zero), so that a split GEMM needs no counter-reset launch ahead of it:
// the GEMM is then the programmatic dependent of the kernel ahead of it and its prologue and first weight
// loads overlap that kernel's tail. Torch-free.
//
// Slot s (common/stream_slots.h: one per device, stream and capture sequence) holds kSplitCounterRows
// counters. The array is static: each kernel translation unit (csrc/sm90/generated/) has its own copy, zero
// when the module loads, used only by its own kernel; the slot index is the same for all of them. Problems
// with more row blocks, or launches when the slots have run out, use zeroed counters in the workspace
// (backend.cu: one reset launch ahead, as before).
#pragma once

#include <cstdint>

namespace nvfp4_gemm::sm90 {

// 128 slots x 512 counters x 4 bytes = 256 KB of device memory per kernel unit that uses them (13 in the
// sm90 module: ~3.3 MB per device). A process that captures more than 128 graphs (or uses more streams) on one
// device gets the workspace path for the rest.
inline constexpr int kSplitCounterSlots = 128;
inline constexpr int kSplitCounterRows = 512;  // row blocks of 128: N <= 65536

static __device__ uint32_t g_split_counters[kSplitCounterSlots * kSplitCounterRows];

// The counters a launch uses: its slot's, or the workspace's (slot < 0).
__device__ __forceinline__ uint32_t* split_counters(int slot, uint32_t* workspace_counters) {
  return slot >= 0 ? g_split_counters + slot * kSplitCounterRows : workspace_counters;
}

}  // namespace nvfp4_gemm::sm90
