"""NVFP4 experts in transformers' MoE models (nvfp4_gemm.moe): tiny random Qwen3-MoE / Mixtral / Qwen2-MoE /
DeepSeek-V3 on the CPU.

  * weight-only: the model's logits equal those of a float model whose experts hold the dequantized weights
    (to fp32 rounding);
  * W4A4 (static per-expert scales, static shared, dynamic; gate and up with their own scales): an experts
    module's output is bit for bit what expert-by-expert quantize-then-mm (nvfp4_gemm.linear) gives;
  * routing corners (empty experts, one token, every token on one expert), generate(), torch.compile.
"""
from __future__ import annotations

import copy

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm import moe
from nvfp4_gemm.formats import dequantize, from_blocked, to_blocked
from conftest import capture_graph

transformers = pytest.importorskip("transformers")

H, I, E, K_TOP, VOCAB = 64, 128, 8, 2, 128


def _spread_(model: torch.nn.Module, seed: int) -> None:
    """Weights over several binades (rows and experts scaled by 2^-8 .. 2^-4), norms near 1: block scales
    differ and every e2m1 code occurs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 3:  # experts [E, N, K]: each expert and row its own binade
                s = torch.exp2(torch.randint(-6, -2, p.shape[:2], generator=g).float()).unsqueeze(-1)
                p.copy_(torch.randn(p.shape, generator=g) * s)
            elif p.dim() == 2:
                s = torch.exp2(torch.randint(-6, -2, p.shape[:1], generator=g).float()).unsqueeze(-1)
                p.copy_(torch.randn(p.shape, generator=g) * s)
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def tiny(family: str = "qwen3_moe", seed: int = 0, layers: int = 2) -> torch.nn.Module:
    common = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    if family == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, head_dim=16, intermediate_size=128, moe_intermediate_size=I,
                                          num_experts=E, num_experts_per_tok=K_TOP, norm_topk_prob=True,
                                          decoder_sparse_step=1, mlp_only_layers=[])
        cls = transformers.Qwen3MoeForCausalLM
    elif family == "mixtral":
        cfg = transformers.MixtralConfig(**common, intermediate_size=I, num_local_experts=E,
                                         num_experts_per_tok=K_TOP)
        cls = transformers.MixtralForCausalLM
    elif family == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(**common, intermediate_size=128, moe_intermediate_size=I, num_experts=E,
                                          num_experts_per_tok=K_TOP, shared_expert_intermediate_size=128,
                                          decoder_sparse_step=1, mlp_only_layers=[])
        cls = transformers.Qwen2MoeForCausalLM
    elif family == "deepseek_v3":
        cfg = transformers.DeepseekV3Config(**{**common, "num_key_value_heads": 4}, intermediate_size=128,
                                            moe_intermediate_size=I,
                                            n_routed_experts=E, num_experts_per_tok=K_TOP, n_shared_experts=1,
                                            n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=32,
                                            kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                            v_head_dim=16)
        cls = transformers.DeepseekV3ForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    _spread_(model, seed)
    return model


def _ids(n: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


def _dequantized_float(model_q: torch.nn.Module, model_f: torch.nn.Module) -> torch.nn.Module:
    """model_f with every experts module's weights replaced by the NVFP4 experts' decoded weights (times each
    part's weight_scale_2), everything else as in model_q (quantized dense layers stay as they are)."""
    ref = copy.deepcopy(model_q)
    for name, mod in list(ref.named_modules()):
        if not isinstance(mod, moe.NVFP4Experts):
            continue
        flt = copy.deepcopy(model_f.get_submodule(name))
        e, i, h = mod.num_experts, mod.intermediate_dim, mod.hidden_dim
        with torch.no_grad():
            for x in range(e):
                gu = dequantize(mod.gate_up_proj[x], mod.gate_up_proj_weight_scale[x], h, torch.float32)
                gu[:i] *= mod.gate_up_proj_weight_scale_2[x, 0]
                gu[i:] *= mod.gate_up_proj_weight_scale_2[x, 1]
                flt.gate_up_proj[x].copy_(gu)
                dn = dequantize(mod.down_proj[x], mod.down_proj_weight_scale[x], i, torch.float32)
                flt.down_proj[x].copy_(dn * mod.down_proj_weight_scale_2[x])
        parent, _, attr = name.rpartition(".")
        setattr(ref.get_submodule(parent), attr, flt)
    return ref


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "qwen2_moe", "deepseek_v3"])
def test_weight_only_logits_equal_the_dequantized_float_model(family):
    model_f = tiny(family)
    model_q = copy.deepcopy(model_f)
    names = moe.quantize_experts(model_q, weight_only=True)
    assert len(names) == (1 if family == "deepseek_v3" else 2)
    for n in names:
        assert isinstance(model_q.get_submodule(n), moe.NVFP4Experts)
        assert "gate" in dict(model_q.get_submodule(n.rpartition(".")[0]).named_children())  # router kept float
    ref = _dequantized_float(model_q, model_f)
    ids = _ids()
    with torch.no_grad():
        got = model_q(ids).logits
        want = ref(ids).logits
        orig = model_f(ids).logits
    assert torch.isfinite(got).all()
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 2e-5 * scale, (got - want).abs().max()
    # the quantization itself moves the logits far more than that: the comparison can see a wrong weight
    assert (orig - want).abs().max().item() > 100 * 2e-5 * scale


# -- one experts module against expert-by-expert nvfp4_gemm.linear


def _random_experts(mode: str, own_parts: bool, seed: int = 0) -> tuple[moe.NVFP4Experts, torch.nn.Module]:
    model = tiny("qwen3_moe", seed=seed, layers=1)
    flt = model.model.layers[0].mlp.experts
    stats = None
    if mode == "static" or mode == "static_shared":
        stats = moe.ExpertStats(flt, None)
        g = torch.Generator().manual_seed(seed + 7)
        stats.amax_in = torch.exp2(torch.randint(-1, 3, (E,), generator=g).float()) * (1 + torch.rand(E, generator=g))
        stats.amax_mid = torch.exp2(torch.randint(-8, -4, (E,), generator=g).float()) * (1 + torch.rand(E, generator=g))
        if mode == "static_shared":
            stats.amax_in[:] = stats.amax_in[0]
            stats.amax_mid[:] = stats.amax_mid[0]
    q = moe.NVFP4Experts.from_float(flt, weight_only=(mode == "weight_only"), share_gate_up=not own_parts,
                                    stats=stats)
    return q, flt


def _reference_experts(q: moe.NVFP4Experts, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Expert by expert with nvfp4_gemm.linear (W4A4 dynamic: the amax of the whole GEMM input, so quantize +
    mm with that scale), gate and up as two separate layers with their own scales."""
    t, h = x.shape
    i = q.intermediate_dim
    dyn = not q.weight_only and not q.static_input_scale
    enc_in = nvfp4_gemm.global_encode_scale(x.abs().amax())
    rows_of = {e: (idx == e).nonzero() for e in range(q.num_experts)}  # (token, slot) pairs

    def layer(a, packed, sf_lin, ws2, inp, enc):
        sf = to_blocked(sf_lin)
        if q.weight_only:
            return nvfp4_gemm.linear(a, packed, sf, ws2.reshape(1), weight_only=True)
        if inp is not None:
            return nvfp4_gemm.linear(a, packed, sf, ws2.reshape(1), inp.reshape(1))
        pa, sfa = nvfp4_gemm.quantize(a, enc)
        return nvfp4_gemm.mm(pa, packed, sfa, sf, (1.0 / enc) * ws2.reshape(1), a.dtype)

    mids = {}
    for e, pairs in rows_of.items():
        if len(pairs) == 0:
            continue
        xe = x[pairs[:, 0]]
        sf_gu = from_blocked(q.gate_up_proj_weight_scale[e], 2 * i, h)
        inp = q.gate_up_proj_input_scale
        parts = [layer(xe, q.gate_up_proj[e, p * i:(p + 1) * i], sf_gu[p * i:(p + 1) * i],
                       q.gate_up_proj_weight_scale_2[e, p], None if inp is None else inp[e, p], enc_in)
                 for p in range(2)]
        mids[e] = q.act_fn(parts[0]) * parts[1]
    enc_mid = nvfp4_gemm.global_encode_scale(torch.cat(list(mids.values())).abs().amax()) if dyn else None
    out = torch.zeros(t, idx.shape[1], h, dtype=torch.float32)
    for e, mid in mids.items():
        pairs = rows_of[e]
        sf_dn = from_blocked(q.down_proj_weight_scale[e], h, i)
        inp = q.down_proj_input_scale
        y = layer(mid, q.down_proj[e], sf_dn, q.down_proj_weight_scale_2[e], None if inp is None else inp[e], enc_mid)
        out[pairs[:, 0], pairs[:, 1]] = y.float() * w[pairs[:, 0], pairs[:, 1]].float().unsqueeze(1)
    return out.sum(dim=1).to(x.dtype)


def _routing(t: int, kind: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        idx = torch.stack([torch.randperm(E, generator=g)[:K_TOP] for _ in range(t)])
    elif kind == "one_expert":  # every token on expert 3 (and 5): all others empty
        idx = torch.tensor([[3, 5]] * t)
    elif kind == "skewed":  # experts 0 and 7 never chosen
        idx = torch.stack([torch.randperm(6, generator=g)[:K_TOP] + 1 for _ in range(t)])
    w = torch.softmax(torch.randn(t, K_TOP, generator=g), dim=-1)
    return idx, w


@pytest.mark.parametrize("mode", ["weight_only", "dynamic", "static", "static_shared"])
@pytest.mark.parametrize("own_parts", [False, True], ids=["shared_gate_up", "own_gate_up"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_experts_equal_expert_by_expert_linear(mode, own_parts, dtype):
    q, _ = _random_experts(mode, own_parts)
    ws2 = q.gate_up_proj_weight_scale_2
    assert torch.equal(ws2[:, 0], ws2[:, 1]) != own_parts  # the case really has differing part scales
    assert q.plan()["own_alphas"] == own_parts
    if mode == "static":
        assert not q.plan()["gate_up_uniform"] and not q.plan()["down_uniform"]
    if mode == "static_shared":
        assert q.plan()["gate_up_uniform"] and q.plan()["down_uniform"]
    # 300 tokens: 600 gathered rows, past moe._FUSED_SHARED_ROWS (static_shared's gate_up quantizes the tokens once)
    for t, kind in ((13, "random"), (1, "random"), (9, "one_expert"), (40, "skewed"), (300, "random")):
        g = torch.Generator().manual_seed(t)
        x = (torch.randn(t, H, generator=g) * torch.exp2(torch.randint(-3, 3, (t, 1), generator=g).float())).to(dtype)
        idx, w = _routing(t, kind, seed=t)
        with torch.no_grad():
            got = q(x, idx, w)
            want = _reference_experts(q, x, idx, w)
        assert got.dtype == dtype and got.shape == (t, H)
        assert torch.isfinite(want).all()
        diff = f"{kind} t={t}: max diff {(got.float() - want.float()).abs().max()}"
        if mode == "weight_only":
            # float activations times decoded weights: the fp32 sums depend on the order the backend's GEMM
            # (the CPU's BLAS picks kernels by shape and machine) adds them in; both within a few ulps of the row
            eps = torch.finfo(dtype).eps
            assert ((got.float() - want.float()).abs() <= 4 * eps * want.float().abs().amax(-1, keepdim=True)).all(), diff
        else:  # W4A4: every product and partial sum is exact in fp32, so any order gives the same bits
            assert torch.equal(got, want), diff


def test_static_input_scales_that_differ_between_gate_and_up_run_exactly():
    q, _ = _random_experts("static", own_parts=False)
    with torch.no_grad():
        q.gate_up_proj_input_scale[:, 1] *= 1.75
    q.refresh()
    assert q.plan()["split_inputs"] and q.plan()["own_alphas"]
    x = torch.randn(11, H, generator=torch.Generator().manual_seed(3))
    idx, w = _routing(11, "random", seed=4)
    with torch.no_grad():
        assert torch.equal(q(x, idx, w), _reference_experts(q, x, idx, w))


def test_state_dict_round_trip_and_mode_from_the_state():
    q, _ = _random_experts("static", own_parts=True)
    fresh = moe.NVFP4Experts(E, H, I)  # dynamic: the loaded state makes it static
    fresh.load_state_dict(q.state_dict())
    assert fresh.static_input_scale and fresh.plan() == q.plan()
    x = torch.randn(5, H)
    idx, w = _routing(5, "random", 0)
    with torch.no_grad():
        assert torch.equal(fresh(x, idx, w), q(x, idx, w))
    # the whole module pickles (torch.save) and comes back the same
    import io

    buf = io.BytesIO()
    torch.save(q, buf)
    buf.seek(0)
    with torch.no_grad():
        assert torch.equal(torch.load(buf, weights_only=False)(x, idx, w), q(x, idx, w))
    # casts keep the formats
    h = copy.deepcopy(q).half()
    assert h.gate_up_proj.dtype == torch.uint8 and h.gate_up_proj_weight_scale_2.dtype == torch.float32


def test_unsupported_family_is_refused_with_the_reason():
    model = tiny("qwen3_moe", layers=2)
    experts = model.model.layers[0].mlp.experts

    class OtherExperts(torch.nn.Module):  # a 3-D experts module of a family nobody checked
        def __init__(self):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.detach().clone())
            self.down_proj = torch.nn.Parameter(experts.down_proj.detach().clone())

    model.model.layers[0].mlp.experts = OtherExperts()
    with pytest.raises(NotImplementedError, match="not of a supported MoE family.*Qwen3-MoE, Qwen2-MoE, Mixtral"):
        moe.quantize_experts(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(NotImplementedError, match="leave it out with filter="):
        nvfp4_gemm.quantize_model(model, progress=False)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # refused before any change
    nvfp4_gemm.quantize_model(model, filter=lambda n, m: "layers.0.mlp.experts" not in n, progress=False)
    assert isinstance(model.model.layers[0].mlp.experts, OtherExperts)
    assert isinstance(model.model.layers[1].mlp.experts, moe.NVFP4Experts)


def test_calibrated_static_and_gptq_experts():
    model_f = tiny("qwen3_moe", layers=1)
    ids = _ids(16, seed=5)

    def calibrate(m):
        m(ids)

    for method in ("rtn", "mse", "gptq"):
        model_q = copy.deepcopy(model_f)
        moe.quantize_experts(model_q, calibrate=calibrate, method=method)
        q = model_q.model.layers[0].mlp.experts
        assert q.static_input_scale
        # each expert its own input scale: the largest |input| it saw / 2688
        assert len(set(q.gate_up_proj_input_scale[:, 0].tolist())) > 1
        with torch.no_grad():
            got, want = model_q(ids).logits, model_f(ids).logits
        rel = ((got - want).norm() / want.norm()).item()
        assert rel < 0.25, (method, rel)


def test_generate_and_compile():
    model = tiny("qwen3_moe")
    moe.quantize_experts(model)  # dynamic W4A4
    ids = _ids(6)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                             pad_token_id=0)
        assert out.shape == (2, 10)
        eager = model(ids).logits
        experts = model.model.layers[1].mlp.experts
        x = torch.randn(7, H)
        idx, w = _routing(7, "random", 2)
        compiled = torch.compile(experts, backend="eager", fullgraph=True)
        assert torch.equal(compiled(x, idx, w), experts(x, idx, w))
        assert torch.isfinite(eager).all()


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_families_save_and_reload_under_their_checkpoint_names(tmp_path, family):
    from safetensors import safe_open

    from nvfp4_gemm.checkpoint import from_pretrained, save_pretrained

    model = tiny(family)
    nvfp4_gemm.quantize_model(model, filter=lambda n, m: n != "lm_head", weight_only=True, progress=False)
    assert sum(isinstance(m, moe.NVFP4Experts) for m in model.modules()) == (1 if family == "deepseek_v3" else 2)
    save_pretrained(model, tmp_path / "ckpt", format="modelopt", progress=False)
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    last = model.config.num_hidden_layers - 1
    block, gate = ("block_sparse_moe", "w1") if family == "mixtral" else ("mlp", "gate_proj")
    assert f"model.layers.{last}.{block}.experts.{E - 1}.{gate}.weight_scale_2" in keys
    assert not any(k.endswith(("gate_up_proj", "experts.down_proj")) for k in keys)
    back = from_pretrained(str(tmp_path / "ckpt"), progress=False)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
    for k, v in model.state_dict().items():
        w = back.state_dict()[k]
        assert torch.equal(v.view(torch.uint8), w.view(torch.uint8)) if v.dtype == torch.float8_e4m3fn else \
            torch.equal(v, w), k


def test_float_checkpoint_quantized_while_loading(tmp_path):
    from nvfp4_gemm.checkpoint import from_pretrained

    model = tiny("qwen3_moe")
    model.save_pretrained(tmp_path / "float")  # transformers writes the experts per expert
    got = from_pretrained(str(tmp_path / "float"), quantize=True, weight_only=True, progress=False, fuse=False)
    want = copy.deepcopy(model)
    moe.quantize_experts(want, weight_only=True)
    for layer in range(2):
        a, b = got.model.layers[layer].mlp.experts, want.model.layers[layer].mlp.experts
        assert isinstance(a, moe.NVFP4Experts) and a.weight_only
        for k, v in b.state_dict().items():  # the same recipe: gate and up share the scale of their largest |w|
            w = a.state_dict()[k]
            assert torch.equal(v.view(torch.uint8), w.view(torch.uint8)), k


def test_from_pretrained_calibrates_each_expert(tmp_path):
    from nvfp4_gemm.checkpoint import from_pretrained

    model = tiny("qwen3_moe", layers=1)
    model.save_pretrained(tmp_path / "float")
    ids = _ids(16, seed=9)
    seen = {}

    def calibrate(m):
        ex = m.model.layers[0].mlp.experts
        h = ex.register_forward_pre_hook(lambda _m, a: seen.update(x=a[0].clone(), idx=a[1].clone()))
        try:
            m(ids)
        finally:
            h.remove()

    got = from_pretrained(str(tmp_path / "float"), quantize=True, calibrate=calibrate, progress=False)
    ex = got.model.layers[0].mlp.experts
    assert isinstance(ex, moe.NVFP4Experts) and ex.static_input_scale
    x, idx = seen["x"], seen["idx"]
    for e in range(E):
        rows = x[(idx == e).any(dim=1)]
        amax = rows.abs().amax() if rows.numel() else torch.zeros(())
        want = 1.0 / nvfp4_gemm.global_encode_scale(amax)
        assert torch.equal(ex.gate_up_proj_input_scale[e], want.expand(2)), e
        assert (ex.down_proj_input_scale[e] > 0) and ((ex.down_proj_input_scale[e] == 1) == (rows.numel() == 0))


CUDA = torch.cuda.is_available()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (the grouped GEMM's GPU backends)")
@pytest.mark.parametrize("mode", ["weight_only", "dynamic", "static"])
def test_cuda_experts_match_the_cpu_and_replay_in_a_graph_with_new_routing(mode):
    q, _ = _random_experts(mode, own_parts=False)
    gq = copy.deepcopy(q).cuda()
    t = 24
    g = torch.Generator().manual_seed(5)
    x = torch.randn(t, H, generator=g).to(torch.bfloat16)
    idx, w = _routing(t, "random", seed=6)
    with torch.no_grad():
        want = q(x, idx, w).float()
        xs, idxs, ws = x.cuda(), idx.cuda(), w.cuda()
        got = gq(xs, idxs, ws).float().cpu()
        # the GPU's fp32 accumulation order differs from the CPU's: bf16 rounding of the same values
        assert (got - want).abs().max() <= 2.0**-6 * want.abs().max(), (got - want).abs().max()
        # one CUDA graph, captured on one routing, replayed on others (routing is read on the device only)
        graph, out = capture_graph(lambda: gq(xs, idxs, ws))
        for seed, kind in ((7, "random"), (8, "one_expert"), (9, "skewed")):
            idx2, w2 = _routing(t, kind, seed=seed)
            x2 = torch.randn(t, H, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
            xs.copy_(x2)
            idxs.copy_(idx2)
            ws.copy_(w2)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            eager = gq(x2.cuda(), idx2.cuda(), w2.cuda())
            assert torch.equal(out, eager), kind


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_float_experts_are_saved_per_expert_and_load_back(tmp_path, fmt):
    from safetensors import safe_open

    from nvfp4_gemm.checkpoint import from_pretrained, save_pretrained

    model = tiny("qwen3_moe")
    nvfp4_gemm.quantize_model(model, filter=lambda n, m: n != "lm_head" and not n.endswith(".experts"),
                              weight_only=True, progress=False)
    assert not any(isinstance(m, moe.NVFP4Experts) for m in model.modules())
    save_pretrained(model, tmp_path / "ckpt", format=fmt, progress=False)
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        w = f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight")
    assert torch.equal(w, model.model.layers[1].mlp.experts.gate_up_proj[3, I:])  # per expert, as transformers saves
    assert "model.layers.1.mlp.experts.gate_up_proj" not in keys
    back = from_pretrained(str(tmp_path / "ckpt"), progress=False)
    assert type(back.model.layers[1].mlp.experts) is type(model.model.layers[1].mlp.experts)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
