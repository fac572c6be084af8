// A device-resident 1.0f: the epilogue always reads alpha through a pointer, so "no alpha" stays
// graph-capturable without a host-side scalar path.
#include <cuda_runtime_api.h>

#include <mutex>

namespace nvfp4_gemm::sm120 {

__device__ const float kDeviceOne = 1.0f;

// Per device: a __device__ symbol has a distinct address in each device's context. `device` is the
// current device; the lock lets threads on several devices ask at once.
const float* device_one(int device) {
  static std::mutex mutex;
  static const float* cached[64] = {};
  if (device < 0 || device >= 64) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (!cached[device]) {
    void* p = nullptr;
    if (cudaGetSymbolAddress(&p, kDeviceOne) != cudaSuccess) {
      cudaGetLastError();  // reported by the caller, not left for the next launch check
      return nullptr;
    }
    cached[device] = static_cast<const float*>(p);
  }
  return cached[device];
}

}  // namespace nvfp4_gemm::sm120
