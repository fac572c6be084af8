"""NVFP4Linear (a drop-in inference nn.Linear on NVFP4 weights) and quantize_model.

A layer computes y = x @ W^T + b as

    packed_x, sf_x = quantize(x, gs_x)                    gs_x: the input's ENCODE scale
    y = mm(packed_x, weight, sf_x, weight_scale, alpha=input_decode * weight_scale_2) + bias

where weight / weight_scale are the NVFP4 weight (packed [N, K/2] uint8, blocked e4m3 scales) and
weight_scale_2 the weight's per-tensor DECODE scale (amax(W) / 2688, ModelOpt's name and convention).
The input's per-tensor scale is either
  * static: the buffer `input_scale` (a DECODE scale, amax / 2688 from calibration, as ModelOpt stores
    it); gs_x = 1 / input_scale. Inputs beyond the calibrated amax saturate. No extra pass over x.
  * dynamic (no `input_scale` buffer): amax of the finite elements of each call's x, computed on the
    device (one extra read of x, no host sync); gs_x = 448 * 6 / amax.
Which one a layer uses is decided by whether it has an `input_scale` (constructor `static_input_scale`,
`from_linear(input_amax=...)`, a ModelOpt checkpoint carrying input_scale, or a loaded state_dict that
has one).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .formats import blocked_shape, to_blocked
from .ops import mm
from .quantize import finite_amax, global_encode_scale, quantize

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def shape_supported(in_features: int, out_features: int) -> str | None:
    """None if the kernels take this layer (K % 32 == 0, N % 8 == 0), else why not."""
    if in_features <= 0 or in_features % 32 != 0:
        return f"in_features (K) must be a positive multiple of 32, got {in_features}"
    if out_features <= 0 or out_features % 8 != 0:
        return f"out_features (N) must be a positive multiple of 8, got {out_features}"
    return None


class NVFP4Linear(nn.Module):
    """y = x @ W^T + b with W stored in NVFP4 and x quantized to NVFP4 on every call (module docstring).

    Buffers (all in state_dict): weight uint8 [N, K/2]; weight_scale float8_e4m3fn, flat 128x4 blocked
    layout of [N, K/16]; weight_scale_2 float32 [1] (weight decode scale); input_scale float32 [1] (input
    decode scale, static mode only); bias [N] in the layer's dtype, if any. Inference only (no autograd).
    Output dtype: x's (float16, bfloat16 or float32); any leading batch dims.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        static_input_scale: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        why = shape_supported(in_features, out_features)
        if why:
            raise ValueError(f"NVFP4Linear: {why}")
        self.in_features, self.out_features = in_features, out_features
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
        amax = torch.as_tensor(amax, dtype=torch.float32, device=self.weight.device).reshape(1)
        self.input_scale = 1.0 / global_encode_scale(amax)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, input_amax: torch.Tensor | float | None = None) -> "NVFP4Linear":
        """Quantizes linear.weight (per-tensor scale from its finite amax) on the weight's device; the bias
        is kept in its dtype. input_amax (from calibration) makes the input scale static."""
        w = linear.weight.detach()
        has_bias = linear.bias is not None
        layer = cls(linear.in_features, linear.out_features, bias=has_bias, device=w.device,
                    dtype=linear.bias.dtype if has_bias else torch.float32)
        gs_w = global_encode_scale(finite_amax(w))
        packed, sf = quantize(w if w.dtype in _OUT_DTYPES else w.float(), gs_w)
        layer.weight.copy_(packed)
        layer.weight_scale.copy_(sf)
        layer.weight_scale_2.copy_(1.0 / gs_w)
        if has_bias:
            layer.bias.copy_(linear.bias.detach())
        layer.set_input_amax(input_amax)
        return layer

    @classmethod
    def from_modelopt(
        cls,
        state_dict: dict[str, torch.Tensor],
        prefix: str = "",
        *,
        device: torch.device | str | None = None,
        bias_dtype: torch.dtype | None = None,
    ) -> "NVFP4Linear":
        """Builds a layer from NVIDIA Model Optimizer's NVFP4 checkpoint tensors `<prefix>weight` (uint8
        [N, K/2], element 2i in the low nibble), `<prefix>weight_scale` (e4m3 [N, K/16], LINEAR layout: it is
        converted to the blocked layout here, once), `<prefix>weight_scale_2` (fp32 weight decode scale),
        optional `<prefix>input_scale` (fp32 input decode scale: makes the layer static) and `<prefix>bias`."""
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
        device = device if device is not None else weight.device
        layer = cls(k, n, bias=bias is not None, static_input_scale=input_scale is not None, device=device,
                    dtype=bias_dtype or (bias.dtype if bias is not None else torch.float32))
        layer.weight.copy_(weight.view(torch.uint8))
        layer.weight_scale.copy_(to_blocked(wscale.view(torch.float8_e4m3fn)))
        layer.weight_scale_2.copy_(wscale2.reshape(1).float())
        if input_scale is not None:
            layer.input_scale.copy_(input_scale.reshape(1).float())
        if bias is not None:
            layer.bias.copy_(bias)
        return layer

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # A saved static layer loads into a fresh (dynamic) one: the checkpoint decides the mode.
        if prefix + "input_scale" in state_dict and self.input_scale is None:
            self.input_scale = torch.ones(1, dtype=torch.float32, device=self.weight.device)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"NVFP4Linear: x.shape[-1] must be in_features = {self.in_features}, got {x.shape[-1]}")
        if x.dtype not in _OUT_DTYPES:
            raise ValueError(f"NVFP4Linear: x must be float16, bfloat16 or float32, got {x.dtype}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.input_scale is not None:
            x_decode = self.input_scale
            x_encode = 1.0 / x_decode
        else:
            x_encode = global_encode_scale(finite_amax(x2))
            x_decode = 1.0 / x_encode
        packed, sf = quantize(x2, x_encode)
        alpha = x_decode * self.weight_scale_2
        if self.bias is None:
            out = mm(packed, self.weight, sf, self.weight_scale, alpha=alpha, out_dtype=x.dtype)
        else:
            # The bias joins the fp32 result before the one rounding to x's dtype: more accurate than two
            # roundings, and what torch.compile computes too (it drops intermediate low-precision casts).
            out = mm(packed, self.weight, sf, self.weight_scale, alpha=alpha, out_dtype=torch.float32)
            out = (out + self.bias.to(torch.float32)).to(x.dtype)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        mode = "static" if self.input_scale is not None else "dynamic"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_scale={mode}")


def quantize_model(
    model: nn.Module,
    filter: Callable[[str, nn.Linear], bool] | None = None,
    *,
    calibrate: Callable[[nn.Module], object] | None = None,
) -> nn.Module:
    """Replaces, in place, every nn.Linear of `model` that the kernels accept (K % 32 == 0, N % 8 == 0) and
    that filter(qualified_name, module) accepts (default: all) by NVFP4Linear.from_linear. Returns model.

    calibrate: optional callable run once as calibrate(model) on the unquantized model (under no_grad);
    each swapped layer then gets a static input scale from the largest finite |input| it saw. Without it,
    input scales are dynamic. Only exact nn.Linear instances are swapped: subclasses such as
    MultiheadAttention's out_proj are read through .weight by their owners and are left alone.
    """
    targets = [
        (name, mod)
        for name, mod in model.named_modules()
        if type(mod) is nn.Linear
        and shape_supported(mod.in_features, mod.out_features) is None
        and (filter is None or filter(name, mod))
    ]
    amax: dict[str, torch.Tensor] = {}
    if calibrate is not None:
        def hook(name):
            def record(_mod, args):
                a = finite_amax(args[0])
                amax[name] = torch.maximum(amax[name], a) if name in amax else a
            return record

        handles = [mod.register_forward_pre_hook(hook(name)) for name, mod in targets]
        try:
            with torch.no_grad():
                calibrate(model)
        finally:
            for h in handles:
                h.remove()
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, NVFP4Linear.from_linear(mod, input_amax=amax.get(name)))
    return model
