"""NVFP4Linear (a drop-in inference nn.Linear on NVFP4 weights) and quantize_model.

A layer stores its weight W in NVFP4 (ModelOpt's buffers: `weight` packed [N, K/2] uint8, `weight_scale`
blocked e4m3, `weight_scale_2` the per-tensor DECODE scale amax(W) / 2688) and computes y = x @ W^T + b in
one of three modes:

  * weight-only (W4A16, `weight_only=True`): x stays in its dtype;
        y = mm(x, weight, None, weight_scale, alpha=weight_scale_2) + bias
    The mode serving stacks run on Hopper: only the weight is rounded, so it is the more accurate one, and
    at small batch it reads a quarter of fp16's weight bytes.
  * static W4A4 (an `input_scale` buffer, a DECODE scale amax / 2688 from calibration, as ModelOpt stores
    it): x is quantized with gs_x = 1 / input_scale; inputs beyond the calibrated amax saturate.
  * dynamic W4A4 (neither): gs_x = 2688 / amax of the finite elements of each call's x, computed on the
    device (one extra read of x, no host sync).
    W4A4:  y = mm(quantize(x, gs_x), weight, sf_x, weight_scale, alpha=(1 / gs_x) * weight_scale_2) + bias
    Both operands in NVFP4, as Blackwell's tensor cores run it (the numbers match those exactly).
  * dynamic per-block W4A4 (`block_scales_only=True`): per-call e4m3 block scales and NO per-tensor
    input scale, gs_x = 1: what compressed-tensors' `input_activations.dynamic: true` means. Its blocks
    saturate at amax 6 * 448 = 2688; a checkpoint saying so runs these numerics, not the per-tensor ones.

Every mode but the per-block one is one call of the native op `nvfp4_gemm.linear` (all the steps on x's
device, no host sync; CUDA-graph and torch.compile safe); the per-block one is `quantize` then `mm`. The bias joins the fp32 result before the one rounding to x's dtype.
Whether a layer is weight-only is a plain attribute (`weight_only`, not in the state_dict: the checkpoint
layout is ModelOpt's either way); static versus dynamic is decided by the presence of `input_scale`.
"""
from __future__ import annotations

import torch
from torch import nn

from . import methods
from ._scale_checks import block_scales_problem, decode_scale_problem
from .formats import blocked_shape, to_blocked
from .autograd import call_linear
from .ops import mm
from .quantize import global_encode_scale, quantize

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Buffers whose dtype is the storage format, not the compute precision: `.half()` and friends leave them.
_FORMAT_BUFFERS = ("weight", "weight_scale", "weight_scale_2", "input_scale")


def shape_supported(in_features: int, out_features: int) -> str | None:
    """None if the kernels take this layer (K % 32 == 0, N % 8 == 0), else why not."""
    if in_features <= 0 or in_features % 32 != 0:
        return f"in_features (K) must be a positive multiple of 32, got {in_features}"
    if out_features <= 0 or out_features % 8 != 0:
        return f"out_features (N) must be a positive multiple of 8, got {out_features}"
    return None


def check_method(method: str) -> None:
    """Raises ValueError unless `method` names a weight quantization method (nvfp4_gemm.methods.METHODS)."""
    if method not in methods.METHODS:
        raise ValueError(f"method must be one of {tuple(methods.METHODS)}, got {method!r}")


class NVFP4Linear(nn.Module):
    """y = x @ W^T + b with W stored in NVFP4 (module docstring for the three modes).

    Buffers (all in state_dict, ModelOpt's names): weight uint8 [N, K/2]; weight_scale float8_e4m3fn, flat
    128x4 blocked layout of [N, K/16]; weight_scale_2 float32 [1] (weight decode scale); input_scale float32
    [1] (input decode scale, static W4A4 only); bias [N], if any. The weight and scales are frozen: gradients
    reach x (straight through the activation quantization in W4A4) and a bias that requires grad
    (nvfp4_gemm.autograd); adapters train beside the layer (nvfp4_gemm.peft).

    x: [..., K] with at least 2 dims, float16, bfloat16 or float32, on the layer's device; y has x's leading
    dims and dtype. A float32 x in weight-only mode runs the weight-only mm in float32 (products exact, fp32
    accumulation): correct, but no faster than fp32 matmul; feed float16 / bfloat16 for speed.

    Casts: `.half()`, `.bfloat16()`, `.float()`, `.to(dtype)` change only the bias (the layer computes in
    x's dtype); the weight and scale buffers keep their formats (uint8, e4m3, float32). Device moves move
    them all.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        static_input_scale: bool = False,
        weight_only: bool = False,
        block_scales_only: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        why = shape_supported(in_features, out_features)
        if why:
            raise ValueError(f"NVFP4Linear: {why}")
        if weight_only and static_input_scale:
            raise ValueError("NVFP4Linear: a weight_only layer has no input scale; static_input_scale must be False")
        if block_scales_only and (weight_only or static_input_scale):
            raise ValueError("NVFP4Linear: block_scales_only is a dynamic W4A4 mode; weight_only and "
                             "static_input_scale must be False with it")
        self.in_features, self.out_features = in_features, out_features
        self.weight_only = bool(weight_only)
        self.block_scales_only = bool(block_scales_only)
        rp, cp = blocked_shape(out_features, in_features)
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.zeros(rp * cp, dtype=torch.float8_e4m3fn, device=device))
        self.register_buffer("weight_scale_2", torch.ones(1, dtype=torch.float32, device=device))
        self.register_buffer("input_scale", torch.ones(1, dtype=torch.float32, device=device) if static_input_scale else None)
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @property
    def static_input_scale(self) -> bool:
        return self.input_scale is not None

    def set_input_amax(self, amax: torch.Tensor | float | None) -> None:
        """Switch to a static input scale from a calibrated amax (decode scale amax / 2688), or back to dynamic
        scaling with None."""
        if amax is None:
            self.input_scale = None
            return
        if self.weight_only:
            raise ValueError("NVFP4Linear.set_input_amax: a weight_only layer does not quantize its input")
        amax = torch.as_tensor(amax, dtype=torch.float32, device=self.weight.device).reshape(1)
        self.input_scale = 1.0 / global_encode_scale(amax)
        self.block_scales_only = False

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        *,
        input_amax: torch.Tensor | float | None = None,
        weight_only: bool = False,
        method: str = "rtn",
        hessian: torch.Tensor | None = None,
        global_scale: torch.Tensor | None = None,
    ) -> "NVFP4Linear":
        """Quantizes linear.weight on its device; the bias keeps its dtype.

        input_amax: the largest |input| seen in calibration; makes the input scale static (W4A4 only).
        weight_only: activations stay float (W4A16); input_amax must then be None.
        method: how the weight is rounded, "rtn" (round to nearest with a per-tensor scale from the finite
            amax), "mse" or "gptq" (nvfp4_gemm.methods.quantize_weight); "gptq" needs `hessian`, the [K, K]
            float32 second moment of the layer's inputs (methods.HessianAccumulator); "mse" takes it (or its
            diagonal [K]) optionally and then weighs each input column's error by its diagonal entry.
        global_scale: a one-element per-tensor ENCODE scale to quantize with instead of the weight's own
            (layers fused into one GEMM share the one from their largest |w|); weight_scale_2 = 1 / it.
        """
        check_method(method)
        if weight_only and input_amax is not None:
            raise ValueError("NVFP4Linear.from_linear: input_amax sets a static input scale, which a weight_only "
                             "layer does not have; pass input_amax=None")
        w = linear.weight.detach()
        has_bias = linear.bias is not None
        layer = cls(linear.in_features, linear.out_features, bias=has_bias, weight_only=weight_only, device=w.device,
                    dtype=linear.bias.dtype if has_bias else torch.float32)
        layer._quantize_from(w, method=method, hessian=hessian, global_scale=global_scale)
        if has_bias:
            layer.bias.copy_(linear.bias.detach())
        layer.set_input_amax(input_amax)
        return layer

    def _quantize_from(self, w: torch.Tensor, *, method: str = "rtn", hessian: torch.Tensor | None = None,
                         global_scale: torch.Tensor | None = None) -> None:
        """Quantizes the float weight w [N, K] into this layer's weight, weight_scale and weight_scale_2 by
        `method` (nvfp4_gemm.methods.quantize_weight; from_linear documents the arguments). What from_linear
        and from_pretrained(quantize=True) both run."""
        kwargs = {} if hessian is None else {"hessian": hessian}
        if global_scale is not None:
            kwargs["global_scale"] = global_scale
        packed, sf, wscale2 = methods.quantize_weight(w if w.dtype in _OUT_DTYPES else w.float(), method, **kwargs)
        self.weight.copy_(packed)
        self.weight_scale.copy_(sf.reshape(-1))
        self.weight_scale_2.copy_(wscale2.reshape(1))

    @classmethod
    def from_modelopt(
        cls,
        state_dict: dict[str, torch.Tensor],
        prefix: str = "",
        *,
        device: torch.device | str | None = None,
        bias_dtype: torch.dtype | None = None,
        weight_only: bool = False,
    ) -> "NVFP4Linear":
        """Builds a layer from NVIDIA Model Optimizer's NVFP4 checkpoint tensors `<prefix>weight` (uint8
        [N, K/2], element 2i in the low nibble), `<prefix>weight_scale` (e4m3 [N, K/16], LINEAR layout: it is
        converted to the blocked layout here, once), `<prefix>weight_scale_2` (fp32 weight decode scale),
        optional `<prefix>input_scale` (fp32 input decode scale: makes the layer static W4A4) and
        `<prefix>bias`. weight_only=True builds a W4A16 layer and ignores any input_scale."""
        if prefix and not prefix.endswith("."):
            prefix += "."

        def get(name: str, required: bool = True) -> torch.Tensor | None:
            t = state_dict.get(prefix + name)
            if t is None and required:
                raise KeyError(f"NVFP4Linear.from_modelopt: state_dict has no '{prefix + name}' "
                               f"(keys with this prefix: {sorted(k for k in state_dict if k.startswith(prefix))[:8]})")
            return t

        weight, wscale, wscale2 = get("weight"), get("weight_scale"), get("weight_scale_2")
        input_scale, bias = get("input_scale", False), get("bias", False)
        if weight_only:
            input_scale = None
        if weight.dim() != 2 or weight.dtype not in (torch.uint8, torch.float4_e2m1fn_x2):
            raise ValueError(f"NVFP4Linear.from_modelopt: '{prefix}weight' must be packed NVFP4 uint8 [N, K/2], "
                             f"got {weight.dtype} {tuple(weight.shape)}")
        n, k = weight.shape[0], weight.shape[1] * 2
        if tuple(wscale.shape) != (n, k // 16) or wscale.dtype not in (torch.float8_e4m3fn, torch.uint8):
            raise ValueError(f"NVFP4Linear.from_modelopt: '{prefix}weight_scale' must be e4m3 [N, K/16] = [{n}, {k // 16}] "
                             f"in the linear layout, got {wscale.dtype} {tuple(wscale.shape)}")
        for name, t in (("weight_scale_2", wscale2), ("input_scale", input_scale)):
            if t is not None and t.numel() != 1:
                raise ValueError(f"NVFP4Linear.from_modelopt: '{prefix}{name}' must be one fp32 value, got shape {tuple(t.shape)}")
        for name, t in (("weight_scale_2", wscale2), ("input_scale", input_scale)):
            why = None if t is None else decode_scale_problem(t)
            if why:
                raise ValueError(f"NVFP4Linear.from_modelopt: '{prefix}{name}' (a decode scale) {why}")
        why = block_scales_problem(wscale)
        if why:
            raise ValueError(f"NVFP4Linear.from_modelopt: '{prefix}weight_scale' {why}")
        device = device if device is not None else weight.device
        layer = cls(k, n, bias=bias is not None, static_input_scale=input_scale is not None, weight_only=weight_only,
                    device=device, dtype=bias_dtype or (bias.dtype if bias is not None else torch.float32))
        layer.weight.copy_(weight.view(torch.uint8))
        layer.weight_scale.copy_(to_blocked(wscale.view(torch.float8_e4m3fn)))
        layer.weight_scale_2.copy_(wscale2.reshape(1).float())
        if input_scale is not None:
            layer.input_scale.copy_(input_scale.reshape(1).float())
        if bias is not None:
            layer.bias.copy_(bias)
        return layer

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # A saved static layer loads into a fresh (dynamic) one: the checkpoint decides the mode. A weight_only
        # layer keeps no input scale, so a strict load of one reports it as unexpected.
        if prefix + "input_scale" in state_dict and self.input_scale is None and not self.weight_only:
            self.input_scale = torch.ones(1, dtype=torch.float32, device=self.weight.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def _apply(self, fn, recurse=True):
        # Module.half() / .to(dtype) / .type() cast every floating buffer, e4m3 and fp32 scales included, and
        # .type() the uint8 weight too. The format buffers take fn's device change only; everything else (the
        # bias) follows fn. A zero-size probe finds what fn would do without casting the real buffer.
        kept = {name: self._buffers[name] for name in _FORMAT_BUFFERS if self._buffers.get(name) is not None}
        for name in kept:
            self._buffers[name] = None
        try:
            super()._apply(fn, recurse)
        finally:
            for name, t in kept.items():
                self._buffers[name] = t
        for name, t in kept.items():
            probe = fn(t.new_empty(0))
            self._buffers[name] = fn(t) if probe.dtype == t.dtype else t.to(probe.device)
        return self

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"NVFP4Linear: x must be [..., in_features] with at least 2 dims, got {x.dim()}-D shape "
                             f"{tuple(x.shape)} (x.unsqueeze(0) makes a batch of one)")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"NVFP4Linear: x.shape[-1] must be in_features = {self.in_features}, got {x.shape[-1]}")
        if x.dtype not in _OUT_DTYPES:
            raise ValueError(f"NVFP4Linear: x must be float16, bfloat16 or float32, got {x.dtype}")
        if x.device != self.weight.device:
            raise ValueError(f"NVFP4Linear: x must be on the layer's device {self.weight.device}, got {x.device}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Host time per call is the budget here (issue 12: no more than F.linear's). The op checks every
        # argument itself; the layer's own checks run only once it has refused, to say why in the layer's
        # terms (in_features, the layer's device). Buffers come from _buffers directly: Module.__getattr__
        # costs ~0.2-1 us per name. Measured before / after: docs/NOTES.md.
        b = self._buffers
        if self.block_scales_only:
            return self._forward_block_scales(x)
        try:
            args = (b["weight"], b["weight_scale"], b["weight_scale_2"], b["input_scale"], b["bias"])
        except KeyError:  # a buffer replaced by a parameter (layer.bias = nn.Parameter(...)) lives elsewhere
            args = (self.weight, self.weight_scale, self.weight_scale_2, self.input_scale, self.bias)
        try:
            return call_linear(x, *args, self.weight_only)
        except RuntimeError:
            self._check_input(x)
            raise

    def _forward_block_scales(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        if self.input_scale is not None:
            raise ValueError("NVFP4Linear: a block_scales_only layer has no input_scale (per-block scales only)")
        x2 = x.reshape(-1, self.in_features)
        packed, sf = quantize(x2.contiguous(), None)
        # fp32 result, bias in fp32, one rounding to x's dtype: the other modes' contract
        y = mm(packed, self.weight, sf, self.weight_scale, self.weight_scale_2, torch.float32)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        mode = "weight_only" if self.weight_only else "static" if self.input_scale is not None else \
            "dynamic_block" if self.block_scales_only else "dynamic"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"mode={mode}")
