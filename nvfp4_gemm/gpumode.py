"""Adapter for the GPU MODE nvfp4_gemm problem's input tuple (docs/CONTRACT.md, last section).

    from nvfp4_gemm.gpumode import custom_kernel
    c = custom_kernel((a, b, sfa, sfb, sfa_permuted, sfb_permuted, c))

a [M, K/2, L] and b [N, K/2, L] float4_e2m1fn_x2 (K-major), sfa / sfb [rows, K/16, L] linear e4m3 (unused
here: the kernels read the blocked copies), sfa_permuted / sfb_permuted the 6-D (32, 4, ceil(R/128), 4,
ceil(K/64), L) views of blocked buffers, c [M, N, L] fp16, filled and returned. Each of the L batch
entries is one mm call reading the caller's buffers in place; with L > 1 a batch entry of a or b has
stride L along K, which the GPU kernels cannot read, so it is copied first. With L = 1 the result is
written into c in place (mm's out=), no copy.
"""
from __future__ import annotations

import torch

from .ops import mm


def custom_kernel(data: tuple) -> torch.Tensor:
    a, b, _sfa, _sfb, sfa_permuted, sfb_permuted, c = data
    for name, t, dims in (("a", a, 3), ("b", b, 3), ("c", c, 3), ("sfa_permuted", sfa_permuted, 6),
                          ("sfb_permuted", sfb_permuted, 6)):
        if t.dim() != dims:
            raise ValueError(f"gpumode.custom_kernel: {name} must be {dims}-D, got shape {tuple(t.shape)}")
    batches = a.shape[2]
    for name, t in (("b", b), ("c", c), ("sfa_permuted", sfa_permuted), ("sfb_permuted", sfb_permuted)):
        if t.shape[-1] != batches:
            raise ValueError(f"gpumode.custom_kernel: {name} must have L = {batches} (a's last dim), got shape "
                             f"{tuple(t.shape)}")
    for l in range(batches):
        a_l, b_l = a[:, :, l], b[:, :, l]
        if batches > 1:
            a_l, b_l = a_l.contiguous(), b_l.contiguous()
        # [..., l:l+1] keeps each scale view 6-D with L = 1, the permuted view mm accepts. With L = 1 the
        # result goes straight into c; a batch entry of c with L > 1 has stride L along N, which the GPU
        # kernels cannot write, so it is filled from a temporary.
        sfa_l, sfb_l = sfa_permuted[..., l:l + 1], sfb_permuted[..., l:l + 1]
        if batches == 1:
            mm(a_l, b_l, sfa_l, sfb_l, out=c[:, :, 0])
        else:
            c[:, :, l].copy_(mm(a_l, b_l, sfa_l, sfb_l, out_dtype=c.dtype))
    return c
