// CPU backend: exact decode to float32 (an e2m1 value times an e4m3 scale is exact in fp32; so is a
// weight-only fp16 / bf16 activation), an fp32 matmul, alpha, then one rounding to the output dtype.
// Correct everywhere; not fast.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "bindings/checks.h"
#include "common/e2m1.h"

namespace nvfp4_gemm {
namespace {

// [rows, k/2] packed data + blocked scales -> [rows, k] of T (float, c10::Half or c10::BFloat16): each value
// e2m1 * e4m3 in fp32, exact, so that its conversion to T is exact too.
template <typename T>
void decode_rows(const uint8_t* src, const uint8_t* sf, int64_t rows, int64_t k, T* dst) {
  const int64_t sf_cols = k / kSfVecSize;
  float lut[16];
  for (int c = 0; c < 16; ++c) lut[c] = e2m1_to_float(static_cast<uint8_t>(c));
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t s = 0; s < sf_cols; ++s) {
        const float scale = e4m3_to_float(sf[blocked_sf_offset(r, s, sf_cols)]);
        const uint8_t* in = src + r * (k / 2) + s * (kSfVecSize / 2);
        T* o = dst + r * k + s * kSfVecSize;
        for (int i = 0; i < kSfVecSize / 2; ++i) {
          o[2 * i] = static_cast<T>(lut[in[i] & 0xF] * scale);
          o[2 * i + 1] = static_cast<T>(lut[in[i] >> 4] * scale);
        }
      }
    }
  });
}

// [rows, k/2] packed data (any strides) + blocked scales -> [rows, k] of `dtype`.
at::Tensor decode_cpu(const at::Tensor& packed, const at::Tensor& sf_blocked, int64_t rows, int64_t k,
                      at::ScalarType dtype = at::kFloat) {
  const at::Tensor data = packed.view(at::kByte).contiguous();
  const uint8_t* src = data.data_ptr<uint8_t>();
  // Every accepted scale view addresses the blocked bytes from its data pointer (checks.cpp).
  const uint8_t* sf = static_cast<const uint8_t*>(sf_blocked.data_ptr());
  at::Tensor out = at::empty({rows, k}, data.options().dtype(dtype));
  switch (dtype) {
    case at::kFloat: decode_rows(src, sf, rows, k, out.data_ptr<float>()); break;
    case at::kHalf: decode_rows(src, sf, rows, k, out.data_ptr<c10::Half>()); break;
    case at::kBFloat16: decode_rows(src, sf, rows, k, out.data_ptr<c10::BFloat16>()); break;
    default: TORCH_CHECK(false, "internal: decode_cpu to ", dtype);
  }
  return out;
}

// The product in fp32 (alpha applied), before the one rounding to the output dtype.
at::Tensor product_fp32(const MmShape& s, const at::Tensor& a, const at::Tensor& b,
                        const std::optional<at::Tensor>& sfa, const at::Tensor& sfb,
                        const std::optional<at::Tensor>& alpha) {
  // Weight-only a (fp16 / bf16 / fp32) is exact in fp32; packed a is decoded exactly.
  const at::Tensor a_dq = s.weight_only ? a.to(at::kFloat) : decode_cpu(a, *sfa, s.m, s.k);
  at::Tensor acc = at::mm(a_dq, decode_cpu(b, sfb, s.n, s.k).t());
  if (alpha.has_value()) acc.mul_(alpha->reshape({}));
  return acc;
}

at::Tensor mm_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                  const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                  std::optional<at::ScalarType> out_dtype) {
  const MmShape s = check_mm_inputs(a, b, sfa, sfb, alpha, out_dtype, nullptr, /*gpu_rules=*/false);
  if (s.m == 0 || s.n == 0) return at::empty({s.m, s.n}, a.options().dtype(s.out_dtype));
  return product_fp32(s, a, b, sfa, sfb, alpha).to(s.out_dtype);
}

void mm_out_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                std::optional<at::ScalarType> out_dtype, const at::Tensor& out) {
  const MmShape s = check_mm_inputs(a, b, sfa, sfb, alpha, out_dtype, &out, /*gpu_rules=*/false);
  if (s.m == 0 || s.n == 0) return;
  out.copy_(product_fp32(s, a, b, sfa, sfb, alpha));
}

at::Tensor decode_op_cpu(const at::Tensor& packed, const at::Tensor& sf, at::ScalarType dtype) {
  const auto [n, k] = check_decode_inputs(packed, sf, dtype);
  return decode_cpu(packed, sf, n, k, dtype);
}

}  // namespace
}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CPU, m) {
  m.impl("mm", &nvfp4_gemm::mm_cpu);
  m.impl("mm_out", &nvfp4_gemm::mm_out_cpu);
  m.impl("_decode", &nvfp4_gemm::decode_op_cpu);
}
