"""Fused projections (nvfp4_gemm.fused): tiny transformers Llama / Qwen2 / Qwen3 / Mistral models built from
configs, quantized with fusion, give bit for bit the logits of the same NVFP4 weights run unfused (eager and
under torch.compile) while running one GEMM per q/k/v and gate/up group; hooks on the parts, state_dict,
save_pretrained, from_pretrained, device casts and the cases that must stay unfused. Also quantize_model's
shared group scale and that it frees each float weight as soon as its NVFP4 layer is installed."""
from __future__ import annotations

import copy
import filecmp
import gc
import logging
import os
import weakref

import pytest
import torch
from torch import nn

import nvfp4_gemm
from nvfp4_gemm import NVFP4Linear, fuse_projections, quantize_model, unfuse_projections
from nvfp4_gemm import fused as fused_mod
from nvfp4_gemm import nn as nn_mod
from nvfp4_gemm.fused import FusedNVFP4Linear
from nvfp4_gemm.quantize import finite_amax, global_encode_scale
from nvfp4_gemm.testing import tiny_causal_lm

transformers = pytest.importorskip("transformers")

MODES = ("weight_only", "dynamic", "static")
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
VOCAB, HIDDEN, LAYERS = 256, 128, 2


def tiny_model(family: str, seed: int = 0, *, kv_heads: int = 4, head_dim: int = 32) -> nn.Module:
    """8 query heads of head_dim (q: N = 256 at 32), kv_heads of head_dim (k, v: N = kv_heads * head_dim), MLP 256;
    weights of gain 1 (transformers' std 0.02 leaves activations tiny: W4A4 would round nothing)."""
    model = tiny_causal_lm(family, seed, init="unit_gain", attn_implementation="sdpa", vocab_size=VOCAB,
                           hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=8,
                           num_key_value_heads=kv_heads, head_dim=head_dim)
    if family == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v carry biases
    return model


def token_ids(seed: int = 1, batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def quantized_pair(family: str, mode: str, **kw):
    """(fused model, the same NVFP4 tensors unfused): quantize_model with fuse=True, then a deep copy with
    unfuse_projections, so that the two differ only in how the projections run."""
    model = tiny_model(family, **kw)
    calib = token_ids(seed=5, batch=1, length=16)
    quantize_model(model, weight_only=mode == "weight_only", progress=False,
                   calibrate=(lambda m: m(calib)) if mode == "static" else None)
    plain = copy.deepcopy(model)
    unfuse_projections(plain)
    assert not any(isinstance(m, FusedNVFP4Linear) for m in plain.modules())
    return model, plain


def own_scales_pair(family: str, mode: str, dtype: torch.dtype = torch.float32, **kw):
    """(fused model, the same NVFP4 tensors unfused) where every layer keeps its OWN per-tensor weight scale
    (quantize_model with fuse=False, as a checkpoint that did not share them): fuse_projections then fuses
    every group with per-part alphas."""
    model = tiny_model(family, **kw)
    calib = token_ids(seed=5, batch=1, length=16)
    quantize_model(model, weight_only=mode == "weight_only", progress=False, fuse=False,
                   calibrate=(lambda m: m(calib)) if mode == "static" else None)
    model.to(dtype)
    plain = copy.deepcopy(model)
    assert fuse_projections(model) == LAYERS * 2
    for layer in model.model.layers:
        for g in (layer.self_attn.q_proj._group, layer.mlp.gate_proj._group):
            assert g.valid and g.own_alphas
            ws2 = [float(p.weight_scale_2) for p in g.parts]
            assert len(set(ws2)) == len(ws2), ws2  # every part's alpha differs: a shared one would show
    return model, plain


class CountGemms:
    """Counts the GEMMs of the fused groups and of the plain layers: nvfp4_gemm.linear calls (both go through
    call_linear) and the fused groups with per-part alphas (fused.linear_parts)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real, real_parts = nn_mod.call_linear, fused_mod.linear_parts

        def counted(*args):
            self.calls += 1
            return real(*args)

        def counted_parts(*args):
            self.calls += 1
            return real_parts(*args)

        monkeypatch.setattr(nn_mod, "call_linear", counted)
        monkeypatch.setattr(fused_mod, "call_linear", counted)
        monkeypatch.setattr(fused_mod, "linear_parts", counted_parts)


def assert_inductor_logits_equal(model, plain, ids) -> None:
    """The fused model and its unfused copy, each compiled by inductor (fullgraph), give the same logits bit for
    bit. (Not compared with eager's: inductor fuses the float ops around the GEMMs its own way.)"""
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True)(ids, use_cache=False).logits
        want = torch.compile(plain, fullgraph=True)(ids, use_cache=False).logits
    assert torch.equal(got, want)


def replayed_logits(model, ids) -> tuple[torch.Tensor, torch.cuda.CUDAGraph]:
    """The model's forward captured in a CUDA graph (after a warm-up on a side stream, as bench_generate
    does), its output poisoned, then one replay: the logits the replay wrote (synchronized), and the graph
    (the caller keeps it alive while it reads them)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(ids, use_cache=False).logits
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return out, graph


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits


# Per decoder layer: qkv, o, gate_up, down fused; q, k, v, o, gate, up, down unfused; plus lm_head.
FUSED_GEMMS, UNFUSED_GEMMS = LAYERS * 4 + 1, LAYERS * 7 + 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_logits_bit_identical_eager(family, mode, monkeypatch):
    model, plain = quantized_pair(family, mode)
    fused_parts = [m for m in model.modules() if isinstance(m, FusedNVFP4Linear)]
    assert len(fused_parts) == LAYERS * 5
    ids = token_ids()
    count = CountGemms(monkeypatch)
    want = logits(plain, ids)
    assert count.calls == UNFUSED_GEMMS
    count.calls = 0
    got = logits(model, ids)
    assert count.calls == FUSED_GEMMS
    assert torch.isfinite(want).all()
    assert torch.equal(got, want)
    # Nothing stays in a slot after the forward (no tensor is kept across forwards).
    assert all(p._group.slot is None for p in fused_parts)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family, dtype", [("llama", torch.float16), ("qwen2", torch.bfloat16),
                                           ("qwen2", torch.float16), ("qwen3", torch.float32)])
def test_groups_with_own_scales_fuse_bit_identical(family, dtype, mode, monkeypatch):
    """Parts whose weight_scale_2 differ fuse too: one GEMM per group, each part's own alpha in the epilogue,
    the logits bit for bit the unfused ones (fp16 / bf16 / fp32, with and without biases), the state_dict
    the unfused one's."""
    model, plain = own_scales_pair(family, mode, dtype)
    ids = token_ids()
    count = CountGemms(monkeypatch)
    want = logits(plain, ids)
    assert count.calls == UNFUSED_GEMMS
    count.calls = 0
    got = logits(model, ids)
    assert count.calls == FUSED_GEMMS
    assert want.dtype == dtype and torch.isfinite(want).all()
    assert torch.equal(got, want)
    assert all(p._group.slot is None for p in model.modules() if isinstance(p, FusedNVFP4Linear))
    sd, ref = model.state_dict(), plain.state_dict()
    assert list(sd) == list(ref) and all(sd[k].dtype == ref[k].dtype and torch.equal(sd[k], ref[k]) for k in sd)


def fused_parts_inputs(device, mode: str, dtype: torch.dtype, bias: bool, sizes=(256, 128, 128), k: int = 256):
    """Parts (NVFP4Linear) of the given N with their own weight scales (weights of different magnitudes),
    and the arguments of fused.linear_parts for their concatenation."""
    g = torch.Generator().manual_seed(sum(sizes) + bias)
    parts = []
    for i, n in enumerate(sizes):
        lin = nn.Linear(k, n, bias=bias)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=g) * (1 + i) / k ** 0.5)
            if bias:
                lin.bias.copy_(torch.randn(n, generator=g))
        p = NVFP4Linear.from_linear(lin.to(dtype), weight_only=mode == "weight_only",
                                    input_amax=3.0 if mode == "static" else None).to(device)
        parts.append(p)
    ws2 = [p.weight_scale_2 for p in parts]
    assert len({float(t) for t in ws2}) == len(parts)
    args = (torch.cat([p.weight for p in parts]), torch.cat([p.weight_scale for p in parts]), ws2, list(sizes),
            parts[0].input_scale, torch.cat([p.bias for p in parts]) if bias else None, mode == "weight_only")
    return parts, args


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device on this machine"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", (False, True))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("mode", MODES)
def test_linear_parts_equal_each_part_alone(device, mode, dtype, bias):
    """fused.linear_parts (one GEMM at alpha 1 into fp32, each part's alpha after) against each part's own
    nvfp4_gemm.linear, bit for bit: for ONE part (the same M, N, K, so on CUDA the same kernel configuration
    and the same accumulation: this holds the epilogue to the kernels' round(fl(alpha * acc))) on every
    device, and for the concatenation of three on the CPU (on CUDA the fused N may pick another configuration:
    to rounding). Rows from 1 (sm90's small-M kernels) to 300 (its wgmma kernels), 3-D and non-contiguous x,
    no rows; on CUDA also 2100 rows, where sm90 hands the problem to decode + cuBLAS, whose kernel choice may
    follow the output dtype (W4A4 decodes to fp16 for an fp32 output, to bf16 for a bf16 one): to rounding."""
    parts, args = fused_parts_inputs(device, mode, dtype, bias)
    g = torch.Generator().manual_seed(7)
    rows = (1, 5, 64, 300) + ((2100,) if device == "cuda" else ())
    xs = [torch.randn(m, 256, generator=g).to(dtype) * 2 for m in rows]
    xs += [torch.randn(2, 3, 256, generator=g).to(dtype), torch.randn(256, 6, generator=g).to(dtype).t(),
           torch.empty(0, 256, dtype=dtype)]
    with torch.no_grad():
        for x in xs:
            x = x.to(device)
            scales = args[1].split([p.weight_scale.numel() for p in parts])
            for p, w, sf, ws2 in zip(parts, args[0].split(args[3]), scales, args[2]):
                one = fused_mod.linear_parts(x, w, sf, [ws2], [p.out_features], p.input_scale, p.bias, p.weight_only)
                want = p(x)
                assert one.dtype == want.dtype == dtype and one.shape == want.shape
                if x.numel() // 256 < 2048:
                    assert torch.equal(one, want), (tuple(x.shape), p.out_features)
                else:
                    torch.testing.assert_close(one, want, rtol=1e-2, atol=1e-2)
            got = fused_mod.linear_parts(x, *args)
            want = torch.cat([p(x) for p in parts], dim=-1)
            assert torch.isfinite(want).all()
            if device == "cpu":
                assert torch.equal(got, want), tuple(x.shape)
            else:
                torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_quantize_model_shares_group_scale_only_when_fusing():
    model = tiny_model("llama")
    ref = copy.deepcopy(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    amax = {n: finite_amax(getattr(attn, n).weight) for n in ("q_proj", "k_proj", "v_proj")}
    assert len({float(a) for a in amax.values()}) == 3  # distinct: sharing is visible
    quantize_model(model, progress=False)
    group_scale = 1.0 / global_encode_scale(torch.stack(list(amax.values())).amax())
    for n in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(getattr(attn, n).weight_scale_2, group_scale)
    assert torch.equal(mlp.gate_proj.weight_scale_2, mlp.up_proj.weight_scale_2)
    # fuse=False: each layer's own scale, as NVFP4Linear.from_linear gives it, and no fused module.
    quantize_model(ref, progress=False, fuse=False)
    assert not any(isinstance(m, FusedNVFP4Linear) for m in ref.modules())
    for n in ("q_proj", "k_proj", "v_proj"):
        own = NVFP4Linear.from_linear(getattr(tiny_model("llama").model.layers[0].self_attn, n))
        got = getattr(ref.model.layers[0].self_attn, n)
        assert torch.equal(got.weight_scale_2, own.weight_scale_2) and torch.equal(got.weight, own.weight)


@pytest.mark.parametrize("method", ("mse", "gptq"))
def test_methods_take_the_group_scale(method):
    model = tiny_model("llama")
    calib = token_ids(seed=5, batch=1, length=16)
    quantize_model(model, method=method, weight_only=True, calibrate=lambda m: m(calib), progress=False)
    attn = model.model.layers[1].self_attn
    assert isinstance(attn.k_proj, FusedNVFP4Linear)
    assert torch.equal(attn.q_proj.weight_scale_2, attn.k_proj.weight_scale_2)
    assert torch.equal(attn.q_proj.weight_scale_2, attn.v_proj.weight_scale_2)
    ids = token_ids()
    plain = copy.deepcopy(model)
    unfuse_projections(plain)
    assert torch.equal(logits(model, ids), logits(plain, ids))


@pytest.mark.parametrize("family, mode, inductor", [("llama", "dynamic", True), ("qwen2", "weight_only", True),
                                                    ("mistral", "static", False), ("qwen3", "dynamic", False)])
def test_fused_under_torch_compile(family, mode, inductor):
    """fullgraph compile: the traced program holds one GEMM per group (counted in the FX graph dynamo hands its
    backend, which then runs it op by op: the eager logits, bit for bit) and, with inductor (two of the
    families: each compile takes ~10-20 s here), the logits equal the unfused model's compiled the same way."""
    model, plain = quantized_pair(family, mode)
    ids = token_ids()
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(sum(1 for n in gm.graph.nodes if n.op == "call_function" and "nvfp4_gemm.linear" in str(n.target)))
        return gm.forward

    want = logits(plain, ids)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend=counting_backend, fullgraph=True)(ids, use_cache=False).logits
        torch.compile(plain, backend=counting_backend, fullgraph=True)(ids, use_cache=False)
    assert graphs == [FUSED_GEMMS, UNFUSED_GEMMS]
    assert torch.equal(got, want)
    if inductor:
        assert_inductor_logits_equal(model, plain, ids)
    torch._dynamo.reset()
    assert all(p._group.slot is None for p in model.modules() if isinstance(p, FusedNVFP4Linear))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_linear_parts_opcheck(device, mode):
    """The op compiled code calls (nvfp4_gemm::_linear_parts): schema, fake and AOT dispatch agree with it."""
    parts, args = fused_parts_inputs(device, mode, torch.bfloat16, True)
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(2)).bfloat16().to(device)
    # (uint8 block scales: opcheck's schema check multiplies tensors, which float8 does not support on the CPU)
    torch.library.opcheck(torch.ops.nvfp4_gemm._linear_parts.default,
                          (x, args[0], args[1].view(torch.uint8), *args[2:]))


@pytest.mark.parametrize("family, mode, inductor", [("llama", "dynamic", True), ("qwen2", "static", False),
                                                    ("qwen3", "weight_only", False)])
def test_own_scales_under_torch_compile(family, mode, inductor):
    """Groups with per-part alphas under fullgraph compile: one nvfp4_gemm._linear_parts per group in the
    traced program (opaque: inductor cannot contract its multiply and bias add), the eager logits, and with
    inductor the unfused model's compiled logits, bit for bit."""
    model, plain = own_scales_pair(family, mode, torch.bfloat16 if family == "qwen2" else torch.float32)
    ids = token_ids()
    graphs = []

    def counting_backend(gm, example_inputs):
        targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        graphs.append((sum("nvfp4_gemm._linear_parts" in t for t in targets),
                       sum("nvfp4_gemm.linear" in t for t in targets)))
        return gm.forward

    want = logits(plain, ids)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend=counting_backend, fullgraph=True)(ids, use_cache=False).logits
    assert graphs == [(LAYERS * 2, FUSED_GEMMS - LAYERS * 2)]
    assert torch.equal(got, want)
    if inductor:
        assert_inductor_logits_equal(model, plain, ids)
    torch._dynamo.reset()
    assert all(p._group.slot is None for p in model.modules() if isinstance(p, FusedNVFP4Linear))


def test_hooks_on_parts_see_unfused_values(monkeypatch):
    model, plain = quantized_pair("llama", "dynamic")
    ids = token_ids()
    seen = {}

    def record(tag):
        def hook(mod, args, out):
            seen.setdefault(tag, []).append(out.clone())
        return hook

    def double_input(mod, args):
        return (args[0] * 2,)

    for tag, m in (("fused", model), ("plain", plain)):
        attn = m.model.layers[0].self_attn
        attn.k_proj.register_forward_hook(record(tag))
        attn.v_proj.register_forward_pre_hook(double_input)
    count = CountGemms(monkeypatch)
    want = logits(plain, ids)
    count.calls = 0
    got = logits(model, ids)
    # layer 0's attention runs unfused (its parts have hooks), everything else fused
    assert count.calls == FUSED_GEMMS + 2
    assert torch.equal(got, want)
    assert len(seen["fused"]) == 1 and torch.equal(seen["fused"][0], seen["plain"][0])
    # A global forward hook sends every group down the unfused path for as long as it is registered.
    calls = []
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: calls.append(type(mod).__name__))
    try:
        count.calls = 0
        assert torch.equal(logits(model, ids), want)
        assert count.calls == UNFUSED_GEMMS and calls.count("FusedNVFP4Linear") == LAYERS * 5
    finally:
        handle.remove()
    count.calls = 0
    logits(model, ids)
    assert count.calls == FUSED_GEMMS + 2


def test_inference_mode(monkeypatch):
    """Tensors made under torch.inference_mode have no version counter: quantizing and running there works,
    fused."""
    model = tiny_model("qwen3")
    ids = token_ids()
    with torch.inference_mode():
        quantize_model(model, progress=False)
        plain = copy.deepcopy(model)
        unfuse_projections(plain)
        count = CountGemms(monkeypatch)
        want = plain(ids, use_cache=False).logits
        count.calls = 0
        got = model(ids, use_cache=False).logits
    assert count.calls == FUSED_GEMMS
    assert torch.equal(got, want)


def test_fusing_and_unfusing_keep_the_modules_and_their_hooks(monkeypatch):
    """fuse_projections / unfuse_projections change the parts in place: the same module objects, with the hooks
    registered before, which keep the group on the unfused path while they are there."""
    model = tiny_model("llama")
    quantize_model(model, progress=False)
    plain = copy.deepcopy(model)
    unfuse_projections(plain)
    assert unfuse_projections(model) == LAYERS * 5
    attn = model.model.layers[0].self_attn
    k_proj, up_proj = attn.k_proj, model.model.layers[0].mlp.up_proj
    assert type(k_proj) is NVFP4Linear
    seen = []
    handle = k_proj.register_forward_hook(lambda mod, args, out: seen.append(out.clone()))
    assert fuse_projections(model) == LAYERS * 2
    assert attn.k_proj is k_proj and model.model.layers[0].mlp.up_proj is up_proj
    assert isinstance(k_proj, FusedNVFP4Linear) and k_proj._group.valid
    ids = token_ids()
    count = CountGemms(monkeypatch)
    want = logits(plain, ids)
    count.calls = 0
    assert torch.equal(logits(model, ids), want)
    assert count.calls == FUSED_GEMMS + 2 and len(seen) == 1
    handle.remove()
    count.calls = 0
    assert torch.equal(logits(model, ids), want)
    assert count.calls == FUSED_GEMMS
    unfuse_projections(model)
    assert attn.k_proj is k_proj and type(k_proj) is NVFP4Linear and not k_proj._load_state_dict_post_hooks
    assert torch.equal(logits(model, ids), want)


def input_grads_and_gemms(models, count):
    """Per model: the gradient of a loss over its logits with respect to the input embeddings, and the GEMM
    calls its forward and backward made (count: a CountGemms)."""
    ids = token_ids()
    out = []
    for m in models:
        emb = m.model.embed_tokens(ids).detach().requires_grad_(True)
        count.calls = 0
        m(inputs_embeds=emb, use_cache=False).logits.square().mean().backward()
        out.append((emb.grad, count.calls))
    return out


def test_gradients_through_fused_groups(monkeypatch):
    """Autograd (nvfp4_gemm.autograd) sees the fused GEMM: the input gradient equals the unfused model's."""
    model, plain = quantized_pair("qwen2", "weight_only")
    grads = input_grads_and_gemms((model, plain), CountGemms(monkeypatch))
    assert grads[0][1] == FUSED_GEMMS and grads[1][1] == UNFUSED_GEMMS
    assert torch.isfinite(grads[0][0]).all() and grads[0][0].abs().sum() > 0
    # (one fp32 sum over the fused N in the backward instead of three added: rounding-level differences)
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-6)


def test_gradients_through_groups_with_own_scales(monkeypatch):
    """A call that needs a gradient runs a per-part-alpha group unfused (linear_parts has no backward): the
    gradients are the unfused model's, bit for bit; without grad the same model runs fused again."""
    model, plain = own_scales_pair("qwen2", "weight_only")
    count = CountGemms(monkeypatch)
    grads = input_grads_and_gemms((model, plain), count)
    assert grads[0][1] == grads[1][1] == UNFUSED_GEMMS
    assert torch.isfinite(grads[0][0]).all() and grads[0][0].abs().sum() > 0
    assert torch.equal(grads[0][0], grads[1][0])
    count.calls = 0
    ids = token_ids()
    assert torch.equal(logits(model, ids), logits(plain, ids))
    assert count.calls == FUSED_GEMMS + UNFUSED_GEMMS
    # a frozen scale that requires grad is refused as an unfused layer refuses it
    model.model.layers[0].self_attn.k_proj.weight_scale_2.requires_grad_(True)
    with pytest.raises(RuntimeError, match="weight_scale_2 requires grad"):
        model(token_ids(), use_cache=False)


def test_own_scales_bad_input_named_by_the_layer():
    model, _ = own_scales_pair("llama", "dynamic")
    q = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        with pytest.raises(ValueError, match="in_features = 128, got 64"):
            q(torch.randn(2, 64))
        with pytest.raises(ValueError, match="at least 2 dims"):
            q(torch.randn(HIDDEN))
        with pytest.raises(ValueError, match="float16, bfloat16 or float32, got torch.int32"):
            q(torch.ones(2, HIDDEN, dtype=torch.int32))
    assert q._group.valid and q._group.slot is None


def test_own_scales_follow_casts_and_loads():
    """.to(dtype) keeps a per-part-alpha group fused; load_state_dict of own-scale tensors into a model fused
    with shared scales turns its groups into per-part-alpha ones (and back), bit for bit the unfused model."""
    model, plain = own_scales_pair("qwen2", "static")
    ids = token_ids()
    shared, shared_plain = quantized_pair("qwen2", "static")
    g = shared.model.layers[1].mlp.gate_proj._group
    assert g.valid and not g.own_alphas
    shared.load_state_dict(plain.state_dict())
    assert g.valid and g.own_alphas
    assert torch.equal(logits(shared, ids), logits(plain, ids))
    shared.load_state_dict(shared_plain.state_dict())
    assert g.valid and not g.own_alphas
    assert torch.equal(logits(shared, ids), logits(shared_plain, ids))
    model.to(torch.bfloat16)
    plain.to(torch.bfloat16)
    assert model.model.layers[0].self_attn.q_proj._group.own_alphas
    assert torch.equal(logits(model, ids), logits(plain, ids))


def test_slot_misses_fall_back_exactly():
    model, plain = quantized_pair("llama", "dynamic")
    attn, ref = model.model.layers[0].self_attn, plain.model.layers[0].self_attn
    g = torch.Generator().manual_seed(3)
    x, other = torch.randn(2, 5, HIDDEN, generator=g), torch.randn(2, 5, HIDDEN, generator=g)
    with torch.no_grad():
        assert torch.equal(attn.q_proj(x), ref.q_proj(x))
        assert torch.equal(attn.k_proj(other), ref.k_proj(other))   # another tensor: its own GEMM
        x.mul_(3)                                                     # x changed in place after q's GEMM
        assert torch.equal(attn.v_proj(x), ref.v_proj(x))
        assert attn.q_proj._group.slot is None or attn.q_proj._group.slot[0] is x
        # Parts called alone, in any order, twice: always their own values.
        for name in ("v_proj", "k_proj", "k_proj", "q_proj", "q_proj", "v_proj", "k_proj"):
            assert torch.equal(getattr(attn, name)(other), getattr(ref, name)(other)), name


def test_state_dict_and_save_pretrained_unchanged(tmp_path):
    model, plain = quantized_pair("qwen2", "static")
    sd, ref = model.state_dict(), plain.state_dict()
    assert list(sd) == list(ref)
    for k in sd:
        assert sd[k].dtype == ref[k].dtype and torch.equal(sd[k], ref[k]), k
    part = model.model.layers[0].self_attn.k_proj
    assert part.weight.untyped_storage().data_ptr() == part._group.weight.data_ptr()  # a view: no copy
    for fmt in ("modelopt", "compressed-tensors"):
        a, b = tmp_path / f"fused-{fmt}", tmp_path / f"plain-{fmt}"
        nvfp4_gemm.save_pretrained(model, a, format=fmt, progress=False)
        nvfp4_gemm.save_pretrained(plain, b, format=fmt, progress=False)
        names = sorted(os.listdir(a))
        assert names == sorted(os.listdir(b)) and "model.safetensors" in names
        for n in names:
            assert filecmp.cmp(a / n, b / n, shallow=False), n
    # load_state_dict into a fused model goes through the views into the fused tensors
    fresh, _ = quantized_pair("qwen2", "static")
    fresh.load_state_dict(plain.state_dict())
    ids = token_ids()
    assert torch.equal(logits(fresh, ids), logits(plain, ids))


def test_from_pretrained_fuses_shared_scales(tmp_path):
    model, plain = quantized_pair("llama", "weight_only")
    nvfp4_gemm.save_pretrained(model, tmp_path / "shared", progress=False)
    loaded = nvfp4_gemm.from_pretrained(tmp_path / "shared", progress=False)
    assert sum(isinstance(m, FusedNVFP4Linear) for m in loaded.modules()) == LAYERS * 5
    assert not any(m._group.own_alphas for m in loaded.modules() if isinstance(m, FusedNVFP4Linear))
    ids = token_ids()
    assert torch.equal(logits(loaded, ids), logits(plain, ids))
    unfused = nvfp4_gemm.from_pretrained(tmp_path / "shared", progress=False, fuse=False)
    assert not any(isinstance(m, FusedNVFP4Linear) for m in unfused.modules())


@pytest.mark.parametrize("fmt, mode", [("modelopt", "weight_only"), ("modelopt", "static"),
                                       ("compressed-tensors", "weight_only"), ("compressed-tensors", "static")])
def test_from_pretrained_fuses_groups_with_own_scales(tmp_path, caplog, fmt, mode):
    """A checkpoint whose q/k/v and gate/up parts have their own weight scales (both formats' layouts, as
    written by save_pretrained: ModelOpt's weight_scale_2, compressed-tensors' weight_global_scale) loads
    fused with per-part alphas (logged at debug level): the logits bit for bit those of the same checkpoint
    loaded unfused, and saving the fused model writes the checkpoint's bytes again."""
    own = tiny_model("qwen2")
    calib = token_ids(seed=5, batch=1, length=16)
    quantize_model(own, weight_only=mode == "weight_only", fuse=False, progress=False,
                   calibrate=(lambda m: m(calib)) if mode == "static" else None)
    with pytest.warns(UserWarning, match="different per-tensor scales"):
        nvfp4_gemm.save_pretrained(own, tmp_path / "own", format=fmt, progress=False)
    with caplog.at_level(logging.DEBUG, logger="nvfp4_gemm.fused"):
        loaded = nvfp4_gemm.from_pretrained(tmp_path / "own", progress=False)
    parts = [m for m in loaded.modules() if isinstance(m, FusedNVFP4Linear)]
    assert len(parts) == LAYERS * 5 and all(p._group.valid and p._group.own_alphas for p in parts)
    assert "weight_scale_2 differ" in caplog.text and "self_attn" in caplog.text
    attn = loaded.model.layers[0].self_attn
    assert float(attn.q_proj.weight_scale_2) != float(attn.k_proj.weight_scale_2)
    assert (attn.q_proj.input_scale is not None) == (mode == "static")
    unfused = nvfp4_gemm.from_pretrained(tmp_path / "own", progress=False, fuse=False)
    ids = token_ids()
    want = logits(unfused, ids)
    assert torch.equal(logits(loaded, ids), want) and torch.equal(logits(own, ids), want)
    with pytest.warns(UserWarning, match="different per-tensor scales"):
        nvfp4_gemm.save_pretrained(loaded, tmp_path / "again", format=fmt, progress=False)
    assert filecmp.cmp(tmp_path / "own" / "model.safetensors", tmp_path / "again" / "model.safetensors",
                       shallow=False)


def test_from_pretrained_quantize_on_load_fuses_after_calibration(tmp_path):
    """quantize=True with calibrate: the group's shared static scales are set first, then the groups fuse."""
    tiny_model("qwen2").save_pretrained(tmp_path / "float")
    calib = token_ids(seed=5, batch=1, length=16)
    model = nvfp4_gemm.from_pretrained(tmp_path / "float", quantize=True, calibrate=lambda m: m(calib),
                                       progress=False)
    attn = model.model.layers[1].self_attn
    assert isinstance(attn.v_proj, FusedNVFP4Linear) and attn.v_proj._group.valid
    assert attn.v_proj.input_scale is not None and torch.equal(attn.v_proj.input_scale, attn.q_proj.input_scale)
    plain = copy.deepcopy(model)
    unfuse_projections(plain)
    ids = token_ids()
    assert torch.equal(logits(model, ids), logits(plain, ids))


def test_unfusable_shapes_keep_their_own_scales():
    """k/v of 192 rows (SmolLM2's) are not whole 128-row scale blocks: q/k/v stay unfused with per-layer
    scales, gate/up still fuse."""
    model = tiny_model("llama", kv_heads=3, head_dim=64)  # q: 8 x 64 = 512, k / v: 3 x 64 = 192
    ref = copy.deepcopy(model)
    quantize_model(model, progress=False)
    quantize_model(ref, progress=False, fuse=False)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert type(attn.k_proj) is NVFP4Linear and type(attn.q_proj) is NVFP4Linear
    assert isinstance(mlp.up_proj, FusedNVFP4Linear)
    for n in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(getattr(attn, n).weight_scale_2, getattr(ref.model.layers[0].self_attn, n).weight_scale_2)


def test_changed_scales_unfuse_until_refused(caplog):
    model, plain = quantized_pair("mistral", "static")
    ids = token_ids()
    attn = model.model.layers[1].self_attn
    g = attn.q_proj._group
    assert g.valid
    with caplog.at_level(logging.DEBUG, logger="nvfp4_gemm.fused"):
        attn.k_proj.set_input_amax(4.0)          # a new tensor: the group cannot share one scale any more
    assert not g.valid and "input_scale" in caplog.text
    plain.model.layers[1].self_attn.k_proj.set_input_amax(4.0)
    assert torch.equal(logits(model, ids), logits(plain, ids))
    assert fuse_projections(model) == 2 * LAYERS - 1     # that group's scales now differ: it stays unfused
    assert type(attn.k_proj) is NVFP4Linear and type(attn.q_proj) is NVFP4Linear
    for name in ("q_proj", "v_proj"):
        getattr(attn, name).set_input_amax(4.0)
        getattr(plain.model.layers[1].self_attn, name).set_input_amax(4.0)
    assert fuse_projections(model) == 2 * LAYERS
    assert isinstance(model.model.layers[1].self_attn.k_proj, FusedNVFP4Linear)
    assert torch.equal(logits(model, ids), logits(plain, ids))
    # An in-place change of a part's scale (eager) is caught by its version counter.
    model.model.layers[1].mlp.up_proj.weight_scale_2.mul_(2)
    plain.model.layers[1].mlp.up_proj.weight_scale_2.mul_(2)
    assert torch.equal(logits(model, ids), logits(plain, ids))
    assert not model.model.layers[1].mlp.up_proj._group.valid
    # fused again, now with per-part alphas (gate's and up's weight scales differ by the factor 2)
    assert fuse_projections(model) == 2 * LAYERS
    assert model.model.layers[1].mlp.up_proj._group.own_alphas
    assert torch.equal(logits(model, ids), logits(plain, ids))


def test_per_block_dynamic_layers_stay_unfused():
    """block_scales_only layers (compressed-tensors' dynamic: true) run quantize then mm: not fused, and a
    fused group whose parts switch to it runs unfused."""
    model, plain = quantized_pair("llama", "dynamic")
    for m in (model, plain):
        for p in m.modules():
            if isinstance(p, NVFP4Linear) and hasattr(p, "block_scales_only"):
                p.block_scales_only = True
    if not hasattr(plain.model.layers[0].mlp.up_proj, "block_scales_only"):
        pytest.skip("NVFP4Linear has no block_scales_only mode here")
    assert not model.model.layers[0].mlp.up_proj._group.valid
    ids = token_ids()
    assert torch.equal(logits(model, ids), logits(plain, ids))
    assert fuse_projections(model) == 0


def test_casts_keep_views_and_fusion():
    model, plain = quantized_pair("qwen2", "weight_only")
    model.to(torch.bfloat16)
    plain.to(torch.bfloat16)
    attn = model.model.layers[0].self_attn
    g = attn.q_proj._group
    assert g.valid and g.bias.dtype == torch.bfloat16 and g.weight.dtype == torch.uint8
    for p in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert p.weight._base is g.weight and p.bias._base is g.bias and p.weight_scale._base is g.weight_scale
    ids = token_ids()
    assert torch.equal(logits(model, ids), logits(plain, ids))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_device_move_keeps_views_and_fusion():
    model, plain = quantized_pair("llama", "dynamic")
    model.cuda()
    g = model.model.layers[0].self_attn.q_proj._group
    assert g.valid and g.weight.is_cuda
    assert model.model.layers[0].self_attn.v_proj.weight._base is g.weight
    ids = token_ids()
    got = logits(model, ids.cuda()).cpu()
    unfuse_projections(model)
    want = logits(model, ids.cuda()).cpu()
    # The same operands; the fused N may pick another kernel configuration (fp32 accumulation order), so on
    # CUDA the logits agree to rounding, not necessarily bit for bit (bench_generate reports which).
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("mode", MODES)
def test_cuda_graph_capture_of_a_fused_model(mode):
    """The fused model's forward captured in a CUDA graph (as bench_generate does) replays the eager logits.

    Attention runs on the math sdpa backend: transformers calls sdpa differently while a stream captures
    (an explicit mask with is_causal=False and repeated k / v, instead of no mask and is_causal=True), and
    the fused attention backends round those two calls differently (measured on the H100: the unfused and
    the fused model alike, first at layer 0's attention output with bit-equal inputs). The math backend
    gives both calls the same bits, so what is compared is the projections' own replay."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model, _ = quantized_pair("llama", mode)
    model.half().cuda()
    ids = token_ids().cuda()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        want = model(ids, use_cache=False).logits.clone()
        out, _graph = replayed_logits(model, ids)
    assert torch.equal(out, want)
    assert all(p._group.slot is None for p in model.modules() if isinstance(p, FusedNVFP4Linear))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_cuda_groups_with_own_scales(mode, dtype):
    """On the GPU: per-part-alpha groups give the unfused logits (bit for bit where the fused N runs the same
    kernel configuration, to rounding otherwise: test_linear_parts_equal_each_part_alone holds the epilogue
    bit for bit), and a CUDA graph of the fused forward replays the eager logits exactly (attention on the
    math sdpa backend: test_cuda_graph_capture_of_a_fused_model says why)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model, plain = own_scales_pair("qwen2", mode, dtype)
    model.cuda()
    plain.cuda()
    ids = token_ids().cuda()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        want = logits(plain, ids)
        got = logits(model, ids)
        assert torch.isfinite(got).all()
        # (a one-ulp difference in a GEMM output can move later fp16 / bf16 roundings: the logits' norm)
        rel = float((got.float() - want.float()).norm() / want.float().norm())
        assert rel < 1e-2, rel
        out, _graph = replayed_logits(model, ids)
    assert torch.equal(out, got)
    assert all(p._group.own_alphas and p._group.slot is None
               for p in model.modules() if isinstance(p, FusedNVFP4Linear))


@pytest.mark.parametrize("method, mode", [("rtn", "dynamic"), ("rtn", "static"), ("mse", "weight_only"),
                                          ("gptq", "weight_only")])
def test_quantize_model_frees_each_float_weight_once_installed(method, mode, monkeypatch):
    """Each layer's float weight must be gone (no reference left anywhere) when the next layer is quantized:
    the peak is then the float model plus one layer's work, not two models."""
    model = tiny_model("llama")
    calib = token_ids(seed=5, batch=1, length=16)
    refs = {name: weakref.ref(mod.weight) for name, mod in model.named_modules() if type(mod) is nn.Linear}
    order = []
    real = NVFP4Linear.from_linear.__func__

    def checked(cls, linear, **kw):
        alive = [n for n in order if refs[n]() is not None]
        assert not alive, f"float weights still referenced while quantizing another layer: {alive}"
        order.append(next(n for n, r in refs.items() if r() is linear.weight))
        return real(cls, linear, **kw)

    monkeypatch.setattr(NVFP4Linear, "from_linear", classmethod(checked))
    gc.disable()  # refcounting alone must free them (no cycle holds a float weight)
    try:
        quantize_model(model, method=method, weight_only=mode == "weight_only", progress=False,
                       calibrate=(lambda m: m(calib)) if (mode == "static" or method != "rtn") else None)
    finally:
        gc.enable()
    assert sorted(order) == sorted(refs)
    assert all(r() is None for r in refs.values())


def test_quantize_weight_global_scale_option():
    """methods.quantize_weight(global_scale=): the given per-tensor ENCODE scale replaces the weight's own in
    every method (what a fused group's parts share); bad values are refused."""
    from nvfp4_gemm.methods import quantize_weight

    g = torch.Generator().manual_seed(4)
    w = torch.randn(64, 128, generator=g)
    gs = global_encode_scale(finite_amax(w) * 3)  # a group whose largest |w| is 3x this part's
    packed, sf = nvfp4_gemm.quantize(w, gs)
    got = quantize_weight(w, "rtn", global_scale=gs)
    assert torch.equal(got[0], packed) and torch.equal(got[1].view(torch.uint8), sf.view(torch.uint8))
    assert torch.equal(got[2], 1.0 / gs)
    own = quantize_weight(w, "rtn")
    assert not torch.equal(own[2], got[2])
    h = torch.rand(128, generator=g) + 0.1
    for method, kw in (("mse", {}), ("mse", {"hessian": h}),
                       ("gptq", {"hessian": torch.eye(128) + 0.01 * torch.ones(128, 128)})):
        _, _, ws2 = quantize_weight(w, method, global_scale=gs, **kw)
        assert torch.equal(ws2, 1.0 / gs), method
    with pytest.raises(ValueError, match="global_scale must be a one-element tensor"):
        quantize_weight(w, "rtn", global_scale=torch.ones(2))
    with pytest.raises(ValueError, match="global_candidates must be 1"):
        quantize_weight(w, "mse", global_scale=gs, global_candidates=4)
