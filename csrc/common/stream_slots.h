// Slots of device state that a kernel keeps zero between its launches (a grid reduction's running words, split
// arrival counters), handed out per (device, stream, capture sequence, host thread of the per-thread default
// stream). Torch-free, host only.
//
// Why: a kernel that resets its own state as its last block leaves (no memset launch ahead of it) needs that
// state zero at its first use and never shared by two launches that may overlap. Launches on one stream run in
// order (with programmatic dependent launch, a kernel touches the state only after griddepcontrol.wait, which
// waits for the kernel ahead to complete); launches captured into a CUDA graph get the slot of that capture,
// never the one of eager launches on the capturing stream nor of another graph, so a graph may replay while
// eager work or another graph runs on other streams. (Replaying one graph on two streams at once is outside
// what torch supports: its memory pool is shared.) The per-thread default stream has one handle for many
// streams: its slots are per host thread too. When the slots run out the caller falls back to state of its
// own zeroed on the stream (one launch more): running out costs speed, never correctness.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace nvfp4_gemm {

class StreamSlots {
 public:
  static constexpr int kMaxDevices = 64;

  explicit StreamSlots(int capacity) : capacity_(capacity) {}

  // cudaSuccess with *index set (-1 when every slot of the device is taken), else the CUDA error.
  cudaError_t get(cudaStream_t stream, int* index) {
    *index = -1;
    int dev = 0;
    if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture = 0;
    if (const cudaError_t e = cudaStreamGetCaptureInfo(stream, &status, &capture); e != cudaSuccess) return e;
    if (status == cudaStreamCaptureStatusNone) capture = 0;  // capture ids start at 1
    const std::thread::id thread = stream == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id();
    const Key key{dev, reinterpret_cast<uintptr_t>(stream), capture, thread};
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = slots_.find(key); it != slots_.end()) {
      *index = it->second;
      return cudaSuccess;
    }
    if (dev < 0 || dev >= kMaxDevices || used_[dev] == capacity_) return cudaSuccess;
    *index = used_[dev]++;
    slots_.emplace(key, *index);
    return cudaSuccess;
  }

 private:
  using Key = std::tuple<int, uintptr_t, unsigned long long, std::thread::id>;
  const int capacity_;
  std::mutex mutex_;
  std::map<Key, int> slots_;
  int used_[kMaxDevices] = {};  // slots handed out per device (each device has its own copy of the state)
};

}  // namespace nvfp4_gemm
