"""nvfp4_gemm.linear (torch.ops.nvfp4_gemm.linear): one op per NVFP4Linear forward, in its three modes.

W4A4 results must equal quantize() followed by mm() with the same scales bit for bit (the op's contract),
and every mode must match a float64 reference of the values it multiplies within SPEC.md's bound."""
from __future__ import annotations

import re
import zlib

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.quantize import finite_amax, global_encode_scale
from test_weight_only import assert_within_spec

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
MODES = ("weight_only", "static", "dynamic")


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
    return y.reshape(*x.shape[:-1], -1), a


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_linear_equals_composed_ops(backend, mode, dtype, bias):
    name, device = backend
    if mode == "weight_only" and dtype == F32 and name in ("sm90", "sm100"):
        pytest.skip(f"a forced {name} backend refuses float32 activations (they run on the generic path)")
    seed = zlib.crc32(f"{mode}-{dtype}-{bias}".encode())
    layer = make_layer(72, 96, device, seed, bias_dtype=dtype if bias else None)
    x = make_x((3, 11, 96), dtype, device, seed + 1)
    input_scale = (finite_amax(x) / 2688.0 * 0.8).reshape(1)  # some inputs saturate, as calibration allows
    y = call(x, layer, mode, input_scale)
    ref, a = composed(x, layer, mode, input_scale)
    assert y.shape == (3, 11, 72) and y.dtype == dtype
    assert torch.equal(y, ref)
    if not bias:
        # And the numbers themselves: float64 product of what was multiplied, SPEC.md's bound.
        alpha = layer["weight_scale_2"] if mode == "weight_only" else None
        if mode != "weight_only":
            decode = input_scale if mode == "static" else 1.0 / global_encode_scale(finite_amax(x))
            alpha = decode * layer["weight_scale_2"]
        assert_within_spec(y.reshape(-1, 72), dict(a, b=layer["weight"], sfb=layer["weight_scale"], alpha=alpha))


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
