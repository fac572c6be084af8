// Torch-free entry point of the per-tensor input scales kernel (csrc/quant/input_scales.cu): what
// nvfp4_gemm::linear needs before it quantizes x, formed on the device in one launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/quantize.h"

namespace nvfp4_gemm::quant {

// Where the kernel's outputs go, in this order (fp32, device memory, 4-byte aligned).
enum InputScale : int { kEncode = 0, kDecode = 1, kAlpha = 2, kNumInputScales = 3 };

// The two words of grid-reduction state one launch of the dynamic kernel uses (running max, arrival
// counter). Zero before the launch and zero again when it completes: the last block to arrive resets them.
// `index` >= 0 names one of the kernel's preallocated slots; each belongs to one (current device, stream,
// capture sequence), so two launches that may run at the same time never share one (input_scales.cu
// explains). index < 0: every slot is taken (or the stream could not be queried; the error is cleared),
// and `words` must point to two zeroed words of the caller's, ordered before the launch on its stream.
struct ReductionSlot {
  int index = -1;
  uint32_t* words = nullptr;
};
ReductionSlot reduction_slot(cudaStream_t stream);

// Dynamic mode (input_scale == nullptr): amax = max |x| over the finite elements of x [rows, k] in
// `dtype` (0 if there are none, rows = 0 included), then recipe.h's dynamic_input_scales(amax, ws2).
// Static mode (input_scale = the input's DECODE scale, one device float; x and slot unused):
// recipe.h's static_input_scales(input_scale, ws2). ws2 = weight_scale_2[0], read on the device.
// out[kEncode], out[kDecode], out[kAlpha] are written; the host path (csrc/bindings/linear.cpp) runs the
// same recipe functions, and both equal the ATen composite they replace bit for bit.
// Guaranteed by the caller (dynamic): x 16-byte aligned, k * element size and ld_x * element size multiples
// of 16 bytes, `slot` from reduction_slot() (with `words` set where it says). Enqueues one launch on `stream`;
// returns false with `err` filled on a launch failure.
bool input_scales_cuda(const void* x, InDtype dtype, int64_t rows, int64_t k, int64_t ld_x,
                       const float* input_scale, const float* weight_scale_2, float* out, ReductionSlot slot,
                       cudaStream_t stream, char* err, size_t err_len);

}  // namespace nvfp4_gemm::quant
