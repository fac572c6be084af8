"""reference_mm: the source of truth every test compares against (pure PyTorch, float64)."""
from __future__ import annotations

import torch

from .formats import dequantize


def reference_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    *,
    alpha: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """alpha * (A * sfa) @ (B * sfb)^T with float64 decode and accumulation, on the CPU.

    The float64 sum is exact to well below any output dtype's rounding (K * 2688^2 < 2^53 * 2^-30 is far
    from mattering); the result is rounded to `out_dtype` via float32 (PyTorch's conversion), which can
    differ from a single rounding only in rare ties, far inside SPEC.md's bound. Returned on a's device.
    """
    k = a.shape[1] * 2
    ad = dequantize(a.cpu(), sfa.cpu(), k, torch.float64)
    bd = dequantize(b.cpu(), sfb.cpu(), k, torch.float64)
    out = ad @ bd.T
    if alpha is not None:
        out = out * alpha.detach().cpu().to(torch.float64).reshape(())
    return out.to(out_dtype).to(a.device)


def abs_product_sum(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """sum_k |a_k * b_k| per output element (float64, CPU): the scale of fp32 accumulation error."""
    k = a.shape[1] * 2
    ad = dequantize(a.cpu(), sfa.cpu(), k, torch.float64).abs()
    bd = dequantize(b.cpu(), sfb.cpu(), k, torch.float64).abs()
    return ad @ bd.T
