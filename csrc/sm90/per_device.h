// Settings that belong to one device. A kernel's function attributes (cudaFuncSetAttribute) live in a
// device's context: set once per process, they hold on the first GPU used only, and a launch on a second
// GPU fails ("invalid argument" for a kernel past the 48 KB default of dynamic shared memory).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

namespace nvfp4_gemm::sm90 {

// Runs a setting (a callable returning cudaError_t) on the current device until it has succeeded there
// once; thread-safe, so two threads may launch on two devices at the same time. Devices past
// kMaxDevices get the setting on every call (correct, only slower).
class OncePerDevice {
 public:
  static constexpr int kMaxDevices = 64;

  template <typename Set>
  cudaError_t run(Set&& set) {
    int dev = 0;
    if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    if (dev < 0 || dev >= kMaxDevices) return set();
    if (done_[dev].load(std::memory_order_acquire)) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_[dev].load(std::memory_order_relaxed)) return cudaSuccess;
    const cudaError_t e = set();
    if (e == cudaSuccess) done_[dev].store(true, std::memory_order_release);
    return e;
  }

 private:
  std::mutex mutex_;
  std::atomic<bool> done_[kMaxDevices] = {};
};

}  // namespace nvfp4_gemm::sm90
