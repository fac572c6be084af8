"""Autograd for nvfp4_gemm.linear and the weight-only nvfp4_gemm.mm: gradients reach the activations (and a
bias) through a frozen NVFP4 weight, which is what adapter training (LoRA) on an NVFP4 model needs.

With W the decoded weight (e2m1 * e4m3 block scale, exact) and alpha its per-tensor decode scale
(`weight_scale_2` for linear, the `alpha` argument for mm), for y = x @ (alpha * W)^T (+ bias):

    dx    = round_to(x.dtype, alpha * (dy @ W))      fp32 accumulation, alpha applied in fp32, one rounding
    dbias = round_to(bias.dtype, sum of dy over every leading dim)   (summed in fp32)

W is decoded from the layer's own buffers at each backward by the registered op nvfp4_gemm::_decode (on
CUDA the generic GEMM path's decode kernel: the packed bytes and scales read once, W written once; on the
CPU the CPU backend's decoder), transient: memory is bounded by the one decoded copy of W in the GEMM's
operand dtype, which the GEMM needs whole. Then one GEMM: on CUDA, W in dy's float16 / bfloat16 (exact) and
`torch.mm(..., out_dtype=float32)`; elsewhere W in float32 and an fp32 matmul. No host sync, CUDA-graph and
torch.compile safe (the op has a fake implementation).

W4A4 (static or dynamic input scale): the forward quantizes x to NVFP4 before the GEMM; the backward
passes the gradient straight through that quantization (the straight-through estimator: d x_q / d x is
taken as the identity, saturation at a static scale included), so dx is the weight-only formula above
with the same W and weight_scale_2. The input's own scale (input_scale, or the dynamic amax) gets no
gradient.

The packed weight and every scale (weight, weight_scale, weight_scale_2, input_scale; mm's b, sfa, sfb,
alpha; a packed `a`) are frozen buffers: a forward with any of them requiring grad raises a RuntimeError
naming it. `nvfp4_gemm.mm(..., out=)` (the mutating mm_out) does not record a graph: with an input that
requires grad it raises instead of leaving the gradient silently None.

Host time: the registered autograd kernel is Python (~5-15 us a call). NVFP4Linear.forward and nvfp4_gemm.mm
go straight to the device kernel when no gradient is asked for (call_linear, call_mm), so inference pays
~1 us for the check and nothing more.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .formats import SF_VEC, from_blocked

# The exact decode op (csrc), and the device types it runs on.
_DECODE_OP = torch.ops.nvfp4_gemm._decode.default
_DECODE_OP_DEVICES = ("cpu", "cuda", "meta")
# decode_weight_torch: values decoded per chunk, bounding the transient int32 index (2^24 values: 32 MiB).
_DECODE_CHUNK = 1 << 24
_PAIR_LUTS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


# The word type holding a pair of decoded values, per value dtype: the table is gathered as one word per byte.
_PAIR_WORD = {torch.float16: torch.int32, torch.bfloat16: torch.int32, torch.float32: torch.int64}


def _make_pair_lut(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256] words: a packed byte -> (value of its low nibble, value of its high nibble) in `dtype`, as one
    word, built on the device from the bit formula (no host-to-device copy: capturable in a CUDA graph)."""
    byte = torch.arange(256, dtype=torch.int32, device=device)
    codes = torch.stack((byte & 0xF, byte >> 4), dim=-1)
    mag, exp = (codes & 1).to(torch.float32), ((codes >> 1) & 3).to(torch.float32)
    # e2m1: exponent 0 is the subnormal m * 0.5; else (1 + m / 2) * 2^(e - 1) = (2 + m) * 2^(e - 2).
    value = torch.where(exp == 0, mag * 0.5, (2.0 + mag) * torch.exp2(exp - 2.0))
    value = torch.where(codes >= 8, -value, value)  # code 8 is -0.0
    return value.to(dtype).view(_PAIR_WORD[dtype]).reshape(256)


def _pair_lut(device: torch.device, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    # Cached only when built eagerly from real tensors: under tracing (torch.compile, fake or functional
    # tensors, a dispatch mode) it is part of the graph, and under CUDA-graph capture its kernels would not
    # have run yet when a later eager call read it.
    if (type(like) is not torch.Tensor or torch.compiler.is_compiling()
            or _get_current_dispatch_mode() is not None
            or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())):
        return _make_pair_lut(device, dtype)
    key = (device, dtype)
    lut = _PAIR_LUTS.get(key)
    if lut is None:
        lut = _PAIR_LUTS[key] = _make_pair_lut(device, dtype)
    return lut


def decode_weight(weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, K/2] packed e2m1 + blocked e4m3 scales (any view mm accepts) -> [N, K] decoded values in `dtype`
    (float16, bfloat16 or float32: every e2m1 * e4m3 product is exact in each), without the per-tensor
    scale: the same numbers as `formats.dequantize`, bit for bit. On the devices the op nvfp4_gemm::_decode
    has kernels for (CPU, CUDA; meta and fake tensors through its fake), that op: one output tensor and no
    other temporary (on CUDA a packed view the kernel cannot read in place, one with a stride along K or rows
    not 8 bytes apart, is first copied contiguous); elsewhere decode_weight_torch."""
    if weight.device.type in _DECODE_OP_DEVICES:
        return _DECODE_OP(weight, weight_scale, dtype)
    return decode_weight_torch(weight, weight_scale, dtype)


def decode_weight_torch(weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """decode_weight in plain PyTorch ops, for any device: per row chunk, the bytes widened to int32 indices,
    one gather of value pairs straight into the output, one in-place scale (memory: the output plus one
    chunk's index, _DECODE_CHUNK values; ~20 bytes of traffic per packed byte against the kernel's ~5)."""
    n, k = weight.shape[0], weight.shape[1] * 2
    scales = from_blocked(weight_scale, n, k).view(torch.float8_e4m3fn).to(dtype)  # [N, K/16]
    out = torch.empty((n, k), dtype=dtype, device=weight.device)
    words = out.view(_PAIR_WORD[dtype])  # [N, K/2]: one word per packed byte
    lut = _pair_lut(weight.device, dtype, weight)
    packed = weight.view(torch.uint8)
    step = max(1, _DECODE_CHUNK // max(k, 1))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        torch.index_select(lut, 0, packed[r0:r1].reshape(-1).to(torch.int32), out=words[r0:r1].view(-1))
        # In place in `dtype`: e2m1 (2 significant bits) * e4m3 (4) fits float16's and bfloat16's 11 / 8 bits.
        out[r0:r1].view(r1 - r0, k // SF_VEC, SF_VEC).mul_(scales[r0:r1].unsqueeze(-1))
    return out


def grad_input(dy: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, alpha: torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor:
    """alpha * dy[M, N] @ W[N, K] with fp32 accumulation, rounded once to `dtype`."""
    if dy.device.type == "cuda" and dy.dtype in (torch.float16, torch.bfloat16):
        acc = torch.mm(dy, decode_weight(weight, weight_scale, dy.dtype), out_dtype=torch.float32)
    else:
        acc = torch.mm(dy.to(torch.float32), decode_weight(weight, weight_scale, torch.float32))
    if alpha is None:
        return acc.to(dtype)
    # The fp32 product rounded to `dtype` as it is stored: one pass over the fp32 result instead of two (a
    # multiply into a second fp32 tensor, then a cast); the same bits (TensorIterator multiplies in fp32,
    # the common dtype, and rounds on the store).
    out = torch.empty(acc.shape, dtype=dtype, device=acc.device)
    return torch.mul(acc, alpha.reshape(()).to(torch.float32), out=out)


def _refuse_frozen(op: str, named: tuple[tuple[str, torch.Tensor | None], ...]) -> None:
    for name, t in named:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(
                f"{op}: {name} requires grad, but it is a frozen NVFP4 buffer (packed weight and scales get no "
                f"gradient; train an adapter such as LoRA beside the layer instead); call {name}.requires_grad_(False)"
                f" or pass {name}.detach()")


# ---- nvfp4_gemm::linear ----------------------------------------------------------------------------------

def _linear_setup_context(ctx, inputs, output):
    x, weight, weight_scale, weight_scale_2, input_scale, bias, _weight_only = inputs
    _refuse_frozen("nvfp4_gemm.linear", (("weight", weight), ("weight_scale", weight_scale),
                                         ("weight_scale_2", weight_scale_2), ("input_scale", input_scale)))
    ctx.save_for_backward(weight, weight_scale, weight_scale_2)
    ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _linear_backward(ctx, dy):
    weight, weight_scale, weight_scale_2 = ctx.saved_tensors
    # One gradient per argument the call passed: the dispatcher drops trailing ones left at their defaults.
    needs = ctx.needs_input_grad
    grads = [None] * len(needs)
    dy2 = dy.reshape(-1, weight.shape[0])
    if needs[0]:
        grads[0] = grad_input(dy2, weight, weight_scale, weight_scale_2, ctx.x_dtype).view(ctx.x_shape)
    if len(needs) > 5 and needs[5]:
        grads[5] = dy2.sum(dim=0, dtype=torch.float32).to(ctx.bias_dtype)
    return tuple(grads)


# ---- nvfp4_gemm::mm (weight-only form: a float) -----------------------------------------------------------

def _mm_setup_context(ctx, inputs, output):
    a, b, sfa, sfb, alpha, _out_dtype = inputs
    named = (("b", b), ("sfa", sfa), ("sfb", sfb), ("alpha", alpha))
    if sfa is not None:  # W4A4: a is packed NVFP4 too
        named = (("a (packed NVFP4)", a),) + named
    _refuse_frozen("nvfp4_gemm.mm", named)
    ctx.save_for_backward(b, sfb, alpha)
    ctx.a_dtype = a.dtype


def _mm_backward(ctx, dout):
    b, sfb, alpha = ctx.saved_tensors
    grads = [None] * len(ctx.needs_input_grad)
    if ctx.needs_input_grad[0]:
        grads[0] = grad_input(dout, b, sfb, alpha, ctx.a_dtype)
    return tuple(grads)


_LINEAR_OP = torch.ops.nvfp4_gemm.linear.default
_MM_OP = torch.ops.nvfp4_gemm.mm.default
_below_autograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad


def refuse_out_with_grad(a, b, sfa, sfb, alpha, out) -> None:
    """nvfp4_gemm.mm(out=...) with an input that requires grad: an op writing into `out` records no graph, so
    the gradient would silently be None; say so instead."""
    if not torch.is_grad_enabled():
        return
    if torch.compiler.is_compiling():  # dynamo cannot trace _any_requires_grad; the attribute it can
        needs = any(isinstance(t, torch.Tensor) and t.requires_grad for t in (a, b, sfa, sfb, alpha, out))
    else:
        needs = _any_requires_grad(a, b, sfa, sfb, alpha, out)
    if needs:
        raise RuntimeError("nvfp4_gemm.mm(out=...): writing into `out` does not support autograd, and an input "
                           "requires grad; call nvfp4_gemm.mm without out= (its weight-only form has a backward)")


def call_mm(a, b, sfa, sfb, alpha, out_dtype):
    """nvfp4_gemm::mm past the (Python) autograd kernel when no gradient is asked for (as call_linear)."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and _any_requires_grad(a, b, sfa, sfb, alpha)):
        return _MM_OP(a, b, sfa, sfb, alpha, out_dtype)
    with _below_autograd():
        return _MM_OP(a, b, sfa, sfb, alpha, out_dtype)


def call_linear(x, weight, weight_scale, weight_scale_2, input_scale, bias, weight_only):
    """nvfp4_gemm::linear for NVFP4Linear.forward. When no gradient is asked for (no_grad, or nothing requires
    grad) it goes straight to the device kernel: the registered autograd kernel is Python, and passing
    through it costs ~5-10 us of host time per call (issue 12's budget is F.linear's). Compiled code takes
    the op as it is (the compiler removes the autograd layer itself)."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and _any_requires_grad(
            x, weight, weight_scale, weight_scale_2, input_scale, bias)):
        return _LINEAR_OP(x, weight, weight_scale, weight_scale_2, input_scale, bias, weight_only)
    with _below_autograd():
        return _LINEAR_OP(x, weight, weight_scale, weight_scale_2, input_scale, bias, weight_only)


torch.library.register_autograd("nvfp4_gemm::linear", _linear_backward, setup_context=_linear_setup_context)
torch.library.register_autograd("nvfp4_gemm::mm", _mm_backward, setup_context=_mm_setup_context)
