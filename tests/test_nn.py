"""NVFP4Linear and quantize_model: numerics against explicit quantize + mm, static and dynamic input scales,
the ModelOpt checkpoint loader, state_dict round trips, torch.compile, layer selection."""
from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import nvfp4_gemm
from nvfp4_gemm import NVFP4Linear, quantize_model
from nvfp4_gemm.formats import dequantize, from_blocked, to_blocked
from conftest import requires_cuda
from test_quantize import random_activations

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def make_linear(k: int, n: int, bias: bool = True, seed: int = 0, dtype=torch.float32) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(random_activations(n, k, torch.float32, seed=seed) * 0.05)
        if bias:
            lin.bias.normal_()
    return lin.to(dtype)


def expected_forward(layer: NVFP4Linear, x: torch.Tensor) -> torch.Tensor:
    """What forward must compute, spelled out: quantize x with the encode scale, mm with the product of
    the decode scales, bias in the output dtype."""
    x2 = x.reshape(-1, layer.in_features)
    if layer.input_scale is not None:
        dec = layer.input_scale
        enc = 1.0 / dec
    else:
        a = x2.float().abs()
        amax = torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax()
        enc = nvfp4_gemm.global_encode_scale(amax)
        dec = 1.0 / enc
    p, sf = nvfp4_gemm.reference_quantize(x2.cpu(), enc.cpu())
    out = nvfp4_gemm.reference_mm(p, layer.weight.cpu(), sf, layer.weight_scale.cpu(),
                                  alpha=dec.cpu() * layer.weight_scale_2.cpu(), out_dtype=torch.float32)
    if layer.bias is not None:
        out = out + layer.bias.cpu().float()
    return out.to(x.dtype).reshape(*x.shape[:-1], layer.out_features)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("static", (False, True), ids=("dynamic", "static"))
def test_forward_matches_explicit_quantize_mm(backend, dtype, static):
    _, device = backend
    lin = make_linear(96, 40, seed=1, dtype=dtype)
    x = random_activations(2 * 3 * 5, 96, dtype, seed=2).reshape(2, 3, 5, 96)
    amax = x.float().abs().amax() * 0.8 if static else None  # some inputs beyond the calibration saturate
    layer = NVFP4Linear.from_linear(lin, input_amax=amax).to(device)
    assert layer.static_input_scale == static
    out = layer(x.to(device))
    assert out.shape == (2, 3, 5, 40) and out.dtype == dtype and out.device.type == device.type
    want = expected_forward(layer, x)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(out.cpu().float(), want.float(), rtol=tol, atol=tol * want.abs().max().item())
    # And it is an approximation of the float layer: NVFP4's ~10% per-element error averages out in the dot.
    ref = lin.float()(x.float())
    rel = (out.cpu().float() - ref).norm() / ref.norm()
    assert rel < 0.12, f"relative error vs the float layer {rel:.3f}"


def test_empty_batch(backend):
    _, device = backend
    layer = NVFP4Linear.from_linear(make_linear(64, 16)).to(device)
    out = layer(torch.zeros(0, 5, 64, dtype=torch.bfloat16, device=device))
    assert out.shape == (0, 5, 16) and out.dtype == torch.bfloat16


def test_from_linear_buffers_are_the_quantized_weight():
    lin = make_linear(128, 64, seed=3)
    layer = NVFP4Linear.from_linear(lin)
    w = lin.weight.detach()
    gs = nvfp4_gemm.global_encode_scale(w.abs().amax())
    p, sf = nvfp4_gemm.quantize(w, gs)
    assert torch.equal(layer.weight, p) and torch.equal(layer.weight_scale.view(torch.uint8), sf.view(torch.uint8))
    assert torch.equal(layer.weight_scale_2, 1.0 / gs)
    assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (64, 64)
    assert layer.weight_scale.dtype == torch.float8_e4m3fn and layer.weight_scale.shape == (128 * 8,)
    w_dq = dequantize(layer.weight, layer.weight_scale, 128) * layer.weight_scale_2
    assert ((w_dq - w).norm() / w.norm()) < 0.12


def _modelopt_state_dict(lin: nn.Linear, prefix: str, input_amax: float | None) -> dict:
    """The ModelOpt NVFP4 export format for one layer: packed weight, LINEAR e4m3 scales [N, K/16], decode
    scales weight_scale_2 = amax / (6 * 448) and input_scale (0-dim fp32), made here with our quantizer."""
    w = lin.weight.detach()
    wscale_2 = w.abs().amax().float() / (6 * 448)
    packed, sf = nvfp4_gemm.quantize(w, (1.0 / wscale_2).reshape(1))
    sd = {
        prefix + "weight": packed,
        prefix + "weight_scale": from_blocked(sf, w.shape[0], w.shape[1]).contiguous(),
        prefix + "weight_scale_2": wscale_2.reshape(()),
    }
    if input_amax is not None:
        sd[prefix + "input_scale"] = torch.tensor(input_amax / (6 * 448), dtype=torch.float32)
    if lin.bias is not None:
        sd[prefix + "bias"] = lin.bias.detach().to(torch.bfloat16)
    return sd


@pytest.mark.parametrize("with_input_scale", (False, True))
def test_from_modelopt(with_input_scale):
    lin = make_linear(64, 32, seed=4)
    sd = _modelopt_state_dict(lin, "model.layers.0.mlp.up_proj.", 3.0 if with_input_scale else None)
    layer = NVFP4Linear.from_modelopt(sd, "model.layers.0.mlp.up_proj")
    assert layer.static_input_scale == with_input_scale
    assert torch.equal(layer.weight_scale.view(torch.uint8),
                       to_blocked(sd["model.layers.0.mlp.up_proj.weight_scale"]).view(torch.uint8))
    assert layer.bias.dtype == torch.bfloat16
    x = random_activations(10, 64, torch.float32, seed=5)
    if with_input_scale:
        x = x.clamp(-3.0, 3.0)
    torch.testing.assert_close(layer(x), expected_forward(layer, x), rtol=1e-5, atol=1e-5)
    ref = lin(x)
    assert (layer(x) - ref).norm() / ref.norm() < 0.12


def test_from_modelopt_errors():
    lin = make_linear(64, 32, seed=4)
    sd = _modelopt_state_dict(lin, "fc.", None)
    with pytest.raises(KeyError, match=r"no 'proj.weight'"):
        NVFP4Linear.from_modelopt(sd, "proj")
    bad = dict(sd, **{"fc.weight_scale": to_blocked(sd["fc.weight_scale"])})
    with pytest.raises(ValueError, match=r"weight_scale' must be e4m3 \[N, K/16\] = \[32, 4\] in the linear layout"):
        NVFP4Linear.from_modelopt(bad, "fc.")


@pytest.mark.parametrize("static", (False, True), ids=("dynamic", "static"))
def test_state_dict_round_trip(static):
    lin = make_linear(96, 48, seed=6)
    layer = NVFP4Linear.from_linear(lin, input_amax=2.5 if static else None)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    fresh = NVFP4Linear(96, 48)  # dynamic by default: a saved input_scale switches it to static
    fresh.load_state_dict(torch.load(buf))
    assert fresh.static_input_scale == static
    for name, t in layer.state_dict().items():
        got = fresh.state_dict()[name]
        assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8)), name
    x = random_activations(9, 96, torch.bfloat16, seed=7)
    assert torch.equal(fresh(x), layer(x))


def test_shape_errors():
    with pytest.raises(ValueError, match=r"in_features \(K\) must be a positive multiple of 32, got 48"):
        NVFP4Linear(48, 64)
    with pytest.raises(ValueError, match=r"out_features \(N\) must be a positive multiple of 8, got 10"):
        NVFP4Linear(64, 10)
    layer = NVFP4Linear.from_linear(make_linear(64, 16))
    with pytest.raises(ValueError, match=r"x.shape\[-1\] must be in_features = 64, got 32"):
        layer(torch.zeros(2, 32))


@pytest.mark.parametrize("static", (False, True), ids=("dynamic", "static"))
def test_torch_compile_fullgraph(backend, static):
    _, device = backend
    torch._dynamo.reset()
    layer = NVFP4Linear.from_linear(make_linear(128, 64, seed=8), input_amax=4.0 if static else None).to(device)
    x = random_activations(24, 128, torch.bfloat16, seed=9).reshape(2, 12, 128).to(device)
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)
        self.head = nn.Linear(64, 10)       # N = 10: not a multiple of 8, stays float
        self.odd = nn.Linear(40, 64)        # K = 40: not a multiple of 32, stays float
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)  # out_proj is read by its owner: untouched
        self.skip_me = nn.Linear(64, 64)

    def forward(self, x):
        h = self.down(torch.relu(self.up(x)))
        h = h + self.attn(h, h, h, need_weights=False)[0] + self.skip_me(h)
        return self.head(h)


def test_quantize_model_selects_layers_and_calibrates():
    torch.manual_seed(0)
    net = _Net().eval()
    x = torch.randn(3, 7, 64)
    with torch.no_grad():
        ref = net(x)
    quantize_model(net, filter=lambda name, m: name != "skip_me", calibrate=lambda m: m(x))
    kinds = {name: type(m).__name__ for name, m in net.named_children()}
    assert kinds == {"up": "NVFP4Linear", "down": "NVFP4Linear", "head": "Linear", "odd": "Linear",
                     "attn": "MultiheadAttention", "skip_me": "Linear"}
    assert type(net.attn.out_proj) is not NVFP4Linear
    assert net.up.static_input_scale and net.down.static_input_scale
    # The calibrated scale is the largest |input| seen / 2688.
    torch.testing.assert_close(net.up.input_scale, (x.abs().amax() / 2688).reshape(1), rtol=1e-6, atol=0)
    with torch.no_grad():
        out = net(x)
    rel = (out - ref).norm() / ref.norm()
    assert rel < 0.25, f"relative error of the quantized net {rel:.3f}"  # measured 0.16; a broken scale gives >= 1


def test_quantize_model_dynamic_by_default():
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    quantize_model(net)
    assert all(isinstance(net[i], NVFP4Linear) and not net[i].static_input_scale for i in (0, 2))


@requires_cuda
def test_cuda_layer_matches_cpu_layer():
    layer = NVFP4Linear.from_linear(make_linear(256, 128, seed=10))
    x = random_activations(33, 256, torch.float32, seed=11)
    cpu = layer(x)
    gpu = layer.to("cuda")(x.cuda()).cpu()
    # Same quantized operands (bitwise, test_quantize); only the fp32 accumulation order differs.
    torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-5 * cpu.abs().max().item())


def test_from_modelopt_with_modelopt_quantized_weight():
    """A layer exported the way NVIDIA Model Optimizer quantizes weights (its own NVFP4QTensor.quantize):
    from_modelopt's decoded weight equals ModelOpt's dequantize."""
    try:
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"nvidia-modelopt is not importable here ({type(e).__name__}: {e})")
    lin = make_linear(128, 48, seed=12)
    w = lin.weight.detach()
    qt, wscale, wscale_2 = NVFP4QTensor.quantize(w.clone(), 16)
    sd = {"proj.weight": qt._quantized_data, "proj.weight_scale": wscale, "proj.weight_scale_2": wscale_2,
          "proj.input_scale": torch.tensor(4.0 / 2688), "proj.bias": lin.bias.detach()}
    layer = NVFP4Linear.from_modelopt(sd, "proj")
    theirs = qt.dequantize(torch.float32, scale=wscale, double_scale=wscale_2, block_sizes={-1: 16})
    ours = dequantize(layer.weight, layer.weight_scale, 128) * layer.weight_scale_2
    # code * scale is exact; only where the fp32 product with weight_scale_2 is rounded may they differ.
    torch.testing.assert_close(ours, theirs, rtol=2.0**-22, atol=0)
    x = random_activations(6, 128, torch.float32, seed=13).clamp(-4, 4)
    torch.testing.assert_close(layer(x), expected_forward(layer, x), rtol=1e-5, atol=1e-5)
