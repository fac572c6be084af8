"""Bad input gets a clear error naming the argument and expected vs actual, never a crash or a guess."""
from __future__ import annotations

import re

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, make_inputs


def call(inputs, **over):
    args = {**inputs, **over}
    return nvfp4_gemm.mm(args["a"], args["b"], args["sfa"], args["sfb"], alpha=args["alpha"], out_dtype=args["out_dtype"])


def expect_error(pattern: str, inputs: dict, **over):
    with pytest.raises((RuntimeError, ValueError, TypeError)) as e:
        call(inputs, **over)
    assert re.search(pattern, str(e.value)), f"message {str(e.value)!r} does not match {pattern!r}"


@pytest.fixture
def good(backend):
    _, device = backend
    return make_inputs(Case(130, 64, 96), device)


def test_wrong_dtype_of_each_tensor(good):
    expect_error(r"a must be packed e2m1 data of dtype torch.uint8 or torch.float4_e2m1fn_x2, or float16 / "
                 r"bfloat16 / float32 activations for the weight-only form \(with sfa=None\), got Int", good,
                 a=good["a"].to(torch.int32))
    # Float a is the weight-only form, which takes no sfa.
    expect_error(r"sfa must be None when a holds Float activations", good, a=good["a"].float())
    expect_error(r"b must be packed e2m1 data .* got Short", good, b=good["b"].to(torch.int16))
    expect_error(r"sfa must hold e4m3 scales of dtype torch.float8_e4m3fn or torch.uint8, got Float", good,
                 sfa=good["sfa"].float())
    expect_error(r"sfb must hold e4m3 scales .* got Float8_e5m2", good, sfb=good["sfb"].view(torch.float8_e5m2))


def test_k_mismatch(good):
    expect_error(r"a and b must have the same K: a is \[M, K/2\] = \[130, 48\] \(K=96\), b is .*\(K=64\)", good,
                 b=good["b"][:, :32])


def test_k_not_multiple_of_32(backend):
    _, device = backend
    bad = make_inputs(Case(8, 16, 64), device)
    bad["a"], bad["b"] = bad["a"][:, :24].contiguous(), bad["b"][:, :24].contiguous()  # K = 48
    expect_error(r"K must be a multiple of 32 .*got K=48", bad)


def test_n_not_multiple_of_8(good):
    expect_error(r"N must be a multiple of 8 .*got N=60", good, b=good["b"][:60])


def test_scales_of_wrong_size(good):
    expect_error(r"sfa must hold round_up\(M,128\)\*round_up\(K/16,4\) = 256\*8 = 2048 e4m3 values .* got 1024",
                 good, sfa=good["sfa"][:1024])
    expect_error(r"sfb must hold round_up\(N,128\)\*round_up\(K/16,4\) = 128\*8 = 1024 .* got 768",
                 good, sfb=good["sfb"][:768])


def test_linear_unpadded_scales_are_refused(good):
    """A linear [M, K/16] scale matrix (not blocked) has the wrong element count here: refused."""
    lin = nvfp4_gemm.from_blocked(good["sfa"], 130, 96).contiguous()
    expect_error(r"sfa must hold .* = 2048 e4m3 values .* got 780", good, sfa=lin)


def test_scales_in_wrong_memory_order(good):
    sf2d = good["sfa"].view(256, 8)
    expect_error(r"sfa must be contiguous in the 128x4 blocked layout, got strides", good,
                 sfa=sf2d.t().contiguous().t())
    six = nvfp4_gemm.permuted_view(good["sfb"], 64, 96)
    wrong = six.permute(1, 0, 2, 3, 4, 5).contiguous().permute(1, 0, 2, 3, 4, 5)
    expect_error(r"6-D sfb must be the permuted view of a blocked-layout buffer", good, sfb=wrong)
    expect_error(r"2-D sfa must be the padded blocked matrix \[round_up\(M,128\), round_up\(K/16,4\)\] = \[256, 8\]",
                 good, sfa=good["sfa"].view(128, 16))
    expect_error(r"sfa must be a view of the 128x4 blocked layout.*got 3-D", good, sfa=good["sfa"].view(256, 2, 4))


def test_one_or_three_dim_data(good):
    expect_error(r"a must be 2-D \[M, K/2\] .*got 1-D", good, a=good["a"].reshape(-1))
    expect_error(r"b must be 2-D \[N, K/2\] .*got 3-D", good, b=good["b"].unsqueeze(-1))


def test_bad_alpha(good):
    device = good["a"].device
    expect_error(r"alpha must be a float32 tensor, got Double", good, alpha=torch.ones(1, dtype=torch.float64, device=device))
    expect_error(r"alpha must hold exactly one value \(shape \[\] or \[1\]\), got shape \[2\]", good,
                 alpha=torch.ones(2, device=device))
    if device.type == "cuda":
        expect_error(r"alpha must be on the inputs' device \(cuda:0\) .*got cpu", good, alpha=torch.ones(1))


def test_bad_out_dtype(good):
    expect_error(r"out_dtype must be torch.float16, torch.bfloat16 or torch.float32, got (Double|torch.float64)", good,
                 out_dtype=torch.float64)
    expect_error(r"out_dtype must be .* got (Float8_e4m3fn|torch.float8_e4m3fn)", good, out_dtype=torch.float8_e4m3fn)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mixing CPU and CUDA tensors needs a CUDA device")
def test_cpu_mixed_with_cuda():
    inputs = make_inputs(Case(8, 16, 64), "cuda")
    expect_error(r"b must be on the same device as a \(cuda:0\), got cpu", inputs, b=inputs["b"].cpu())
    expect_error(r"sfa must be on the same device as a \(cuda:0\), got cpu", inputs, sfa=inputs["sfa"].cpu())
    cpu = make_inputs(Case(8, 16, 64), "cpu")
    expect_error(r"sfb must be on the same device as a \(cpu\), got cuda:0", cpu, sfb=cpu["sfb"].cuda())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU read rules need a CUDA device")
def test_gpu_unreadable_views():
    inputs = make_inputs(Case(8, 16, 64), "cuda")
    expect_error(r"a must be K-major .*call .contiguous\(\) first", inputs,
                 a=inputs["a"].t().contiguous().t())
    wide = torch.zeros(8, 40, dtype=torch.uint8, device="cuda")
    expect_error(r"a rows must start 16 bytes apart .*got row stride 40", inputs, a=wide[:, :32])
    flat = torch.zeros(8 * 32 + 1, dtype=torch.uint8, device="cuda")
    expect_error(r"a data must be 16-byte aligned", inputs, a=flat[1:].view(8, 32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_forcing_an_unknown_backend_is_an_error(monkeypatch):
    inputs = make_inputs(Case(8, 16, 64), "cuda")
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm75")
    expect_error(r"NVFP4_GEMM_BACKEND must be one of auto, generic, sm90, sm100, sm120 .*got 'sm75'", inputs)
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "auto")
    monkeypatch.setenv("NVFP4_GEMM_CONFIG", "no_such_config")
    expect_error(r"NVFP4_GEMM_CONFIG=no_such_config names no compiled kernel config", inputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["sm90", "sm100"])
def test_forcing_a_backend_this_device_cannot_run(monkeypatch, name):
    major, minor = torch.cuda.get_device_capability()
    if name in torch.ops.nvfp4_gemm._backends_for_sm(major * 10 + minor):
        pytest.skip(f"{name} runs on this SM {major}.{minor} device")
    inputs = make_inputs(Case(8, 16, 64), "cuda")
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", name)
    if name in nvfp4_gemm.configs():
        expect_error(rf"NVFP4_GEMM_BACKEND={name} \(.*\) cannot run on this SM {major}.{minor} device", inputs)
    else:
        expect_error(rf"NVFP4_GEMM_BACKEND={name} but that backend was not compiled into this build; rebuild with "
                     r"NVFP4_GEMM_CUDA_ARCHS=", inputs)


# ---------------------------------------------------------------------- every argument on a's device, meta too

def _meta(t):
    return None if t is None else t.to("meta")


def test_meta_argument_with_cpu_inputs_is_refused():
    """A meta argument sends the call to the fake (meta) kernel, which must refuse it: before, it returned an
    uninitialized tensor on a's device (garbage, no error)."""
    inputs = make_inputs(Case(8, 16, 64), "cpu")
    inputs["alpha"] = torch.ones(1)
    for name in ("b", "sfa", "sfb", "alpha"):
        with pytest.raises(RuntimeError, match=rf"nvfp4_gemm.mm: {name} must be on a's device \(cpu\), got meta"):
            call(inputs, **{name: _meta(inputs[name])})
    out = torch.empty(8, 16, dtype=torch.float16, device="meta")
    with pytest.raises(RuntimeError, match=r"out must be on a's device \(cpu\), got meta"):
        nvfp4_gemm.mm(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], alpha=inputs["alpha"], out=out)


def _linear_args(static: bool):
    torch.manual_seed(0)
    layer = nvfp4_gemm.NVFP4Linear.from_linear(torch.nn.Linear(64, 16), input_amax=4.0 if static else None)
    return dict(x=torch.randn(3, 64), weight=layer.weight, weight_scale=layer.weight_scale,
                weight_scale_2=layer.weight_scale_2, input_scale=layer.input_scale, bias=layer.bias)


@pytest.mark.parametrize("name", ["weight", "weight_scale", "weight_scale_2", "input_scale", "bias"])
def test_linear_meta_argument_is_refused(name):
    args = _linear_args(static=True)
    args[name] = _meta(args[name])
    with pytest.raises(RuntimeError, match=rf"nvfp4_gemm.linear: {name} must be on x's device \(cpu\), got meta"):
        nvfp4_gemm.linear(**args)


def test_quantize_meta_global_scale_is_refused():
    x = torch.randn(4, 32)
    with pytest.raises(RuntimeError, match=r"nvfp4_gemm.quantize: global_scale must be on x's device"):
        nvfp4_gemm.quantize(x, torch.ones(1, device="meta"))
    with pytest.raises(RuntimeError, match=r"nvfp4_gemm.quantize_mse: global_scale must be on x's device"):
        torch.ops.nvfp4_gemm.quantize_mse(x, torch.ones(1, device="meta"))
    with pytest.raises(RuntimeError, match=r"nvfp4_gemm.quantize_mse: column_weight must be on x's device"):
        torch.ops.nvfp4_gemm.quantize_mse(x, torch.ones(1), column_weight=torch.ones(32, device="meta"))


def test_linear_names_its_own_arguments():
    """Errors about the weight and its scales say weight / weight_scale (linear's names), not mm's b / sfb."""
    args = _linear_args(static=False)
    for over, pattern in (
        (dict(weight=args["weight"].to(torch.int16)), r"linear: weight must be packed e2m1 .* got Short"),
        (dict(weight_scale=args["weight_scale"][:-4]), r"linear: weight_scale must hold round_up\(N,128\)"),
        (dict(weight_scale=args["weight_scale"].float()), r"linear: weight_scale must hold e4m3 scales"),
        (dict(weight_scale=args["weight_scale"].view(128, 4, 1)), r"linear: weight_scale must be a view of the"),
    ):
        with pytest.raises(RuntimeError) as e:
            nvfp4_gemm.linear(**{**args, **over})
        assert re.search(pattern, str(e.value)), str(e.value)
        assert not re.search(r"\b(sfb|b)\b must", str(e.value)), str(e.value)


# ---------------------------------------------------------------------- quantize_mse's encode scale

@pytest.mark.parametrize("gs", [-1.0, -0.0, 0.0, float("nan"), float("inf"), float("-inf")])
def test_quantize_mse_refuses_bad_global_scale(backend, gs):
    """A negative or -0 encode scale made sign-bit scale bytes that indexed past the 128-entry candidate table
    (AddressSanitizer: heap-buffer-overflow in mse_search.h); it is refused before the search runs."""
    _, device = backend
    x = torch.randn(8, 64, device=device)
    with pytest.raises(RuntimeError, match=r"quantize_mse: global_scale must be positive and finite"):
        torch.ops.nvfp4_gemm.quantize_mse(x, torch.tensor([gs], device=device))


# ---------------------------------------------------------------------- quantize's and linear's per-tensor scales

BAD_SCALES = [-1.0, -0.0, 0.0, float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("gs", BAD_SCALES)
def test_quantize_bad_global_scale(backend, gs):
    """An encode scale that is not positive and finite made sign-bit block scales and zero codes (or all-448
    scales): a result that decodes to zeros or sign-flipped values. A Python float (any device) and a CPU
    tensor are refused by name; a CUDA tensor is not read by the host, so every block scale is NaN there."""
    _, device = backend
    x = torch.randn(130, 64, device=device)
    with pytest.raises(ValueError, match=r"quantize: global_scale must be positive and finite .* got "):
        nvfp4_gemm.quantize(x, gs)
    t = torch.tensor([gs], device=device)
    if device.type == "cpu":
        with pytest.raises(RuntimeError, match=r"quantize: global_scale must be positive and finite .* got "):
            nvfp4_gemm.quantize(x, t)
        return
    packed, sf = nvfp4_gemm.quantize(x, t)
    ref_packed, ref_sf = nvfp4_gemm.reference_quantize(x, t)
    real = nvfp4_gemm.from_blocked(sf, 130, 64).view(torch.uint8)
    assert torch.all(real == 0x7F), real.unique()
    assert torch.equal(sf.view(torch.uint8), ref_sf.view(torch.uint8)) and torch.equal(packed, ref_packed)
    assert torch.isnan(nvfp4_gemm.dequantize(packed, sf, 64, torch.float32)).all()


@pytest.mark.parametrize("gs", BAD_SCALES)
def test_reference_quantize_bad_global_scale_gives_nan_scales(gs):
    """The plain-PyTorch definition follows the same rule as the kernels (every block scale NaN)."""
    _, sf = nvfp4_gemm.reference_quantize(torch.randn(4, 32), torch.tensor([gs]))
    assert torch.all(nvfp4_gemm.from_blocked(sf, 4, 32).view(torch.uint8) == 0x7F)


@pytest.mark.parametrize("name", ["weight_scale_2", "input_scale"])
@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("inf")])
def test_linear_bad_decode_scale(backend, name, value):
    """linear with a per-tensor decode scale that is not positive and finite: refused by name on the CPU; on
    CUDA (scales not read by the host) a bad input_scale gives NaN outputs, never plausible numbers."""
    _, device = backend
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 128, generator=g)
    ws2 = (w.abs().amax() / 2688.0).reshape(1)
    packed, sf = nvfp4_gemm.quantize(w, 1.0 / ws2)
    args = dict(x=torch.randn(3, 128, generator=g).to(device), weight=packed.to(device), weight_scale=sf.to(device),
                weight_scale_2=ws2.to(device), input_scale=torch.tensor([0.01]).to(device))
    args[name] = torch.tensor([value], device=device)
    if device.type == "cpu":
        with pytest.raises(RuntimeError, match=rf"linear: {name} must be positive and finite .* got "):
            nvfp4_gemm.linear(**args)
        with pytest.raises(RuntimeError, match=rf"_input_scales: {name} must be positive and finite"):
            torch.ops.nvfp4_gemm._input_scales(args["x"], args["weight_scale_2"], args["input_scale"])
    elif name == "input_scale":
        assert torch.isnan(nvfp4_gemm.linear(**args)).all()
