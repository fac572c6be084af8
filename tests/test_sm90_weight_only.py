"""The weight-only form (fp16 / bf16 activations x NVFP4 weights) on the sm90 kernels: a random sweep over
every dispatch row, every config forced, exactness of the B decode in both 16-bit types, determinism, a
side stream and CUDA-graph replay. References are float64 on the GPU with docs/CONTRACT.md's bound
(nvfp4_gemm.testing.Reference; sfa None is the weight-only form); failure messages carry the seed."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import zlib

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Reference, forced, poison_cuda_allocator, recorded_choices, run_after_slow_producer
from conftest import backend_skip_reason

_reason = backend_skip_reason("sm90")
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
SWEEP_CASES = int(os.environ.get("NVFP4_GEMM_SM90_WO_SWEEP", "200"))


@pytest.fixture(autouse=True)
def _force_sm90(monkeypatch):
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm90")
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)


def _inputs(m, n, k, a_dtype, out_dtype=None, alpha=None, scales="typical", seed=0):
    """Random packed B (all 16 codes) with e4m3 scales over `scales`' binades, and activations spread over
    eight binades with some zeros, generated on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    lo, hi = {"typical": (1, 11), "wide": (1, 13), "tiny": (0, 3)}[scales]
    exp = torch.randint(lo, hi, (n, k // 16), device="cuda", generator=g)
    man = torch.randint(0, 8, (n, k // 16), device="cuda", generator=g)
    sfb = nvfp4_gemm.to_blocked(((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn))
    a = torch.randn(m, k, device="cuda", generator=g) * torch.exp2(
        torch.randint(-4, 4, (m, k), device="cuda", generator=g).float())
    a[torch.rand(m, k, device="cuda", generator=g) < 0.05] = 0.0
    al = None if alpha is None else torch.tensor([alpha], dtype=F32, device="cuda")
    return dict(a=a.to(a_dtype), b=b, sfa=None, sfb=sfb, alpha=al, out_dtype=out_dtype)


def _configs():
    return nvfp4_gemm.configs().get("sm90", [])


def test_random_sweep():
    """Random M 1..2047 (every dispatch row: small-M, each wgmma token tile, split and unsplit grids), N up
    to 8192, K up to 16384 (K % 64 == 32 included), fp16 and bf16 A, every output dtype, alpha."""
    rng = random.Random(2611)
    fails = []
    for i in range(SWEEP_CASES):
        m = min(2047, max(1, int(math.exp(rng.uniform(0, math.log(2047))))))
        n = min(8192, max(8, 8 * int(math.exp(rng.uniform(0, math.log(1024))))))
        k = min(16384, max(32, 32 * int(math.exp(rng.uniform(0, math.log(512))))))
        if m * n * k > 2048 * 4096 * 4096:  # keeps the float64 reference quick
            k = max(32, (2048 * 4096 * 4096 // (m * n)) // 32 * 32)
        a_dtype = rng.choice([F16, BF16])
        out = rng.choice([None, F16, BF16, F32])
        alpha = rng.choice([None, 0.5, -2.0])
        # fp16 results overflow for wide scales at large K; keep them to fp32 / bf16 outputs there.
        scales = rng.choice(["typical", "tiny", "wide"]) if out in (F32, BF16) or (out is None and a_dtype == BF16) \
            else rng.choice(["typical", "tiny"])
        inputs = _inputs(m, n, k, a_dtype, out, alpha, scales, seed=i)
        try:
            got = nvfp4_gemm.mm(**inputs)
            assert got.dtype == (out or a_dtype)
            Reference(inputs).check(got)
        except AssertionError as e:
            fails.append(f"({m},{n},{k}) a={a_dtype} out={out} alpha={alpha} {scales} seed={i}: {e}")
    assert not fails, f"{len(fails)} of {SWEEP_CASES} failed:\n" + "\n".join(fails[:20])


# Shapes off every tile size (M, N, K; K/16 % 4 != 0); the K-sliced configs take K % 256 == 0 only, so theirs
# are off the tile in M and N (M past the token tile runs as several launches) with 1 to 5 stages of K.
_FORCED_SHAPES = ((1, 8, 32), (7, 136, 96), (45, 264, 544), (300, 200, 1056))
_FORCED_SHAPES_WK = ((1, 8, 256), (7, 136, 512), (13, 264, 768), (45, 200, 1280))


def _is_wk(name):
    return name is not None and "_wk_" in name


@pytest.mark.parametrize("a_dtype", [F16, BF16], ids=["f16", "bf16"])
def test_every_config_forced(a_dtype):
    """Each config, forced, on shapes off every tile size, split counts 1 and 3."""
    for i, name in enumerate(_configs()):
        for j, (m, n, k) in enumerate(_FORCED_SHAPES_WK if _is_wk(name) else _FORCED_SHAPES):
            for splits in (1, 3):
                seed = 100 * i + 10 * j + splits
                inputs = _inputs(m, n, k, a_dtype, F32, -0.75, seed=seed)
                with forced(config=name, splits=splits):
                    out = nvfp4_gemm.mm(**inputs)
                Reference(inputs).check(out, f"{name} ({m},{n},{k}) splits {splits} seed {seed}")


@pytest.mark.parametrize("a_dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("scales", ["typical", "tiny", "wide"])
def test_decode_is_exact(monkeypatch, a_dtype, scales):
    """A = rows of the identity picks single columns of B: C must equal the decoded weights exactly (each
    output is one exact product), on every config. Catches a flushed subnormal (code 0.5, e4m3 subnormal
    scales), a misplaced nibble, scale or K position, in fp16 and in bf16."""
    n = 264
    for i, name in enumerate([None] + _configs()):
        if name:
            monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        m = 8 if name is None or "_smallm_" in name else 16 if _is_wk(name) else 136
        k = 768 if _is_wk(name) else 544
        inputs = _inputs(m, n, k, a_dtype, F32, None, scales, seed=7 + i)
        cols = torch.randperm(k, generator=torch.Generator().manual_seed(i))[:m].cuda()
        a = torch.zeros(m, k, dtype=a_dtype, device="cuda")
        a[torch.arange(m, device="cuda"), cols] = 1.0
        inputs["a"] = a
        want = nvfp4_gemm.dequantize(inputs["b"], inputs["sfb"], k, F32)[:, cols].t()
        got = nvfp4_gemm.mm(**inputs)
        assert torch.equal(got, want), (name, scales, (got - want).abs().max().item())


@pytest.mark.parametrize("shape", [(1, 7168, 16384), (16, 4096, 7168), (128, 7168, 2048), (300, 4096, 1024)])
@pytest.mark.parametrize("a_dtype", [F16, BF16], ids=["f16", "bf16"])
def test_bitwise_deterministic(shape, a_dtype):
    inputs = _inputs(*shape, a_dtype, seed=5)
    first = nvfp4_gemm.mm(**inputs)
    for _ in range(9):
        assert torch.equal(nvfp4_gemm.mm(**inputs).view(torch.int16), first.view(torch.int16))


def test_every_config_on_a_side_stream(monkeypatch):
    """Inputs still being produced on a side stream, only that stream synchronized before the check: the
    A prepass, the GEMM and the split fix-up must all run on the caller's stream."""
    for i, name in enumerate(_configs()):
        monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        m = 8 if "_smallm_" in name else 16 if _is_wk(name) else 300
        inputs = _inputs(m, 1024, 2048 if _is_wk(name) else 2080, BF16 if i % 2 else F16, F32, 1.5, seed=31 + i)
        out, _ = run_after_slow_producer(nvfp4_gemm.mm, inputs)
        Reference(inputs).check(out, f"{name} on a side stream, seed {31 + i}")


@pytest.mark.parametrize("shape", [(128, 1024, 2048), (8, 1024, 8192)])
def test_cuda_graph_replay(shape):
    inputs = _inputs(*shape, BF16, alpha=1.5, seed=9)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nvfp4_gemm.mm(**inputs)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = nvfp4_gemm.mm(**inputs)
    inputs["alpha"].fill_(-3.0)
    inputs["a"].mul_(0.5)  # read at replay time
    graph.replay()
    torch.cuda.synchronize()
    Reference(inputs).check(captured, f"graph replay of {shape}")


def test_dispatch_takes_16_bit_activations():
    """Automatic dispatch: fp16 / bf16 activations run on sm90 (small-M or K-sliced at M <= 32, wgmma above), fp32
    activations on the generic path (nvfp4_gemm.testing.recorded_choices)."""
    b = torch.randint(0, 256, (1024, 1024), dtype=torch.uint8, device="cuda")
    sfb = nvfp4_gemm.to_blocked(torch.full((1024, 128), 0x38, dtype=torch.uint8, device="cuda")
                                .view(torch.float8_e4m3fn))
    with forced(backend="auto"), recorded_choices() as recorded:
        for dt in (F16, BF16, F32):
            for m in (4, 100):
                nvfp4_gemm.mm(torch.randn(m, 2048, device="cuda").to(dt), b, None, sfb)
    torch.cuda.synchronize()
    lines = [ln for ln in recorded if "w4a16" in ln]
    assert len(lines) == 6, lines
    sm90 = [ln for ln in lines if ln.startswith("sm90:")]
    generic = [ln for ln in lines if ln.startswith("generic")]
    assert len(sm90) == 4 and len(generic) == 2, lines
    assert any(("_smallm_" in ln or "_wk_" in ln) and " m=4 " in ln for ln in sm90), sm90
    assert any("_smallm_" not in ln and "_wk_" not in ln and " m=100 " in ln for ln in sm90), sm90


@pytest.mark.parametrize("x_dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_linear_quantizes_in_the_gemm(x_dtype, mode):
    """nvfp4_gemm.linear in W4A4 modes hands x to the sm90 kernels, which quantize it in a kernel of the call
    ahead of the GEMM (K-sliced kernel, M <= 16 with K % 256 == 0), while staging A (small-M kernel, M <= 32) or
    in their prepass (wgmma configs): the result must be bit for bit quantize() + mm() with the same scales, over
    every kernel, K % 64 == 32, every split count, NaN / inf / zero rows in x."""
    from nvfp4_gemm.quantize import finite_amax, global_encode_scale

    rng = random.Random(zlib.crc32(f"{x_dtype}-{mode}".encode()))
    for i, (m, n, k) in enumerate(((1, 264, 544), (7, 136, 4096), (17, 1024, 2080), (32, 128, 96), (33, 200, 1056),
                                   (100, 392, 544), (300, 136, 4128))):
        g = torch.Generator(device="cuda").manual_seed(i)
        x = (torch.randn(m, k, device="cuda", generator=g) * 4).to(x_dtype)
        if i % 3 == 1:
            x[0, 5] = float("nan")
            x[-1, 40] = float("inf")
        if m > 2:
            x[1].zero_()
        w = torch.randn(n, k, device="cuda", generator=g)
        ws2 = (w.abs().amax() / 2688.0).reshape(1)
        wq, wsf = nvfp4_gemm.quantize(w, 1.0 / ws2)
        input_scale = (finite_amax(x) / 2688.0 * 0.8).reshape(1)
        for splits in (0, rng.choice([1, 2, 3])):
            with forced(splits=splits):
                y = nvfp4_gemm.linear(x, wq, wsf, ws2, input_scale if mode == "static" else None)
                if mode == "static":
                    decode = input_scale
                    encode = torch.reciprocal(decode)
                else:
                    encode = global_encode_scale(finite_amax(x))
                    decode = torch.reciprocal(encode)
                packed, sf = nvfp4_gemm.quantize(x, encode)
                ref = nvfp4_gemm.mm(packed, wq, sf, wsf, decode * ws2, x_dtype)
            assert torch.equal(y.view(torch.uint8), ref.view(torch.uint8)), (m, n, k, splits)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_wk_configs_quantize_on_the_fly(mode):
    """The K-sliced configs, forced, on linear's W4A4: x quantized into the call's workspace, then read as NVFP4
    A. Past TOKENS (M = 40: several launches reuse the workspace, each quantizing its own rows), x with rows
    further apart than K (a view), every x dtype, poisoned memory: bit for bit quantize() + mm()."""
    from nvfp4_gemm.quantize import finite_amax, global_encode_scale

    wk = [c for c in nvfp4_gemm.configs()["sm90"] if "_wk_" in c]
    assert wk
    for i, name in enumerate(wk):
        for j, (m, n, k) in enumerate(((1, 136, 256), (13, 200, 2048), (40, 136, 512), (16, 264, 1536))):
            g = torch.Generator(device="cuda").manual_seed(10 * i + j)
            x_dtype = (F16, BF16, F32)[(i + j) % 3]
            wide = (torch.randn(m, k + 64, device="cuda", generator=g) * 3).to(x_dtype)
            x = wide[:, :k] if j % 2 else wide[:, :k].contiguous()
            w = torch.randn(n, k, device="cuda", generator=g)
            ws2 = (w.abs().amax() / 2688.0).reshape(1)
            wq, wsf = nvfp4_gemm.quantize(w, 1.0 / ws2)
            input_scale = (finite_amax(x) / 2688.0 * 0.7).reshape(1)
            poison_cuda_allocator(m * n * 4 + m * k, torch.device("cuda"))
            with forced(config=name):
                y = nvfp4_gemm.linear(x, wq, wsf, ws2, input_scale if mode == "static" else None)
                encode = torch.reciprocal(input_scale) if mode == "static" else global_encode_scale(finite_amax(x))
                packed, sf = nvfp4_gemm.quantize(x, encode)
                ref = nvfp4_gemm.mm(packed, wq, sf, wsf, torch.reciprocal(encode) * ws2 if mode == "dynamic"
                                    else input_scale * ws2, x_dtype)
            assert torch.equal(y.view(torch.uint8), ref.view(torch.uint8)), (name, m, n, k, x_dtype)


_DYNAMIC_CHECK = """
import sys, torch, nvfp4_gemm
def check(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for x_dtype in (torch.float16, torch.bfloat16, torch.float32):
        for m, n, k in ((1, 264, 4096), (16, 136, 1024), (9, 200, 14336), (64, 200, 1056), (600, 264, 2080)):
            w = torch.randn(n, k, device="cuda", generator=g)
            ws2 = (w.abs().amax() / 2688.0).reshape(1)
            wq, wsf = nvfp4_gemm.quantize(w, 1.0 / ws2)
            base = torch.randn(m, k, device="cuda", generator=g)
            # Each launch must start from zeroed reduction words: a large amax, then small ones, then none finite.
            xs = [base * 1000, base * 1e-3, torch.zeros_like(base), base.clone()]
            xs[3][0, 3] = float("nan")
            xs[3][-1, 7] = float("inf")
            xs.append(torch.full_like(base, float("nan")))
            for i, x in enumerate(x.to(x_dtype) for x in xs):
                y = nvfp4_gemm.linear(x, wq, wsf, ws2)
                scales = torch.ops.nvfp4_gemm._input_scales(x, ws2, None)
                packed, sf = nvfp4_gemm.quantize(x, scales[0:1])
                ref = nvfp4_gemm.mm(packed, wq, sf, wsf, scales[2:3], x_dtype)
                assert torch.equal(y.view(torch.uint8), ref.view(torch.uint8)), (x_dtype, m, n, k, i)
check(int(sys.argv[1]))
if sys.argv[2] == "workspace-words":
    # Take every split-counter slot of the device (one per stream and capture sequence: each capture takes a new
    # one), so that the calls below, captured, count on workspace words zeroed ahead.
    x = torch.randn(1, 256, device="cuda")
    w, s2 = nvfp4_gemm.quantize(torch.randn(128, 256, device="cuda"), torch.ones(1, device="cuda"))
    for _ in range(130):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            nvfp4_gemm.linear(x, w, s2, torch.ones(1, device="cuda"))
    eager = nvfp4_gemm.linear
    def captured(*args):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = eager(*args)
        g.replay()
        torch.cuda.synchronize()
        return y
    nvfp4_gemm.linear = captured
    check(int(sys.argv[1]))
print("ok")
"""


@pytest.mark.parametrize("slots", ["counter-slot", "workspace-words"])
def test_dynamic_scales_formed_in_the_gemm(slots):
    """Dynamic W4A4 at M <= 16 (K % 256 == 0) and M > 32: the call forms the input scales itself (a grid-wide max
    over x's finite values, then recipe.h's scales; the K-sliced call's quantization kernel, the wgmma configs'
    A prepass, which at M = 600 loops over more groups than its one-CTA-per-SM grid holds) with no input-scales
    launch; bit for bit the input-scales op, quantize and mm, for every x dtype, a launch after a larger amax
    (the reduction words start from zero each time), all zeros, NaN / inf elements and nothing finite; on the
    stream's counter slot and, once every slot of the device is taken (in a child process, which takes them all
    with CUDA-graph captures), on workspace words zeroed ahead, in captured calls."""
    env = dict(os.environ, NVFP4_GEMM_BACKEND="sm90")
    env.pop("NVFP4_GEMM_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", _DYNAMIC_CHECK, "5", slots], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_linear_runs_one_fused_gemm():
    """What runs (nvfp4_gemm.testing.recorded_choices): one GEMM call that quantizes x itself, the K-sliced kernel at
    M = 4 (K % 256 == 0), a wgmma config at M = 100."""
    w = torch.randn(256, 1024, device="cuda")
    ws2 = (w.abs().amax() / 2688.0).reshape(1)
    wq, wsf = nvfp4_gemm.quantize(w, 1.0 / ws2)
    with forced(backend="auto"), recorded_choices() as lines:
        for m in (4, 100):
            x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
            nvfp4_gemm.linear(x, wq, wsf, ws2, torch.full((1,), 0.01, device="cuda"))
            nvfp4_gemm.linear(x, wq, wsf, ws2)
    torch.cuda.synchronize()
    sm90 = [ln for ln in lines if ln.startswith("sm90:")]
    small = [ln for ln in sm90 if " m=4 " in ln]
    large = [ln for ln in sm90 if " m=100 " in ln]
    assert small and all("_wk_" in ln and "quantizing a=bf16" in ln for ln in small), lines
    assert large and all("_wk_" not in ln and "quantizing a=bf16" in ln for ln in large), lines
    assert not any("quantizing" not in ln for ln in sm90), lines  # no separate mm of a packed x


@pytest.mark.parametrize("m, splits, n", [(1, 1, 2048), (1, 0, 2048), (16, 1, 2048), (16, 0, 2048), (16, 0, 8192)],
                         ids=["m1-unsplit", "m1-auto-split", "m16-unsplit", "m16-auto-split", "m16-k-sliced-split"])
def test_chain_consumes_the_previous_output(m, splits, n):
    """Each call's activations are the previous call's output, launched back to back (the small-M kernels
    start before their predecessor ends: programmatic dependent launch; split calls count on counters that
    the previous call left zero), eagerly and in a CUDA graph: equal bit for bit to the same chain with a
    device synchronize between calls. n = 8192 at M = 16 is the K-sliced kernel with 4 splits."""
    k = n
    layers = [_inputs(1, n, k, F16, seed=700 + i) for i in range(12)]
    for layer in layers:  # alpha keeps the activations' RMS through the chain, within fp16's range
        w = nvfp4_gemm.dequantize(layer["b"], layer["sfb"], k, F32)
        layer["alpha"] = (1.0 / (w.pow(2).mean().sqrt() * math.sqrt(k))).reshape(1)
    x0 = _inputs(m, n, k, F16, seed=800)["a"]

    def chain(x, sync):
        for layer in layers:
            x = nvfp4_gemm.mm(x, layer["b"], None, layer["sfb"], alpha=layer["alpha"])
            if sync:
                torch.cuda.synchronize()
        return x

    with forced(splits=splits):
        ref = chain(x0, sync=True)
        assert bool(torch.isfinite(ref).all()) and ref.abs().max() > 0
        assert torch.equal(chain(x0, sync=False), ref)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            chain(x0, sync=False)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = chain(x0, sync=False)
        for _ in range(3):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, ref)


@pytest.mark.parametrize("m, n", [(1, 2048), (16, 8192)], ids=["small-m", "k-sliced"])
def test_split_chains_on_two_streams_at_once(m, n):
    """Split GEMMs on two streams at the same time (each stream has its own split counters,
    csrc/sm90/split_counters.cuh): each stream's chain equals the same chain run alone, bit for bit."""
    layers = [_inputs(1, n, n, F16, seed=900 + i) for i in range(6)]
    for layer in layers:
        w = nvfp4_gemm.dequantize(layer["b"], layer["sfb"], n, F32)
        layer["alpha"] = (1.0 / (w.pow(2).mean().sqrt() * math.sqrt(n))).reshape(1)
    xs = [_inputs(m, n, n, F16, seed=950 + j)["a"] for j in range(2)]

    def chain(x):
        for _ in range(4):
            for layer in layers:
                x = nvfp4_gemm.mm(x, layer["b"], None, layer["sfb"], alpha=layer["alpha"])
        return x

    refs = [chain(x) for x in xs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in xs]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for s, x in zip(streams, xs):
        with torch.cuda.stream(s):
            outs.append(chain(x))
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for out, ref in zip(outs, refs):
        assert torch.equal(out, ref)
