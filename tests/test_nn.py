"""NVFP4Linear and quantize_model against references that do not share their code path: torchao's NVFP4
quantizer (for the weight and the activations) and checkpoints written byte by byte in this file, decoded
here in float64; outputs checked with docs/CONTRACT.md's bound. Also: the ModelOpt loader's errors, state_dict round
trips, input errors, torch.compile, layer selection and calibration."""
from __future__ import annotations

import importlib
import io

import pytest
import torch
from torch import nn

from nvfp4_gemm import NVFP4Linear, quantize_model
from nvfp4_gemm.formats import dequantize
from nvfp4_gemm.testing import MODES, SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, seed_of
from conftest import skip_refused_weight_only_float32

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Per-tensor amaxes with 2688 / amax a power of two: the decode scales amax / 2688 are then exact, so torchao
# (which divides by the decode scale) and the layer (which multiplies by the encode scale) round the same.
W_AMAX = 2688.0 / 8192   # weight decode scale 2^-13
X_AMAX = 2688.0 / 256    # activation decode scale 2^-8


# ---- independent decoding (docs/CONTRACT.md's definitions, written out here) -------------------------------------

def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[R, K/2] bytes -> [R, K] float64 values; element 2i in the low nibble (docs/CONTRACT.md)."""
    b = packed.view(torch.uint8).long()
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1)
    mag = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def decode_e4m3(sf: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes -> float64 by the bit formula (bias 7, subnormals 2^-6 * m/8, 0x7F NaN)."""
    b = sf.view(torch.uint8).long()
    e, m = (b >> 3) & 0xF, (b & 7).double()
    val = torch.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * torch.pow(2.0, (e - 7).double()))
    val = torch.where((b & 0x7F) == 0x7F, torch.full_like(val, float("nan")), val)
    return torch.where(b >= 0x80, -val, val)


def decode_nvfp4(packed: torch.Tensor, sf_linear: torch.Tensor, decode_scale: float) -> torch.Tensor:
    return decode_e2m1(packed) * decode_e4m3(sf_linear).repeat_interleave(16, dim=1) * decode_scale


def torchao_module():
    try:
        return importlib.import_module("torchao.prototype.mx_formats.nvfp4_tensor")
    except Exception as e:  # noqa: BLE001 - absent, or built for another torch
        pytest.skip(f"torchao is not importable here ({type(e).__name__}: {e}); `pip install --no-deps torchao==0.18.0`")


def torchao_dequantized(t: torch.Tensor, decode_scale: float) -> torch.Tensor:
    """t quantized by torchao's NVFP4 quantizer with per-tensor decode scale `decode_scale`, decoded here."""
    scale, data = torchao_module().nvfp4_quantize(t.float().contiguous(), 16, torch.tensor(decode_scale))
    return decode_nvfp4(data, scale.reshape(t.shape[0], -1), decode_scale)


def check_linear_output(out: torch.Tensor, x_dq: torch.Tensor, w_dq: torch.Tensor, bias: torch.Tensor | None,
                        dtype: torch.dtype) -> None:
    """docs/CONTRACT.md's bound for y = x_dq @ w_dq^T + bias (float64 operands with the per-tensor scales folded in):
    |out - ref| <= 2u|ref| + 2^-16 (|x_dq| @ |w_dq|^T + |bias|) + d. The bias term covers its fp32 addition."""
    assert out.dtype == dtype, f"dtype {out.dtype} != {dtype}"
    x2 = x_dq.reshape(-1, x_dq.shape[-1])
    ref = x2 @ w_dq.T
    mag = x2.abs() @ w_dq.abs().T
    if bias is not None:
        ref, mag = ref + bias.double(), mag + bias.double().abs()
    got = out.detach().cpu().double().reshape(ref.shape)
    bound = 2 * UNIT_ROUNDOFF[dtype] * ref.abs() + 2.0**-16 * mag + SMALLEST_SUBNORMAL[dtype]
    ratio = (got - ref).abs() / bound
    worst = int(ratio.argmax())
    i, j = divmod(worst, ref.shape[1])
    assert ratio.max() <= 1.0, (f"{int((ratio > 1).sum())} of {ratio.numel()} outputs out of bound; worst ({i}, {j}): "
                                f"out={got[i, j].item()!r} ref={ref[i, j].item()!r} bound={bound[i, j].item():.3g}")


# ---- data --------------------------------------------------------------------------------------------------

def make_weight(n: int, k: int, seed: int) -> torch.Tensor:
    """Weights over several binades per block, with one element of magnitude exactly W_AMAX."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.04 * torch.exp(0.7 * torch.randn(n, k // 16, 1, generator=g)).repeat_interleave(16, 1).reshape(n, k)
    w = w.clamp(-0.9 * W_AMAX, 0.9 * W_AMAX)
    w[seed % n, (seed // n) % k] = -W_AMAX if seed % 2 else W_AMAX
    return w


def make_activations(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Activation-like rows (spread by e^N(0, 1) per row and per block), some exact quarter multiples (e2m1
    rounding midpoints after scaling), one element of magnitude exactly X_AMAX."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp(torch.randn(rows, 1, generator=g))
    x = (x.view(rows, -1, 16) * torch.exp(torch.randn(rows, k // 16, 1, generator=g))).view(rows, k)
    quarters = torch.randint(-24, 25, (rows, k), generator=g).float() * 0.25
    x = torch.where(torch.rand(rows, k, generator=g) < 0.1, quarters, x).clamp(-0.95 * X_AMAX, 0.95 * X_AMAX)
    x[rows // 2, seed % k] = X_AMAX
    return x.to(dtype)


def make_linear(k: int, n: int, bias: bool, dtype: torch.dtype, seed: int) -> nn.Linear:
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(make_weight(n, k, seed))
        if bias:
            lin.bias.copy_(torch.randn(n, generator=torch.Generator().manual_seed(seed + 1)))
    return lin.to(dtype)


def layer_for(mode: str, lin: nn.Linear) -> NVFP4Linear:
    # Static: a calibrated amax twice the data's, so the static and the dynamic scales differ (2^-7 vs 2^-8).
    if mode == "weight_only":
        return NVFP4Linear.from_linear(lin, weight_only=True)
    return NVFP4Linear.from_linear(lin, input_amax=2 * X_AMAX if mode == "static" else None)


# ---- from_linear ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_from_linear_buffers_match_torchao(dtype):
    """The weight buffers are torchao's NVFP4 quantization of the weight (swizzled scales = the blocked layout)."""
    ao = torchao_module()
    n, k = 136, 96  # N > 128 and K/16 = 6: both paddings of the blocked layout
    lin = make_linear(k, n, True, dtype, seed_of("from_linear", dtype))
    layer = NVFP4Linear.from_linear(lin)
    t = ao.NVFP4Tensor.to_nvfp4(lin.weight.detach().float(), per_tensor_scale=torch.tensor(W_AMAX / 2688),
                                is_swizzled_scales=True)
    assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (n, k // 2)
    assert layer.weight_scale.dtype == torch.float8_e4m3fn and layer.weight_scale.shape == (256 * 8,)
    assert torch.equal(layer.weight, t.qdata.view(torch.uint8))
    assert torch.equal(layer.weight_scale.view(torch.uint8), t.scale.reshape(-1).view(torch.uint8))
    assert layer.weight_scale_2.dtype == torch.float32 and layer.weight_scale_2.item() == 2.0**-13
    assert layer.bias.dtype == dtype and torch.equal(layer.bias, lin.bias.detach())
    assert not layer.static_input_scale and not layer.weight_only


def test_from_linear_argument_errors():
    lin = make_linear(64, 16, False, torch.float32, 0)
    with pytest.raises(ValueError, match=r"weight_only layer does not have; pass input_amax=None"):
        NVFP4Linear.from_linear(lin, input_amax=1.0, weight_only=True)
    with pytest.raises(ValueError, match=r"method must be one of .*'rtn'.*, got 'nearest'"):
        NVFP4Linear.from_linear(lin, method="nearest")
    with pytest.raises(ValueError, match=r"a weight_only layer has no input scale; static_input_scale must be False"):
        NVFP4Linear(64, 16, static_input_scale=True, weight_only=True)


# ---- forward -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", (True, False), ids=("bias", "nobias"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_forward_matches_float64_reference(backend, mode, dtype, bias):
    """y against float64 math on torchao-quantized operands: W4A4 quantizes x with the static (2^-7) or
    dynamic (amax 2688 * 2^-8) decode scale; weight-only multiplies x as given."""
    name, device = backend
    skip_refused_weight_only_float32(name, mode, dtype)
    k, n = 96, 40
    seed = seed_of("forward", mode, dtype, bias)
    lin = make_linear(k, n, bias, dtype, seed)
    x = make_activations(2 * 3 * 5, k, dtype, seed + 2).reshape(2, 3, 5, k)
    layer = layer_for(mode, lin).to(device)
    out = layer(x.to(device))
    assert out.shape == (2, 3, 5, n) and out.device.type == device.type
    w_dq = torchao_dequantized(lin.weight.detach(), W_AMAX / 2688)
    x2 = x.reshape(-1, k)
    x_dq = {"weight_only": lambda: x2.double(), "static": lambda: torchao_dequantized(x2, 2.0**-7),
            "dynamic": lambda: torchao_dequantized(x2, 2.0**-8)}[mode]()
    check_linear_output(out, x_dq, w_dq, lin.bias.detach() if bias else None, dtype)


def test_static_scale_saturates_beyond_calibration():
    """An input beyond the calibrated amax decodes to at most 6 * 448 * input_scale (the largest NVFP4 value)."""
    k, n = 64, 16
    lin = nn.Linear(k, n, bias=False)
    with torch.no_grad():
        lin.weight.zero_()
        lin.weight[:, 0] = W_AMAX  # picks x[:, 0] times W_AMAX (the one exactly representable weight)
    layer = NVFP4Linear.from_linear(lin, input_amax=X_AMAX)
    x = torch.zeros(3, k)
    x[:, 0] = torch.tensor([0.5 * X_AMAX, 4 * X_AMAX, -100 * X_AMAX])
    out = layer(x)[:, 0]
    assert out.tolist() == pytest.approx([0.5 * X_AMAX * W_AMAX, X_AMAX * W_AMAX, -X_AMAX * W_AMAX], rel=2.0**-20)


@pytest.mark.parametrize("mode", MODES)
def test_empty_batch(backend, mode):
    _, device = backend
    layer = layer_for(mode, make_linear(64, 16, True, torch.float32, 3)).to(device)
    out = layer(torch.zeros(0, 5, 64, dtype=torch.bfloat16, device=device))
    assert out.shape == (0, 5, 16) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("mode", MODES)
def test_input_errors(mode):
    layer = layer_for(mode, make_linear(64, 16, True, torch.float32, 4))
    with pytest.raises(ValueError, match=r"x.shape\[-1\] must be in_features = 64, got 32"):
        layer(torch.zeros(2, 32))
    with pytest.raises(ValueError, match=r"at least 2 dims, got 1-D shape \(64,\)"):
        layer(torch.zeros(64))
    with pytest.raises(ValueError, match=r"x must be float16, bfloat16 or float32, got torch.int32"):
        layer(torch.zeros(2, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"x must be on the layer's device cpu, got meta"):
        layer(torch.zeros(2, 64, device="meta"))
    with pytest.raises(ValueError, match=r"in_features \(K\) must be a positive multiple of 32, got 48"):
        NVFP4Linear(48, 64)
    with pytest.raises(ValueError, match=r"out_features \(N\) must be a positive multiple of 8, got 10"):
        NVFP4Linear(64, 10)


# ---- ModelOpt checkpoints --------------------------------------------------------------------------------------

def handmade_checkpoint(n: int, k: int, prefix: str, seed: int, input_scale: float | None) -> dict:
    """A ModelOpt NVFP4 layer from bytes: random codes (all 16), LINEAR e4m3 scales from 2^-6 to 2^3 (every
    mantissa), a non-power-of-two weight_scale_2, a bf16 bias. Nothing here goes through our quantizer."""
    g = torch.Generator().manual_seed(seed)
    exp = torch.randint(1, 11, (n, k // 16), generator=g)
    man = torch.randint(0, 8, (n, k // 16), generator=g)
    sd = {
        prefix + "weight": torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
        prefix + "weight_scale": ((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn),
        prefix + "weight_scale_2": torch.tensor(0.0123, dtype=torch.float32),  # 0-dim, as ModelOpt writes it
        prefix + "bias": torch.randn(n, generator=g).to(torch.bfloat16),
    }
    if input_scale is not None:
        sd[prefix + "input_scale"] = torch.tensor(input_scale, dtype=torch.float32)
    return sd


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_from_modelopt_handmade_bytes(mode, dtype):
    n, k, p = 48, 160, "model.layers.0.mlp.up_proj."
    seed = seed_of("modelopt", mode, dtype)
    sd = handmade_checkpoint(n, k, p, seed, None if mode == "dynamic" else 2.0**-7)
    layer = NVFP4Linear.from_modelopt(sd, p.rstrip("."), weight_only=mode == "weight_only")
    assert layer.weight_only == (mode == "weight_only")
    assert layer.static_input_scale == (mode == "static")  # weight_only ignores the checkpoint's input_scale
    assert layer.bias.dtype == torch.bfloat16
    ws2 = float(sd[p + "weight_scale_2"])
    w_ref = decode_nvfp4(sd[p + "weight"], sd[p + "weight_scale"], 1.0) * float(torch.tensor(ws2, dtype=torch.float32))
    # The blocked scales the layer made decode to the checkpoint's values: an independent check of the layout.
    w_layer = dequantize(layer.weight, layer.weight_scale, k, torch.float64) * layer.weight_scale_2.double()
    assert torch.equal(w_layer, w_ref)
    x = make_activations(37, k, dtype, seed + 1)
    out = layer(x)
    x_dq = {"weight_only": lambda: x.double(), "static": lambda: torchao_dequantized(x, 2.0**-7),
            "dynamic": lambda: torchao_dequantized(x, 2.0**-8)}[mode]()
    check_linear_output(out, x_dq, w_ref, sd[p + "bias"], dtype)


def test_from_modelopt_errors():
    sd = handmade_checkpoint(32, 64, "fc.", 5, None)
    with pytest.raises(KeyError, match=r"no 'proj.weight'"):
        NVFP4Linear.from_modelopt(sd, "proj")
    bad = dict(sd, **{"fc.weight_scale": sd["fc.weight_scale"].reshape(-1)})
    with pytest.raises(ValueError, match=r"weight_scale' must be e4m3 \[N, K/16\] = \[32, 4\] in the linear layout"):
        NVFP4Linear.from_modelopt(bad, "fc.")
    bad = dict(sd, **{"fc.weight_scale_2": torch.ones(2)})
    with pytest.raises(ValueError, match=r"'fc.weight_scale_2' must be one fp32 value, got shape \(2,\)"):
        NVFP4Linear.from_modelopt(bad, "fc.")


def test_from_modelopt_with_modelopt_quantized_weight():
    """A layer exported the way NVIDIA Model Optimizer quantizes weights (its own NVFP4QTensor.quantize):
    from_modelopt's decoded weight equals ModelOpt's dequantize."""
    try:
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"nvidia-modelopt is not importable here ({type(e).__name__}: {e})")
    lin = make_linear(128, 48, True, torch.float32, 12)
    w = lin.weight.detach()
    qt, wscale, wscale_2 = NVFP4QTensor.quantize(w.clone(), 16)
    sd = {"proj.weight": qt._quantized_data, "proj.weight_scale": wscale, "proj.weight_scale_2": wscale_2,
          "proj.bias": lin.bias.detach()}
    layer = NVFP4Linear.from_modelopt(sd, "proj", weight_only=True)
    theirs = qt.dequantize(torch.float32, scale=wscale, double_scale=wscale_2, block_sizes={-1: 16})
    ours = dequantize(layer.weight, layer.weight_scale, 128) * layer.weight_scale_2
    # code * scale is exact; only where the fp32 product with weight_scale_2 is rounded may they differ.
    torch.testing.assert_close(ours, theirs, rtol=2.0**-22, atol=0)
    x = make_activations(6, 128, torch.float16, 13)
    check_linear_output(layer(x), x.double(), theirs.double(), lin.bias.detach(), torch.float16)


# ---- state_dict ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_state_dict_round_trip(mode):
    lin = make_linear(96, 48, True, torch.float32, seed_of("state_dict", mode))
    layer = layer_for(mode, lin)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    # Dynamic by default: a saved input_scale switches a fresh layer to static.
    fresh = NVFP4Linear(96, 48, weight_only=mode == "weight_only")
    fresh.load_state_dict(torch.load(buf))
    assert fresh.static_input_scale == (mode == "static")
    assert set(fresh.state_dict()) == set(layer.state_dict())
    for name, t in layer.state_dict().items():
        got = fresh.state_dict()[name]
        assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8)), name
    x = make_activations(9, 96, torch.bfloat16, 7)
    assert torch.equal(fresh(x), layer(x))


def test_weight_only_layer_refuses_an_input_scale_in_a_strict_load():
    static = layer_for("static", make_linear(64, 16, True, torch.float32, 8))
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"input_scale\""):
        NVFP4Linear(64, 16, weight_only=True).load_state_dict(static.state_dict())


# ---- torch.compile -----------------------------------------------------------------------------------------------

def test_torch_compile_fullgraph_every_mode(backend):
    """One compiled model holding a layer of each mode: bitwise the eager result."""
    _, device = backend
    torch._dynamo.reset()
    net = nn.Sequential(*(layer_for(m, make_linear(128, 128, True, torch.float32, i)) for i, m in enumerate(MODES)))
    net = net.to(device)
    x = make_activations(24, 128, torch.bfloat16, 9).reshape(2, 12, 128).to(device)
    torch.testing.assert_close(torch.compile(net, fullgraph=True)(x), net(x), rtol=0, atol=0)


# ---- quantize_model ---------------------------------------------------------------------------------------------

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)
        self.head = nn.Linear(64, 10)       # N = 10: not a multiple of 8, stays float
        self.odd = nn.Linear(40, 64)        # K = 40: not a multiple of 32, stays float
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)  # out_proj is read by its owner: untouched
        self.skip_me = nn.Linear(64, 64)
        with torch.no_grad():
            for i, lin in enumerate((self.up, self.down, self.skip_me)):
                lin.weight.copy_(make_weight(lin.out_features, lin.in_features, 100 + i))

    def forward(self, x):
        h = self.down(torch.relu(self.up(x)))
        h = h + self.attn(h, h, h, need_weights=False)[0] + self.skip_me(h)
        return self.head(h)


def test_quantize_model_selects_layers_and_calibrates():
    torch.manual_seed(0)
    net = _Net().eval()
    x = make_activations(21, 64, torch.float32, 14).reshape(3, 7, 64)
    seen = {}
    handles = [getattr(net, n).register_forward_pre_hook(lambda m, a, n=n: seen.__setitem__(n, a[0].abs().amax()))
               for n in ("up", "down")]
    with torch.no_grad():
        net(x)
    for h in handles:
        h.remove()
    quantize_model(net, filter=lambda name, m: name != "skip_me", calibrate=lambda m: m(x), progress=False)
    kinds = {name: type(m).__name__ for name, m in net.named_children()}
    assert kinds == {"up": "NVFP4Linear", "down": "NVFP4Linear", "head": "Linear", "odd": "Linear",
                     "attn": "MultiheadAttention", "skip_me": "Linear"}
    assert type(net.attn.out_proj) is not NVFP4Linear
    # The calibrated scale is the largest |input| each layer saw (recorded above on the float net) / 2688.
    for name in ("up", "down"):
        layer = getattr(net, name)
        assert layer.static_input_scale and not layer.weight_only
        torch.testing.assert_close(layer.input_scale, (seen[name] / 2688).reshape(1), rtol=2.0**-22, atol=0)


def test_quantize_model_weight_only_matches_dequantized_float_net():
    """A weight-only float32 net computes what the same net does with torchao's dequantized weights."""
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    with torch.no_grad():
        for i in (0, 2):
            net[i].weight.copy_(make_weight(net[i].out_features, net[i].in_features, 200 + i))
    w_dq = [torchao_dequantized(net[i].weight.detach(), W_AMAX / 2688) for i in (0, 2)]
    b = [net[i].bias.detach().double() for i in (0, 2)]
    quantize_model(net, weight_only=True, progress=False)
    assert all(isinstance(net[i], NVFP4Linear) and net[i].weight_only for i in (0, 2))
    x = make_activations(11, 64, torch.float32, 15)
    ref = torch.relu(x.double() @ w_dq[0].T + b[0]) @ w_dq[1].T + b[1]
    out = net(x)
    # fp32 accumulation over K <= 128 in two layers: a few fp32 ulps of the magnitudes involved.
    torch.testing.assert_close(out.double(), ref, rtol=2.0**-16, atol=2.0**-16 * ref.abs().max().item())


def test_quantize_model_dynamic_by_default_and_argument_errors():
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    quantize_model(net, progress=False)
    assert all(isinstance(net[i], NVFP4Linear) and not net[i].static_input_scale and not net[i].weight_only
               for i in (0, 2))
    fresh = nn.Sequential(nn.Linear(64, 64))
    with pytest.raises(ValueError, match=r"calibrate sets static input scales, which weight_only layers do not have"):
        quantize_model(fresh, weight_only=True, calibrate=lambda m: None)
    with pytest.raises(ValueError, match=r"method='gptq' needs calibrate"):
        quantize_model(fresh, method="gptq")
    with pytest.raises(ValueError, match=r"method must be one of .*, got 'best'"):
        quantize_model(fresh, method="best")
    assert type(fresh[0]) is nn.Linear
