// Programmatic dependent launch for the quantization kernels (input_scales.cu, quantize.cu, quantize_grouped.cu).
//
// Launched with cudaLaunchAttributeProgrammaticStreamSerialization, a kernel may start while the kernel ahead
// of it on the stream is finishing. These kernels wait for that kernel before they touch global memory, then
// at once let the next kernel launch: a GEMM that follows runs its prologue and asks L2 for its weights while
// the quantization runs, and waits for this grid itself before it reads what it wrote.
//
// Only a kernel whose code holds the wait may be launched so: one compiled from PTX for SM 9.0 or newer.
// A build without such a target JIT-compiles older PTX on a newer GPU, and launched early that code would read
// its input before the kernel ahead finished writing it. kernel_waits_for_predecessor reads ptxVersion (the
// virtual architecture, as CUB reads it) once per device.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "common/pdl.h"

namespace nvfp4_gemm::quant {

constexpr int kMaxDevices = 64;

__device__ __forceinline__ void wait_for_predecessor_then_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A value of the current device, read once per device by `read` (int* -> cudaError_t) and cached (`cache`
// holds value + 1; 0: not read yet).
template <typename Read>
cudaError_t cached_per_device(std::atomic<int>* cache, int* out, Read read) {
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (dev >= 0 && dev < kMaxDevices) {
    if (const int v = cache[dev].load(std::memory_order_relaxed)) {
      *out = v - 1;
      return cudaSuccess;
    }
  }
  if (const cudaError_t e = read(dev, out); e != cudaSuccess) return e;
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(*out + 1, std::memory_order_relaxed);
  return cudaSuccess;
}

// *out = 1 if `kernel` as it runs on the current device holds griddepcontrol.wait (see the top), else 0;
// `cache` (kMaxDevices entries, zeroed) is the kernel's own.
template <typename Kernel>
cudaError_t kernel_waits_for_predecessor(Kernel* kernel, std::atomic<int>* cache, int* out) {
  return cached_per_device(cache, out, [kernel](int, int* v) {
    cudaFuncAttributes a{};
    const cudaError_t e = cudaFuncGetAttributes(&a, kernel);
    *v = e == cudaSuccess && a.ptxVersion >= 90 ? 1 : 0;
    return e;
  });
}

// kernel_waits_for_predecessor with a cache per kernel signature: kernels of one module share their PTX version,
// so kernels whose signatures coincide may share the answer.
template <typename Kernel>
cudaError_t waits_for_predecessor(Kernel* kernel, int* out) {
  static std::atomic<int> cached[kMaxDevices] = {};
  return kernel_waits_for_predecessor(kernel, cached, out);
}

}  // namespace nvfp4_gemm::quant
