// Launch configurations for programmatic dependent launch (PDL), shared by the quantization kernels
// (csrc/quant) and the sm90 kernels. Host code; needs the CUDA runtime's types.
//
// A kernel launched as a programmatic dependent may start while the kernel ahead of it on the stream is still
// running (once that kernel has triggered, or finished): it must execute griddepcontrol.wait
// (cudaGridDependencySynchronize) before it reads anything that kernel wrote, and before it writes anything
// that kernel may still read.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace nvfp4_gemm {

// `grid` x `block` threads with `smem` bytes of dynamic shared memory on `stream`, a programmatic dependent of
// the kernel ahead where `pdl` is set. `attr` (attr[0] used) must outlive the launch; a caller that needs a
// cluster shape too passes room for two and calls add_cluster_dim.
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                                        cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 0;
  if (pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 1;
  }
  return cfg;
}

// Adds a thread-block cluster shape to `cfg` as its next attribute (cfg.attrs must have room for it).
inline void add_cluster_dim(cudaLaunchConfig_t& cfg, dim3 dim) {
  cudaLaunchAttribute& a = cfg.attrs[cfg.numAttrs++];
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = dim.x;
  a.val.clusterDim.y = dim.y;
  a.val.clusterDim.z = dim.z;
}

}  // namespace nvfp4_gemm
