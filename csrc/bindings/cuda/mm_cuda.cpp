// CUDA implementation of nvfp4_gemm::mm and mm_out (and of _decode, the generic path's decode alone):
// validate once, describe the problem to the backends, pick one through the resolver (bindings/resolve.h: a
// forced backend or config, else the first arch module whose table takes the problem on this device, else the
// generic path), allocate its workspace through torch, launch on the current stream. No host sync on the
// call path (the one-time self-check below is the exception, outside CUDA-graph capture only).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "bindings/checks.h"
#include "bindings/cuda/mm_cuda.h"
#include "bindings/registry.h"
#include "bindings/resolve.h"
#include "quant/input_scales.h"
#include "cuda/generic.h"

namespace nvfp4_gemm {

// The one per-device cache of what dispatch needs (every op that launches a GEMM reads it; no per-call query).
const DeviceInfo& device_info(int device) {
  constexpr int kMaxDevices = 256;
  static std::mutex mutex;
  static DeviceInfo cache[kMaxDevices];
  static bool filled[kMaxDevices] = {};
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "nvfp4_gemm: device index ", device, " out of range [0, ",
              kMaxDevices, ")");
  std::lock_guard<std::mutex> lock(mutex);
  if (!filled[device]) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
    cache[device] = DeviceInfo{prop->major * 10 + prop->minor, prop->multiProcessorCount,
                               static_cast<int64_t>(prop->sharedMemPerBlockOptin), device};
    filled[device] = true;
  }
  return cache[device];
}

namespace {

constexpr size_t kErrLen = 512;

using Choice = nvfp4_gemm::Choice<BackendApi>;

std::string choice_name(const Choice& c) {
  return c.api ? std::string(c.api->name) + ":" + c.api->config_names[c.config] : "generic";
}

// The line of this call's choice (resolve.h: printed under NVFP4_GEMM_PRINT_CONFIGS, recorded for tests).
void note_choice(const Choice& c, const Problem& p, bool weight_only) {
  if (!noting_choices()) return;
  static constexpr const char* kATypeNames[] = {"e2m1", "f16", "bf16", "f32"};
  note_choice_line(choice_name(c) +
                   (quantizes_a(p)  ? std::string(" quantizing a=") + kATypeNames[static_cast<int>(p.a_type)]
                    : weight_only ? std::string(" w4a16 a=") + kATypeNames[static_cast<int>(p.a_type)]
                                  : std::string()) +
                   " m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
                   " out=" + std::to_string(static_cast<int>(p.out_dtype)));
}

std::string shape_of(const Problem& p) {
  return "M=" + std::to_string(p.m) + " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k);
}

// The backend and config for `p` under the forcing in effect (resolve.h), which also sets the problem's forced
// split count. `optional`: a fused form the caller can replace with its unfused one (a choice that cannot take it
// declines instead of failing).
Choice choose(Problem& p, const DeviceInfo& dev, bool optional) {
  const Forcing f = current_forcing();
  p.forced_splits = f.splits;
  Choice c;
  const std::string err = resolve(p, dev, backends(), f, optional, [&p] { return shape_of(p); }, &c);
  TORCH_CHECK(err.empty(), "nvfp4_gemm: ", err);
  return c;
}

// ---------------------------------------------------------------------------------------------------
// The generic path: decode to exact 16-bit (or fp32) operands, one cuBLAS GEMM.

void run_generic(const MmShape& s, const Problem& p, const at::Tensor& a, const at::Tensor& c, int sm) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  char err[kErrLen] = {0};
  const auto fail = [&](bool ok) {
    TORCH_CHECK(ok, "nvfp4_gemm.mm (generic CUDA path, SM ", sm / 10, ".", sm % 10, ", M=", s.m, " N=", s.n,
                " K=", s.k, "): ", err);
  };
  const auto scalar_type = [](generic::Operand t) {
    return t == generic::Operand::kFloat32 ? at::kFloat : t == generic::Operand::kBFloat16 ? at::kBFloat16 : at::kHalf;
  };
  generic::Operand op;
  at::Tensor a_dq;  // A as the GEMM reads it
  int64_t lda = 0;
  if (s.weight_only) {
    op = a.scalar_type() == at::kFloat ? generic::Operand::kFloat32
         : a.scalar_type() == at::kBFloat16 ? generic::Operand::kBFloat16
                                            : generic::Operand::kFloat16;
    a_dq = a;
    lda = s.m > 1 ? a.stride(0) : s.k;
  } else {
    op = generic::w4a4_operand(p.out_dtype);
    a_dq = at::empty({s.m, s.k}, a.options().dtype(scalar_type(op)));
    fail(generic::decode(p.a, p.lda, p.sfa, s.m, s.k, op, a_dq.data_ptr(), stream, err, kErrLen));
    lda = s.k;
  }
  at::Tensor b_dq = at::empty({s.n, s.k}, a.options().dtype(scalar_type(op)));
  fail(generic::decode(p.b, p.ldb, p.sfb, s.n, s.k, op, b_dq.data_ptr(), stream, err, kErrLen));

  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  if (generic::gemm_writes(op, p.out_dtype)) {
    fail(generic::gemm(handle, op, a_dq.data_ptr(), lda, b_dq.data_ptr(), s.k, s.m, s.n, s.k, p.alpha, p.c, p.ldc,
                       p.out_dtype, err, kErrLen));
    return;
  }
  // cuBLAS pairs this operand type with other outputs only: fp32 result, then one rounding.
  at::Tensor acc = at::empty({s.m, s.n}, a.options().dtype(at::kFloat));
  fail(generic::gemm(handle, op, a_dq.data_ptr(), lda, b_dq.data_ptr(), s.k, s.m, s.n, s.k, p.alpha,
                     acc.data_ptr(), s.n, OutDtype::kFloat32, err, kErrLen));
  c.copy_(acc);
}

void run_arch(const Choice& choice, const MmShape& s, const Problem& p, const at::Tensor& a,
              const DeviceInfo& dev) {
  const size_t ws_bytes = choice.api->workspace_bytes(&p, choice.config, &dev);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
  char err[kErrLen] = {0};
  const bool ok = choice.api->run(&p, choice.config, &dev, ws_bytes ? workspace.data_ptr() : nullptr, ws_bytes,
                                  at::cuda::getCurrentCUDAStream(), err, kErrLen);
  TORCH_CHECK(ok, "nvfp4_gemm.mm (", choice.api->name, " config ", choice.api->config_names[choice.config],
              ", M=", s.m, " N=", s.n, " K=", s.k, "): ", err);
}

// ---------------------------------------------------------------------------------------------------
// Self-check on first use. The SM100 kernels are verified by compilation, SASS inspection and host-side
// checks of their arguments, but were never run on a GPU by this project; so on first use in a process,
// each (device, config, output dtype) runs once on a small random problem against torch._scaled_mm
// (cuBLAS's NVFP4 GEMM, the same semantics), or against the generic path where _scaled_mm cannot run.
// A mismatch warns once and sends that config's problems to the generic path (decode + cuBLAS, which
// keeps alpha on the device and every output dtype). NVFP4_GEMM_SELFCHECK=0 turns it off, =1 extends it
// to every arch backend (to exercise it on Hopper).

enum class Verdict { kPass, kFail };

bool selfcheck_applies(const BackendApi* api) {
  static const std::string mode = env_or_empty("NVFP4_GEMM_SELFCHECK");
  if (mode == "0") return false;
  if (mode == "1") return true;
  // Compile- and host-verified archs with no GPU of theirs here: each config checks itself once on first use.
  return std::string(api->name) == "sm100" || std::string(api->name) == "sm120";
}

// Random W4A4 operands of a shape the config runs: uniform bytes (all 16 codes), e4m3 scales over ten
// binades (2^-6 .. 2^3), drawn on the CPU from a fixed seed (the caller's RNG state is not touched).
struct CheckOperands {
  at::Tensor a, b, sfa, sfb;
};

CheckOperands make_check_operands(int64_t m, int64_t n, int64_t k, const at::Device& device) {
  at::Generator gen = at::detail::createCPUGenerator(0x5EEDull);
  const auto cpu_u8 = at::TensorOptions().dtype(at::kByte);
  const auto bytes = [&](int64_t rows, int64_t cols) {
    return at::randint(0, 256, {rows, cols}, gen, cpu_u8).to(device);
  };
  // Biased exponent 1..10, any mantissa: 8 .. 87, never NaN (0x7F).
  const auto scales = [&](int64_t rows) {
    return at::randint(8, 88, {round_up(rows, kSfAtomRows) * round_up(k / kSfVecSize, kSfAtomCols)}, gen, cpu_u8)
        .to(device);
  };
  return CheckOperands{bytes(m, k / 2), bytes(n, k / 2), scales(m), scales(n)};
}

Verdict run_selfcheck(const Choice& choice, OutDtype out, const at::ScalarType out_type, const DeviceInfo& dev,
                      const at::Device& device, std::string& detail) {
  // Sizes whose scale matrices have no padding (the kernels and _scaled_mm then read identical bytes).
  static constexpr int64_t kShapes[][3] = {{256, 256, 1024}, {128, 256, 512}, {512, 512, 2048}, {1024, 1024, 4096}};
  char why[kErrLen] = {0};
  for (const auto& shape : kShapes) {
    const int64_t m = shape[0], n = shape[1], k = shape[2];
    const CheckOperands o = make_check_operands(m, n, k, device);
    at::Tensor c = at::empty({m, n}, o.a.options().dtype(out_type));
    const Problem p{o.a.data_ptr<uint8_t>(), o.b.data_ptr<uint8_t>(), o.sfa.data_ptr<uint8_t>(),
                    o.sfb.data_ptr<uint8_t>(), nullptr, c.data_ptr(), m, n, k, k / 2, k / 2, n, out};
    if (!choice.api->can_run(&p, choice.config, &dev, why, kErrLen)) continue;
    const MmShape s{m, n, k, out_type, false};
    run_arch(choice, s, p, o.a, dev);

    at::Tensor ref;
    std::string ref_name = "torch._scaled_mm";
    try {
      ref = at::_scaled_mm(o.a.view(at::kFloat4_e2m1fn_x2), o.b.view(at::kFloat4_e2m1fn_x2).t(),
                           o.sfa.view(at::kFloat8_e4m3fn), o.sfb.view(at::kFloat8_e4m3fn), std::nullopt,
                           std::nullopt, out_type);
    } catch (const c10::Error&) {
      ref_name = "the generic path";
      ref = at::empty({m, n}, o.a.options().dtype(out_type));
      Problem pr = p;
      pr.c = ref.data_ptr();
      run_generic(s, pr, o.a, ref, dev.sm);
    }
    // Both sides sum exact products in fp32; only the summation order and the final rounding differ. A
    // misplaced scale or a wrong nibble moves outputs by a sizeable fraction of the largest one.
    const at::Tensor got = c.to(at::kFloat), want = ref.to(at::kFloat);
    const double u = out == OutDtype::kFloat32 ? 0x1p-24 : out == OutDtype::kBFloat16 ? 0x1p-8 : 0x1p-11;
    const at::Tensor tol = want.abs() * (4 * u) + want.abs().max() * 0x1p-10;
    const at::Tensor bad = ((got - want).abs() > tol) | got.isnan() | want.isnan();
    const int64_t n_bad = bad.sum().item<int64_t>();
    if (n_bad == 0) return Verdict::kPass;
    detail = std::to_string(n_bad) + " of " + std::to_string(m * n) + " outputs differ from " + ref_name +
             " at M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
             " (max |diff| " + std::to_string((got - want).abs().max().item<float>()) + ", max |ref| " +
             std::to_string(want.abs().max().item<float>()) + ")";
    return Verdict::kFail;
  }
  detail = "no self-check shape fits this config; it runs unchecked";
  return Verdict::kPass;
}

// Whether `choice` may run this call: true once its self-check passed on this device. During CUDA-graph
// capture a check cannot run (it synchronizes): an unchecked config then gives way to the generic path
// for this call, with a warning to make one call before capturing.
bool verified(const Choice& choice, OutDtype out, at::ScalarType out_type, int device_index,
              const DeviceInfo& dev, const at::Device& device) {
  if (choice.api == nullptr || !selfcheck_applies(choice.api)) return true;
  static std::mutex mutex;
  static std::map<std::tuple<int, const BackendApi*, int32_t, int>, Verdict> verdicts;
  const auto key = std::make_tuple(device_index, choice.api, choice.config, static_cast<int>(out));
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = verdicts.find(key);
  if (it != verdicts.end()) return it->second == Verdict::kPass;
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    TORCH_WARN_ONCE("nvfp4_gemm: ", choice_name(choice), " has not passed its first-use self-check in this process "
                    "and cannot run it during CUDA-graph capture; the generic path runs instead. Make one eager "
                    "call of each shape before capturing (NVFP4_GEMM_SELFCHECK=0 skips the check).");
    return false;
  }
  std::string detail;
  const Verdict v = run_selfcheck(choice, out, out_type, dev, device, detail);
  verdicts.emplace(key, v);
  if (v == Verdict::kFail) {
    TORCH_WARN("nvfp4_gemm: self-check of ", choice_name(choice), " on cuda:", device_index, " (SM ", dev.sm / 10,
               ".", dev.sm % 10, ") FAILED: ", detail, ". Its problems go to the generic path from now on. Please "
               "report this with the output of `python -m nvfp4_gemm --selftest`.");
  } else if (!detail.empty()) {
    TORCH_WARN_ONCE("nvfp4_gemm: ", choice_name(choice), ": ", detail);
  }
  return v == Verdict::kPass;
}

// ---------------------------------------------------------------------------------------------------

void mm_into(const MmShape& s, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
             const at::Tensor& sfb, const std::optional<at::Tensor>& alpha, const at::Tensor& c) {
  const int device_index = a.get_device();
  const DeviceInfo& dev = device_info(device_index);
  TORCH_CHECK(dev.sm >= 80, "nvfp4_gemm.mm: no usable kernel for this GPU (SM ", dev.sm / 10, ".", dev.sm % 10,
              "): the CUDA backends need SM >= 8.0; move the tensors to the CPU to use the CPU backend");

  Problem p{static_cast<const uint8_t*>(a.data_ptr()),
                  static_cast<const uint8_t*>(b.data_ptr()),
                  s.weight_only ? nullptr : static_cast<const uint8_t*>(sfa->data_ptr()),
                  static_cast<const uint8_t*>(sfb.data_ptr()),
                  alpha.has_value() ? alpha->data_ptr<float>() : nullptr,
                  c.data_ptr(),
                  s.m, s.n, s.k,
                  s.m > 1 ? a.stride(0) * static_cast<int64_t>(a.element_size()) : s.k / 2,
                  s.n > 1 ? b.stride(0) : s.k / 2,
                  s.m > 1 ? c.stride(0) : s.n,
                  to_out_dtype(s.out_dtype),
                  !s.weight_only                         ? AType::kE2m1
                  : a.scalar_type() == at::kHalf         ? AType::kFloat16
                  : a.scalar_type() == at::kBFloat16     ? AType::kBFloat16
                                                         : AType::kFloat32};
  // Each arch module's can_run says which A types it takes (sm90: e2m1, fp16, bf16; sm100: e2m1); a
  // problem no module takes runs on the generic path, which takes every form.
  Choice choice = choose(p, dev, /*optional=*/false);
  if (!verified(choice, p.out_dtype, s.out_dtype, device_index, dev, a.device())) choice = Choice{};
  note_choice(choice, p, s.weight_only);
  if (choice.api == nullptr) {
    run_generic(s, p, a, c, dev.sm);
  } else {
    run_arch(choice, s, p, a, dev);
  }
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                   const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                   std::optional<at::ScalarType> out_dtype) {
  const MmShape s = check_mm_inputs(a, b, sfa, sfb, alpha, out_dtype, nullptr, /*gpu_rules=*/true);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor c = at::empty({s.m, s.n}, a.options().dtype(s.out_dtype));
  if (s.m > 0 && s.n > 0) mm_into(s, a, b, sfa, sfb, alpha, c);
  return c;
}

void mm_out_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                 const at::Tensor& sfb, const std::optional<at::Tensor>& alpha,
                 std::optional<at::ScalarType> out_dtype, const at::Tensor& out) {
  const MmShape s = check_mm_inputs(a, b, sfa, sfb, alpha, out_dtype, &out, /*gpu_rules=*/true);
  const c10::cuda::CUDAGuard guard(a.device());
  if (s.m > 0 && s.n > 0) mm_into(s, a, b, sfa, sfb, alpha, out);
}

// nvfp4_gemm::_decode on CUDA: the generic path's decode kernel into a new [N, K] tensor. The kernel reads
// each 16-value group as 8 bytes: a view with a stride along K, rows not 8 bytes apart or an unaligned base is
// copied contiguous first (the only other allocation, transient; the fused layers' row-slice views and mm's
// operands are read in place).
at::Tensor decode_op_cuda(const at::Tensor& packed, const at::Tensor& sf, at::ScalarType dtype) {
  const auto [n, k] = check_decode_inputs(packed, sf, dtype);
  const c10::cuda::CUDAGuard guard(packed.device());
  at::Tensor out = at::empty({n, k}, packed.options().dtype(dtype));
  if (n == 0) return out;  // a launch of zero blocks is an error
  // The kernel runs one thread per 16-value group in a 1-D grid of 256-thread blocks.
  constexpr int64_t kMaxGroups = static_cast<int64_t>(INT32_MAX) * 256;
  TORCH_CHECK(n <= kMaxGroups / (k / kSfVecSize), "nvfp4_gemm._decode: N * K / 16 must be at most 2^31 * 256 on "
              "CUDA, got N=", n, " K=", k);
  const int device_index = packed.get_device();
  const int sm = device_info(device_index).sm;
  TORCH_CHECK(sm >= 80, "nvfp4_gemm._decode: the CUDA decode kernel needs SM >= 8.0, this GPU is SM ", sm / 10, ".",
              sm % 10, "; move the tensors to the CPU");
  at::Tensor bytes = packed.view(at::kByte);
  const bool readable = (bytes.stride(1) == 1 || bytes.size(1) <= 1) && (n <= 1 || bytes.stride(0) % 8 == 0) &&
                        reinterpret_cast<uintptr_t>(bytes.data_ptr()) % 8 == 0;
  if (!readable) bytes = bytes.clone(at::MemoryFormat::Contiguous);  // (contiguous() keeps an unaligned base)
  const int64_t ld_bytes = n > 1 ? bytes.stride(0) : k / 2;
  const generic::Operand op = dtype == at::kFloat      ? generic::Operand::kFloat32
                              : dtype == at::kBFloat16 ? generic::Operand::kBFloat16
                                                       : generic::Operand::kFloat16;
  char err[kErrLen] = {0};
  TORCH_CHECK(generic::decode(bytes.data_ptr<uint8_t>(), ld_bytes, static_cast<const uint8_t*>(sf.data_ptr()), n, k,
                              op, out.data_ptr(), at::cuda::getCurrentCUDAStream(), err, kErrLen),
              "nvfp4_gemm._decode (N=", n, " K=", k, "): ", err);
  return out;
}

}  // namespace

namespace {

// One float32 value on x's device, or a clear error naming it.
void check_device_scalar(const at::Tensor& t, const char* name, const at::Tensor& x, int64_t numel = 1) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.numel() == numel && t.is_contiguous() && t.device() == x.device(),
              "nvfp4_gemm: ", name, " must be ", numel == 1 ? std::string("one float32 value") :
              std::to_string(numel) + " contiguous float32 values", " on x's device (", x.device(), "), got ",
              t.scalar_type(), " of shape ", t.sizes(), " on ", t.device());
}

// x [M, K] quantized on the fly by an arch kernel: `set_scales` fills the Problem's quantization fields. The
// result, or nullopt (nothing launched) when no arch kernel takes the problem on this device.
template <typename SetScales>
std::optional<at::Tensor> run_quantizing(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                         const at::Tensor& alpha, at::ScalarType out_dtype, SetScales set_scales) {
  // x, b, sfb, alpha and out_dtype under mm's own rules (x as the activations of the weight-only form).
  const MmShape s = check_mm_inputs(x, b, std::nullopt, sfb, alpha, out_dtype, nullptr, /*gpu_rules=*/true);
  if (s.m == 0 || s.n == 0) return std::nullopt;
  const c10::cuda::CUDAGuard guard(x.device());
  const int device_index = x.get_device();
  const DeviceInfo& dev = device_info(device_index);
  at::Tensor c = at::empty({s.m, s.n}, x.options().dtype(s.out_dtype));
  Problem p{static_cast<const uint8_t*>(x.data_ptr()),
            static_cast<const uint8_t*>(b.data_ptr()),
            nullptr,
            static_cast<const uint8_t*>(sfb.data_ptr()),
            alpha.data_ptr<float>(),
            c.data_ptr(),
            s.m, s.n, s.k,
            s.m > 1 ? x.stride(0) * static_cast<int64_t>(x.element_size()) : s.k * static_cast<int64_t>(x.element_size()),
            s.n > 1 ? b.stride(0) : s.k / 2,
            s.n,
            to_out_dtype(s.out_dtype),
            x.scalar_type() == at::kHalf       ? AType::kFloat16
            : x.scalar_type() == at::kBFloat16 ? AType::kBFloat16
                                               : AType::kFloat32};
  set_scales(p);
  // Resolved as mm resolves the packed problem, so that the fused call and quantize + mm run the same config.
  const Choice choice = choose(p, dev, /*optional=*/true);
  if (choice.api == nullptr || !verified(choice, p.out_dtype, s.out_dtype, device_index, dev, x.device()))
    return std::nullopt;
  note_choice(choice, p, /*weight_only=*/false);
  run_arch(choice, s, p, x, dev);
  return c;
}

}  // namespace

std::optional<at::Tensor> mm_quantized_a_cuda(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                              const at::Tensor& a_scale, bool a_scale_is_decode,
                                              const at::Tensor& alpha, const std::optional<at::Tensor>& alpha2,
                                              at::ScalarType out_dtype) {
  check_device_scalar(a_scale, "a_scale", x);
  if (alpha2.has_value()) check_device_scalar(*alpha2, "alpha2", x);
  return run_quantizing(x, b, sfb, alpha, out_dtype, [&](Problem& p) {
    p.a_scale = a_scale.data_ptr<float>();
    p.a_scale_is_decode = a_scale_is_decode;
    p.alpha2 = alpha2.has_value() ? alpha2->data_ptr<float>() : nullptr;
  });
}

std::optional<at::Tensor> mm_dynamic_a_cuda(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                            const at::Tensor& weight_scale_2, const at::Tensor& scales,
                                            at::ScalarType out_dtype) {
  check_device_scalar(weight_scale_2, "weight_scale_2", x);
  check_device_scalar(scales, "the input-scales buffer", x, quant::kNumInputScales);
  return run_quantizing(x, b, sfb, scales.narrow(0, quant::kAlpha, 1), out_dtype, [&](Problem& p) {
    p.a_dynamic_ws2 = weight_scale_2.data_ptr<float>();
    p.a_dynamic_out = scales.data_ptr<float>();
  });
}

}  // namespace nvfp4_gemm

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) {
  m.impl("mm", &nvfp4_gemm::mm_cuda);
  m.impl("mm_out", &nvfp4_gemm::mm_out_cuda);
  m.impl("_decode", &nvfp4_gemm::decode_op_cuda);
}
