"""The public op: nvfp4_gemm.mm, i.e. torch.ops.nvfp4_gemm.mm, and its fake (meta) implementation."""
from __future__ import annotations

import torch


def mm(
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor,
    sfb: torch.Tensor,
    *,
    alpha: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """C[M, N] = alpha * (A * sfa) @ (B * sfb)^T for NVFP4 operands.

    Args:
        a: [M, K/2] packed e2m1 (torch.uint8 or torch.float4_e2m1fn_x2), K-major; element 2i of a row in
            the low nibble of byte i.
        b: [N, K/2] likewise (the weight, "TN" layout: C = A @ B^T).
        sfa, sfb: e4m3 scales (torch.float8_e4m3fn or torch.uint8), one per 16 K elements, in the 128x4
            blocked layout of SPEC.md, as a flat 1-D tensor (`to_blocked`), a 2-D [round_up(R,128),
            round_up(K/16,4)] tensor, or the 6-D permuted view (`permuted_view`). Nothing else is accepted.
        alpha: None (1) or a one-element float32 tensor on the inputs' device (read on the device, so CUDA
            graphs stay valid): the product of the two per-tensor global dequantization scales.
        out_dtype: torch.float16 (default), torch.bfloat16 or torch.float32.

    Rules: K a multiple of 32, N a multiple of 8, any M >= 0 (M = 0 gives an empty result). On CUDA, a and
    b rows must be 16-byte aligned with unit stride along K. Products are exact, accumulation is fp32 (or
    wider on the CPU), the result is rounded once to out_dtype, as torch._scaled_mm and CUTLASS's
    block-scaled SM100 GEMM do. Runs on the current CUDA stream; no host synchronization.
    """
    return torch.ops.nvfp4_gemm.mm.default(a, b, sfa, sfb, alpha=alpha, out_dtype=out_dtype)


@torch.library.register_fake("nvfp4_gemm::mm")
def _mm_fake(a, b, sfa, sfb, *, alpha=None, out_dtype=None):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "nvfp4_gemm.mm: a and b must be 2-D [rows, K/2]")
    torch._check(a.shape[1] == b.shape[1], lambda: f"nvfp4_gemm.mm: a and b must have the same K/2, got {a.shape[1]} and {b.shape[1]}")
    torch._check(b.shape[0] % 8 == 0, lambda: f"nvfp4_gemm.mm: N must be a multiple of 8, got {b.shape[0]}")
    torch._check(a.shape[1] % 16 == 0, lambda: f"nvfp4_gemm.mm: K must be a multiple of 32, got {a.shape[1] * 2}")
    dtype = out_dtype if out_dtype is not None else torch.float16
    torch._check(
        dtype in (torch.float16, torch.bfloat16, torch.float32),
        lambda: f"nvfp4_gemm.mm: out_dtype must be float16, bfloat16 or float32, got {dtype}",
    )
    return a.new_empty((a.shape[0], b.shape[0]), dtype=dtype)
