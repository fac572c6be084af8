// CUDA implementation of nvfp4_gemm::grouped_mm / grouped_mm_out and of the grouped quantization's row kernel:
// validate once, describe the problem (GroupedProblem), pick a backend through the resolver mm uses
// (bindings/resolve.h: a forced backend or grouped config, else the first arch module whose grouped table takes
// the problem on this device, else the generic path), allocate its workspace through torch, launch on the current
// stream. offs and alpha stay on the device: no host sync anywhere on this path, so the calls can be captured in a
// CUDA graph whose routing changes between replays.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>

#include "bindings/cuda/mm_cuda.h"
#include "bindings/grouped.h"
#include "bindings/registry.h"
#include "bindings/resolve.h"
#include "cuda/grouped.h"
#include "quant/quantize_grouped.h"

namespace nvfp4_gemm {
namespace {

constexpr size_t kErrLen = 512;
constexpr const char* kOp = "nvfp4_gemm.grouped_mm";

using Choice = nvfp4_gemm::Choice<GroupedBackendApi>;  // api nullptr: the generic path

std::string choice_name(const Choice& c) {
  return c.api ? std::string(c.api->name) + ":" + c.api->config_names[c.config] : "generic:grouped_simt_64x64";
}

std::string shape_text(const GroupedProblem& p) {
  return "T=" + std::to_string(p.t) + " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) +
         " G=" + std::to_string(p.g);
}

// The backend and config for `p` under the forcing in effect, by the rules mm's follow (resolve.h). A forced
// config that names a dense kernel only does not apply here (resolve.h's for_table): the grouped call follows the
// forced backend / automatic dispatch.
Choice choose(const GroupedProblem& p, const DeviceInfo& dev) {
  const Forcing f = for_table(current_forcing(), grouped_backends(), backends());
  Choice c;
  const std::string err = resolve(p, dev, grouped_backends(), f, /*optional=*/false, [&p] { return shape_text(p); },
                                  &c);
  TORCH_CHECK(err.empty(), "nvfp4_gemm: ", err);
  return c;
}

// The line of this call's choice (resolve.h: printed under NVFP4_GEMM_PRINT_CONFIGS, recorded for tests), as mm's.
void note_choice(const Choice& c, const GroupedProblem& p) {
  if (!noting_choices()) return;
  static constexpr const char* kATypeNames[] = {"e2m1", "f16", "bf16", "f32"};
  note_choice_line("grouped " + choice_name(c) + " a=" + kATypeNames[static_cast<int>(p.a_type)] + " " +
                   shape_text(p) + " out=" + std::to_string(static_cast<int>(p.out_dtype)) +
                   (p.offs_ready ? " after quantize_grouped" : ""));
}

OutDtype out_type(at::ScalarType t) {
  return t == at::kFloat ? OutDtype::kFloat32 : t == at::kBFloat16 ? OutDtype::kBFloat16 : OutDtype::kFloat16;
}

// offs_ready: GroupedProblem::offs_ready (only grouped_linear_cuda, which launched the quantization of A just ahead).
void grouped_into(const GroupedShape& s, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                  const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                  const at::Tensor& c, bool offs_ready = false) {
  const int device_index = a.get_device();
  const DeviceInfo& dev = device_info(device_index);
  TORCH_CHECK(dev.sm >= 80, kOp, ": no usable kernel for this GPU (SM ", dev.sm / 10, ".", dev.sm % 10,
              "): the CUDA backends need SM >= 8.0; move the tensors to the CPU to use the CPU backend");
  GroupedProblem p{};
  p.a = static_cast<const uint8_t*>(a.data_ptr());
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.sfa = s.weight_only ? nullptr : static_cast<const uint8_t*>(sfa->data_ptr());
  p.sfb = static_cast<const uint8_t*>(sfb.data_ptr());
  p.offs = offs.data_ptr<int32_t>();
  p.alpha = alpha.has_value() ? alpha->data_ptr<float>() : nullptr;
  p.c = c.data_ptr();
  p.t = s.t;
  p.n = s.n;
  p.k = s.k;
  p.g = s.g;
  p.lda = s.t > 1 ? a.stride(0) * static_cast<int64_t>(a.element_size())
                  : (s.weight_only ? s.k * static_cast<int64_t>(a.element_size()) : s.k / 2);
  p.ldb = s.n > 1 ? b.stride(1) : s.k / 2;
  p.b_group_bytes = s.g > 1 ? b.stride(0) : s.n * p.ldb;
  p.ldc = s.t > 1 ? c.stride(0) : s.n;
  p.sfa_rows = s.sfa_rows;
  p.out_dtype = out_type(s.out_dtype);
  p.a_type = !s.weight_only                     ? AType::kE2m1
             : a.scalar_type() == at::kHalf     ? AType::kFloat16
             : a.scalar_type() == at::kBFloat16 ? AType::kBFloat16
                                                : AType::kFloat32;
  p.offs_ready = offs_ready ? 1 : 0;
  const Choice choice = choose(p, dev);
  note_choice(choice, p);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  char err[kErrLen] = {0};
  if (choice.api == nullptr) {
    const size_t ws_bytes = generic::grouped_workspace_bytes(p.g);
    at::Tensor ws = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
    TORCH_CHECK(generic::grouped_run(p, ws.data_ptr(), ws_bytes, stream, err, kErrLen), kOp, " (generic CUDA path, SM ",
                dev.sm / 10, ".", dev.sm % 10, ", ", shape_text(p), "): ", err);
    return;
  }
  const size_t ws_bytes = choice.api->workspace_bytes(&p, choice.config, &dev);
  at::Tensor ws;
  if (ws_bytes > 0) ws = at::empty({static_cast<int64_t>(ws_bytes)}, a.options().dtype(at::kByte));
  const bool ok = choice.api->run(&p, choice.config, &dev, ws_bytes ? ws.data_ptr() : nullptr, ws_bytes, stream, err,
                                  kErrLen);
  TORCH_CHECK(ok, kOp, " (", choice.api->name, " config ", choice.api->config_names[choice.config], ", ", shape_text(p),
              "): ", err);
}

at::Tensor grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                           const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                           std::optional<at::ScalarType> out_dtype) {
  const GroupedShape s = check_grouped_inputs(a, b, sfa, sfb, offs, alpha, out_dtype, nullptr, /*gpu_rules=*/true);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor c = at::empty({s.t, s.n}, a.options().dtype(s.out_dtype));
  if (s.t > 0 && s.n > 0) grouped_into(s, a, b, sfa, sfb, offs, alpha, c);
  return c;
}

void grouped_mm_out_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                         const at::Tensor& sfb, const at::Tensor& offs, const std::optional<at::Tensor>& alpha,
                         std::optional<at::ScalarType> out_dtype, const at::Tensor& out) {
  const GroupedShape s = check_grouped_inputs(a, b, sfa, sfb, offs, alpha, out_dtype, &out, /*gpu_rules=*/true);
  const c10::cuda::CUDAGuard guard(a.device());
  if (s.t > 0 && s.n > 0) grouped_into(s, a, b, sfa, sfb, offs, alpha, out);
}

// x [T, K] as the quantization kernels read it: 16-byte chunks, so unit stride along K, 16-byte aligned rows and base;
// anything else is copied once (a fresh allocation is 16-byte aligned).
at::Tensor kernel_rows(const at::Tensor& x) {
  const int64_t esize = static_cast<int64_t>(x.element_size());
  const bool aligned = x.stride(1) == 1 && (x.size(0) <= 1 || (x.stride(0) * esize) % 16 == 0) &&
                       reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  return x.size(0) == 0 || aligned ? x : x.clone(at::MemoryFormat::Contiguous);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_grouped_cuda(const at::Tensor& x_in, const at::Tensor& offs,
                                                                     const std::optional<at::Tensor>& input_scale,
                                                                     const std::optional<at::Tensor>& weight_scale_2,
                                                                     int64_t sfa_rows, bool one_scale) {
  check_quantize_grouped(x_in, offs, input_scale, weight_scale_2, sfa_rows, one_scale);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const int64_t t = x_in.size(0), k = x_in.size(1), g = offs.numel();
  at::Tensor packed = at::empty({t, k / 2}, x_in.options().dtype(at::kByte));
  at::Tensor sf = at::empty({sfa_rows * round_up(k / kSfVecSize, kSfAtomCols)}, x_in.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scale = at::empty({g}, x_in.options().dtype(at::kFloat));
  const int sm = device_info(x_in.get_device()).sm;
  TORCH_CHECK(sm >= 80, "nvfp4_gemm.quantize_grouped: the CUDA kernels need SM >= 8.0, this GPU is SM ", sm / 10, ".",
              sm % 10, "; move the tensors to the CPU");
  const at::Tensor x = kernel_rows(x_in);
  const quant::InDtype dt = x.scalar_type() == at::kFloat  ? quant::InDtype::kFloat32
                            : x.scalar_type() == at::kHalf ? quant::InDtype::kFloat16
                                                           : quant::InDtype::kBFloat16;
  at::Tensor ws = at::empty({static_cast<int64_t>(quant::quantize_grouped_workspace_bytes(t, k, g))},
                            x_in.options().dtype(at::kByte));
  char err[kErrLen] = {0};
  TORCH_CHECK(quant::quantize_grouped_cuda(x.data_ptr(), dt, t, k, t > 1 ? x.stride(0) : k, offs.data_ptr<int32_t>(), g,
                                           input_scale.has_value() ? input_scale->data_ptr<float>() : nullptr, one_scale,
                                           weight_scale_2.has_value() ? weight_scale_2->data_ptr<float>() : nullptr,
                                           sfa_rows, ws.data_ptr(), packed.data_ptr<uint8_t>(),
                                           static_cast<uint8_t*>(sf.data_ptr()), scale.data_ptr<float>(),
                                           at::cuda::getCurrentCUDAStream(), err, kErrLen),
              "nvfp4_gemm.quantize_grouped (CUDA): ", err);
  return {packed, sf, scale};
}

// nvfp4_gemm::_grouped_linear: quantize_grouped(x, offs, input_scale, weight_scale_2, one_scale) and then grouped_mm of
// its NVFP4 rows with its alpha, bit for bit, as two launches back to back on the stream. The GEMM is told so
// (GroupedProblem::offs_ready): the quantization kernels wait for the kernels ahead of them before they let the next
// grid launch and write only A, its scales and alpha, so the GEMM may read offs and start streaming the weights while
// A is being quantized. Every argument is checked before anything is launched.
at::Tensor grouped_linear_cuda(const at::Tensor& x_in, const at::Tensor& b, const at::Tensor& sfb, const at::Tensor& offs,
                               const std::optional<at::Tensor>& input_scale, const at::Tensor& weight_scale_2,
                               std::optional<at::ScalarType> out_dtype, bool one_scale) {
  const int64_t rows = grouped_sfa_rows_worst(x_in.dim() == 2 ? x_in.size(0) : 0, offs.numel());
  check_quantize_grouped(x_in, offs, input_scale, weight_scale_2, rows, one_scale);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = kernel_rows(x_in);
  // x as the weight-only form's activations: b, sfb, offs and out_dtype under grouped_mm's rules
  const GroupedShape s = check_grouped_inputs(x, b, std::nullopt, sfb, offs, std::nullopt, out_dtype, nullptr,
                                              /*gpu_rules=*/true);
  const auto [packed, sfa, alpha] = quantize_grouped_cuda(x, offs, input_scale, weight_scale_2, rows, one_scale);
  const GroupedShape q = check_grouped_inputs(packed, b, sfa, sfb, offs, alpha, s.out_dtype, nullptr, /*gpu_rules=*/true);
  at::Tensor c = at::empty({q.t, q.n}, x.options().dtype(q.out_dtype));
  if (q.t > 0 && q.n > 0) grouped_into(q, packed, b, sfa, sfb, offs, alpha, c, /*offs_ready=*/true);
  return c;
}

// What grouped_mm would run for a problem of this shape on a device of SM version `sm` (132 SMs, an H100's shared
// memory), under the forcing in effect: the same choose() over the same tables, with nothing on a device (the
// operand pointers are placeholders that select / can_run only check for alignment). Returns the choice's line
// name ("sm90:<config>", "generic:..."), or throws grouped_mm's error.
std::string grouped_choice(int64_t sm, int64_t t, int64_t n, int64_t k, int64_t g, const std::string& a) {
  static const char* const kATypes[] = {"e2m1", "f16", "bf16", "f32"};
  int a_type = -1;
  for (int i = 0; i < 4; ++i)
    if (a == kATypes[i]) a_type = i;
  TORCH_CHECK(a_type >= 0, "nvfp4_gemm._grouped_choice: a must be e2m1, f16, bf16 or f32, got '", a, "'");
  TORCH_CHECK(sm > 0 && sm < 1000 && t >= 0 && n >= 8 && n % 8 == 0 && k >= 32 && k % 32 == 0 && g >= 1,
              "nvfp4_gemm._grouped_choice: needs 0 < sm < 1000, T >= 0, N >= 8 and K >= 32 multiples of 8 and 32, "
              "G >= 1; got sm ", sm, " T ", t, " N ", n, " K ", k, " G ", g);
  alignas(16) static const uint8_t kPlaceholder[16] = {};
  static const int64_t kASize[] = {0, 2, 2, 4};
  GroupedProblem p{};
  p.a = p.b = p.sfb = kPlaceholder;
  p.sfa = a_type == 0 ? kPlaceholder : nullptr;
  p.offs = reinterpret_cast<const int32_t*>(kPlaceholder);
  p.t = t;
  p.n = n;
  p.k = k;
  p.g = g;
  p.lda = a_type == 0 ? k / 2 : k * kASize[a_type];
  p.ldb = k / 2;
  p.b_group_bytes = n * p.ldb;
  p.ldc = n;
  p.sfa_rows = a_type == 0 ? grouped_sfa_rows_worst(t, g) : 0;
  p.out_dtype = OutDtype::kFloat16;
  p.a_type = static_cast<AType>(a_type);
  const DeviceInfo dev{static_cast<int32_t>(sm), 132, 232448, 0};
  return choice_name(choose(p, dev));
}

}  // namespace
}  // namespace nvfp4_gemm

// torch.ops.nvfp4_gemm._grouped_choice(sm, t, n, k, g, a): grouped_mm's dispatch decision without a device (above);
// for tests of the forcing rules on machines without the GPU.
TORCH_LIBRARY_FRAGMENT(nvfp4_gemm, m) {
  m.def("_grouped_choice(int sm, int t, int n, int k, int g, str a) -> str", &nvfp4_gemm::grouped_choice);
}

TORCH_LIBRARY_IMPL(nvfp4_gemm, CUDA, m) {
  m.impl("grouped_mm", &nvfp4_gemm::grouped_mm_cuda);
  m.impl("grouped_mm_out", &nvfp4_gemm::grouped_mm_out_cuda);
  m.impl("_quantize_grouped", &nvfp4_gemm::quantize_grouped_cuda);
  m.impl("_grouped_linear", &nvfp4_gemm::grouped_linear_cuda);
}
