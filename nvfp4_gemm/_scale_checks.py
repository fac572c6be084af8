"""The value checks every way into an NVFP4Linear shares: the checkpoint loader, save_pretrained and the
layer constructors (NVFP4Linear.from_modelopt). Each returns None for a good value, else why not, and
the caller raises its own error naming the file / tensor / argument (as nn.shape_supported does).

A per-tensor DECODE scale (weight_scale_2, input_scale) must be a finite, positive, normal float32: the
layer multiplies by it (alpha) and, for W4A4, divides by it (the input's encode scale), so a NaN, an inf,
a zero or a subnormal (whose reciprocal overflows) makes every output NaN or inf. The checks apply to the
value after every conversion (compressed-tensors stores the ENCODE scale g; 1 / g is what is checked).
Block scales (e4m3) must not be NaN (byte 0x7F / 0xFF: the whole block decodes to NaN) or negative (the
block's signs flip); zero is a valid scale (an all-zero block).
"""
from __future__ import annotations

import torch

_MIN_NORMAL = torch.finfo(torch.float32).tiny


def decode_scale_problem(t: torch.Tensor) -> str | None:
    """None if t is one finite, positive, normal float32 decode scale, else why not."""
    if t.numel() != 1:
        return f"must hold one value, got shape {list(t.shape)}"
    v = float(t.detach().reshape(()).to("cpu", torch.float32))
    if not v == v or v in (float("inf"), float("-inf")):
        return f"must be finite, got {v}"
    if v <= 0.0:
        return f"must be positive, got {v}"
    if v < _MIN_NORMAL:
        return f"must be a normal float32 (>= {_MIN_NORMAL:.3g}; its reciprocal overflows), got {v:.3g}"
    return None


def block_scales_problem(t: torch.Tensor) -> str | None:
    """None if no e4m3 block scale in t (float8_e4m3fn or its uint8 bytes, any shape) is NaN or negative."""
    b = t.detach().view(torch.uint8) if t.dtype != torch.uint8 else t.detach()
    mag = b & 0x7F
    nan = int((mag == 0x7F).sum())
    if nan:
        return f"holds {nan} NaN block scale(s) (e4m3 byte 0x7F / 0xFF): those blocks would decode to NaN"
    neg = int(((b & 0x80) != 0).logical_and(mag != 0).sum())
    if neg:
        return f"holds {neg} negative block scale(s): the scales are magnitudes"
    return None
