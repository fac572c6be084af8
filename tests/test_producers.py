"""Checkpoints of the real producers in, and ours out to the producers' own readers.

In: tests/fixtures/producers/ holds checkpoints made by llm-compressor 0.14.0.1 (compressed-tensors 0.19.0)
and NVIDIA ModelOpt 0.47.0 from one tiny random Llama (tests/fixtures/make_producer_checkpoints.py made
them and recorded the versions in MANIFEST.json; llm-compressor cannot be installed beside this project's
transformers, see that script). Every quantized layer must become an NVFP4Linear in the mode the producer
meant, holding its bytes. Weight-only logits are held to fp32 rounding of a model with the producer's own
decoded weights (its decoder run at float32: transformers + compressed-tensors round them to bfloat16,
which is checked too); W4A4 layer by layer on the same inputs against the producer's own activation
quantizer (compressed-tensors' fake_quantize; ModelOpt's pure-torch NVFP4QTensor), where the two may
differ only by e2m1 rounding ties (division there, reciprocal multiplication here: docs/QUANTIZE.md).

Out: what save_pretrained writes is read by transformers + compressed-tensors and by compressed-tensors'
ModelOpt converter with the same numbers, and follows ModelOpt's conventions as its export writes them.

When the tools themselves are importable (llm-compressor: NVFP4_GEMM_LLMCOMPRESSOR_PATH names a private
environment for it; ModelOpt: importable here or NVFP4_GEMM_MODELOPT_PATH), the fixtures are made again in
a subprocess and must equal the committed ones.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import nvfp4_gemm
from nvfp4_gemm import NVFP4Linear
from nvfp4_gemm.checkpoint import from_pretrained, save_pretrained
from nvfp4_gemm.formats import E2M1_VALUES, dequantize, from_blocked
from nvfp4_gemm.quantize import finite_amax
from nvfp4_gemm.testing import rel_error

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "producers")
MAKER = os.path.join(HERE, "fixtures", "make_producer_checkpoints.py")
with open(os.path.join(FIXTURES, "MANIFEST.json")) as _f:
    MANIFEST = json.load(_f)
MODE = {"llmc-nvfp4": "static", "llmc-nvfp4a16": "weight_only", "llmc-nvfp4-dynamic": "dynamic_block",
        "modelopt-nvfp4": "static", "modelopt-w4a16-nvfp4": "weight_only"}
N_QUANTIZED = 14  # 2 layers x (q, k, v, o, gate, up, down); the tied lm_head stays float in every producer
HAVE_CT = importlib.util.find_spec("compressed_tensors") is not None
NO_CT = "compressed-tensors is not installed (bash scripts/install.sh installs compressed-tensors==0.20.0)"
HAVE_MODELOPT = importlib.util.find_spec("modelopt") is not None
E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)


def path(name: str) -> str:
    return os.path.join(FIXTURES, name)


def tensors(directory: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(directory, "model.safetensors"))


def is_ct(directory: str) -> bool:
    return not os.path.exists(os.path.join(directory, "hf_quant_config.json"))


def quantized_names(t: dict[str, torch.Tensor]) -> list[str]:
    """The layers the file holds packed NVFP4 weights for (either format)."""
    return sorted(k.rpartition(".")[0] for k, v in t.items()
                  if k.endswith(".weight_packed") or (k.endswith(".weight") and v.dtype == torch.uint8))


def token_ids(seed: int = 0, rows: int = 4, length: int = 16) -> torch.Tensor:
    return torch.randint(0, 128, (rows, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ the producers' own decoders and quantizers

def ct_weight(t: dict, n: str, args) -> torch.Tensor:
    """compressed-tensors' own NVFP4 decode of layer n (unpack_fp4_from_uint8 + dequantize), run at float32:
    what its decompressor computes before its final rounding to bfloat16."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    packed = t[f"{n}.weight_packed"]
    m, half = packed.shape
    codes = unpack_fp4_from_uint8(packed, m, half * 2, dtype=torch.float32)
    return ct_dequantize(x_q=codes, scale=t[f"{n}.weight_scale"].float(), args=args,
                         global_scale=t[f"{n}.weight_global_scale"].reshape(1).float(), dtype=torch.float32)


def ct_activations(x: torch.Tensor, args, global_scale: torch.Tensor | None) -> torch.Tensor:
    """compressed-tensors' own activation fake-quantization (compute_dynamic_scales_and_zp + fake_quantize), as
    its quantized forward runs it for `input_activations` = args."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp

    scale, zp = compute_dynamic_scales_and_zp(value=x, args=args, module=nn.Module(), global_scale=global_scale)
    return fake_quantize(x=x, scale=scale, zero_point=zp, args=args, global_scale=global_scale)


def modelopt_weight(t: dict, n: str) -> tuple[torch.Tensor, str]:
    """ModelOpt's pure-torch NVFP4 decode (NVFP4QTensor.dequantize) of its exported tensors; without ModelOpt,
    the same decode written out here (e2m1 value * e4m3 scale * weight_scale_2, in float64)."""
    w, sf, ws2 = t[f"{n}.weight"], t[f"{n}.weight_scale"], t[f"{n}.weight_scale_2"]
    if HAVE_MODELOPT:
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

        q = NVFP4QTensor((w.shape[0], w.shape[1] * 2), torch.float32, w)
        return q.dequantize(dtype=torch.float32, scale=sf, double_scale=ws2, block_sizes={-1: 16}), "NVFP4QTensor"
    codes = torch.stack([w & 0xF, w >> 4], dim=-1).reshape(w.shape[0], -1).long()
    vals = torch.tensor(E2M1_VALUES, dtype=torch.float64)[codes]
    s = sf.to(torch.float64).repeat_interleave(16, dim=1)
    return vals * s * ws2.double(), "own decode"


def modelopt_activations(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """ModelOpt's NVFP4 activation quantizer with a static input scale, pure torch (NVFP4QTensor.quantize with
    weights_scaling_factor_2 = input_scale, then dequantize). Without ModelOpt: skipped by the caller."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    q, sf, s2 = NVFP4QTensor.quantize(x.float(), 16, weights_scaling_factor_2=input_scale.float())
    return q.dequantize(dtype=torch.float32, scale=sf, double_scale=s2, block_sizes={-1: 16})


# ------------------------------------------------------------------ comparison on the same inputs

def layer_inputs(model: nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    got, hooks = {}, []
    for n, m in model.named_modules():
        if isinstance(m, NVFP4Linear):
            hooks.append(m.register_forward_pre_hook(
                lambda _m, args, n=n: got.__setitem__(n, args[0].detach().reshape(-1, args[0].shape[-1]).clone())))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return got


def our_activations(layer: NVFP4Linear, x: torch.Tensor) -> torch.Tensor:
    """The activations our layer multiplies, decoded exactly (float64)."""
    if layer.block_scales_only:
        gs = None
    elif layer.input_scale is not None:
        gs = 1.0 / layer.input_scale
    else:
        gs = nvfp4_gemm.global_encode_scale(finite_amax(x))
    packed, sf = nvfp4_gemm.quantize(x, gs)
    xd = dequantize(packed, sf, x.shape[1], torch.float64)
    return xd if gs is None else xd / gs.double()


def compare_w4a4(name: str, layer: NVFP4Linear, x: torch.Tensor, x_theirs: torch.Tensor,
                 w_theirs: torch.Tensor, decode_scale_theirs: torch.Tensor, y: torch.Tensor | None = None) -> int:
    """Our layer's output on x against the producer's: its activations x_theirs times its decoded weight.
    Our activations may differ from theirs only where x / scale lands on an e2m1 midpoint (one rounding
    ties one way, the other the other way) or by float32 rounding of their fake-quantized values; the
    output may differ by docs/CONTRACT.md's fp32 bound plus exactly what those activation differences contribute.
    Returns the number of tie flips. y: our output if computed elsewhere (another device), else layer(x)."""
    if y is None:
        with torch.no_grad():
            y = layer(x)
    y = y.double()
    xo, xt, w = our_activations(layer, x), x_theirs.double(), w_theirs.double()
    diff = (xo - xt).abs()
    flips = diff > 2.0**-20 * xt.abs().clamp(min=xo.abs()) + 1e-30
    if flips.any():  # each one a tie: |x| / (its block's decode scale) within float32 noise of a midpoint
        q = (x.double().abs() / decode_scale_theirs.double())[flips]
        near = ((q.unsqueeze(-1) - E2M1_MIDPOINTS).abs() / E2M1_MIDPOINTS).amin(-1)
        assert bool((near <= 2.0**-20).all()), f"{name}: activations differ away from an e2m1 tie: {near.max()}"
    assert int(flips.sum()) <= max(2, x.numel() // 200), f"{name}: {int(flips.sum())} tie flips"
    want = xt @ w.T
    bound = 2 * 2.0**-24 * want.abs() + 2.0**-16 * (xo.abs() @ w.abs().T) + (diff @ w.abs().T) * (1 + 2.0**-40)
    worst = float(((y - want).abs() - bound).max())
    assert worst <= 0, f"{name}: output beyond docs/CONTRACT.md's bound plus the ties' contribution by {worst}"
    return int(flips.sum())


def block_decode_scales(x: torch.Tensor, scale_of_block) -> torch.Tensor:
    """[rows, K] float64: each element's block decode scale, scale_of_block(block amax [rows, K/16])."""
    amax = x.float().abs().reshape(x.shape[0], -1, 16).amax(-1)
    return scale_of_block(amax).double().repeat_interleave(16, dim=1)


def ct_args(directory: str, which: str):
    from compressed_tensors.quantization import QuantizationArgs

    qc = json.load(open(os.path.join(directory, "config.json")))["quantization_config"]
    groups = list(qc["config_groups"].values())
    assert len(groups) == 1
    a = groups[0][which]
    return None if a is None else QuantizationArgs.model_validate(a)


def check_w4a4_against_producer(directory: str, model: nn.Module, ids: torch.Tensor) -> int:
    """Every NVFP4Linear of `model` (loaded from `directory`) against the producer's numerics on the same inputs."""
    t = tensors(directory)
    xs = layer_inputs(model, ids)
    flips = 0
    for n, x in xs.items():
        layer = model.get_submodule(n)
        if is_ct(directory):
            wargs, aargs = ct_args(directory, "weights"), ct_args(directory, "input_activations")
            g = t.get(f"{n}.input_global_scale")
            w = ct_weight(t, n, wargs)
            xt = ct_activations(x, aargs, g)
            gg = g.double() if g is not None else torch.ones((), dtype=torch.float64)
            dec = block_decode_scales(x, lambda a: (a / 6 * (g if g is not None else 1.0)).to(
                torch.float8_e4m3fn).double() / gg)
        else:
            if not HAVE_MODELOPT:
                pytest.skip("nvidia-modelopt is not installed (bash scripts/install.sh installs 0.47.0): its "
                            "activation quantizer is the reference here")
            s_in = t[f"{n}.input_scale"]
            w, _ = modelopt_weight(t, n)
            xt = modelopt_activations(x, s_in)
            dec = block_decode_scales(x, lambda a: (a / (6 * s_in)).clamp(2.0**-9, 448).to(
                torch.float8_e4m3fn).double() * s_in.double())
        flips += compare_w4a4(n, layer, x, xt, w, dec)
    return flips


# ------------------------------------------------------------------ producer -> us

@pytest.mark.parametrize("name", list(MODE))
def test_producer_checkpoint_loads_every_layer(name):
    d = path(name)
    t = tensors(d)
    model = from_pretrained(d, progress=False)
    names = quantized_names(t)
    assert len(names) == N_QUANTIZED and type(model.lm_head) is nn.Linear
    got = {n: m.mode for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    assert sorted(got) == names, "every layer the producer quantized, and no other, is an NVFP4Linear"
    assert set(got.values()) == {MODE[name]}, got
    ct = is_ct(d)
    for n in names:
        layer = model.get_submodule(n)
        assert torch.equal(layer.weight, t[f"{n}.weight_packed" if ct else f"{n}.weight"]), n
        sf = from_blocked(layer.weight_scale, layer.out_features, layer.in_features)
        assert torch.equal(sf.view(torch.uint8), t[f"{n}.weight_scale"].view(torch.uint8)), n
        want = 1.0 / t[f"{n}.weight_global_scale"].reshape(1) if ct else t[f"{n}.weight_scale_2"].reshape(1)
        assert torch.equal(layer.weight_scale_2, want), n
        if MODE[name] == "static":
            want = 1.0 / t[f"{n}.input_global_scale"].reshape(1) if ct else t[f"{n}.input_scale"].reshape(1)
            assert torch.equal(layer.input_scale, want), n
    with torch.no_grad():
        assert torch.isfinite(model(token_ids()).logits).all()


def producer_float_model(d: str) -> tuple[nn.Module, str]:
    """A float model holding the producer's decoded weights, at float32. compressed-tensors: loaded by
    transformers with the compressed-tensors quantizer (dequantize=True; it returns bfloat16 weights, which
    must be its float32 decode rounded), then given that float32 decode. ModelOpt (no reader of its own
    export): the file's float tensors and NVFP4QTensor's decode."""

    t = tensors(d)
    if is_ct(d):
        if not HAVE_CT:
            pytest.skip(NO_CT)
        from transformers import AutoModelForCausalLM, CompressedTensorsConfig

        model = AutoModelForCausalLM.from_pretrained(d, quantization_config=CompressedTensorsConfig(dequantize=True))
        from compressed_tensors.compressors import NVFP4PackedCompressor
        from compressed_tensors.quantization import QuantizationScheme

        args = ct_args(d, "weights")
        scheme = QuantizationScheme(targets=["Linear"], weights=args)
        for n in quantized_names(t):
            mod = model.get_submodule(n)
            local = {k.rpartition(".")[2]: v for k, v in t.items() if k.rpartition(".")[0] == n}
            theirs = NVFP4PackedCompressor.decompress(local, scheme)["weight"]
            assert torch.equal(mod.weight.detach(), theirs.to(mod.weight.dtype)), \
                f"{n}: transformers holds what compressed-tensors' decompressor decodes"
            mod.weight = nn.Parameter(ct_weight(t, n, args), requires_grad=False)
        return model.float().eval(), "compressed-tensors decode"
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.float32).eval()
    sd = {k: v for k, v in t.items() if v.is_floating_point() and not k.endswith(("_scale", "_scale_2"))}
    how = "own decode"
    for n in quantized_names(t):
        sd[f"{n}.weight"], how = modelopt_weight(t, n)
        sd[f"{n}.weight"] = sd[f"{n}.weight"].float()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    model.tie_weights()
    return model, how


@pytest.mark.parametrize("name", ["llmc-nvfp4a16", "modelopt-w4a16-nvfp4"])
def test_weight_only_logits_match_producer(name):
    d = path(name)
    theirs, how = producer_float_model(d)
    ours = from_pretrained(d, progress=False)
    ids = token_ids()
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    err = rel_error(a, b)
    print(f"{name}: logits relative error vs the producer's model ({how}) {err:.2e}")
    assert err < 1e-5  # fp32 rounding; a scale off by one ulp or a misplaced block is far larger


@pytest.mark.parametrize("name", ["llmc-nvfp4", "llmc-nvfp4-dynamic", "modelopt-nvfp4"])
def test_w4a4_layers_match_producer(name):
    d = path(name)
    if is_ct(d) and not HAVE_CT:
        pytest.skip(NO_CT)
    model = from_pretrained(d, progress=False)
    flips = check_w4a4_against_producer(d, model, token_ids(1))
    print(f"{name}: every layer within docs/CONTRACT.md's bound of the producer's numerics; {flips} e2m1 tie flips")


def test_dynamic_true_runs_per_block_numerics():
    """compressed-tensors' dynamic=true has no global scale: a layer loaded from it quantizes its input with
    quantize(x, None) (it would differ from the per-tensor dynamic mode by far more than ties)."""
    d = path("llmc-nvfp4-dynamic")
    model = from_pretrained(d, progress=False)
    layer = model.get_submodule("model.layers.0.mlp.down_proj")
    g = torch.Generator().manual_seed(5)
    # rows 2^-10 .. 2^11 in magnitude (seeded: an unseeded draw made this order-dependent): one per-tensor
    # scale cannot serve them all, per-block scales can
    x = torch.randn(8, layer.in_features, generator=g) * torch.exp2(torch.arange(8).float() * 3 - 10)[:, None]
    packed, sf = nvfp4_gemm.quantize(x, None)
    want = nvfp4_gemm.mm(packed, layer.weight, sf, layer.weight_scale, layer.weight_scale_2, torch.float32)
    x[0, 0] = x[0, 0]  # the layer must not change its input
    with torch.no_grad():
        assert torch.equal(layer(x), want)
        layer.block_scales_only = False  # the per-tensor mode is a different function
        assert rel_error(layer(x), want) > 1e-3


# ------------------------------------------------------------------ us -> the producers' readers

def ours_in_every_mode():
    """A model from the llm-compressor NVFP4 checkpoint per mode our writer takes."""
    d = path("llmc-nvfp4")
    out = {"static": from_pretrained(d, progress=False), "weight_only": from_pretrained(d, weight_only=True, progress=False)}
    block = from_pretrained(d, progress=False)
    for m in block.modules():
        if isinstance(m, NVFP4Linear):
            m.set_input_amax(None)
            m.block_scales_only = True
    out["dynamic_block"] = block
    return out


@pytest.mark.parametrize("mode", ["static", "weight_only", "dynamic_block"])
def test_our_compressed_tensors_checkpoint_in_their_reader(tmp_path, mode):
    if not HAVE_CT:
        pytest.skip(NO_CT)
    model = ours_in_every_mode()[mode]
    d = str(tmp_path / "ct")
    save_pretrained(model, d, format="compressed-tensors", progress=False)
    theirs, _ = producer_float_model(d)  # transformers + compressed-tensors load it; weights = their decode
    if mode == "weight_only":
        with torch.no_grad():
            err = rel_error(model(token_ids()).logits, theirs(token_ids()).logits)
        print(f"ours saved weight-only, read by transformers + compressed-tensors: logits relative error {err:.2e}")
        assert err < 1e-5
    else:
        check_w4a4_against_producer(d, from_pretrained(d, progress=False), token_ids(2))
        flips = check_w4a4_against_producer(d, model, token_ids(2))  # the model we saved, not only its reload
        print(f"ours saved {mode}: every layer within docs/CONTRACT.md's bound of compressed-tensors' numerics, {flips} ties")


def convert_modelopt(src: str, d: str, *, input_activations=...) -> dict[str, torch.Tensor]:
    """compressed-tensors' ModelOpt NVFP4 converter run on the checkpoint `src` as its entrypoint runs it (our
    export's exclude_modules as its ignore list), written to `d` as a compressed-tensors checkpoint; the
    converted tensors. input_activations, when given, replaces what the converter's config says of them."""
    from compressed_tensors.entrypoints.convert import ModelOptNvfp4Converter

    hf = json.load(open(os.path.join(src, "hf_quant_config.json")))["quantization"]
    conv = ModelOptNvfp4Converter(ignore=hf["exclude_modules"], targets=["Linear"])
    converted = conv.validate(tensors(src))
    os.makedirs(d)
    save_file(converted, os.path.join(d, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = conv.update_config(None).model_dump(mode="json")
    cfg["quantization_config"]["quant_method"] = "compressed-tensors"
    if input_activations is not ...:
        for g in cfg["quantization_config"]["config_groups"].values():
            g["input_activations"] = input_activations
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return converted


def skip_without_converter() -> None:
    if not HAVE_CT:
        pytest.skip(NO_CT)
    try:
        from compressed_tensors.entrypoints.convert import ModelOptNvfp4Converter  # noqa: F401
    except ImportError as e:
        pytest.skip(f"this compressed-tensors has no ModelOpt converter ({e})")


def test_our_modelopt_checkpoint_through_the_compressed_tensors_converter(tmp_path):
    """compressed-tensors' ModelOpt NVFP4 converter, given our export's exclude_modules as its ignore list,
    turns our static W4A4 ModelOpt checkpoint into a compressed-tensors one that transformers loads with our
    numbers (layer by layer, their fake quantization)."""
    skip_without_converter()
    model = from_pretrained(path("modelopt-nvfp4"), progress=False)
    src = str(tmp_path / "modelopt")
    save_pretrained(model, src, format="modelopt", progress=False)
    d = str(tmp_path / "converted")
    converted = convert_modelopt(src, d)
    assert not any(k.startswith("model.embed_tokens.") and k != "model.embed_tokens.weight" for k in converted)
    producer_float_model(d)  # loads; bf16 weights = the converter's tensors decoded
    check_w4a4_against_producer(d, model, token_ids(3))


def test_weight_only_modelopt_through_the_converter_is_their_defect(tmp_path):
    """A weight-only (W4A16_NVFP4) ModelOpt checkpoint through compressed-tensors' ModelOpt converter reads
    back in transformers as NaN logits. Whose defect: ModelOpt's OWN weight-only export converts the same way
    as ours (both say W4A16_NVFP4 and hold no input_scale, as test_our_modelopt_export_follows_modelopt
    checks): the converter writes its W4A4 NVFP4 scheme whatever the source's quant_algo, whose inputs need
    an input_global_scale that no tensor provides, and transformers leaves that parameter uninitialized.
    Their reader takes the converted tensors with the NVFP4A16 scheme (input_activations null) and then runs
    our weight-only save with our numbers (docs/CHECKPOINTS.md)."""
    skip_without_converter()
    from transformers import AutoModelForCausalLM

    model = from_pretrained(path("modelopt-w4a16-nvfp4"), progress=False)
    ours = str(tmp_path / "ours")
    save_pretrained(model, ours, format="modelopt", progress=False)
    for name, src in (("theirs", path("modelopt-w4a16-nvfp4")), ("ours", ours)):
        assert json.load(open(os.path.join(src, "hf_quant_config.json")))["quantization"]["quant_algo"] == "W4A16_NVFP4"
        d = str(tmp_path / f"{name}-as-converted")
        converted = convert_modelopt(src, d)
        groups = json.load(open(os.path.join(d, "config.json")))["quantization_config"]["config_groups"]
        assert all(g["input_activations"] is not None for g in groups.values()), name  # the W4A4 scheme
        assert not any(k.endswith(("input_scale", "input_global_scale")) for k in converted), name
    d = str(tmp_path / "as-nvfp4a16")
    converted = convert_modelopt(ours, d, input_activations=None)
    # transformers >= 5.2x refuses the converter's 0-d global scales (compressed-tensors registers [1])
    save_file({k: v.reshape(1) if v.dim() == 0 else v for k, v in converted.items()}, os.path.join(d, "model.safetensors"))
    theirs = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        want = model.to(torch.bfloat16)(token_ids()).logits
        got = theirs(token_ids()).logits
    err = rel_error(got, want)
    print(f"ours saved weight-only as ModelOpt, converted with input_activations null, run by transformers + "
          f"compressed-tensors in bf16: logits relative error {err:.2e}")
    assert torch.isfinite(got).all() and err < 2e-2


def test_our_modelopt_export_follows_modelopt(tmp_path):
    """Saved as ModelOpt, a model from ModelOpt's own export writes the same quantization config ModelOpt
    wrote (quant_algo, exclude_modules with the embeddings, config_groups), the same tensor names, dtypes,
    shapes and bytes; weight-only says W4A16_NVFP4, and a mix of the two MIXED_PRECISION."""
    for name, algo in (("modelopt-nvfp4", "NVFP4"), ("modelopt-w4a16-nvfp4", "W4A16_NVFP4")):
        d = path(name)
        out = str(tmp_path / name)
        save_pretrained(from_pretrained(d, progress=False), out, format="modelopt", progress=False)
        theirs, ours = (json.load(open(os.path.join(x, "hf_quant_config.json")))["quantization"] for x in (d, out))
        assert ours == theirs and ours["quant_algo"] == algo
        tq, oq = (json.load(open(os.path.join(x, "config.json")))["quantization_config"] for x in (d, out))
        for key in ("quant_method", "quant_algo", "ignore", "config_groups"):
            assert oq[key] == tq[key], key
        a, b = tensors(d), tensors(out)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) if a[k].dtype.itemsize == 1 else \
                torch.equal(a[k], b[k]), k
    mixed = from_pretrained(path("llmc-nvfp4"), progress=False)
    for n, m in mixed.named_modules():
        if isinstance(m, NVFP4Linear) and n.endswith("mlp.down_proj"):
            m.set_input_amax(None)
            m.weight_only = True
    save_pretrained(mixed, tmp_path / "mixed", format="modelopt", progress=False)
    q = json.load(open(tmp_path / "mixed" / "hf_quant_config.json"))["quantization"]
    assert q["quant_algo"] == "MIXED_PRECISION"
    assert {v["quant_algo"] for k, v in q["quantized_layers"].items() if k.endswith("down_proj")} == {"W4A16_NVFP4"}
    assert len(q["quantized_layers"]) == N_QUANTIZED
    again = from_pretrained(tmp_path / "mixed", progress=False)
    assert {n: m.mode for n, m in again.named_modules() if isinstance(m, NVFP4Linear)} == \
        {n: m.mode for n, m in mixed.named_modules() if isinstance(m, NVFP4Linear)}


def test_writer_refuses_what_a_format_cannot_say(tmp_path):
    d = path("llmc-nvfp4")
    dynamic = from_pretrained(d, progress=False)
    for m in dynamic.modules():
        if isinstance(m, NVFP4Linear):
            m.set_input_amax(None)
    block = ours_in_every_mode()["dynamic_block"]
    with pytest.raises(ValueError, match=r"format='modelopt'.*14 layer\(s\).*ModelOpt NVFP4 requires static input"):
        save_pretrained(dynamic, tmp_path / "a", format="modelopt", progress=False)
    with pytest.raises(ValueError, match=r"format='modelopt'.*dynamic_block.*requires static input scales"):
        save_pretrained(block, tmp_path / "b", format="modelopt", progress=False)
    with pytest.raises(ValueError, match=r"compressed-tensors.*per-tensor input scale.*dynamic=true means per-block"):
        save_pretrained(dynamic, tmp_path / "c", format="compressed-tensors", progress=False)
    assert not any(os.path.exists(tmp_path / x) for x in "abc"), "refused before anything is written"


def test_weight_only_load_of_modelopt_nvfp4_without_input_scales(tmp_path):
    """weight_only=True drops input scales, so a ModelOpt NVFP4 checkpoint without them loads that way (and
    still fails, naming the tensor, without weight_only)."""
    d = tmp_path / "no_input_scales"
    os.makedirs(d)
    for f in os.listdir(path("modelopt-nvfp4")):
        if f != "model.safetensors":
            with open(os.path.join(path("modelopt-nvfp4"), f), "rb") as src, open(d / f, "wb") as dst:
                dst.write(src.read())
    t = {k: v for k, v in tensors(path("modelopt-nvfp4")).items() if not k.endswith(".input_scale")}
    save_file(t, str(d / "model.safetensors"))
    model = from_pretrained(d, weight_only=True, progress=False)
    assert {m.mode for m in model.modules() if isinstance(m, NVFP4Linear)} == {"weight_only"}
    with pytest.raises(nvfp4_gemm.checkpoint.CheckpointError, match=r"input_scale' is missing"):
        from_pretrained(d, progress=False)


# ------------------------------------------------------------------ the real tools, where present

def _tool_env(var: str, module: str) -> dict | None:
    extra = os.environ.get(var)
    if extra is None and importlib.util.find_spec(module) is None:
        return None
    env = dict(os.environ)
    if extra:
        env["PYTHONPATH"] = extra
    return env


@pytest.mark.parametrize("producer,var,module", [("llmcompressor", "NVFP4_GEMM_LLMCOMPRESSOR_PATH", "llmcompressor"),
                                                 ("modelopt", "NVFP4_GEMM_MODELOPT_PATH", "modelopt")])
def test_fixtures_are_what_the_producer_makes(tmp_path, producer, var, module):
    env = _tool_env(var, module)
    if env is None:
        pytest.skip(f"{producer} is not importable (set {var} to an environment holding it; "
                    f"tests/fixtures/make_producer_checkpoints.py lists the packages)")
    r = subprocess.run([sys.executable, MAKER, producer, "--out", str(tmp_path)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    made = json.load(open(tmp_path / "MANIFEST.json"))
    for name, entry in made.items():
        assert entry["versions"] == MANIFEST[name]["versions"], f"{name}: made with other versions"
        a, b = tensors(path(name)), tensors(str(tmp_path / name))
        assert a.keys() == b.keys(), name
        for k in a:
            assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) if a[k].dtype.itemsize == 1 else \
                torch.equal(a[k], b[k]), f"{name}: {k}"


def test_compressed_tensors_save_keeps_per_tensor_scales(tmp_path):
    """compressed-tensors stores 1 / scale. A scale that is a float32 reciprocal (every compressed-tensors
    checkpoint's, our quantizer's) reloads bit for bit; ModelOpt's amax / 2688 need not be one: those reload
    within one ulp, and the save names them in a warning."""
    import warnings

    def scales(m):
        return {f"{n}.{a}": getattr(l, a).clone() for n, l in m.named_modules() if isinstance(l, NVFP4Linear)
                for a in ("weight_scale_2", "input_scale") if getattr(l, a) is not None}

    llmc = from_pretrained(path("llmc-nvfp4"), progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_pretrained(llmc, tmp_path / "a", format="compressed-tensors", progress=False)
    before, after = scales(llmc), scales(from_pretrained(tmp_path / "a", progress=False))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

    mo = from_pretrained(path("modelopt-nvfp4"), progress=False)
    with pytest.warns(UserWarning, match=r"per-tensor scale\(s\) .* one float32 ulp off") as rec:
        save_pretrained(mo, tmp_path / "b", format="compressed-tensors", progress=False)
    before, after = scales(mo), scales(from_pretrained(tmp_path / "b", progress=False))
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert moved and all(float((before[k] - after[k]).abs() / before[k]) <= 2.0**-23 for k in moved)
    assert f"{len(moved)} per-tensor scale(s)" in str(rec[0].message)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="ModelOpt's fake-quant forward needs a CUDA device")
def test_modelopt_fake_quant_forward_on_gpu(tmp_path):
    """On a GPU, ModelOpt's own quantized model (mtq.quantize NVFP4_DEFAULT_CFG, its CUDA fake quantization)
    against our layers loaded from its export of that model: each layer's output on the same inputs within
    docs/CONTRACT.md's bound of its fake-quantized activations times its fake-quantized weight (ties allowed)."""
    if not HAVE_MODELOPT:
        pytest.skip("nvidia-modelopt is not installed (bash scripts/install.sh installs 0.47.0)")
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    spec = importlib.util.spec_from_file_location("make_producer_checkpoints", MAKER)
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    model = maker.tiny_llama().cuda()
    calib = maker.calib_ids().cuda()

    def forward_loop(m):
        with torch.no_grad():
            for row in calib:
                m(row.unsqueeze(0))

    mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, forward_loop)
    # the export gives fused q/k/v and gate/up one weight and one input amax (measured: k_proj's weight amax
    # 0.221 becomes q's 0.291); its own step, applied first, makes the fake-quant model hold what it exports
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    requantize_resmooth_fused_llm_layers(model)
    captured, hooks = {}, []
    for n, m in model.named_modules():
        if hasattr(m, "input_quantizer") and hasattr(m, "weight_quantizer") and m.weight_quantizer.is_enabled:
            def grab(mod, args, n=n):
                x = args[0].reshape(-1, args[0].shape[-1])
                captured[n] = (x.float().cpu(), mod.input_quantizer(x).float().cpu(),
                               mod.weight_quantizer(mod.weight).float().cpu())
            hooks.append(m.register_forward_pre_hook(grab))
    with torch.no_grad():
        model(token_ids(4).cuda())
    for h in hooks:
        h.remove()
    d = str(tmp_path / "export")
    export_hf_checkpoint(model, export_dir=d)
    t = tensors(d)
    on_gpu = from_pretrained(d, device="cuda", progress=False)
    on_cpu = from_pretrained(d, progress=False)
    names = [n for n, m in on_cpu.named_modules() if isinstance(m, NVFP4Linear)]
    assert sorted(names) == sorted(captured) and len(names) == N_QUANTIZED
    flips = 0
    for n in names:
        x, xt, w = captured[n]
        s_in = t[f"{n}.input_scale"]
        with torch.no_grad():
            y = on_gpu.get_submodule(n)(x.cuda()).cpu()
        dec = block_decode_scales(x, lambda a: (a / (6 * s_in)).clamp(2.0**-9, 448).to(
            torch.float8_e4m3fn).double() * s_in.double())
        flips += compare_w4a4(n, on_cpu.get_submodule(n), x, xt, w, dec, y=y)
    print(f"ModelOpt CUDA fake quantization vs ours on the GPU: every layer within bound, {flips} tie flips")
