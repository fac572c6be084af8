"""Backward through frozen NVFP4 weights (nvfp4_gemm.autograd): nvfp4_gemm.linear in its three modes and the
weight-only nvfp4_gemm.mm, against float64 references built from the decoded weight; the straight-through
semantics of W4A4; the frozen-buffer errors; opcheck; torch.compile, activation checkpointing; and on a GPU,
no host sync and CUDA-graph capture of forward + backward."""
from __future__ import annotations

import re

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import nvfp4_gemm
from nvfp4_gemm import NVFP4Linear, autograd as nvfp4_autograd
from nvfp4_gemm.formats import dequantize
from nvfp4_gemm.testing import MODES, SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, Case, make_inputs, seed_of
from conftest import requires_cuda, skip_refused_weight_only_float32
from test_linear_op import call, make_layer, make_x

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def decoded64(layer: dict) -> torch.Tensor:
    """alpha * W in float64 on the CPU, through formats.dequantize (not the backward's decoder)."""
    w = layer["weight"].cpu()
    return dequantize(w, layer["weight_scale"].cpu(), w.shape[1] * 2, torch.float64) * layer["weight_scale_2"].cpu().double()


def assert_grad_within_fp32(got: torch.Tensor, dy: torch.Tensor, w64: torch.Tensor, dtype: torch.dtype) -> None:
    """got = round(dy @ w64) with fp32 accumulation: |got - ref| <= 2u|ref| + 2^-16 |dy| @ |w| + d (docs/CONTRACT.md's
    bound, the accumulation term covering any fp32 summation order over N)."""
    assert got is not None, "gradient is None"
    assert got.dtype == dtype
    dy2 = dy.detach().cpu().double().reshape(-1, w64.shape[0])
    ref, mag = dy2 @ w64, dy2.abs() @ w64.abs()
    bound = 2 * UNIT_ROUNDOFF[dtype] * ref.abs() + 2.0**-16 * mag + SMALLEST_SUBNORMAL[dtype]
    err = (got.detach().cpu().double().reshape(ref.shape) - ref).abs()
    worst = float((err / bound).max())
    assert worst <= 1, f"gradient off by {worst:.3g}x the bound"


def input_scale_for(x: torch.Tensor) -> torch.Tensor:
    # 0.5x the amax: a good share of the inputs saturate, which straight-through must not care about.
    return (x.detach().float().abs().amax() / 2688.0 * 0.5).reshape(1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_linear_grads_match_decoded_reference(backend, mode, dtype, bias):
    name, device = backend
    skip_refused_weight_only_float32(name, mode, dtype)
    seed = seed_of("grad", mode, dtype, bias)
    layer = make_layer(72, 96, device, seed, bias_dtype=dtype if bias else None)
    if bias:
        layer["bias"].requires_grad_(True)
    x = make_x((3, 7, 96), dtype, device, seed + 1).requires_grad_(True)  # 3-D: leading dims flattened
    dy = make_x((3, 7, 72), dtype, device, seed + 2)
    y = call(x, layer, mode, input_scale_for(x).to(device))
    assert y.requires_grad and y.shape == (3, 7, 72)
    y.backward(dy)
    assert x.grad is not None and x.grad.shape == x.shape
    assert_grad_within_fp32(x.grad, dy, decoded64(layer), dtype)
    if bias:
        g = layer["bias"].grad
        ref = dy.detach().cpu().double().reshape(-1, 72).sum(0)
        mag = dy.detach().cpu().double().abs().reshape(-1, 72).sum(0)
        bound = 2 * UNIT_ROUNDOFF[dtype] * ref.abs() + 21 * UNIT_ROUNDOFF[F32] * mag + SMALLEST_SUBNORMAL[dtype]
        assert g is not None and g.dtype == dtype
        assert bool(((g.cpu().double() - ref).abs() <= bound).all())


def test_w4a4_is_straight_through(backend):
    """W4A4's dx is the weight-only layer's dx bit for bit (the activation quantization passes the gradient
    through, saturated inputs included), while the forwards differ."""
    _, device = backend
    layer = make_layer(64, 128, device, 31, bias_dtype=BF16)
    x = make_x((5, 128), BF16, device, 32)
    dy = make_x((5, 64), BF16, device, 33)
    grads, outs = {}, {}
    for mode in MODES:
        xi = x.clone().requires_grad_(True)
        outs[mode] = call(xi, layer, mode, input_scale_for(x).to(device))
        outs[mode].backward(dy)
        grads[mode] = xi.grad
    assert not torch.equal(outs["static"], outs["weight_only"])
    assert torch.equal(grads["static"], grads["weight_only"])
    assert torch.equal(grads["dynamic"], grads["weight_only"])


def test_bias_alone_requires_grad():
    """A trainable bias with a frozen x: dbias flows, x gets none; the weight-only bf16 + bias forward (once an
    `out=` autograd error) runs."""
    layer = make_layer(64, 96, "cpu", 34, bias_dtype=BF16)
    layer["bias"].requires_grad_(True)
    x = make_x((4, 96), BF16, "cpu", 35)
    for mode in MODES:
        layer["bias"].grad = None
        y = call(x, layer, mode, torch.full((1,), 0.01))
        y.float().sum().backward()
        assert torch.equal(layer["bias"].grad, torch.full((64,), 4.0, dtype=BF16)), mode


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
@pytest.mark.parametrize("out_dtype", [None, F32], ids=["out-same", "out-f32"])
def test_mm_weight_only_grad(backend, dtype, out_dtype):
    name, device = backend
    if dtype == F32 and name in ("sm90", "sm100"):
        pytest.skip(f"a forced {name} backend refuses float32 activations")
    inputs = make_inputs(Case(m=9, n=40, k=64, out_dtype=F16, alpha=0.375), device, seed=seed_of("mm", dtype))
    a = make_x((9, 64), dtype, device, 41).requires_grad_(True)
    out = nvfp4_gemm.mm(a, inputs["b"], None, inputs["sfb"], inputs["alpha"], out_dtype)
    dout = make_x(tuple(out.shape), out.dtype, device, 42)
    out.backward(dout)
    w64 = dequantize(inputs["b"].cpu(), inputs["sfb"].cpu(), 64, torch.float64) * 0.375
    assert_grad_within_fp32(a.grad, dout.to(torch.float64), w64, dtype)


def test_decode_weight_equals_dequantize():
    """The backward's decoder against formats.dequantize, every code and scale kind (zero, subnormal, NaN), each
    output dtype: decode_weight (the op nvfp4_gemm::_decode on the CPU; tests/test_decode_op.py tests it in
    depth). (The nan kind puts its NaN scales in sfa: a / sfa are the decoded operand.)"""
    for scales in ("typical", "tiny", "nan"):
        inputs = make_inputs(Case(m=136, n=8, k=96, scales=scales), "cpu", seed=seed_of("decode", scales))
        packed, sf = inputs["a"], inputs["sfa"]
        want = dequantize(packed, sf, 96, F32)
        assert bool(torch.isnan(want).any()) == (scales == "nan")
        for dtype in (F16, BF16, F32):
            want = dequantize(packed, sf, 96, dtype)
            got = nvfp4_autograd.decode_weight(packed, sf, dtype)
            assert got.dtype == dtype and got.shape == want.shape
            same = (got == want) | (torch.isnan(got) & torch.isnan(want))
            assert bool(same.all()), (scales, dtype)
            # signed zeros too (code 8 is -0.0)
            assert torch.equal(torch.signbit(got[~torch.isnan(got)]), torch.signbit(want[~torch.isnan(want)]))


def test_frozen_buffer_requiring_grad_is_refused():
    """A scale that requires grad is refused at the forward, by name. (The packed uint8 weight cannot require
    grad at all: torch refuses requires_grad on integer tensors.)"""
    layer = make_layer(64, 96, "cpu", 51)
    x = make_x((3, 96), F32, "cpu", 52).requires_grad_(True)
    args = dict(weight=layer["weight"], weight_scale=layer["weight_scale"], weight_scale_2=layer["weight_scale_2"],
                input_scale=torch.full((1,), 0.01))
    tried = 0
    for name in ("weight_scale", "weight_scale_2", "input_scale"):
        try:
            t = args[name].clone().requires_grad_(True)
        except RuntimeError:  # float8 may not be allowed to require grad: then there is nothing to refuse
            continue
        tried += 1
        message = f"nvfp4_gemm.linear: {name} requires grad, but it is a frozen NVFP4 buffer"
        with pytest.raises(RuntimeError, match=re.escape(message)):
            nvfp4_gemm.linear(x, **dict(args, **{name: t}))
    assert tried >= 2
    with pytest.raises(RuntimeError):
        layer["weight"].clone().requires_grad_(True)


def test_mm_frozen_operands_and_out_are_refused():
    inputs = make_inputs(Case(m=4, n=16, k=64, alpha=0.5), "cpu", seed=61)
    a = make_x((4, 64), F32, "cpu", 62).requires_grad_(True)
    alpha = inputs["alpha"].clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match=re.escape("nvfp4_gemm.mm: alpha requires grad, but it is a frozen NVFP4 buffer")):
        nvfp4_gemm.mm(a, inputs["b"], None, inputs["sfb"], alpha)
    out = torch.full((4, 16), float("nan"))
    with pytest.raises(RuntimeError, match=re.escape("nvfp4_gemm.mm(out=...): writing into `out` does not support autograd")):
        nvfp4_gemm.mm(a, inputs["b"], None, inputs["sfb"], inputs["alpha"], out=out)
    # Without grad the out= form runs as before.
    with torch.no_grad():
        nvfp4_gemm.mm(a, inputs["b"], None, inputs["sfb"], inputs["alpha"], out=out)
    assert torch.equal(out, nvfp4_gemm.mm(a.detach(), inputs["b"], None, inputs["sfb"], inputs["alpha"]))


@pytest.mark.parametrize("mode", MODES)
def test_linear_opcheck_with_grad(backend, mode):
    _, device = backend
    layer = make_layer(64, 96, device, 71, bias_dtype=BF16)
    x = make_x((2, 5, 96), BF16, device, 72).requires_grad_(True)
    bias = layer["bias"].clone().requires_grad_(True)
    args = (x, layer["weight"], layer["weight_scale"].view(torch.uint8), layer["weight_scale_2"],
            torch.full((1,), 0.002, device=device) if mode == "static" else None, bias, mode == "weight_only")
    torch.library.opcheck(torch.ops.nvfp4_gemm.linear.default, args)


def test_mm_opcheck_with_grad(backend):
    name, device = backend
    inputs = make_inputs(Case(m=6, n=32, k=64, alpha=0.25), device, seed=73)
    a = make_x((6, 64), BF16, device, 74).requires_grad_(True)
    # uint8 scales: opcheck's schema check multiplies tensors, which float8 does not support on the CPU
    torch.library.opcheck(torch.ops.nvfp4_gemm.mm.default,
                          (a, inputs["b"], None, inputs["sfb"].view(torch.uint8), inputs["alpha"], F32))


def small_net(device, mode: str, seed: int, dtype=F32):
    """Two NVFP4Linear layers with a trainable float layer between (what an adapter is to the base)."""
    torch.manual_seed(seed)
    kw = dict(weight_only=mode == "weight_only")
    l1 = NVFP4Linear.from_linear(torch.nn.Linear(64, 96).to(device), input_amax=4.0 if mode == "static" else None, **kw)
    l2 = NVFP4Linear.from_linear(torch.nn.Linear(96, 32, bias=False).to(device), **kw)
    mid = torch.nn.Linear(96, 96).to(device)
    return l1.to(dtype), mid.to(dtype), l2.to(dtype)


def net_dtype(device) -> torch.dtype:
    # float32 activations run on the CPU and the generic CUDA path only; a forced arch backend takes 16-bit ones.
    return F32 if torch.device(device).type == "cpu" else BF16


def test_compile_forward_and_backward(backend):
    _, device = backend
    torch._dynamo.reset()
    dtype = net_dtype(device)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == F32 else dict(rtol=2e-2, atol=1e-3)
    for mode in MODES:
        l1, mid, l2 = small_net(device, mode, 81, dtype)

        def f(x):
            return l2(torch.relu(mid(l1(x))))

        x = make_x((6, 64), dtype, device, 82)
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y_eager = f(x1)
        y_eager.float().square().sum().backward()
        g_eager = (x1.grad, mid.weight.grad.clone())
        mid.weight.grad = None
        y_comp = torch.compile(f, fullgraph=True)(x2)
        y_comp.float().square().sum().backward()
        assert x2.grad is not None and mid.weight.grad is not None
        torch.testing.assert_close(y_comp, y_eager, **tol)
        torch.testing.assert_close(x2.grad, g_eager[0], **tol)
        torch.testing.assert_close(mid.weight.grad, g_eager[1], **tol)


def test_activation_checkpointing(backend):
    """Recomputing the NVFP4 layers in the backward (torch.utils.checkpoint) gives the same gradients bit for bit."""
    _, device = backend
    dtype = net_dtype(device)
    for mode in MODES:
        l1, mid, l2 = small_net(device, mode, 91, dtype)

        def block(x):
            return l2(torch.relu(mid(l1(x))))

        x = make_x((2, 5, 64), dtype, device, 92)
        grads = []
        for use_ckpt in (False, True):
            mid.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            y = checkpoint(block, xi, use_reentrant=False) if use_ckpt else block(xi)
            y.float().square().sum().backward()
            grads.append((xi.grad, mid.weight.grad, mid.bias.grad))
        for a, b in zip(*grads):
            assert torch.equal(a, b), mode


@requires_cuda
@pytest.mark.parametrize("mode", MODES)
def test_cuda_backward_has_no_host_sync_and_captures(mode):
    """On the GPU: forward + backward of a layer issue no host synchronization (sync debug mode raises on one),
    and the two captured in one CUDA graph replay to the eager gradients for new inputs."""
    l1, mid, l2 = small_net("cuda", mode, 101, BF16)
    net = lambda x: l2(torch.relu(mid(l1(x))))  # noqa: E731
    x = make_x((16, 64), BF16, "cuda", 102).requires_grad_(True)
    net(x).float().square().sum().backward()  # first call: builds the decode tables outside any capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        x.grad = None
        net(x).float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)

    static_x = make_x((16, 64), BF16, "cuda", 103).requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            static_x.grad = None
            net(static_x).float().square().sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    static_x.grad = None
    with torch.cuda.graph(graph):
        net(static_x).float().square().sum().backward()
    for seed in (104, 105):
        with torch.no_grad():
            static_x.copy_(make_x((16, 64), BF16, "cuda", seed))
        graph.replay()
        eager_x = static_x.detach().clone().requires_grad_(True)
        net(eager_x).float().square().sum().backward()
        assert torch.equal(static_x.grad, eager_x.grad), seed
