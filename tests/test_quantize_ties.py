"""Which runtime activation quantizer nvfp4_gemm.quantize is bit-equal to, on values that land on e2m1
rounding midpoints (docs/QUANTIZE.md, "Rounding ties and the serving quantizers").

The serving stacks that feed Blackwell's FP4 GEMMs (vLLM's scaled_fp4_quant, FlashInfer's and
TensorRT-LLM's fp4_quantize) quantize a 16-element block of fp16 / bf16 values with global encode scale gs as:

    sf    = gs * (vecmax * rcp(6))                     fp32, each product rounded
    s8    = e4m3(sf)                                   round to nearest even, saturating
    scale = s8 != 0 ? rcp(s8 * rcp(gs)) : 0            a reciprocal, applied as a multiplier
    code  = e2m1_rn_satfinite(x * scale)               cvt.rn.satfinite.e2m1x2.f32: ties to even

where rcp is the PTX instruction rcp.approx.ftz.f32. `serving_quantize` below transcribes that arithmetic
in PyTorch, with rcp taken as the correctly rounded fp32 reciprocal with subnormals flushed to zero (the
instruction's result for powers of two; for other operands the PTX manual bounds it by one ulp, and this
CPU test cannot run it: the kernels use cvt...e2m1x2, which needs an SM100 GPU). compressed-tensors' and
ModelOpt's fake quantization instead divide: x / (s8 / gs).
"""
from __future__ import annotations

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.formats import from_blocked, unpack_e2m1

E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
FLT_MIN = 2.0**-126


def _ftz(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v.abs() < FLT_MIN, torch.zeros_like(v), v)


def rcp(v: torch.Tensor) -> torch.Tensor:
    """rcp.approx.ftz.f32, modeled as fl(1 / v) with subnormal inputs and results flushed to zero."""
    return _ftz(1.0 / _ftz(v))


def e2m1_rne(q: torch.Tensor) -> torch.Tensor:
    """|q| (fp32) -> e2m1 magnitude code, nearest with ties to the even code, saturating at 6 (code 7)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    d = (q.double().abs().clamp(max=6.0).unsqueeze(-1) - grid).abs()
    best = d.amin(-1, keepdim=True)
    tied = (d == best)
    # of the (at most two) nearest, the even code (codes 0, 2, 4, 6 are the even mantissas)
    even = tied & (torch.arange(8) % 2 == 0)
    return torch.where(even.any(-1), even.float().argmax(-1), tied.float().argmax(-1)).to(torch.uint8)


def serving_quantize(x: torch.Tensor, gs: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The serving quantizers' arithmetic (module docstring): x [R, K] fp16 / bf16 -> (codes [R, K] uint8 with
    the sign in bit 3, e4m3 scales [R, K/16] as uint8)."""
    r, k = x.shape
    xf = x.float().reshape(r, k // 16, 16)
    g = torch.tensor(gs, dtype=torch.float32)
    vecmax = xf.abs().amax(-1)
    sf = g * (vecmax * rcp(torch.tensor(6.0)))
    s8 = sf.clamp(max=448.0).to(torch.float8_e4m3fn)
    s8f = s8.float()
    scale = torch.where(s8f != 0, rcp(s8f * rcp(g)), torch.zeros_like(s8f))
    q = xf * scale.unsqueeze(-1)
    codes = e2m1_rne(q) | (torch.signbit(xf).to(torch.uint8) << 3)
    return codes.reshape(r, k), s8.view(torch.uint8)


def dividing_quantize(x: torch.Tensor, gs: float) -> torch.Tensor:
    """compressed-tensors' / ModelOpt's value step: x / fl(s8 / gs), with our block scales (codes only)."""
    r, k = x.shape
    xf = x.float().reshape(r, k // 16, 16)
    g = torch.tensor(gs, dtype=torch.float32)
    s8 = (xf.abs().amax(-1) / 6.0 * g).clamp(max=448.0).to(torch.float8_e4m3fn).float()
    q = torch.where(s8.unsqueeze(-1) > 0, xf / (s8 / g).unsqueeze(-1), torch.zeros_like(xf))
    return (e2m1_rne(q) | (torch.signbit(xf).to(torch.uint8) << 3)).reshape(r, k)


def ours(x: torch.Tensor, gs: float) -> tuple[torch.Tensor, torch.Tensor]:
    packed, sf = nvfp4_gemm.quantize(x, gs)
    return unpack_e2m1(packed), from_blocked(sf, x.shape[0], x.shape[1]).view(torch.uint8)


def midpoint_blocks(dtype: torch.dtype, gs: float, seed: int) -> torch.Tensor:
    """Rows of 16-element blocks whose amax is 6 * s8 / gs (so the block scale is exactly the e4m3 value s8)
    and whose other elements are e2m1 midpoints times s8 / gs: every x * gs / s8 is exactly a midpoint.
    s8 runs over every normal e4m3 value with 1-3 mantissa bits set in a modest range."""
    g = torch.Generator().manual_seed(seed)
    s8_values = torch.tensor([m * 2.0**e for e in range(-6, 4) for m in (1.0, 1.125, 1.25, 1.375, 1.5, 1.625,
                                                                         1.75, 1.875)])
    mids = torch.tensor(E2M1_MIDPOINTS)
    blocks = []
    for s8 in s8_values:
        vals = mids[torch.randint(0, len(mids), (16,), generator=g)]
        vals[torch.randint(0, 16, (1,), generator=g)] = 6.0  # the amax: 6 * s8
        signs = torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0)
        blocks.append(vals * signs * s8 / gs)
    x = torch.stack(blocks).reshape(-1, 64)
    if dtype != torch.float32:
        assert torch.equal(x.to(dtype).double(), x.double()), "the constructed values must be exact in the dtype"
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gs", [1.0, 2.0**-3, 2.0**5])
def test_bit_equal_to_the_serving_quantizers_on_midpoints(dtype, gs):
    """With a power-of-two global scale (1: compressed-tensors' dynamic=true, our block_scales_only), our codes
    and scales are the serving quantizers' bit for bit, on values that all sit on e2m1 midpoints; the
    dividing recipe rounds many of those the other way (so the comparison can tell them apart)."""
    x = midpoint_blocks(dtype, gs, seed=int(gs * 8) + (dtype == torch.float16))
    codes, sf = ours(x, gs)
    want_codes, want_sf = serving_quantize(x, gs)
    assert torch.equal(sf, want_sf)
    assert torch.equal(codes, want_codes), f"{int((codes != want_codes).sum())} codes differ from the serving recipe"
    divided = dividing_quantize(x, gs)
    flipped = int((divided != codes).sum())
    assert flipped > 0, "the midpoint data must separate dividing from reciprocal-multiplying"
    print(f"{dtype} gs={gs}: {x.numel()} midpoint values, serving recipe identical, dividing recipe {flipped} differ")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_general_global_scale_differs_only_at_ties(dtype):
    """With a general global scale the two reciprocals differ (ours fl(gs / s8), one rounding; theirs
    rcp(s8 * rcp(gs)), two), and so may the block scale (amax / 6 versus amax * rcp(6)): codes then differ
    only where x * gs / s8 lies within float32 noise of an e2m1 midpoint, scales only at e4m3 midpoints."""
    g = torch.Generator().manual_seed(3)
    gs = 2688.0 / 23.71875  # a per-tensor amax of 23.71875, as a static input scale would be
    rows = [midpoint_blocks(torch.float32, gs, seed=5)]  # midpoints for this gs, then rounded to the dtype
    rows.append(torch.randn(256, 64, generator=g) * torch.exp2(torch.randint(-4, 4, (256, 1), generator=g).float()))
    x = torch.cat(rows).to(dtype)
    codes, sf = ours(x, gs)
    want_codes, want_sf = serving_quantize(x, gs)
    same_scale = (sf == want_sf).repeat_interleave(16, dim=1)
    q = x.double().abs() * gs / sf.view(torch.float8_e4m3fn).double().repeat_interleave(16, dim=1)
    near = ((q.unsqueeze(-1) - torch.tensor(E2M1_MIDPOINTS, dtype=torch.float64)).abs()
            <= 2.0**-21 * q.unsqueeze(-1)).any(-1)
    off = (codes != want_codes) & same_scale
    assert bool(near[off].all()), "codes differ away from an e2m1 midpoint"
    print(f"{dtype} gs={gs:.6g}: {int((sf != want_sf).sum())} of {sf.numel()} block scales and {int(off.sum())} of "
          f"{x.numel()} codes differ from the serving recipe (all at midpoints); "
          f"{int(near.sum())} values at midpoints")
