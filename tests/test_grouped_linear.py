"""nvfp4_gemm.grouped_linear: the grouped form of `linear` (weight-only, static W4A4, dynamic W4A4).

Each mode is held bit for bit to the calls it stands for (grouped_mm on the activations; quantize_grouped followed by
grouped_mm with its alpha), on every device here. On CUDA the W4A4 forms launch the GEMM behind the quantization with
the promise that lets it stream its weights before A is written (GroupedProblem::offs_ready): its choice line says so,
and on Hopper each K-sliced config is held to the two separate calls forced onto the same config. Outputs are poisoned
before each call.
"""
from __future__ import annotations

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.grouped import grouped_backends
from nvfp4_gemm.testing import forced, recorded_choices
from nvfp4_gemm.testing_grouped import GroupedCase, make_grouped_inputs


def _devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def _sm90_here() -> bool:
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and "sm90" in grouped_backends())


def _problem(device, counts, n, k, dtype, seed):
    """x [T, K] over many binades (zeros, a NaN-free spread of signs), the weights and scales of a grouped case,
    per-group static input scales near each group's amax / 2688 and weight scales."""
    g = len(counts)
    case = GroupedCase(sum(counts), n, k, g, counts=tuple(counts), a_dtype=torch.bfloat16)
    inputs = make_grouped_inputs(case, device, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    t = sum(counts)
    x = torch.randn(t, k, generator=gen) * torch.exp2(torch.randint(-6, 6, (t, 1), generator=gen).float())
    x[torch.rand(t, k, generator=gen) < 0.05] = 0.0
    amax = x.abs().amax().clamp_min(1e-3)
    input_scale = (amax / 2688.0 * (0.5 + torch.rand(g, generator=gen))).float()
    ws2 = ((torch.rand(g, generator=gen) * 0.5 + 0.25) / 64).float()
    return (x.to(device, dtype), inputs["b"], inputs["sfb"], inputs["offs"], input_scale.to(device), ws2.to(device))


def _unfused(x, b, sfb, offs, input_scale, ws2, out_dtype, one=False):
    packed, sfa, alpha = nvfp4_gemm.quantize_grouped(x, offs, input_scale, weight_scale_2=ws2, one_input_scale=one)
    return nvfp4_gemm.grouped_mm(packed, b, sfa, sfb, offs, alpha=alpha, out_dtype=out_dtype)


COUNTS = [
    [1, 0, 3, 1, 2, 0, 8, 1],      # decode: a few rows a group, empty groups
    [16, 9, 0, 17, 31],            # 8-20 rows a group (the 16-token K-sliced config on Hopper)
    [120, 0, 90, 5],               # >= 20 rows a group on average (a wgmma tile): quantized first everywhere
]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("counts", COUNTS, ids=["decode", "rows16", "rows40"])
@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["out_x", "out_f32"])
@pytest.mark.parametrize("static", [True, False, "one"], ids=["static", "dynamic", "dynamic_one"])
def test_w4a4_equals_quantize_then_grouped_mm(device, dtype, counts, out_dtype, static):
    x, b, sfb, offs, s, w = _problem(device, counts, 136, 512, dtype, seed=sum(counts) + 7)
    one = static == "one"
    s = s if static is True else None
    want = _unfused(x, b, sfb, offs, s, w, out_dtype or dtype, one)
    if device == "cuda":  # the caching allocator hands the output memory poisoned with NaN first
        torch.full((sum(counts) * 136 * 4,), float("nan"), device=device)
    with recorded_choices() as lines:
        got = nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, s, out_dtype=out_dtype, one_input_scale=one)
    assert got.dtype == (out_dtype or dtype) and got.shape == want.shape
    assert torch.equal(got, want), (got - want).abs().max()
    if device == "cuda":
        assert any("after quantize_grouped" in line for line in lines), lines


@pytest.mark.skipif(not _sm90_here(), reason="needs an SM 9.0 GPU with sm90 grouped kernels")
@pytest.mark.parametrize("config", [0, 1], ids=["t8", "t16"])
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
def test_each_k_sliced_config_streams_b_ahead(config, static):
    """Forced to each K-sliced config (whose producer loads B before the grid dependency under the promise), the
    call equals quantize_grouped + grouped_mm forced the same way, at one CTA stage or many."""
    from nvfp4_gemm.grouped import grouped_configs
    name = grouped_configs()["sm90"][config]
    for counts, k in (([5, 0, 12, 1, 30, 2], 768), ([1, 0, 2], 256)):
        x, b, sfb, offs, s, w = _problem("cuda", counts, 264, k, torch.bfloat16, seed=31 + k)
        s = s if static else None
        with forced(backend="sm90", config=name):
            want = _unfused(x, b, sfb, offs, s, w, torch.bfloat16)
            with recorded_choices() as lines:
                got = nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, s)
        assert any("after quantize_grouped" in line and name in line for line in lines), lines
        assert torch.equal(got, want)


@pytest.mark.parametrize("device", _devices())
def test_weight_only_and_dynamic_modes(device):
    x, b, sfb, offs, s, w = _problem(device, [3, 0, 7, 2], 136, 256, torch.bfloat16, seed=5)
    wo = nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, weight_only=True)
    assert torch.equal(wo, nvfp4_gemm.grouped_mm(x, b, None, sfb, offs, alpha=w, out_dtype=torch.bfloat16))
    dyn = nvfp4_gemm.grouped_linear(x, b, sfb, w, offs)
    packed, sfa, alpha = nvfp4_gemm.quantize_grouped(x, offs, weight_scale_2=w)
    assert torch.equal(dyn, nvfp4_gemm.grouped_mm(packed, b, sfa, sfb, offs, alpha=alpha, out_dtype=torch.bfloat16))
    one = nvfp4_gemm.grouped_linear(x, b, sfb, w[:1], offs, s[:1])  # one value for every group
    assert torch.equal(one, _unfused(x, b, sfb, offs, s[:1].expand(4).contiguous(), w[:1].expand(4).contiguous(),
                                     torch.bfloat16))


def test_errors_name_the_argument():
    x, b, sfb, offs, s, w = _problem("cpu", [2, 2], 128, 256, torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match=r"input_scale must be float32 with G = 2 values .* got torch.float16"):
        nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, s.half())
    with pytest.raises(ValueError, match="weight_only=True takes no input_scale"):
        nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, s, weight_only=True)
    with pytest.raises(ValueError, match="weight_only=True takes no input_scale nor one_input_scale"):
        nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, weight_only=True, one_input_scale=True)
    with pytest.raises(ValueError, match="one_input_scale=True forms one dynamic scale from all of x"):
        nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, s, one_input_scale=True)
    with pytest.raises(ValueError, match="weight_scale_2 must be a float32 tensor"):
        nvfp4_gemm.grouped_linear(x, b, sfb, None, offs, s)
    with pytest.raises(RuntimeError, match=r"weight_scale_2 must be a contiguous float32 \[G\] = \[2\] tensor"):
        torch.ops.nvfp4_gemm._grouped_linear(x, b, sfb, offs, s, torch.ones(3), None)
    with pytest.raises(RuntimeError, match=r"K = x.shape\[1\] must be a positive multiple of 16"):
        torch.ops.nvfp4_gemm._grouped_linear(x[:, :40], b, sfb, offs, s, w, None)
    with pytest.raises(RuntimeError, match="nvfp4_gemm.grouped_mm"):  # b's K against x's
        torch.ops.nvfp4_gemm._grouped_linear(x[:, :128].contiguous(), b, sfb, offs, s, w, None)


@pytest.mark.parametrize("device", _devices())
def test_opcheck_and_compile(device):
    x, b, sfb, offs, s, w = _problem(device, [2, 0, 5], 128, 256, torch.bfloat16, seed=9)
    # opcheck compares inputs before / after with arithmetic that float8 lacks: the scales as their uint8 bytes
    for scale in (s, None):
        torch.library.opcheck(torch.ops.nvfp4_gemm._grouped_linear.default,
                              (x, b, sfb.view(torch.uint8), offs, scale, w, None))
    torch._dynamo.reset()
    eager = nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, s)
    compiled = torch.compile(lambda *a: nvfp4_gemm.grouped_linear(*a), fullgraph=True)(x, b, sfb, w, offs, s)
    assert torch.equal(eager, compiled)
