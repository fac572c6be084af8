"""reference_mm: the source of truth every test compares against (pure PyTorch, float64)."""
from __future__ import annotations

import torch

from .formats import dequantize


def _operand_a(a: torch.Tensor, sfa: torch.Tensor | None, k: int) -> torch.Tensor:
    """A in float64 on the CPU: decoded NVFP4, or the weight-only activations as they are (exact)."""
    if sfa is None:
        return a.detach().cpu().to(torch.float64)
    return dequantize(a.cpu(), sfa.cpu(), k, torch.float64)


def reference_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor | None,
    sfb: torch.Tensor,
    alpha: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """alpha * (A * sfa) @ (B * sfb)^T with float64 decode and accumulation, on the CPU. With sfa=None, a is
    float activations [M, K] (the weight-only form) and out_dtype defaults to a's dtype, else to float16.

    The float64 sum is exact to well below any output dtype's rounding (K * 2688^2 < 2^53 * 2^-30 is far
    from mattering); the result is rounded to `out_dtype` via float32 (PyTorch's conversion), which can
    differ from a single rounding only in rare ties, far inside docs/CONTRACT.md's bound. Returned on a's device.
    """
    k = b.shape[1] * 2
    if out_dtype is None:
        out_dtype = a.dtype if sfa is None else torch.float16
    ad = _operand_a(a, sfa, k)
    bd = dequantize(b.cpu(), sfb.cpu(), k, torch.float64)
    out = ad @ bd.T
    if alpha is not None:
        out = out * alpha.detach().cpu().to(torch.float64).reshape(())
    return out.to(out_dtype).to(a.device)


def abs_product_sum(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor | None, sfb: torch.Tensor) -> torch.Tensor:
    """sum_k |a_k * b_k| per output element (float64, CPU): the scale of fp32 accumulation error."""
    k = b.shape[1] * 2
    ad = _operand_a(a, sfa, k).abs()
    bd = dequantize(b.cpu(), sfb.cpu(), k, torch.float64).abs()
    return ad @ bd.T
