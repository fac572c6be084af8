"""torch.ops.nvfp4_gemm._moe_topk (nvfp4_gemm.moe.moe_topk) and the fused routers (nvfp4_gemm.moe.fuse_routers).

  * the CPU op against transformers' router formula (softmax in float32, torch.topk, renormalization, cast) on
    tie-free logits of every dtype, E from 1 to 512, k up to 32, T = 0: ids equal, weights within one ulp of
    float16 / bfloat16, within 8 float32 ulps (torch's CPU softmax is itself up to ~4 ulps off: its vectorized
    exp), and within 6 ulps of the exact softmax of the same float32 differences; k = 1 renormalized is exactly 1;
  * equal probabilities by the lower expert id (torch.sort(stable) order; torch.topk leaves ties in any order);
    NaN / inf rows NaN as torch's softmax; non-contiguous logits; the backward is the formula's;
  * argument errors name the argument; opcheck; torch.compile traces it (fullgraph);
  * the fused routers of tiny Qwen3-MoE / Qwen2-MoE / Mixtral models after quantize_experts: the same outputs as
    transformers' routers, isinstance kept (router_logits recording), the same Parameter, state_dict keys and
    hooks, torch.save / torch.compile / from_pretrained, unknown and changed routers left alone;
  * CUDA (skipped without a device): the CUDA op equals the CPU op (ids, weights to the expf difference),
    torch's CUDA formula, one kernel, no host sync, CUDA graph replay with new logits, the fused router on CUDA.
"""
from __future__ import annotations

import copy
import io
import itertools

import pytest
import torch

import nvfp4_gemm  # noqa: F401  (loads the op)
from nvfp4_gemm import moe
from conftest import capture_graph, cuda_kernels, requires_cuda, run_without_host_sync

OP = torch.ops.nvfp4_gemm._moe_topk.default
MAX_EXPERTS, MAX_K = 512, 32
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# float32 weights against torch's CPU formula: its softmax's vectorized exp is a few ulps off (measured: up to 4
# ulps from the exact softmax of the same differences, ours up to 4; the two up to 6 apart). CUDA against CPU: the
# two expf differ by a few ulps. CUDA against torch's CUDA formula: the p are the same (the same expf and sums),
# the renormalizing sums of the k weights may add in another order.
F32_ULPS_TORCH, F32_ULPS_EXACT, F32_ULPS_CUDA = 8, 6, 4
SHAPES = [(e, k) for e in (1, 2, 8, 31, 60, 128, 200, 256, 512) for k in (1, 2, 4, 8, 32) if k <= e]


def make_logits(t: int, e: int, dtype: torch.dtype, seed: int, scale: float = 1.0, ties: bool = False):
    """Logits without ties: distinct multiples of scale / 8 in [-32, 32) scale (exact in every dtype), float32 with
    a jitter below scale / 16; probabilities 1/8 apart in log at least, none underflowing. ties: from 12 values."""
    g = torch.Generator().manual_seed(seed)
    if ties:
        i = torch.randint(-6, 6, (t, e), generator=g)
    else:
        i = torch.stack([torch.randperm(512, generator=g)[:e] for _ in range(t)]) - 256 if t else torch.zeros(0, e)
    x = i.float() * (scale / 8)
    if dtype == torch.float32 and not ties:
        x = x + torch.rand(x.shape, generator=g) * (scale / 16)
    return x.to(dtype)


def transformers_router(logits: torch.Tensor, k: int, normalize: bool):
    """Qwen3MoeTopKRouter.forward after its F.linear (Mixtral's, with normalize, on float32 logits)."""
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    value, index = torch.topk(probs, k, dim=-1)
    if normalize:
        value /= value.sum(dim=-1, keepdim=True)
    return value.to(logits.dtype), index


def exact_router(logits: torch.Tensor, k: int, normalize: bool, ids: torch.Tensor) -> torch.Tensor:
    """The weights of `ids` in float64 from the float32 differences logits - max (their rounding is the input's
    conditioning, not the op's error), rounded once to float32."""
    x = logits.float()
    p = torch.exp((x - x.amax(-1, keepdim=True)).double())
    v = (p / p.sum(-1, keepdim=True)).gather(-1, ids)
    if normalize:
        v = v / v.sum(-1, keepdim=True)
    return v.float()


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in units in the last place between same-signed finite a and b."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.numel() == 0:
        return 0
    as_int = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    return int((a.view(as_int).long() - b.view(as_int).long()).abs().max())


def check_weights(got: torch.Tensor, want: torch.Tensor, f32_ulps: int, what) -> None:
    assert got.dtype == want.dtype, what
    assert ulps(got, want) <= (f32_ulps if got.dtype == torch.float32 else 1), (what, ulps(got, want))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
def test_cpu_equals_the_transformers_formula(dtype, normalize):
    for n, ((e, k), t, scale) in enumerate(itertools.product(SHAPES, (0, 1, 3, 64), (1 / 16, 1 / 2, 1))):
        x = make_logits(t, e, dtype, seed=n, scale=scale)
        w, ids = OP(x, k, normalize)
        assert w.shape == ids.shape == (t, k) and ids.dtype == torch.int64
        want_w, want_ids = transformers_router(x, k, normalize)
        assert torch.equal(ids, want_ids), (e, k, t, scale)
        check_weights(w, want_w, F32_ULPS_TORCH, (e, k, t, scale))
        if dtype == torch.float32:
            assert ulps(w, exact_router(x, k, normalize, ids)) <= F32_ULPS_EXACT, (e, k, t, scale)
        if normalize and k == 1:  # p / p
            assert torch.equal(w, torch.ones_like(w))


def test_equal_probabilities_take_the_lower_id_first():
    for n, (e, k) in enumerate(SHAPES):
        for dtype in DTYPES:
            x = make_logits(40, e, dtype, seed=n, ties=True)
            w, ids = OP(x, k, False)
            p = torch.softmax(x, dim=-1, dtype=torch.float)
            order = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
            assert torch.equal(ids, order), (e, k, dtype)
            check_weights(w, p.gather(-1, order).to(dtype), F32_ULPS_TORCH, (e, k, dtype))
            # the values of torch.topk's, which orders ties as it likes
            check_weights(w.sort(-1).values, transformers_router(x, k, False)[0].sort(-1).values, F32_ULPS_TORCH,
                          (e, k, dtype))
    # underflowed probabilities are ties at 0 too: after every nonzero one, by id
    x = torch.tensor([[0.0, -200.0, 5.0, -300.0, -150.0, 1.0]])
    w, ids = OP(x, 6, False)
    assert ids.tolist() == [[2, 5, 0, 1, 3, 4]] and (w[0, 3:] == 0).all()


def test_nan_and_inf_rows_are_nan_as_the_softmax():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[0.0, 1.0, nan, 2.0], [0.0, inf, 1.0, 2.0], [-inf, -inf, -inf, -inf], [-inf, 1.0, -inf, 0.5]])
    for normalize in (False, True):
        w, ids = OP(x, 3, normalize)
        assert torch.isnan(w[:3]).all() and ids[:3].tolist() == [[0, 1, 2]] * 3
        assert ids[3].tolist() == [1, 3, 0] and w[3, 2] == 0 and torch.isfinite(w[3]).all()
        assert torch.isnan(transformers_router(x, 3, normalize)[0][:3]).all()


def test_non_contiguous_logits_and_empty():
    x = make_logits(30, 64, torch.bfloat16, seed=2)
    view = x.t().contiguous().t()
    assert not view.is_contiguous()
    for got, want in zip(OP(view, 8, True), OP(x, 8, True)):
        assert torch.equal(got, want)
    w, ids = OP(torch.zeros(0, 128, dtype=torch.bfloat16), 8, True)
    assert w.shape == ids.shape == (0, 8) and w.dtype == torch.bfloat16 and ids.dtype == torch.int64


def test_argument_errors_name_the_argument():
    x = torch.zeros(4, 16)
    with pytest.raises(RuntimeError, match=r"logits must be 2-D \[T, E\]"):
        OP(x.reshape(-1), 2, True)
    with pytest.raises(RuntimeError, match=r"logits must be 2-D \[T, E\]"):
        OP(x.reshape(2, 2, 16), 2, True)
    for bad in (torch.float64, torch.int32, torch.float8_e4m3fn):
        with pytest.raises(RuntimeError, match="logits must be float32, float16 or bfloat16"):
            OP(x.to(bad), 2, True)
    for e in (0, MAX_EXPERTS + 1):
        with pytest.raises(RuntimeError, match=rf"logits must have 1 to 512 experts .*got {e}"):
            OP(torch.zeros(4, e), 1, True)
    for e, k in ((16, 0), (16, -1), (16, 17), (64, MAX_K + 1)):
        with pytest.raises(RuntimeError, match=rf"k must be in \[1, min\(E, 32\) = {min(e, MAX_K)}\], got {k}"):
            OP(torch.zeros(4, e), k, True)
    OP(torch.zeros(2, MAX_EXPERTS), MAX_K, True)  # the largest E and k are taken


@pytest.mark.parametrize("case", ["float32", "bfloat16", "float16_raw", "empty", "one_expert"])
def test_opcheck(case):
    x, k, normalize = {"float32": (make_logits(9, 64, torch.float32, 1), 8, True),
                       "bfloat16": (make_logits(9, 128, torch.bfloat16, 2), 8, True),
                       "float16_raw": (make_logits(5, 60, torch.float16, 3), 4, False),
                       "empty": (torch.zeros(0, 8), 2, True),
                       "one_expert": (make_logits(3, 1, torch.float32, 4), 1, False)}[case]
    torch.library.opcheck(OP, (x, k, normalize))
    torch.library.opcheck(OP, (x.clone().requires_grad_(), k, normalize))


def test_traced_by_torch_compile():
    def route(x):
        w, ids = moe.moe_topk(x, 4, True)
        return w.float().sum(-1) + ids.sum(-1)

    x = make_logits(7, 64, torch.bfloat16, seed=4)
    compiled = torch.compile(route, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), route(x))


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_is_the_formulas(normalize, dtype):
    x = make_logits(16, 60, dtype, seed=5, scale=1 / 4)
    gw = torch.randn(16, 6, generator=torch.Generator().manual_seed(6)).to(dtype)
    grads = []
    for fn in (lambda z: OP(z, 6, normalize)[0], lambda z: transformers_router(z, 6, normalize)[0]):
        z = x.clone().requires_grad_()
        (fn(z) * gw).sum().backward()
        grads.append(z.grad.float())
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(grads[0], grads[1], rtol=tol, atol=tol * grads[1].abs().max().item())


# ---------------------------------------------------------------------------------------------------------
# The fused routers


@pytest.fixture(scope="module")
def moe_tests():
    pytest.importorskip("transformers")
    import test_moe

    return test_moe


FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")


def _quantized(moe_tests, family: str, **kw):
    model_f = moe_tests.tiny(family, **kw)
    model_q = copy.deepcopy(model_f)
    names = moe.quantize_experts(model_q, weight_only=True)
    gates = [n.rpartition(".")[0] + ".gate" for n in names]
    return model_f, model_q, gates


def _check_router(fused, original, x: torch.Tensor) -> None:
    with torch.no_grad():
        got, want = fused(x), original(x)
    assert torch.equal(got[0], want[0])  # the logits: the same F.linear
    assert torch.equal(got[2], want[2])
    check_weights(got[1], want[1], F32_ULPS_TORCH, type(original).__name__)


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_routers_give_transformers_outputs(moe_tests, family):
    model_f, model_q, gates = _quantized(moe_tests, family)
    assert len(gates) == 2
    for gate in gates:
        fused, original = model_q.get_submodule(gate), model_f.get_submodule(gate)
        assert isinstance(fused, moe._FusedTopKForward) and isinstance(fused, type(original))
        assert type(fused).__name__ == "FusedTopK" + type(original).__name__
        x = torch.randn(33, moe_tests.H, generator=torch.Generator().manual_seed(1))
        flags = (False, True) if hasattr(original, "norm_topk_prob") else (None,)
        for flag in flags:
            if flag is not None:
                fused.norm_topk_prob = original.norm_topk_prob = flag
            _check_router(fused, original, x)
            # in bfloat16 (Mixtral's weights stay float32, as its router returns them)
            fb, ob = copy.deepcopy(fused).bfloat16(), copy.deepcopy(original).bfloat16()
            _check_router(fb, ob, x.bfloat16())
            assert fb(x.bfloat16())[1].dtype == (torch.float32 if family == "mixtral" else torch.bfloat16)
        with torch.no_grad():  # a dtype the op does not take: transformers' own forward
            for g, w in zip(copy.deepcopy(fused).double()(x.double()), copy.deepcopy(original).double()(x.double())):
                assert torch.equal(g, w)
    ids = moe_tests._ids()
    with torch.no_grad():
        assert torch.isfinite(model_q(ids).logits).all()


def test_fused_router_keeps_parameter_keys_hooks_and_recording(moe_tests):
    model = moe_tests.tiny("qwen3_moe")
    gate = model.model.layers[0].mlp.gate
    weight, keys = gate.weight, list(model.state_dict())
    seen = []
    gate.register_forward_hook(lambda m, a, out: seen.append(out[2].clone()))
    model_f = copy.deepcopy(model)
    moe.quantize_experts(model, weight_only=True)
    assert model.model.layers[0].mlp.gate is gate and gate.weight is weight
    assert isinstance(gate, moe._FusedTopKForward)
    experts = ("gate_up_proj", "down_proj")  # the experts' keys are NVFP4Experts', the rest as before
    assert [k for k in model.state_dict() if not k.rpartition(".")[0].endswith(".experts")] == \
        [k for k in keys if not k.endswith(experts)]
    assert list(gate.state_dict()) == ["weight"]
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        fresh.model.layers[0].mlp.gate.weight.zero_()
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh.model.layers[0].mlp.gate.weight, weight)
    ids = moe_tests._ids()
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
        out_f = model_f(ids, output_router_logits=True)
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the hook ran in both models
    # transformers records router_logits by isinstance of its router class: still every layer's
    assert len(out.router_logits) == len(out_f.router_logits) == 2
    assert torch.equal(out.router_logits[0], out_f.router_logits[0]) and out.aux_loss is not None


def test_fused_router_pickles_compiles_and_trains(moe_tests):
    _, model, gates = _quantized(moe_tests, "qwen3_moe")
    gate = model.get_submodule(gates[0])
    x = torch.randn(9, moe_tests.H, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = gate(x)
        compiled = torch.compile(copy.deepcopy(gate), backend="aot_eager", fullgraph=True)
        for g, w in zip(compiled(x), want):
            assert torch.equal(g, w)
    buf = io.BytesIO()
    torch.save(model, buf)  # the fused class is found by its name in nvfp4_gemm.moe
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert type(back.get_submodule(gates[0])) is type(gate)
    ids = moe_tests._ids()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)
    # the router's weight gets the gradient through the top-k weights as transformers' router gives it
    original = moe_tests.tiny("qwen3_moe").get_submodule(gates[0])
    with torch.no_grad():
        original.weight.copy_(gate.weight)
    grads = []
    for r in (gate, original):
        r.weight.grad = None
        r(x)[1].square().sum().backward()
        grads.append(r.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6 * grads[1].abs().max().item())


def test_unknown_and_changed_routers_are_left_alone(moe_tests, monkeypatch):
    model = moe_tests.tiny("deepseek_v3")  # a sigmoid, grouped router: not a softmax top-k one
    gate_type = type(model.model.layers[1].mlp.gate)
    assert moe.quantize_experts(model, weight_only=True) == ["model.layers.1.mlp.experts"]
    assert type(model.model.layers[1].mlp.gate) is gate_type
    assert "not one of the softmax top-k routers" in moe.router_problem(model.model.layers[1].mlp.gate)

    # a transformers release whose router computes something else: the probe sees it
    import transformers.models.qwen3_moe.modeling_qwen3_moe as qwen3

    def sigmoid_router(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(hidden_states, self.weight)
        value, index = torch.topk(torch.sigmoid(logits.float()), self.top_k, dim=-1)
        return logits, value.to(logits.dtype), index

    monkeypatch.setattr(moe, "_ROUTER_PROBES", {})
    monkeypatch.setattr(qwen3.Qwen3MoeTopKRouter, "forward", sigmoid_router)
    _, model, gates = _quantized(moe_tests, "qwen3_moe")
    assert all(type(model.get_submodule(g)) is qwen3.Qwen3MoeTopKRouter for g in gates)
    assert "weighs the experts otherwise" in moe.router_problem(model.get_submodule(gates[0]))
    monkeypatch.undo()

    # limits of the op, and a forward replaced on the instance
    _, model, gates = _quantized(moe_tests, "qwen3_moe")
    router = moe_tests.tiny("qwen3_moe").get_submodule(gates[0])
    assert moe.router_problem(router) is None
    router.top_k = 40
    assert "top_k 40" in moe.router_problem(router)
    router.top_k = 2
    router.forward = lambda h: None
    assert "replaced on the instance" in moe.router_problem(router)


def test_from_pretrained_fuses_the_routers_too(moe_tests, tmp_path):
    from nvfp4_gemm.checkpoint import from_pretrained, save_pretrained

    _, model, gates = _quantized(moe_tests, "mixtral")
    save_pretrained(model, tmp_path / "ckpt", format="modelopt", progress=False)
    back = from_pretrained(str(tmp_path / "ckpt"), progress=False)
    assert all(type(back.get_submodule(g)) is type(model.get_submodule(g)) for g in gates)
    ids = moe_tests._ids()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)


# ---------------------------------------------------------------------------------------------------------
# CUDA


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_equals_cpu_and_the_torch_formula(dtype):
    for n, ((e, k), t) in enumerate(itertools.product(SHAPES, (1, 5, 16, 1000))):
        for normalize in (False, True):
            x = make_logits(t, e, dtype, seed=n, scale=(1 / 16, 1 / 2, 1)[n % 3])
            xc = x.cuda()
            w, ids = OP(xc, k, normalize)
            assert w.device.type == ids.device.type == "cuda"
            want_w, want_ids = OP(x, k, normalize)
            assert torch.equal(ids.cpu(), want_ids), (e, k, t, normalize)
            check_weights(w.cpu(), want_w, F32_ULPS_TORCH, (e, k, t, normalize))
            tw, tids = transformers_router(xc, k, normalize)
            assert torch.equal(ids, tids), (e, k, t, normalize)
            check_weights(w, tw, F32_ULPS_CUDA, (e, k, t, normalize))
    x = make_logits(64, 128, dtype, seed=7, ties=True)
    w, ids = OP(x.cuda(), 8, True)
    want_w, want_ids = OP(x, 8, True)
    assert torch.equal(ids.cpu(), want_ids)  # ties by the lower id on both
    check_weights(w.cpu(), want_w, F32_ULPS_TORCH, "ties")
    for t in (0, 3):
        w, ids = OP(torch.zeros(t, 60, dtype=dtype, device="cuda"), 4, True)
        assert w.shape == ids.shape == (t, 4)


@requires_cuda
def test_cuda_raw_probabilities_are_torchs_bit_for_bit():
    """Without renormalization the weights are torch's CUDA softmax's values: the same expf, max, lane order and
    butterfly as its warp softmax (E <= 1024)."""
    for n, (e, k) in enumerate(SHAPES):
        x = make_logits(300, e, torch.float32, seed=n).cuda()
        w, ids = OP(x, k, False)
        assert torch.equal(w, torch.softmax(x, dim=-1).gather(-1, ids)), (e, k)


@requires_cuda
def test_cuda_one_kernel_no_host_sync():
    for t in (1, 16, 2000):
        x = make_logits(t, 128, torch.bfloat16, seed=t).cuda()
        got = cuda_kernels(lambda: OP(x, 8, True))
        assert len(got) == 1 and "topk_rows" in got[0], got
        run_without_host_sync(lambda: OP(x, 8, True))


@requires_cuda
@pytest.mark.parametrize("t", [1, 16, 300])
def test_cuda_graph_replays_new_logits(t):
    e, k = 128, 8
    x = make_logits(t, e, torch.bfloat16, seed=1).cuda()
    graph, (w, ids) = capture_graph(lambda: OP(x, k, True))
    for seed in (2, 3, 4):
        new = make_logits(t, e, torch.bfloat16, seed=seed, ties=seed == 4)
        x.copy_(new)
        w.fill_(float("nan"))
        ids.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        want_w, want_ids = OP(new.cuda(), k, True)
        assert torch.equal(w, want_w) and torch.equal(ids, want_ids), seed


@requires_cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_fused_router(moe_tests, family):
    model_f, model_q, gates = _quantized(moe_tests, family)
    fused = copy.deepcopy(model_q.get_submodule(gates[0])).cuda().bfloat16()
    original = copy.deepcopy(model_f.get_submodule(gates[0])).cuda().bfloat16()
    x = torch.randn(16, moe_tests.H, generator=torch.Generator().manual_seed(3)).bfloat16().cuda()
    _check_router(fused, original, x)
