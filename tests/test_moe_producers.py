"""Mixture-of-experts checkpoints of the real producers in, and ours out under the producers' names.

tests/fixtures/producers/{modelopt,llmc}-moe-* hold a tiny random Qwen3-MoE quantized by NVIDIA ModelOpt 0.47.0
and llm-compressor 0.14.0.1 (tests/fixtures/make_moe_producer_checkpoints.py; versions in MANIFEST.json),
experts as per-expert tensors. Loaded by from_pretrained, every expert must hold the file's bytes and scales
in one NVFP4Experts per layer, in the mode the producer meant; weight-only logits equal those of a float model
holding the producer's own decoded weights (to fp32 rounding); W4A4 experts, part by part on the inputs the
model routes to them, equal the producer's own activation quantizer times its decoded weight (test_producers'
comparison: e2m1 rounding ties aside). Saving a loaded producer checkpoint in the producer's format gives the
producer's tensors back, under its names; quantize -> save -> load is bit for bit in both formats.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from nvfp4_gemm import moe
from nvfp4_gemm._moe_checkpoint import _PartView
from nvfp4_gemm.checkpoint import from_pretrained, save_pretrained
from nvfp4_gemm.formats import from_blocked

transformers = pytest.importorskip("transformers")
from test_producers import (  # noqa: E402
    FIXTURES,
    HAVE_CT,
    HAVE_MODELOPT,
    NO_CT,
    compare_w4a4,
    ct_activations,
    ct_args,
    ct_weight,
    modelopt_activations,
    modelopt_weight,
    rel_error,
    tensors,
    token_ids,
)

MODE = {"modelopt-moe-nvfp4": "static", "modelopt-moe-w4a16-nvfp4": "weight_only",
        "llmc-moe-nvfp4": "static", "llmc-moe-nvfp4a16": "weight_only"}
LAYERS, EXPERTS, PARTS = 2, 4, ("gate_proj", "up_proj", "down_proj")


def path(name: str) -> str:
    return os.path.join(FIXTURES, name)


def is_ct(name: str) -> bool:
    return name.startswith("llmc")


def expert_file_tensors(t: dict, name: str, l: int, e: int, part: str) -> dict:
    """The file's tensors of one expert part, under our roles (decode scales for both formats)."""
    p = f"model.layers.{l}.mlp.experts.{e}.{part}"
    if is_ct(name):
        out = {"weight": t[f"{p}.weight_packed"], "weight_scale": t[f"{p}.weight_scale"],
               "weight_scale_2": 1.0 / t[f"{p}.weight_global_scale"].reshape(())}
        if f"{p}.input_global_scale" in t:
            out["input_scale"] = 1.0 / t[f"{p}.input_global_scale"].reshape(())
        return out
    out = {k: t[f"{p}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2")}
    if f"{p}.input_scale" in t:
        out["input_scale"] = t[f"{p}.input_scale"]
    return out


@pytest.mark.parametrize("name", list(MODE))
def test_moe_producer_checkpoint_loads_every_expert(name):
    model = from_pretrained(path(name), progress=False)
    t = tensors(path(name))
    for l in range(LAYERS):
        ex = model.model.layers[l].mlp.experts
        assert isinstance(ex, moe.NVFP4Experts) and ex.num_experts == EXPERTS
        mode = "weight_only" if ex.weight_only else "static" if ex.static_input_scale else "dynamic"
        assert mode == MODE[name]
        assert isinstance(model.model.layers[l].mlp.gate, transformers.models.qwen3_moe.modeling_qwen3_moe.
                          Qwen3MoeTopKRouter)  # the router stays float
        for e in range(EXPERTS):
            for part, short in zip(PARTS, ("gate", "up", "down")):
                mine = _PartView(ex, e, short)
                theirs = expert_file_tensors(t, name, l, e, part)
                assert torch.equal(mine.weight, theirs["weight"]), (l, e, part)
                sf = from_blocked(mine.weight_scale, mine.out_features, mine.in_features)
                assert torch.equal(sf.view(torch.uint8), theirs["weight_scale"].view(torch.uint8)), (l, e, part)
                assert torch.equal(mine.weight_scale_2.reshape(()), theirs["weight_scale_2"].float().reshape(())), \
                    (l, e, part)
                if mode == "static":
                    assert torch.equal(mine.input_scale.reshape(()), theirs["input_scale"].float().reshape(()))


def producer_float_model(name: str):
    """A float32 Qwen3-MoE holding the producer's own decode of every quantized layer (ModelOpt: NVFP4QTensor,
    or the decode written out; compressed-tensors: its dequantize), experts stacked into the 3-D tensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = path(name)
    t = tensors(d)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.float32).eval()
    if is_ct(name) and not HAVE_CT:
        pytest.skip(NO_CT)
    wargs = ct_args(d, "weights") if is_ct(name) else None

    def decode(n):
        return ct_weight(t, n, wargs) if is_ct(name) else modelopt_weight(t, n)[0].float()

    sd = {}
    for k, v in t.items():
        if v.is_floating_point() and not k.endswith(("_scale", "_scale_2", "global_scale")):
            sd[k] = v
    for k in list(t):
        if k.endswith((".weight_packed",)) or (k.endswith(".weight") and t[k].dtype == torch.uint8):
            n = k.rpartition(".")[0]
            if ".experts." not in n:
                sd[f"{n}.weight"] = decode(n)
    for l in range(LAYERS):
        p = f"model.layers.{l}.mlp.experts"
        sd[f"{p}.gate_up_proj"] = torch.stack([torch.cat([decode(f"{p}.{e}.gate_proj"), decode(f"{p}.{e}.up_proj")])
                                               for e in range(EXPERTS)])
        sd[f"{p}.down_proj"] = torch.stack([decode(f"{p}.{e}.down_proj") for e in range(EXPERTS)])
    sd = {k: v for k, v in sd.items() if ".experts." not in k or k.endswith(("gate_up_proj", "down_proj"))}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model


@pytest.mark.parametrize("name", ["modelopt-moe-w4a16-nvfp4", "llmc-moe-nvfp4a16"])
def test_moe_weight_only_logits_match_producer(name):
    theirs = producer_float_model(name)
    ours = from_pretrained(path(name), progress=False)
    ids = token_ids()
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    err = rel_error(a, b)
    print(f"{name}: logits relative error vs the producer's decode {err:.2e}")
    assert err < 1e-5


@pytest.mark.parametrize("name", ["modelopt-moe-nvfp4", "llmc-moe-nvfp4"])
def test_moe_w4a4_experts_match_producer(name):
    d = path(name)
    if not is_ct(name) and not HAVE_MODELOPT:
        pytest.skip("nvidia-modelopt is not installed: its activation quantizer is the reference here")
    if is_ct(name) and not HAVE_CT:
        pytest.skip(NO_CT)
    t = tensors(d)
    model = from_pretrained(d, progress=False)
    seen = {}
    hooks = [model.model.layers[l].mlp.experts.register_forward_pre_hook(
        lambda _m, args, l=l: seen.__setitem__(l, (args[0].detach().clone(), args[1].clone())))
        for l in range(LAYERS)]
    with torch.no_grad():
        model(token_ids())
    for h in hooks:
        h.remove()
    checked = flips = 0
    for l, (x, idx) in seen.items():
        ex = model.model.layers[l].mlp.experts
        for e in range(EXPERTS):
            rows = x[(idx == e).any(dim=1)]
            if rows.shape[0] == 0:
                continue
            outs = {}
            for part, short in zip(PARTS, ("gate", "up", "down")):
                n = f"model.layers.{l}.mlp.experts.{e}.{part}"
                layer = _PartView(ex, e, short)
                a = rows if short != "down" else (ex.act_fn(outs["gate"]) * outs["up"])
                with torch.no_grad():
                    outs[short] = layer(a)
                if is_ct(name):
                    g = t[f"{n}.input_global_scale"]
                    w = ct_weight(t, n, ct_args(d, "weights"))
                    xt = ct_activations(a, ct_args(d, "input_activations"), g)
                    from test_producers import block_decode_scales

                    dec = block_decode_scales(a, lambda am: (am / 6 * g).to(torch.float8_e4m3fn).double() / g.double())
                else:
                    s_in = t[f"{n}.input_scale"]
                    w, _ = modelopt_weight(t, n)
                    xt = modelopt_activations(a, s_in)
                    from test_producers import block_decode_scales

                    dec = block_decode_scales(a, lambda am: (am / (6 * s_in)).clamp(2.0**-9, 448).to(
                        torch.float8_e4m3fn).double() * s_in.double())
                flips += compare_w4a4(n, layer, a, xt, w, dec, y=outs[short])
                checked += 1
        # and the module runs exactly these parts: its output from the same routing
        with torch.no_grad():
            w_top = torch.full(idx.shape, 0.5)
            got = ex(x, idx, w_top)
        assert torch.isfinite(got).all()
    assert checked >= LAYERS * 3 * 2, checked
    print(f"{name}: {checked} expert parts checked, {flips} e2m1 tie flips")


@pytest.mark.parametrize("name,fmt", [("modelopt-moe-nvfp4", "modelopt"), ("modelopt-moe-w4a16-nvfp4", "modelopt"),
                                      ("llmc-moe-nvfp4", "compressed-tensors"),
                                      ("llmc-moe-nvfp4a16", "compressed-tensors")])
def test_saving_a_producer_checkpoint_gives_its_tensors_back(tmp_path, name, fmt):
    model = from_pretrained(path(name), progress=False)
    out = tmp_path / "again"
    save_pretrained(model, out, format=fmt, progress=False)
    assert isinstance(model.model.layers[0].mlp.experts, moe.NVFP4Experts)  # the model is restored after saving
    theirs, ours = tensors(path(name)), tensors(str(out))
    expert_keys = {k for k in theirs if ".experts." in k}
    assert expert_keys and expert_keys == {k for k in ours if ".experts." in k}
    for k in expert_keys:
        a, b = ours[k], theirs[k]
        if k.endswith("global_scale"):
            # the model keeps DECODE scales, fl(1 / g): several float32 g share one; the saved g is one of them
            a, b = 1.0 / a, 1.0 / b
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                                  b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b), k
    cfg = json.load(open(out / "config.json"))["quantization_config"]
    excluded = cfg.get("ignore") or []
    assert {"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"} <= set(excluded)  # routers listed as float
    back = from_pretrained(str(out), progress=False)
    ids = token_ids()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)


def _tiny_moe():
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(FIXTURES)))
    import make_moe_producer_checkpoints as maker

    return maker._float_model()


@pytest.mark.parametrize("mode", ["weight_only", "static"])
@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_quantize_save_reload_bit_for_bit(tmp_path, mode, fmt):
    import nvfp4_gemm

    model = _tiny_moe()
    ids = token_ids(seed=3)
    calibrate = None if mode == "weight_only" else (lambda m: m(ids))
    nvfp4_gemm.quantize_model(model, filter=lambda n, m: n != "lm_head", weight_only=mode == "weight_only",
                              calibrate=calibrate, progress=False)
    ex = model.model.layers[1].mlp.experts  # quantize_model swapped the experts too, in the same mode
    assert isinstance(ex, moe.NVFP4Experts) and ex.weight_only == (mode == "weight_only")
    assert ex.static_input_scale == (mode == "static")
    out = tmp_path / "ckpt"
    save_pretrained(model, out, format=fmt, progress=False)
    back = from_pretrained(str(out), progress=False)
    sd_a, sd_b = model.state_dict(), back.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        a, b = sd_a[k], sd_b[k]
        same = torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype == torch.float8_e4m3fn else \
            torch.equal(a, b)
        assert same, k
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
        gen = back.generate(ids[:1, :5], attention_mask=torch.ones_like(ids[:1, :5]), max_new_tokens=3,
                            do_sample=False, pad_token_id=0)
    assert gen.shape == (1, 8)


def test_default_save_of_the_default_quantization_round_trips(tmp_path):
    import nvfp4_gemm

    model = _tiny_moe()
    nvfp4_gemm.quantize_model(model, filter=lambda n, m: n != "lm_head", progress=False)  # dynamic W4A4
    save_pretrained(model, tmp_path / "ckpt", progress=False)  # the format chosen from the model
    back = from_pretrained(str(tmp_path / "ckpt"), progress=False)
    ex = back.model.layers[0].mlp.experts
    assert isinstance(ex, moe.NVFP4Experts) and not ex.weight_only and not ex.static_input_scale  # dynamic again
    ids = token_ids(seed=4)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
