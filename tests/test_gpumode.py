"""The GPU MODE input tuple through nvfp4_gemm.gpumode.custom_kernel, built the way that harness builds it:
data as [L, rows, K/2] permuted to [rows, K/2, L]; scales as a contiguous (L, rb, sb, 32, 4, 4) buffer
permuted to the 6-D (32, 4, rb, 4, sb, L) view."""
from __future__ import annotations

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.formats import blocked_shape
from nvfp4_gemm.gpumode import custom_kernel
from nvfp4_gemm.testing import Case, case_seed, check_against_reference, make_inputs


def gpumode_tuple(m, n, k, batches, device):
    seed = case_seed(Case(m, n, k))
    per = [make_inputs(Case(m, n, k), device, seed=seed + l) for l in range(batches)]

    def data(key):  # [L, rows, K/2] -> [rows, K/2, L], float4_e2m1fn_x2
        return torch.stack([p[key] for p in per]).permute(1, 2, 0).view(torch.float4_e2m1fn_x2)

    def permuted(key, rows):
        rp, cp = blocked_shape(rows, k)
        blocked = torch.stack([p[key].view(torch.uint8) for p in per]).view(batches, rp // 128, cp // 4, 32, 4, 4)
        return blocked.permute(3, 4, 1, 5, 2, 0).view(torch.float8_e4m3fn)

    def linear(key, rows):
        return torch.stack([nvfp4_gemm.from_blocked(p[key], rows, k) for p in per]).permute(1, 2, 0)

    c = torch.full((m, n, batches), float("nan"), dtype=torch.float16, device=device)
    tup = (data("a"), data("b"), linear("sfa", m), linear("sfb", n), permuted("sfa", m), permuted("sfb", n), c)
    return tup, per


@pytest.mark.parametrize("m,n,k,batches", [(7, 64, 96, 1), (130, 128, 320, 1), (33, 72, 256, 2)])
def test_custom_kernel_matches_reference(backend, m, n, k, batches):
    _, device = backend
    tup, per = gpumode_tuple(m, n, k, batches, device)
    c = custom_kernel(tup)
    assert c.data_ptr() == tup[-1].data_ptr()
    for l, inputs in enumerate(per):
        check_against_reference(c[:, :, l], inputs, f"batch {l}, seed {case_seed(Case(m, n, k)) + l}")


def test_custom_kernel_rejects_mismatched_batches():
    tup, _ = gpumode_tuple(8, 16, 64, 1, "cpu")
    with pytest.raises(ValueError, match=r"c must have L = 1"):
        custom_kernel(tup[:-1] + (torch.zeros(8, 16, 2, dtype=torch.float16),))
