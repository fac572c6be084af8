"""nvfp4_gemm.grouped_mm (docs/CONTRACT.md "Grouped GEMM") and its helpers on every backend available here.

Every case: random data per docs/CONTRACT.md (all 16 e2m1 codes, scales over many binades), the output poisoned before
the call, docs/CONTRACT.md's bound per element against the float64 reference group by group. CUDA backends run when a
GPU is present (NVFP4_GEMM_TEST_BACKENDS narrows them); an arch backend without grouped kernels in this build
is skipped with the reason.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.formats import SF_VEC, round_up, to_blocked
from nvfp4_gemm.grouped import grouped_backends, grouped_configs, grouped_sfa_rows
from nvfp4_gemm.quantize import finite_amax
from nvfp4_gemm.testing import case_seed
from nvfp4_gemm.testing_grouped import (
    GroupedCase,
    grouped_blocked_reference,
    grouped_reference,
    make_grouped_inputs,
    op_args,
    routing_counts,
)
from conftest import backend_skip_reason, requires_cuda, selected_backends


def _grouped_backend_names() -> list[str]:
    """selected_backends(), plus sm120 (grouped kernels of its own; the dense suite runs it in tests/test_sm120.py)
    unless NVFP4_GEMM_TEST_BACKENDS narrows the list."""
    names = selected_backends()
    return names if os.environ.get("NVFP4_GEMM_TEST_BACKENDS") or "sm120" in names else [*names, "sm120"]


@pytest.fixture(params=_grouped_backend_names())
def gbackend(request, monkeypatch):
    """(backend name, device) for the grouped GEMM, NVFP4_GEMM_BACKEND forced for the CUDA ones."""
    name = request.param
    reason = backend_skip_reason(name)
    if reason:
        pytest.skip(reason)
    if name in ("sm90", "sm100", "sm120") and name not in grouped_backends():
        pytest.skip(f"backend {name} has no grouped kernels in this build (registered: {grouped_backends()})")
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)
    if name == "cpu":
        monkeypatch.delenv("NVFP4_GEMM_BACKEND", raising=False)
        yield name, torch.device("cpu")
    else:
        monkeypatch.setenv("NVFP4_GEMM_BACKEND", name)
        yield name, torch.device("cuda")


def runnable(name: str, case: GroupedCase) -> GroupedCase:
    """The case as a forced arch backend can run it: sm90's grouped kernels take K % 256 == 0 and 16-bit or NVFP4 A
    (tests/test_sm90_grouped.py covers their own limits), so K is rounded up to a multiple of 256 there (T, N, G,
    routing and scales kept); a float32-A case skips with the reason. sm100's and sm120's (CUTLASS's grouped
    block-scaled kernels) take NVFP4 A only, at any K the contract allows: a weight-only case skips there. CPU and
    generic run every case as written."""
    if name in ("sm100", "sm120"):
        if case.a_dtype is not None:
            pytest.skip(f"{name}'s grouped kernels take NVFP4 A only; the weight-only form runs on the generic path")
        return case
    if name != "sm90":
        return case
    if case.a_dtype == torch.float32:
        pytest.skip(f"{name}'s grouped kernels take fp16 / bf16 / NVFP4 A; float32 A runs on the generic path")
    return dataclasses.replace(case, k=round_up(case.k, 256))


def gseed(case: GroupedCase) -> int:
    return case_seed(case)  # crc32 of the id (case_seed only reads .id)


CASES = [
    GroupedCase(37, 64, 96, 4),                                              # T, K/16 = 6 off every tile size
    GroupedCase(200, 136, 160, 8, "skewed", torch.bfloat16, alpha=True),
    GroupedCase(130, 72, 64, 5, "one", torch.float32, alpha=True),           # one group holds every token
    GroupedCase(6, 64, 128, 9, "ones", alpha=True),                          # groups of 1 token, 3 empty
    GroupedCase(1, 8, 32, 1),                                                # G = 1, T = 1, N = 8
    GroupedCase(301, 64, 256, 1, alpha=True, sfa_size="least"),              # G = 1, T not a multiple of anything
    GroupedCase(70, 16, 64, 6, "edges", sfa_size="exact", sfa_view="2d", sfb_view="3d"),
    GroupedCase(50, 32, 96, 3, scales="tiny", out_dtype=torch.float32),     # zero and subnormal scales
    GroupedCase(40, 32, 64, 3, scales="large"),                             # scales up to 448, overflow to inf
    GroupedCase(40, 32, 64, 3, scales="nan", alpha=True),                   # NaN scales: NaN exactly there
    GroupedCase(0, 16, 64, 3, counts=(0, 0, 0)),                             # no tokens at all
    GroupedCase(33, 24, 96, 4, "skewed", a_dtype=torch.float16, alpha=True),  # weight-only
    GroupedCase(33, 24, 64, 4, "ones", a_dtype=torch.bfloat16, out_dtype=torch.float32),
    GroupedCase(20, 16, 64, 2, "uniform", a_dtype=torch.float32, out_dtype=torch.float32, alpha=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_grouped_matches_reference(gbackend, case):
    name, device = gbackend
    case = runnable(name, case)
    inputs = make_grouped_inputs(case, device, seed=gseed(case))
    args, kwargs = op_args(inputs)
    dt = case.out_dtype
    out = torch.full((case.t, case.n), float("nan"), dtype=dt, device=device)  # poisoned
    got = nvfp4_gemm.grouped_mm(*args, **kwargs, out=out)
    assert got is out
    ref = grouped_reference(inputs)
    ref.check(out, f"{case.id} seed {gseed(case)} counts {inputs['counts']}")
    fresh = nvfp4_gemm.grouped_mm(*args, **kwargs)  # the allocating op: the same bits
    assert fresh.dtype == dt and fresh.shape == (case.t, case.n) and fresh.device.type == device.type
    assert torch.equal(fresh.view(torch.uint8), out.view(torch.uint8))


def test_default_out_dtype(gbackend):
    name, device = gbackend
    case = runnable(name, GroupedCase(9, 16, 64, 2))
    inputs = make_grouped_inputs(case, device, seed=1)
    args, _ = op_args(inputs)
    assert nvfp4_gemm.grouped_mm(*args).dtype == torch.float16
    wo = make_grouped_inputs(runnable(name, GroupedCase(9, 16, 64, 2, a_dtype=torch.bfloat16)), device, seed=1)
    args, _ = op_args(wo)
    assert nvfp4_gemm.grouped_mm(*args).dtype == torch.bfloat16


def test_groups_equal_dense_mm(gbackend):
    """Each group's rows equal nvfp4_gemm.mm of that group alone (within the bound; bit for bit on the CPU,
    where both run the same decode + fp32 matmul)."""
    name, device = gbackend
    case = runnable(name, GroupedCase(150, 48, 160, 5, "skewed", torch.float16, alpha=True))
    inputs = make_grouped_inputs(case, device, seed=7)
    args, kwargs = op_args(inputs)
    out = nvfp4_gemm.grouped_mm(*args, **kwargs)
    dense = torch.full_like(out, float("nan"))
    sp = round_up(case.k // SF_VEC, 4)
    flat = inputs["sfa"].reshape(-1)
    start = pad = 0
    for gi, m in enumerate(inputs["counts"]):
        if m:
            rows = round_up(m, 128)
            dense[start:start + m] = nvfp4_gemm.mm(inputs["a"][start:start + m], inputs["b"][gi],
                                                   flat[pad * sp:(pad + rows) * sp], inputs["sfb"][gi],
                                                   inputs["alpha"][gi:gi + 1], out_dtype=case.out_dtype)
            pad += rows
        start += m
    if name == "cpu":
        assert torch.equal(out, dense)
    else:  # another summation order (cuBLAS vs the grouped kernel): both within the bound
        ref = grouped_reference(inputs)
        ref.check(dense, "dense mm per group")
        ref.check(out, "grouped_mm")


def test_fp4x2_and_uint8_views_agree(gbackend):
    """a and b as torch.float4_e2m1fn_x2 (same bytes), scales as uint8: the same bits out."""
    name, device = gbackend
    inputs = make_grouped_inputs(runnable(name, GroupedCase(40, 32, 64, 4, alpha=True)), device, seed=9)
    args, kwargs = op_args(inputs)
    want = nvfp4_gemm.grouped_mm(*args, **kwargs)
    a, b, sfa, sfb, offs = args
    got = nvfp4_gemm.grouped_mm(a.view(torch.float4_e2m1fn_x2), b.view(torch.float4_e2m1fn_x2),
                                sfa.view(torch.uint8), sfb.view(torch.uint8), offs, **kwargs)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_opcheck(gbackend):
    name, device = gbackend
    for case in (runnable(name, GroupedCase(19, 16, 64, 3, alpha=True)), runnable(name, GroupedCase(7, 8, 32, 2, a_dtype=torch.float16))):
        inputs = make_grouped_inputs(case, device, seed=3)
        # opcheck compares inputs before / after with arithmetic that float8 lacks: scales as their uint8 bytes.
        if inputs["sfa"] is not None:
            inputs["sfa"] = inputs["sfa"].view(torch.uint8)
        inputs["sfb"] = inputs["sfb"].view(torch.uint8)
        args, kwargs = op_args(inputs)
        torch.library.opcheck(torch.ops.nvfp4_gemm.grouped_mm.default, args, kwargs)
        out = torch.empty((case.t, case.n), dtype=case.out_dtype, device=device)
        torch.library.opcheck(torch.ops.nvfp4_gemm.grouped_mm_out.default, args, {**kwargs, "out": out})


def test_grouped_backends_listing():
    configs = grouped_configs()
    assert set(configs) == set(grouped_backends())
    for name, names in configs.items():
        assert names and all(isinstance(c, str) and c for c in names), (name, names)


def test_schema():
    schema = str(torch.ops.nvfp4_gemm.grouped_mm.default._schema)
    assert schema.startswith("nvfp4_gemm::grouped_mm(Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor offs"), schema
    assert "Tensor? alpha=None" in schema and "ScalarType? out_dtype=None" in schema
    assert "Tensor(a!) out" in str(torch.ops.nvfp4_gemm.grouped_mm_out.default._schema)
    assert nvfp4_gemm.grouped_mm.__module__ == "nvfp4_gemm.grouped"


def test_torch_compile_fullgraph(gbackend):
    name, device = gbackend
    torch._dynamo.reset()
    case = runnable(name, GroupedCase(45, 32, 64, 4, "skewed", torch.float32, alpha=True))
    inputs = make_grouped_inputs(case, device, seed=5)

    # aot_eager: dynamo (no graph break) and the fake kernels through AOT autograd, without inductor's codegen
    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(a, b, sfa, sfb, offs, alpha):
        c = nvfp4_gemm.grouped_mm(a, b, sfa, sfb, offs, alpha=alpha, out_dtype=torch.float32)
        return c, c * 2.0

    c, d = f(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], inputs["offs"], inputs["alpha"])
    grouped_reference(inputs).check(c, case.id)
    assert torch.equal(d, c * 2.0)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def g(a, b, sfa, sfb, offs, alpha, out):
        nvfp4_gemm.grouped_mm(a, b, sfa, sfb, offs, alpha=alpha, out=out)
        return out + 1.0

    out = torch.full_like(c, float("nan"))
    e = g(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], inputs["offs"], inputs["alpha"], out)
    assert torch.equal(out, c) and torch.equal(e, c + 1.0)  # the mutation reaches the caller's tensor


def test_torch_compile_quantize_then_gemm(gbackend):
    """The whole W4A4 MoE step (route, quantize per group, grouped GEMM) compiles without graph breaks."""
    name, device = gbackend
    torch._dynamo.reset()
    case = runnable(name, GroupedCase(30, 16, 64, 3))
    inputs = make_grouped_inputs(case, device, seed=6)
    x = torch.randn(case.t, case.k, generator=torch.Generator().manual_seed(0)).to(device, torch.bfloat16)

    def step(x, b, sfb, offs, ws2):
        packed, sfa, alpha = nvfp4_gemm.quantize_grouped(x, offs, weight_scale_2=ws2)
        return nvfp4_gemm.grouped_mm(packed, b, sfa, sfb, offs, alpha=alpha, out_dtype=torch.bfloat16)

    ws2 = torch.full((case.g,), 0.5, device=device)
    eager = step(x, inputs["b"], inputs["sfb"], inputs["offs"], ws2)
    compiled = torch.compile(step, fullgraph=True)(x, inputs["b"], inputs["sfb"], inputs["offs"], ws2)
    assert torch.equal(eager, compiled)


# --- Sizes of sfa against the routing -------------------------------------------------------------------------


def test_sfa_too_small_for_routing(gbackend):
    """sfa holds round_up(T,128) rows but the routing needs more: the CPU refuses; CUDA (which never reads offs on
    the host) gives NaN in exactly the rows whose scales lie past the buffer, and the right rows elsewhere."""
    name, device = gbackend
    case = runnable(name, GroupedCase(100, 16, 64, 3, counts=(60, 30, 10)))  # needs 384 rows, round_up(T,128) = 128
    inputs = make_grouped_inputs(runnable(name, GroupedCase(100, 16, 64, 3, counts=(60, 30, 10))), "cpu", seed=8)
    sp = round_up(case.k // SF_VEC, 4)
    small = inputs["sfa"].reshape(-1)[:128 * sp].clone()
    args = [inputs[k].to(device) if inputs[k] is not None else None for k in ("a", "b", "sfa", "sfb", "offs")]
    args[2] = small.to(device)
    if name == "cpu":
        with pytest.raises(RuntimeError, match=r"sfa holds 128 padded rows, but this routing needs .* = 384"):
            nvfp4_gemm.grouped_mm(*args)
        return
    out = nvfp4_gemm.grouped_mm(*args).cpu()
    assert not torch.isnan(out[:60]).any()  # group 0's scales fit
    assert torch.isnan(out[60:]).all()      # groups 1 and 2 start at padded rows 128 and 256
    ref = grouped_reference({**inputs, "out_dtype": torch.float16})
    ref.m = 60
    ref.ref, ref.bound = ref.ref[:60], ref.bound[:60]
    ref.check(out[:60])


def test_grouped_sfa_rows_bounds_every_routing():
    gen = torch.Generator().manual_seed(0)
    for t, g in ((0, 4), (1, 1), (1, 256), (5, 3), (16, 128), (127, 2), (300, 7), (4096, 256)):
        worst = grouped_sfa_rows(t, g)
        assert worst % 128 == 0 and worst >= round_up(t, 128)
        for routing in ("uniform", "skewed", "ones", "one"):
            counts = routing_counts(t, g, routing, gen)
            assert sum(round_up(m, 128) for m in counts) <= worst, (t, g, routing)
        # the adversarial routing: min(g, t) - 1 groups of one token, the rest in one group
        ne = min(g, t)
        if ne:
            counts = [1] * (ne - 1) + [t - ne + 1]
            assert sum(round_up(m, 128) for m in counts) <= worst


# --- Helpers: to_blocked_grouped, quantize_grouped -----------------------------------------------------------


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available() and "generic" in selected_backends():
        devs.append("cuda")
    return devs


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("t,g,routing", [(37, 4, "uniform"), (6, 9, "ones"), (130, 5, "one"), (0, 3, "uniform"),
                                         (300, 16, "skewed"), (50, 6, "edges")])
def test_to_blocked_grouped_matches_spec(device, t, g, routing):
    gen = torch.Generator().manual_seed(t * 31 + g)
    k16 = 6
    counts = routing_counts(t, g, routing, gen)
    sf = torch.randint(1, 255, (t, k16), dtype=torch.uint8, generator=gen)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    got = nvfp4_gemm.to_blocked_grouped(sf.view(torch.float8_e4m3fn).to(device), offs.to(device))
    assert got.dtype == torch.float8_e4m3fn and got.device.type == device
    rows = grouped_sfa_rows(t, g)
    want = grouped_blocked_reference(sf, counts, rows)
    assert torch.equal(got.view(torch.uint8).cpu(), want)
    exact = sum(round_up(m, 128) for m in counts)
    got_exact = nvfp4_gemm.to_blocked_grouped(sf.to(device), offs.to(device), rows=max(exact, 128 if t else 0))
    assert torch.equal(got_exact.cpu(), grouped_blocked_reference(sf, counts, max(exact, 128 if t else 0)))


def test_to_blocked_grouped_single_group_is_to_blocked():
    sf = torch.randint(1, 255, (77, 5), dtype=torch.uint8)
    got = nvfp4_gemm.to_blocked_grouped(sf, torch.tensor([77], dtype=torch.int32))
    assert torch.equal(got, to_blocked(sf))


def test_to_blocked_grouped_drops_what_does_not_fit():
    """A capacity too small for the routing drops the scales that would land past it: nothing written out of
    bounds (the CUDA GEMM then gives NaN for those rows)."""
    sf = torch.randint(1, 255, (100, 4), dtype=torch.uint8)
    offs = torch.tensor([60, 90, 100], dtype=torch.int32)
    got = nvfp4_gemm.to_blocked_grouped(sf, offs, rows=128)
    want = grouped_blocked_reference(sf, [60, 30, 10], 384)[:128 * 4]
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="rows must be a multiple of 128"):
        nvfp4_gemm.to_blocked_grouped(sf, offs, rows=100)


def _x(t, k, dtype, seed):
    """Activations over many binades with signs, zeros and exact ties."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen) * torch.exp2(torch.randint(-8, 8, (t, 1), generator=gen).float())
    x[torch.rand(t, k, generator=gen) < 0.05] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ws2", [False, True])
@pytest.mark.parametrize("mode", ["static", "dynamic", "static_scalar", "dynamic_one"])
@pytest.mark.parametrize("t,k,g", [(90, 96, 5), (700, 1040, 4), (200, 1040, 20), (900, 96, 300)])
def test_quantize_grouped_equals_per_group_quantize(device, dtype, mode, t, k, g, ws2):
    """Bits equal per-group quantize placed by to_blocked_grouped, every byte of sfa included (the CUDA caching
    allocator hands the outputs memory poisoned with 0xFF first); the third output is each group's decode scale, or
    with weight_scale_2 the float32 product decode * weight_scale_2. K = 96 / 1040: a last atom column of 2 / 1
    scale columns. On CUDA (a CTA takes ~120 rows at K = 96, ~14 at K = 1040, a group of one row at K = 1040 one
    CTA): (90, 96, 5) one CTA a group (dynamic: the amax inside the quantizing launch); (700, 1040, 4) several CTAs
    share each group (dynamic: an amax launch ahead, as 700 rows in one group would take more than 16 CTAs);
    (200, 1040, 20) no amax launch (200 rows are 14 CTAs' work), while the skewed routing's popular groups take
    several (dynamic: each of their CTAs forms the group's amax over all its rows); (900, 96, 300) more groups than a
    CTA's threads, so each CTA's search for its share spans two chunks of groups. dynamic_one: one scale for every
    group from the finite amax of all of x (one_input_scale), from every CTA's slot of the amax launch where x
    exceeds 64 KiB (every shape but (90, 96, 5)), and at (90, 96, 5) from each CTA's own pass over x."""
    gen = torch.Generator().manual_seed(11)
    counts = routing_counts(t, g, "skewed", gen)
    counts[1] = 0  # an empty group too
    counts[0] += t - sum(counts)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    x = _x(t, k, dtype, 12)
    x[3, 5] = float("nan")
    x[4, 7] = float("inf")
    if mode == "static":
        scale = (torch.rand(g, generator=gen) * 0.05 + 1e-3).to(torch.float32)
    elif mode == "static_scalar":
        scale = torch.tensor([0.0123], dtype=torch.float32)
    else:
        scale = None
    x_dev, offs_dev = x.to(device), offs.to(device)
    scale_dev = None if scale is None else scale.to(device)
    if device == "cuda":
        torch.cuda.synchronize()
        poison = torch.full((4 * (t * k + grouped_sfa_rows(t, g) * round_up(k // 16, 4)),), 0xFF, dtype=torch.uint8,
                            device=device)
        del poison
    w2 = (torch.rand(g, generator=gen) * 0.5 + 0.25) / 64 if ws2 else None
    packed, sfa, alpha_a = nvfp4_gemm.quantize_grouped(x_dev, offs_dev, scale_dev,
                                                       weight_scale_2=None if w2 is None else w2.to(device),
                                                       one_input_scale=mode == "dynamic_one")
    assert packed.shape == (t, k // 2) and packed.dtype == torch.uint8
    assert sfa.dtype == torch.float8_e4m3fn and sfa.numel() == grouped_sfa_rows(t, g) * round_up(k // 16, 4)
    assert alpha_a.shape == (g,) and alpha_a.dtype == torch.float32
    packed, sfa, alpha_a = packed.cpu(), sfa.cpu(), alpha_a.cpu()
    lin_parts, start = [], 0
    for gi, m in enumerate(counts):
        xs = x[start:start + m]
        if mode.startswith("dynamic"):
            enc = nvfp4_gemm.global_encode_scale(finite_amax(xs if mode == "dynamic" else x))
            dec = torch.reciprocal(enc)
        else:
            dec = scale.reshape(-1).expand(g)[gi:gi + 1]
            enc = torch.reciprocal(dec)
        want_alpha = dec.reshape(()) if w2 is None else dec.reshape(()) * w2[gi]
        assert alpha_a[gi].view(torch.int32) == want_alpha.view(torch.int32), (gi, alpha_a[gi], want_alpha)
        if m:
            p_ref, sf_ref = nvfp4_gemm.quantize(xs, enc)
            assert torch.equal(packed[start:start + m], p_ref), f"group {gi} codes"
            lin_parts.append(nvfp4_gemm.from_blocked(sf_ref, m, k).view(torch.uint8))
        start += m
    lin = torch.cat(lin_parts)
    want = grouped_blocked_reference(lin, counts, grouped_sfa_rows(t, g))
    assert torch.equal(sfa.view(torch.uint8), want)


def test_quantize_grouped_errors():
    x = torch.randn(8, 64)
    offs = torch.tensor([3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="offs must be 1-D int32"):
        nvfp4_gemm.quantize_grouped(x, offs.to(torch.int64))
    with pytest.raises(ValueError, match="input_scale must be float32 with G = 2"):
        nvfp4_gemm.quantize_grouped(x, offs, torch.ones(3))
    with pytest.raises(RuntimeError, match="K = x.shape.1. must be a positive multiple of 16"):
        nvfp4_gemm.quantize_grouped(torch.randn(8, 40), offs)
    with pytest.raises(RuntimeError, match="group 1's input scale must be positive and finite"):
        nvfp4_gemm.quantize_grouped(x, offs, torch.tensor([1.0, 0.0]))
    with pytest.raises(RuntimeError, match="must be float32, float16 or bfloat16"):
        nvfp4_gemm.quantize_grouped(x.to(torch.float64), offs)
    with pytest.raises(RuntimeError, match=r"sfa_rows must be a multiple of 128 and at least round_up\(T,128\) = 128"):
        nvfp4_gemm.quantize_grouped(x, offs, sfa_rows=100)
    with pytest.raises(ValueError, match=r"weight_scale_2 must be float32 with G = 2 values .* got torch.float16"):
        nvfp4_gemm.quantize_grouped(x, offs, weight_scale_2=torch.ones(2, dtype=torch.float16))
    with pytest.raises(ValueError, match="weight_scale_2 must be a float32 tensor"):
        nvfp4_gemm.quantize_grouped(x, offs, weight_scale_2=0.5)
    with pytest.raises(RuntimeError, match=r"weight_scale_2 must be a contiguous float32 \[G\] = \[2\] tensor"):
        torch.ops.nvfp4_gemm._quantize_grouped(x, offs, None, torch.ones(3), 128)
    with pytest.raises(RuntimeError, match="x must be 2-D|must be 2-D"):
        torch.ops.nvfp4_gemm._quantize_grouped(x.reshape(-1), offs, None, None, 128)
    with pytest.raises(ValueError, match="one_input_scale=True forms one dynamic scale from all of x; input_scale"):
        nvfp4_gemm.quantize_grouped(x, offs, torch.ones(2), one_input_scale=True)
    with pytest.raises(RuntimeError, match="one_input_scale=True forms one dynamic scale from all of x; input_scale "
                                           r"must then be None, got a tensor of shape \[2\]"):
        torch.ops.nvfp4_gemm._quantize_grouped(x, offs, torch.ones(2), None, 128, True)


@pytest.mark.parametrize("device", _devices())
def test_quantize_grouped_capacity_too_small(device):
    """sfa_rows below the routing's need: the scales that fit are those of the full layout, nothing past the buffer;
    empty groups and an amax-free (all-zero) group get decode scale 1."""
    t, k = 100, 64
    x = _x(t, k, torch.bfloat16, 13)
    x[90:] = 0.0  # group 3 all zeros: dynamic scale 1
    counts = [60, 0, 30, 10]
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    full = nvfp4_gemm.quantize_grouped(x.to(device), offs.to(device))
    small = nvfp4_gemm.quantize_grouped(x.to(device), offs.to(device), sfa_rows=128)
    assert small[1].numel() == 128 * 4
    assert torch.equal(small[1].view(torch.uint8).cpu(), full[1].view(torch.uint8).cpu()[:128 * 4])
    assert torch.equal(small[0][:60].cpu(), full[0][:60].cpu())  # group 0's rows fit
    assert torch.equal(small[2].cpu(), full[2].cpu())
    assert float(full[2][1]) == 1.0 and float(full[2][3]) == 1.0


# --- Errors: every bad argument, named, expected vs actual, nothing written --------------------------------------

def _good(device):
    inputs = make_grouped_inputs(GroupedCase(20, 16, 64, 3, alpha=True), device, seed=2)
    return {k: inputs[k] for k in ("a", "b", "sfa", "sfb", "offs", "alpha")}


def _bad_cases(device):
    g = _good("cpu")
    sp = round_up(64 // 16, 4)
    f8 = torch.float8_e4m3fn
    yield "a dtype", dict(a=g["a"].to(torch.int16)), r"a must be packed e2m1 data .* got Short"
    yield "a dims", dict(a=g["a"].reshape(-1)), r"a must be 2-D \[T, K/2\]"
    yield "sfa None", dict(sfa=None), r"sfa is None, but a holds packed e2m1"
    yield "sfa with weight-only", dict(a=torch.zeros(20, 64, dtype=torch.float16)), r"sfa must be None when a holds"
    yield "b dims", dict(b=g["b"][0]), r"b must be 3-D \[G, N, K/2\]"
    yield "b dtype", dict(b=g["b"].to(torch.int8)), r"b must be packed e2m1 data .* got Char"
    yield "K mismatch", dict(b=torch.zeros(3, 16, 64, dtype=torch.uint8)), r"a and b must have the same K"
    yield "N % 8", dict(b=torch.zeros(3, 12, 32, dtype=torch.uint8),
                        sfb=torch.zeros(3, 128 * sp, dtype=torch.uint8)), r"N must be a multiple of 8 .* got N=12"
    yield "K % 32", dict(a=torch.zeros(20, 8, dtype=torch.uint8), b=torch.zeros(3, 16, 8, dtype=torch.uint8)), \
        r"K must be a multiple of 32 .* got K=16"
    yield "offs dtype", dict(offs=g["offs"].to(torch.int64)), r"offs must be int32 .* got Long"
    yield "offs shape", dict(offs=g["offs"][:2]), r"offs must be 1-D \[G\] = \[3\] .* got shape \[2\]"
    yield "sfb size", dict(sfb=g["sfb"].reshape(-1)[:-512].view(2, -1)), r"sfb must hold G\*round_up\(N,128\)"
    yield "sfb shape", dict(sfb=g["sfb"].reshape(-1)), r"sfb must be \[G, round_up\(N,128\), round_up\(K/16,4\)\]"
    yield "sfb dtype", dict(sfb=g["sfb"].view(torch.uint8).to(torch.int8)), r"sfb must hold e4m3 scales .* got Char"
    yield "sfa partial atom", dict(sfa=g["sfa"][:-4]), r"sfa must hold a whole number of 128-row blocks of 128\*round_up\(K/16,4\) = 512 .* got 1532"
    yield "sfa under T", dict(a=torch.zeros(130, 32, dtype=torch.uint8),
                              offs=torch.tensor([100, 120, 130], dtype=torch.int32),
                              sfa=torch.zeros(128 * sp, dtype=f8)), r"sfa must hold at least round_up\(T,128\) = 256"
    yield "sfa 2-D width", dict(sfa=g["sfa"].view(-1, 8)), r"sfa must be the grouped blocked layout .* \[rows, 4\]"
    yield "sfa dtype", dict(sfa=g["sfa"].view(torch.uint8).to(torch.int16)), r"sfa must hold e4m3 scales"
    yield "alpha dtype", dict(alpha=g["alpha"].double()), r"alpha must be a float32 tensor .* got Double"
    yield "alpha shape", dict(alpha=g["alpha"][:1]), r"alpha must be 1-D \[G\] = \[3\] .* got shape \[1\]"
    yield "out_dtype", dict(out_dtype=torch.int32), r"out_dtype must be torch.float16, torch.bfloat16 or torch.float32"
    yield "out shape", dict(out=torch.empty(20, 8, dtype=torch.float16)), r"out must have shape \[T, N\] = \[20, 16\]"
    yield "out dtype", dict(out=torch.empty(20, 16, dtype=torch.float32), out_dtype=torch.float16), \
        r"out must have the result dtype Half, got Float"
    yield "no groups", dict(b=torch.zeros(0, 16, 32, dtype=torch.uint8), sfb=torch.zeros(0, 128 * sp, dtype=f8),
                            offs=torch.zeros(0, dtype=torch.int32), alpha=None), r"at least one group"


@pytest.mark.parametrize("what", [c[0] for c in _bad_cases("cpu")])
def test_errors(gbackend, what):
    _, device = gbackend
    overrides, pattern = next((o, p) for name, o, p in _bad_cases(device) if name == what)
    args = {**_good("cpu"), "out_dtype": None, "out": None}
    args.update(overrides)
    args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    out = args.pop("out")
    if out is not None:
        out.fill_(7.0)
    with pytest.raises(RuntimeError, match=pattern):
        nvfp4_gemm.grouped_mm(args.pop("a"), args.pop("b"), args.pop("sfa"), args.pop("sfb"), args.pop("offs"),
                              **args, out=out)
    if out is not None:
        assert (out == 7.0).all()  # nothing written


def test_error_device_mismatch(gbackend):
    name, device = gbackend
    if name == "cpu":
        pytest.skip("needs a second device type")
    g = {k: v.to(device) for k, v in _good("cpu").items()}
    for key in ("b", "sfa", "sfb", "offs", "alpha"):
        bad = dict(g)
        bad[key] = g[key].cpu()
        with pytest.raises(RuntimeError, match=f"{key} must be on"):
            nvfp4_gemm.grouped_mm(bad["a"], bad["b"], bad["sfa"], bad["sfb"], bad["offs"], alpha=bad["alpha"])


def test_gpu_layout_errors(gbackend):
    """What only the GPU kernels need: 16-byte aligned bases and rows, K-major operands; refused by name."""
    name, device = gbackend
    if name == "cpu":
        pytest.skip("the CPU backend reads any strides")
    g = {k: v.to(device) for k, v in _good("cpu").items()}
    a_big = torch.zeros((20, 48), dtype=torch.uint8, device=device)
    a_big[:, 1:33] = g["a"]
    with pytest.raises(RuntimeError, match="a data must be 16-byte aligned"):
        nvfp4_gemm.grouped_mm(a_big[:, 1:33], g["b"], g["sfa"], g["sfb"], g["offs"])
    b_t = g["b"].transpose(1, 2).contiguous().transpose(1, 2)  # same values, stride 1 along N
    with pytest.raises(RuntimeError, match="b must be K-major"):
        nvfp4_gemm.grouped_mm(g["a"], b_t, g["sfa"], g["sfb"], g["offs"])
    out = torch.full((20, 32), 7.0, dtype=torch.float16, device=device)
    with pytest.raises(RuntimeError, match="out must have unit stride along N"):
        nvfp4_gemm.grouped_mm(g["a"], g["b"], g["sfa"], g["sfb"], g["offs"], out=out[:, ::2])
    assert (out == 7.0).all()


def test_cpu_checks_routing():
    g = _good("cpu")
    for offs, pattern in (([5, 3, 20], r"offs must be non-decreasing .* offs\[1\] = 3 after offs\[0\] = 5"),
                          ([-1, 3, 20], r"offs\[0\] = -1 \(below 0\)"),
                          ([5, 10, 19], r"offs\[G-1\] must equal T = a.shape\[0\] = 20 .* got 19")):
        with pytest.raises(RuntimeError, match=pattern):
            nvfp4_gemm.grouped_mm(g["a"], g["b"], g["sfa"], g["sfb"], torch.tensor(offs, dtype=torch.int32))


def test_fake_kernel_shapes():
    g = _good("cpu")
    meta = {k: v.to("meta") for k, v in g.items()}
    out = torch.ops.nvfp4_gemm.grouped_mm(meta["a"], meta["b"], meta["sfa"], meta["sfb"], meta["offs"], meta["alpha"],
                                          torch.bfloat16)
    assert out.shape == (20, 16) and out.dtype == torch.bfloat16 and out.device.type == "meta"
    with pytest.raises(RuntimeError, match="offs must be int32"):
        torch.ops.nvfp4_gemm.grouped_mm(meta["a"], meta["b"], meta["sfa"], meta["sfb"], meta["offs"].long())


# --- CUDA only: graphs, streams, garbage routing --------------------------------------------------------------


def _cuda_backend(gbackend):
    name, device = gbackend
    if name == "cpu":
        pytest.skip("a CUDA-only property")
    return name, device


@requires_cuda
def test_cuda_graph_replay_with_new_routing(gbackend):
    """Routing, alpha and data change between replays of one captured graph: every replay is right, no host sync."""
    name, device = _cuda_backend(gbackend)
    case = runnable(name, GroupedCase(96, 64, 128, 8, "uniform", torch.bfloat16, alpha=True, sfa_size="worst"))
    static = make_grouped_inputs(case, device, seed=20)
    args, kwargs = op_args(static)
    nvfp4_gemm.grouped_mm(*args, **kwargs)  # warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = nvfp4_gemm.grouped_mm(*args, **kwargs)
    for seed, routing in ((21, "skewed"), (22, "one"), (23, "ones"), (24, "edges")):
        fresh = make_grouped_inputs(runnable(name, GroupedCase(96, 64, 128, 8, routing, torch.bfloat16, alpha=True)), device, seed=seed)
        for key in ("a", "b", "sfa", "sfb", "offs", "alpha"):
            if static[key].element_size() == 1:  # copy_ lacks float8: copy the bytes
                static[key].view(torch.uint8).copy_(fresh[key].view(torch.uint8))
            else:
                static[key].copy_(fresh[key])
        graph.replay()
        torch.cuda.synchronize()
        grouped_reference(fresh).check(out, f"replay {routing}")


@requires_cuda
def test_cuda_graph_quantize_and_gemm_with_new_routing(gbackend):
    """The whole W4A4 step (quantize_grouped dynamic, grouped_mm) captured once, replayed with new tokens and new
    routing: each replay equals the eager call on the same inputs, bit for bit."""
    name, device = _cuda_backend(gbackend)
    case = runnable(name, GroupedCase(80, 64, 128, 6))
    t, k, g = case.t, case.k, case.g
    inputs = make_grouped_inputs(case, device, seed=25)
    ws2 = torch.full((g,), 0.25, device=device)
    x = _x(t, k, torch.bfloat16, 26).to(device)
    offs = inputs["offs"].clone()

    def step():
        p, sfa, a_dec = nvfp4_gemm.quantize_grouped(x, offs)
        return nvfp4_gemm.grouped_mm(p, inputs["b"], sfa, inputs["sfb"], offs, alpha=a_dec * ws2,
                                     out_dtype=torch.bfloat16)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    gen = torch.Generator().manual_seed(27)
    for routing in ("skewed", "one", "ones", "edges"):
        counts = routing_counts(t, g, routing, gen)
        offs.copy_(torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32))
        x.copy_(_x(t, k, torch.bfloat16, len(routing)).to(device))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step()), routing


@requires_cuda
def test_garbage_routing_stays_in_bounds(gbackend):
    """offs that break every rule (decreasing, negative, past T) give wrong rows but no fault: the next call on the
    stream still runs and is right."""
    name, device = _cuda_backend(gbackend)
    good = make_grouped_inputs(runnable(name, GroupedCase(40, 32, 64, 4, alpha=True)), device, seed=30)
    args, kwargs = op_args(good)
    for bad in ([30, 10, -5, 40], [1000, 2000, 40, 40], [-7, -7, -7, -7], [40, 0, 40, 0]):
        nvfp4_gemm.grouped_mm(args[0], args[1], args[2], args[3], torch.tensor(bad, dtype=torch.int32, device=device),
                              **kwargs)
    torch.cuda.synchronize()
    grouped_reference(good).check(nvfp4_gemm.grouped_mm(*args, **kwargs), "after garbage routing")


@requires_cuda
def test_runs_on_current_stream(gbackend):
    from nvfp4_gemm.testing import run_after_slow_producer

    name, device = _cuda_backend(gbackend)
    inputs = make_grouped_inputs(runnable(name, GroupedCase(64, 32, 64, 4, alpha=True)), device, seed=31)
    call = dict(inputs)
    counts = call.pop("counts")
    out, _ = run_after_slow_producer(
        lambda a, b, sfa, sfb, offs, alpha, out_dtype: nvfp4_gemm.grouped_mm(a, b, sfa, sfb, offs, alpha=alpha,
                                                                              out_dtype=out_dtype),
        call, keys=("a", "b", "sfa", "sfb", "offs", "alpha"))
    grouped_reference({**inputs, "counts": counts}).check(out, "slow producer")


@requires_cuda
def test_strided_b_groups(gbackend):
    """b a slice of a larger stacked weight (gate half of a fused gate_up): groups strided, rows K-major."""
    name, device = _cuda_backend(gbackend)
    case = runnable(name, GroupedCase(50, 32, 64, 3, alpha=True))
    inputs = make_grouped_inputs(case, device, seed=32)
    big = torch.zeros((3, 64, case.k // 2), dtype=torch.uint8, device=device)
    big[:, :32] = inputs["b"]
    args, kwargs = op_args({**inputs, "b": big[:, :32]})
    grouped_reference(inputs).check(nvfp4_gemm.grouped_mm(*args, **kwargs), "strided b")


def test_strided_b_groups_cpu():
    case = GroupedCase(50, 32, 64, 3, alpha=True)
    inputs = make_grouped_inputs(case, "cpu", seed=32)
    big = torch.zeros((3, 64, 32), dtype=torch.uint8)
    big[:, :32] = inputs["b"]
    args, kwargs = op_args({**inputs, "b": big[:, :32]})
    grouped_reference(inputs).check(nvfp4_gemm.grouped_mm(*args, **kwargs), "strided b")


def test_reference_grouped_mm_agrees_with_checker():
    inputs = make_grouped_inputs(GroupedCase(30, 16, 64, 3, "skewed", torch.float32, alpha=True), "cpu", seed=40)
    args, kwargs = op_args(inputs)
    ref = nvfp4_gemm.reference_grouped_mm(*args, **kwargs)
    grouped_reference(inputs).check(ref, "reference_grouped_mm")


if os.environ.get("NVFP4_GEMM_GROUPED_SLOW"):  # a larger sweep for the GPU machine
    @pytest.mark.parametrize("routing", ["uniform", "skewed", "one", "ones"])
    @pytest.mark.parametrize("form", ["w4a4", "f16", "bf16"])
    def test_moe_shapes(gbackend, routing, form):
        name, device = gbackend
        a_dtype = None if form == "w4a4" else {"f16": torch.float16, "bf16": torch.bfloat16}[form]
        for t, n, k, g in ((1, 1536, 2048, 128), (64, 1536, 2048, 128), (300, 2048, 768, 128), (16, 512, 7168, 256)):
            case = runnable(name, GroupedCase(t, n, k, g, routing, torch.bfloat16, alpha=True, a_dtype=a_dtype))
            inputs = make_grouped_inputs(case, device, seed=gseed(case))
            args, kwargs = op_args(inputs)
            grouped_reference(inputs).check(nvfp4_gemm.grouped_mm(*args, **kwargs), case.id)


@requires_cuda
def test_recorded_choices_include_grouped(monkeypatch):
    """nvfp4_gemm.testing.recorded_choices records what each grouped_mm call ran as it records mm's, in one list in
    call order: "grouped <backend>:<config> a=<A> T=.. N=.. K=.. G=.. out=..", the generic path as
    "grouped generic:grouped_simt_64x64"."""
    from nvfp4_gemm.testing import Case, forced, make_inputs, recorded_choices

    monkeypatch.delenv("NVFP4_GEMM_BACKEND", raising=False)
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)
    args, kwargs = op_args(make_grouped_inputs(GroupedCase(40, 32, 256, 4), "cuda", seed=3))
    dense = make_inputs(Case(8, 32, 256), "cuda")
    major, minor = torch.cuda.get_device_capability()
    on_sm90 = "sm90" in grouped_backends() and "sm90" in torch.ops.nvfp4_gemm._backends_for_sm(major * 10 + minor)
    with recorded_choices() as lines:
        with forced(backend="generic"):
            nvfp4_gemm.grouped_mm(*args, **kwargs)
            nvfp4_gemm.mm(**dense)
        with forced(backend="auto"):
            nvfp4_gemm.grouped_mm(*args, **kwargs)
    torch.cuda.synchronize()
    shape = "T=40 N=32 K=256 G=4 out=0"
    auto = f"sm90:{grouped_configs()['sm90'][1]}" if on_sm90 else "generic:grouped_simt_64x64"
    assert lines == [f"grouped generic:grouped_simt_64x64 a=e2m1 {shape}", "generic m=8 n=32 k=256 out=0",
                     f"grouped {auto} a=e2m1 {shape}"], lines


@requires_cuda
def test_forcing_errors_match_mm(monkeypatch):
    """grouped_mm refuses a wrong forcing with mm's words (tests/test_errors.py): an unknown backend or config name,
    a backend that cannot run here; a forced dense config names no grouped kernel and leaves grouped_mm to auto."""
    from nvfp4_gemm.testing import forced, recorded_choices

    args, kwargs = op_args(make_grouped_inputs(GroupedCase(20, 16, 256, 2), "cuda", seed=5))
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm75")
    with pytest.raises(RuntimeError, match=r"NVFP4_GEMM_BACKEND must be one of auto, generic, sm90, sm100, sm120 "
                                           r".*got 'sm75'"):
        nvfp4_gemm.grouped_mm(*args, **kwargs)
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "auto")
    monkeypatch.setenv("NVFP4_GEMM_CONFIG", "no_such_config")
    with pytest.raises(RuntimeError, match=r"NVFP4_GEMM_CONFIG=no_such_config names no compiled grouped kernel config"):
        nvfp4_gemm.grouped_mm(*args, **kwargs)
    monkeypatch.delenv("NVFP4_GEMM_CONFIG")
    major, minor = torch.cuda.get_device_capability()
    here = torch.ops.nvfp4_gemm._backends_for_sm(major * 10 + minor)
    for name, configs in grouped_configs().items():
        if name in here:
            continue
        with forced(backend=name), pytest.raises(RuntimeError, match=rf"forced backend={name} \(.*\) cannot run on "
                                                                     rf"this SM {major}.{minor} device"):
            nvfp4_gemm.grouped_mm(*args, **kwargs)
        with forced(config=configs[0]), pytest.raises(RuntimeError, match=rf"belongs to backend {name} \(.*\), which "
                                                                          rf"cannot run on this SM {major}.{minor}"):
            nvfp4_gemm.grouped_mm(*args, **kwargs)
    for name, configs in nvfp4_gemm.configs().items():  # a dense config: grouped_mm runs as automatic dispatch does
        with recorded_choices() as auto:
            nvfp4_gemm.grouped_mm(*args, **kwargs)
        with forced(config=configs[0]), recorded_choices() as lines:
            nvfp4_gemm.grouped_mm(*args, **kwargs)
        assert len(auto) == 1 and lines == auto, (name, auto, lines)
