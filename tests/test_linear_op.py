"""nvfp4_gemm.linear (torch.ops.nvfp4_gemm.linear): one op per NVFP4Linear forward, in its three modes.

W4A4 results must equal quantize() followed by mm() with the same scales bit for bit (the op's contract),
and every mode must match a float64 reference of the values it multiplies within docs/CONTRACT.md's bound."""
from __future__ import annotations

import re
import zlib

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.quantize import finite_amax, global_encode_scale
from nvfp4_gemm.testing import MODES
from conftest import skip_refused_weight_only_float32
from test_weight_only import assert_within_spec

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def make_layer(n: int, k: int, device, seed: int, bias_dtype=None) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-3, 3, (n, 1), generator=g).float())
    ws2 = (w.abs().amax() / 2688.0).reshape(1)
    packed, sf = nvfp4_gemm.quantize(w, 1.0 / ws2)
    bias = None if bias_dtype is None else torch.randn(n, generator=g).to(bias_dtype).to(device)
    return dict(weight=packed.to(device), weight_scale=sf.to(device), weight_scale_2=ws2.to(device), bias=bias)


def make_x(shape, dtype, device, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(dtype).to(device)


def call(x, layer, mode, input_scale=None):
    return nvfp4_gemm.linear(x, layer["weight"], layer["weight_scale"], layer["weight_scale_2"],
                             input_scale if mode == "static" else None, layer["bias"],
                             weight_only=mode == "weight_only")


def composed(x, layer, mode, input_scale=None):
    """The same layer through the public ops: quantize, then mm (W4A4), or the weight-only mm."""
    x2 = x.reshape(-1, x.shape[-1])
    out_dtype = F32 if layer["bias"] is not None else x.dtype
    if mode == "weight_only":
        y = nvfp4_gemm.mm(x2, layer["weight"], None, layer["weight_scale"], layer["weight_scale_2"], out_dtype)
        a = dict(a=x2, sfa=None)
    else:
        encode = 1.0 / input_scale if mode == "static" else global_encode_scale(finite_amax(x2))
        decode = input_scale if mode == "static" else 1.0 / encode
        packed, sf = nvfp4_gemm.quantize(x2, encode)
        alpha = decode * layer["weight_scale_2"]
        y = nvfp4_gemm.mm(packed, layer["weight"], sf, layer["weight_scale"], alpha, out_dtype)
        a = dict(a=packed, sfa=sf)
    if layer["bias"] is not None:
        y = (y + layer["bias"].to(F32)).to(x.dtype)
    return y.reshape(*x.shape[:-1], y.shape[-1]), a


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_linear_equals_composed_ops(backend, mode, dtype, bias):
    name, device = backend
    skip_refused_weight_only_float32(name, mode, dtype)
    seed = zlib.crc32(f"{mode}-{dtype}-{bias}".encode())
    layer = make_layer(72, 96, device, seed, bias_dtype=dtype if bias else None)
    x = make_x((3, 11, 96), dtype, device, seed + 1)
    input_scale = (finite_amax(x) / 2688.0 * 0.8).reshape(1)  # some inputs saturate, as calibration allows
    y = call(x, layer, mode, input_scale)
    ref, a = composed(x, layer, mode, input_scale)
    assert y.shape == (3, 11, 72) and y.dtype == dtype
    assert torch.equal(y, ref)
    if not bias:
        # And the numbers themselves: float64 product of what was multiplied, docs/CONTRACT.md's bound.
        alpha = layer["weight_scale_2"] if mode == "weight_only" else None
        if mode != "weight_only":
            decode = input_scale if mode == "static" else 1.0 / global_encode_scale(finite_amax(x))
            alpha = decode * layer["weight_scale_2"]
        assert_within_spec(y.reshape(-1, 72), dict(a, b=layer["weight"], sfb=layer["weight_scale"], alpha=alpha))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("m", [1, 10])
def test_linear_equals_composed_ops_at_decode_shapes(backend, mode, dtype, m):
    """M <= 16 with K % 256 == 0: on Hopper the K-sliced kernel takes NVFP4, 16-bit and float A quantized on the
    fly there; linear's W4A4 quantizes x into the call's workspace first (csrc/sm90/backend.cu, run_wk). Still
    quantize + mm bit for bit, within docs/CONTRACT.md's bound, with several K splits (K = 1024 on 264 rows)."""
    name, device = backend
    skip_refused_weight_only_float32(name, mode, dtype)
    seed = zlib.crc32(f"decode-{mode}-{dtype}-{m}".encode())
    layer = make_layer(264, 1024, device, seed)
    x = make_x((m, 1024), dtype, device, seed + 1)
    input_scale = (finite_amax(x) / 2688.0 * 0.8).reshape(1)
    y = call(x, layer, mode, input_scale)
    ref, a = composed(x, layer, mode, input_scale)
    assert torch.equal(y, ref)
    alpha = layer["weight_scale_2"]
    if mode != "weight_only":
        decode = input_scale if mode == "static" else 1.0 / global_encode_scale(finite_amax(x))
        alpha = decode * layer["weight_scale_2"]
    assert_within_spec(y, dict(a, b=layer["weight"], sfb=layer["weight_scale"], alpha=alpha))


def test_linear_non_contiguous_and_empty(backend):
    _, device = backend
    layer = make_layer(64, 128, device, 5, bias_dtype=F16)
    x = make_x((128, 9), F16, device, 6).t()  # [9, 128], stride 1 along rows: not K-major
    for mode in MODES:
        y = call(x, layer, mode, torch.full((1,), 0.01, device=device))
        ref, _ = composed(x.contiguous(), layer, mode, torch.full((1,), 0.01, device=device))
        assert torch.equal(y, ref), mode
        empty = call(x[:0], layer, mode, torch.full((1,), 0.01, device=device))
        assert empty.shape == (0, 64) and empty.dtype == F16


def test_linear_nan_and_inf_stay_in_their_rows(backend):
    _, device = backend
    layer = make_layer(64, 128, device, 7)
    x = make_x((6, 128), F16, device, 8)
    x[1, 5] = float("nan")
    x[3, 70] = float("inf")
    for mode in MODES:
        y = call(x, layer, mode, torch.full((1,), 0.01, device=device)).float()
        rows_with_nan = torch.isnan(y).any(dim=1).nonzero().flatten().tolist()
        # W4A4 saturates inf to the largest code; weight-only multiplies it as it is (inf * 0 = NaN, as
        # F.linear gives), so there row 3 may hold NaN and inf too. No other row is touched.
        assert rows_with_nan == ([1, 3] if mode == "weight_only" else [1]), (mode, rows_with_nan)
        assert bool(torch.isfinite(y[[0, 2, 4, 5] + ([3] if mode != "weight_only" else [])]).all()), mode


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(x=torch.zeros(128)), "x must be [..., K] with at least 2 dims"),
        (dict(x=torch.zeros(2, 96)), "x.shape[-1] must be in_features K = 128"),
        (dict(x=torch.zeros(2, 128, dtype=torch.int32)), "x must be float16, bfloat16 or float32, got Int"),
        (dict(input_scale=torch.ones(1), weight_only=True), "weight_only=True takes no input_scale"),
        (dict(weight_scale_2=torch.ones(2)), "weight_scale_2 must hold exactly one value"),
        (dict(input_scale=torch.ones(1, dtype=torch.float64)), "input_scale must be float32"),
        (dict(bias=torch.zeros(63)), "bias must be [N] = [64]"),
    ],
    ids=["1d-x", "wrong-k", "int-x", "weight-only-with-input-scale", "ws2-shape", "input-scale-dtype", "bias-shape"],
)
def test_linear_errors(backend, kwargs, message):
    _, device = backend
    layer = make_layer(64, 128, device, 9)
    args = dict(x=torch.zeros(2, 128), weight=layer["weight"], weight_scale=layer["weight_scale"],
                weight_scale_2=layer["weight_scale_2"], input_scale=None, bias=None, weight_only=False)
    args.update(kwargs)
    args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    with pytest.raises(RuntimeError, match=re.escape(message)):
        nvfp4_gemm.linear(**args)


@pytest.mark.parametrize("mode", MODES)
def test_linear_opcheck(backend, mode):
    _, device = backend
    layer = make_layer(64, 96, device, 10, bias_dtype=BF16)
    x = make_x((2, 5, 96), BF16, device, 11)
    args = (x, layer["weight"], layer["weight_scale"].view(torch.uint8), layer["weight_scale_2"],
            torch.full((1,), 0.002, device=device) if mode == "static" else None, layer["bias"], mode == "weight_only")
    torch.library.opcheck(torch.ops.nvfp4_gemm.linear.default, args)


def test_linear_compiles_fullgraph(backend):
    _, device = backend
    torch._dynamo.reset()
    layer = make_layer(64, 96, device, 12, bias_dtype=F16)
    x = make_x((4, 96), F16, device, 13)

    @torch.compile(fullgraph=True)
    def f(x):
        return torch.relu(call(x, layer, "dynamic")) + call(x, layer, "weight_only")

    assert torch.equal(f(x), torch.relu(call(x, layer, "dynamic")) + call(x, layer, "weight_only"))


# ---- the input scales: one native step (one CUDA launch) in place of ~12 ATen ops --------------------------------

def composite_scales(x: torch.Tensor, weight_scale_2: torch.Tensor, input_scale=None) -> torch.Tensor:
    """[encode, decode, alpha] through the ATen ops nvfp4_gemm.linear used to issue, on x's device: the
    reference nvfp4_gemm._input_scales must equal bit for bit."""
    if input_scale is not None:
        decode = input_scale.reshape(1)
        encode = torch.reciprocal(decode)
    else:
        encode = global_encode_scale(finite_amax(x))
        decode = torch.reciprocal(encode)
    return torch.cat([encode, decode, decode * weight_scale_2.reshape(1)])


def scale_cases(dtype, device) -> dict:
    """x [rows, K] on `device` per case (one a strided view)."""
    big = torch.finfo(dtype).max
    # The smallest subnormal of fp16 / bf16, a subnormal fp32: for bf16 and fp32, 2688 / it overflows fp32
    # (encode clamps to the largest finite float, decode is subnormal).
    tiny = {F16: 2.0**-24, BF16: 2.0**-133, F32: 2.0**-130}[dtype]

    def rand(rows, k, seed, scale=3.0):
        return make_x((rows, k), dtype, "cpu", seed) * scale

    cases = {}
    cases["random"] = rand(37, 96, 1)
    x = rand(29, 64, 2)
    x[3, 7], x[11, 0], x[28, 63] = float("nan"), float("inf"), -float("inf")
    x[17, 33] = 1000.0  # the finite max, among NaN and inf that must not win
    cases["nan_inf"] = x
    cases["all_zero"] = torch.zeros(5, 32, dtype=dtype)
    cases["negative_zero"] = torch.full((4, 32), -0.0, dtype=dtype)
    cases["only_nan_inf"] = torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan")] * 16,
                                         dtype=dtype).reshape(2, 32)
    x = torch.zeros(7, 64, dtype=dtype)
    x[6, 63] = -tiny
    cases["tiny_amax"] = x
    x = rand(9, 32, 3)
    x[4, 5] = -big  # the dtype's largest finite value (fp32: 1 / amax is subnormal)
    cases["huge_amax"] = x
    cases["empty_batch"] = torch.zeros(0, 64, dtype=dtype)
    cases["one_row"] = rand(1, 160, 4)
    # Many blocks on a GPU (more work than one wave of the grid: blocks loop), max in the last element.
    x = rand(1031, 1024, 5, scale=0.5)
    x[-1, -1] = 7.25
    cases["many_blocks"] = x
    # Rows further apart than K (a column slice): the kernel's strided-row path, max in the last row.
    x = rand(40, 256, 6)
    x[-1, 191] = -50.0
    cases = {name: t.to(device) for name, t in cases.items()}
    cases["strided_rows"] = x.to(device)[:, 64:192]
    assert cases["strided_rows"].stride() == (256, 1)
    return cases


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
def test_input_scales_equal_the_composite_bitwise(device, dtype):
    g = torch.Generator().manual_seed(zlib.crc32(f"scales-{dtype}".encode()))
    for name, x in scale_cases(dtype, device).items():
        ws2 = (torch.rand(1, generator=g) * 2.0 ** torch.randint(-20, 0, (1,), generator=g)).to(device)
        for input_scale in (None, (torch.rand(1, generator=g) * 0.01 + 1e-4).to(device)):
            got = torch.ops.nvfp4_gemm._input_scales(x, ws2, input_scale)
            want = composite_scales(x, ws2, input_scale)
            assert got.dtype == F32 and got.shape == (3,) and got.device == x.device
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (name, input_scale, got, want)
            if device == "cuda":  # and the host recipe gives the same bits
                cpu = torch.ops.nvfp4_gemm._input_scales(x.cpu(), ws2.cpu(), None if input_scale is None else
                                                         input_scale.cpu())
                assert torch.equal(got.cpu().view(torch.int32), cpu.view(torch.int32)), (name, input_scale)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_input_scales_reduction_state_resets_itself():
    """The dynamic kernel's grid reduction keeps its state in a slot per (device, stream, capture) that every
    launch leaves zeroed (no memset launch). A slot left dirty would make the next launch's last block never
    recognise itself: back-to-back launches of different grid sizes, two streams, and launches recorded in two
    CUDA graphs replayed between eager ones must all give the composite's bits."""
    ws2 = torch.full((1,), 0.37, device="cuda")
    xs = [make_x((rows, 256), BF16, "cuda", 100 + rows) * (rows % 7 + 1) for rows in (1, 700, 3, 2049, 64)]

    def check(x, got, what):
        want = composite_scales(x, ws2)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (what, got, want)

    for rep in range(3):
        for x in xs:
            check(x, torch.ops.nvfp4_gemm._input_scales(x, ws2), f"eager {rep} rows={x.shape[0]}")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got_side = [torch.ops.nvfp4_gemm._input_scales(x, ws2) for x in xs]
    got_main = [torch.ops.nvfp4_gemm._input_scales(x, ws2) for x in reversed(xs)]
    torch.cuda.synchronize()
    for x, got in zip(xs, got_side):
        check(x, got, f"side stream rows={x.shape[0]}")
    for x, got in zip(reversed(xs), got_main):
        check(x, got, f"main stream rows={x.shape[0]}")

    graphs, outs, statics = [], [], []
    for i, rows in enumerate((700, 3)):
        static_x = make_x((rows, 256), BF16, "cuda", 200 + i)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs.append(torch.ops.nvfp4_gemm._input_scales(static_x, ws2))
        graphs.append(g)
        statics.append(static_x)
    for rep in range(3):
        for i, (g, static_x, out) in enumerate(zip(graphs, statics, outs)):
            static_x.copy_(make_x(static_x.shape, BF16, "cuda", 300 + 10 * rep + i) * (rep + 1))
            g.replay()
            check(static_x, out, f"graph {i} replay {rep}")
            check(xs[1], torch.ops.nvfp4_gemm._input_scales(xs[1], ws2), f"eager after graph {i} replay {rep}")


@pytest.mark.parametrize("mode", ("dynamic", "static"))
def test_linear_with_extreme_inputs_equals_composed_ops(backend, mode):
    """The cases that exercise the scale arithmetic's edges, end to end through linear."""
    _, device = backend
    input_scale = torch.full((1,), 0.013, device=device)
    for name, x in scale_cases(BF16, device).items():
        if name == "many_blocks":
            continue  # the GEMM of the rest is enough; this one is about the reduction alone
        layer = make_layer(64, x.shape[1], device, 21, bias_dtype=BF16)
        y = call(x, layer, mode, input_scale)
        ref, _ = composed(x, layer, mode, input_scale)
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), (name, mode)


def test_linear_float64_bias(backend):
    """A bias wider than float32 is rounded to float32 before it joins the fp32 result."""
    _, device = backend
    layer = make_layer(64, 96, device, 22, bias_dtype=torch.float64)
    x = make_x((5, 96), F16, device, 23)
    for mode in MODES:
        y = call(x, layer, mode, torch.full((1,), 0.01, device=device))
        ref, _ = composed(x, layer, mode, torch.full((1,), 0.01, device=device))
        assert y.dtype == F16 and torch.equal(y, ref), mode


def test_input_scales_errors():
    x = torch.zeros(2, 32)
    ws2 = torch.ones(1)
    with pytest.raises(RuntimeError, match=re.escape("_input_scales: x must be 2-D [rows, K], got shape [32]")):
        torch.ops.nvfp4_gemm._input_scales(x[0], ws2)
    with pytest.raises(RuntimeError, match=re.escape("_input_scales: K = x.shape[1] must be a multiple of 16, got 24")):
        torch.ops.nvfp4_gemm._input_scales(torch.zeros(2, 24), ws2)
    with pytest.raises(RuntimeError, match=re.escape("_input_scales: weight_scale_2 must be float32, got Double")):
        torch.ops.nvfp4_gemm._input_scales(x, ws2.double())
    with pytest.raises(RuntimeError, match=re.escape("_input_scales: input_scale must hold exactly one value, got shape [2]")):
        torch.ops.nvfp4_gemm._input_scales(x, ws2, torch.ones(2))


@pytest.mark.parametrize("static", (False, True), ids=("dynamic", "static"))
def test_input_scales_opcheck(backend, static):
    _, device = backend
    x = make_x((7, 64), BF16, device, 24)
    torch.library.opcheck(torch.ops.nvfp4_gemm._input_scales.default,
                          (x, torch.full((1,), 0.5, device=device),
                           torch.full((1,), 0.002, device=device) if static else None))
