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

from .formats import dequantize

# The exact decode op (csrc), and the device types it runs on.
_DECODE_OP = torch.ops.nvfp4_gemm._decode.default
_DECODE_OP_DEVICES = ("cpu", "cuda", "meta")


def decode_weight(weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, K/2] packed e2m1 + blocked e4m3 scales (any view mm accepts) -> [N, K] decoded values in `dtype`
    (float16, bfloat16 or float32: every e2m1 * e4m3 product is exact in each), without the per-tensor
    scale: the same numbers as `formats.dequantize`, bit for bit. On the devices the op nvfp4_gemm::_decode
    has kernels for (CPU, CUDA; meta and fake tensors through its fake), that op: one output tensor and no
    other temporary (on CUDA a packed view the kernel cannot read in place, one with a stride along K or rows
    not 8 bytes apart, is first copied contiguous); elsewhere formats.dequantize (the forward has no kernel
    there either)."""
    if weight.device.type in _DECODE_OP_DEVICES:
        return _DECODE_OP(weight, weight_scale, dtype)
    return dequantize(weight, weight_scale, weight.shape[1] * 2, dtype)


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


# Bound once: resolving torch.ops.nvfp4_gemm.linear.default attribute by attribute costs ~1 us of host time
# per call, and NVFP4Linear.forward issues one per layer.
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
