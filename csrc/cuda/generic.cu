#include "cuda/generic.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdio>
#include <mutex>

#include "common/convert_out.cuh"
#include "cuda/decode.cuh"

namespace nvfp4_gemm::generic {
namespace {

// alpha = 1 and beta = 0 on the device: cuBLAS's device pointer mode (needed for alpha, so that CUDA
// graphs stay valid) applies to both scalars.
__device__ const float kOneAndZero[2] = {1.0f, 0.0f};


// One thread per 16-element scale group: 8 packed bytes in, one scale, 16 values out.
template <typename T>
__global__ void decode_kernel(const uint8_t* __restrict__ packed, int64_t ld_bytes,
                              const uint8_t* __restrict__ sf, int64_t rows, int64_t k, T* __restrict__ out) {
  const int64_t groups_per_row = k / kSfVecSize;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= rows * groups_per_row) return;
  const int64_t r = g / groups_per_row, s = g % groups_per_row;
  const uint2 bytes = *reinterpret_cast<const uint2*>(packed + r * ld_bytes + s * (kSfVecSize / 2));
  const float scale = e4m3_value(sf[blocked_sf_offset(r, s, groups_per_row)]);
  alignas(16) T vals[kSfVecSize];
  const uint32_t words[2] = {bytes.x, bytes.y};
#pragma unroll
  for (int i = 0; i < kSfVecSize; ++i) {
    // Element 2j sits in the low nibble of byte j (docs/CONTRACT.md).
    const uint32_t code = (words[i / 8] >> (4 * (i % 8))) & 0xF;
    vals[i] = convert_out<T>(e2m1_value(code) * scale);  // exact: the product fits T's significand
  }
  uint4* dst = reinterpret_cast<uint4*>(out + r * k + s * kSfVecSize);
  constexpr int kVectors = kSfVecSize * sizeof(T) / sizeof(uint4);  // 2 for fp16 / bf16, 4 for fp32
#pragma unroll
  for (int v = 0; v < kVectors; ++v) dst[v] = reinterpret_cast<const uint4*>(vals)[v];
}

template <typename T>
void launch_decode(const uint8_t* packed, int64_t ld_bytes, const uint8_t* sf, int64_t rows, int64_t k,
                   void* out, cudaStream_t stream) {
  const int64_t groups = rows * (k / kSfVecSize);
  constexpr int kThreads = 256;
  const int64_t blocks = ceil_div(groups, kThreads);
  decode_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(packed, ld_bytes, sf, rows, k,
                                                                            static_cast<T*>(out));
}

const float* device_one_and_zero(char* err, size_t err_len) {
  static std::mutex mutex;
  static const float* cache[256] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 256) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (cache[dev] == nullptr) {
    void* p = nullptr;
    const cudaError_t e = cudaGetSymbolAddress(&p, kOneAndZero);
    if (e != cudaSuccess) {
      std::snprintf(err, err_len, "cudaGetSymbolAddress failed: %s", cudaGetErrorString(e));
      return nullptr;
    }
    cache[dev] = static_cast<const float*>(p);
  }
  return cache[dev];
}

cudaDataType_t cuda_type(Operand t) {
  return t == Operand::kFloat32 ? CUDA_R_32F : t == Operand::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace

bool gemm_writes(Operand t, OutDtype out) {
  switch (t) {
    case Operand::kFloat16: return out != OutDtype::kBFloat16;
    case Operand::kBFloat16: return out != OutDtype::kFloat16;
    case Operand::kFloat32: return out == OutDtype::kFloat32;
  }
  return false;
}

bool decode(const uint8_t* packed, int64_t ld_bytes, const uint8_t* sf, int64_t rows, int64_t k, Operand t,
            void* out, cudaStream_t stream, char* err, size_t err_len) {
  switch (t) {
    case Operand::kFloat16: launch_decode<__half>(packed, ld_bytes, sf, rows, k, out, stream); break;
    case Operand::kBFloat16: launch_decode<__nv_bfloat16>(packed, ld_bytes, sf, rows, k, out, stream); break;
    case Operand::kFloat32: launch_decode<float>(packed, ld_bytes, sf, rows, k, out, stream); break;
  }
  // Read once: a second cudaGetLastError() would report success, having cleared the error.
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::snprintf(err, err_len, "decode kernel launch failed: %s (was the generic path compiled for this GPU? "
                  "rebuild with NVFP4_GEMM_CUDA_ARCHS including this device's arch)", cudaGetErrorString(e));
    return false;
  }
  return true;
}

bool gemm(cublasHandle_t handle, Operand t, const void* a, int64_t lda, const void* b, int64_t ldb, int64_t m,
          int64_t n, int64_t k, const float* alpha, void* c, int64_t ldc, OutDtype out, char* err, size_t err_len) {
  if (!gemm_writes(t, out)) {
    std::snprintf(err, err_len, "internal: cuBLAS GEMM of operand type %d cannot write output type %d directly",
                  static_cast<int>(t), static_cast<int>(out));
    return false;
  }
  // cuBLAS takes int dimensions: the binding layer bounds m, n, k; a leading dimension of a strided view
  // can still be larger.
  for (const int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v > INT32_MAX) {
      std::snprintf(err, err_len, "cuBLAS takes dimensions and leading dimensions up to 2^31 - 1, got "
                    "m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld; pass contiguous operands",
                    static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                    static_cast<long long>(lda), static_cast<long long>(ldb), static_cast<long long>(ldc));
      return false;
    }
  }
  const float* one_zero = device_one_and_zero(err, err_len);
  if (one_zero == nullptr) return false;
  const float* beta = one_zero + 1;
  if (alpha == nullptr) alpha = one_zero;

  const cudaDataType_t op_type = cuda_type(t);
  const cudaDataType_t c_type = out == OutDtype::kFloat32   ? CUDA_R_32F
                                : out == OutDtype::kBFloat16 ? CUDA_R_16BF
                                                             : CUDA_R_16F;
  cublasPointerMode_t old_mode;
  cublasMath_t old_math;
  cublasGetPointerMode(handle, &old_mode);
  cublasGetMathMode(handle, &old_math);
  cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE);
  // fp32 accumulation throughout: no reduced-precision split-K reductions, and (default math) no TF32 for
  // fp32 operands.
  cublasSetMathMode(handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                      CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  // Row-major C[m, n] = A[m, k] B[n, k]^T is column-major C^T[n, m] = B^T' A', with B read transposed.
  const cublasStatus_t st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                         static_cast<int>(k), alpha, b, op_type, static_cast<int>(ldb), a, op_type,
                                         static_cast<int>(lda), beta, c, c_type, static_cast<int>(ldc),
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  cublasSetPointerMode(handle, old_mode);
  cublasSetMathMode(handle, old_math);
  if (st != CUBLAS_STATUS_SUCCESS) {
    std::snprintf(err, err_len, "cublasGemmEx failed: %s", cublasGetStatusString(st));
    return false;
  }
  return true;
}

}  // namespace nvfp4_gemm::generic
