"""How fast the H100 streams a packed weight matrix under different read orders (diagnostics for the
small-M kernel, docs/SM90_NOTES.md). Every pattern reads the same bytes, B = [7168][8192] uint8 (the packed
B of N = 7168, K = 16384), with 224 CTAs of 256 threads, 16-byte non-allocating loads, 8 in flight per
thread (16 for the '16' variants, 4 for 'fragment4'); each CTA covers 128 rows x 2048 bytes (or, for 'linear', 256 KB of the flat buffer).
  fragment: a warp reads 16 rows x 64 bytes per load (the small-M kernel's order: lane (g, tig) holds rows
            g and g + 8, [16 tig, +16) and [64 + 16 tig, +16) of each 128-byte K block)
  row:      a warp reads 512 contiguous bytes of one row per load, a row's 2048 bytes at a time
  linear:   the CTA's 256 KB of the flat buffer in address order
    python benchmarks/diagnostics/hbm_pattern_probe.py
"""
import torch
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <int P, int U>
__global__ void __launch_bounds__(256, 2) rd(const uint8_t* b, long ldb, uint32_t* sink) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int rb = blockIdx.x, split = blockIdx.y;
  uint32_t acc = 0;
  for (int it = 0; it < 64; it += U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = it + u;
      const uint8_t* p;
      if (P == 0) {
        const int blk = i >> 2, w = i & 3, row = rb * 128 + warp * 16 + g + (w >> 1) * 8;
        p = b + row * ldb + split * 2048 + blk * 128 + (w & 1) * 64 + tig * 16;
      } else if (P == 1) {
        const int row = rb * 128 + warp * 16 + (i >> 2);
        p = b + row * ldb + split * 2048 + (i & 3) * 512 + lane * 16;
      } else {
        p = b + (long)(rb * gridDim.y + split) * 262144 + (long)(i * 256 + tid) * 16;
      }
      v[u] = ld_stream(p);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
void run(torch::Tensor b, torch::Tensor sink, int64_t pattern) {
  dim3 grid(b.size(0) / 128, 4);
  auto* f = pattern == 0 ? rd<0, 8> : pattern == 1 ? rd<1, 8> : pattern == 2 ? rd<2, 8> :
            pattern == 3 ? rd<0, 16> : pattern == 4 ? rd<1, 16> : pattern == 5 ? rd<2, 16> : rd<0, 4>;
  f<<<grid, 256, 0, at::cuda::getCurrentCUDAStream()>>>(b.data_ptr<uint8_t>(), b.stride(0), (uint32_t*)sink.data_ptr());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""
mod = load_inline("hbm_pattern_probe", cpp_sources="void run(torch::Tensor b, torch::Tensor sink, int64_t pattern);",
                  cuda_sources=SRC, functions=["run"], extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"])
b = torch.randint(0, 256, (7168, 8192), dtype=torch.uint8, device="cuda")
sink = torch.zeros(4, dtype=torch.int32, device="cuda")
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for name, pat in (("fragment", 0), ("row", 1), ("linear", 2), ("fragment16", 3), ("row16", 4), ("linear16", 5),
                  ("fragment4", 6)):
    ts = []
    for _ in range(30):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        mod.run(b, sink, pat)
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    t = sorted(ts)[len(ts) // 2]
    print(f"{name:9s} {t:6.1f} us  {b.numel() / t / 1e6:.2f} TB/s", flush=True)
