"""torch.ops.nvfp4_gemm._moe_route (nvfp4_gemm.moe.moe_route): the routing of the MoE forward in one op.

  * the CPU op equals the torch reference (torch.sort(stable) of the ids, perm // k, bincount + cumsum, the
    inverse by scatter) over random / skewed / one-expert / sentinel routings, int64 and int32 ids;
  * ids outside [0, E): after every expert's rows, in pair order (torch.sort's order for the sentinel E), inside
    the last expert's group (offs[E-1] = S: every row in a group); the MoE forward drops their results;
  * argument errors name the argument; opcheck; torch.compile traces it (fake kernel);
  * the MoE forward and the calibration observer give the same bits as the torch routing they replace;
  * CUDA (skipped without a device): the CUDA op equals the CPU op, in both of its forms (one launch, three
    launches), with one kernel at decode sizes, no host sync, and under CUDA graph replay with new routing.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import nvfp4_gemm  # noqa: F401  (loads the op)
from nvfp4_gemm import moe
from conftest import capture_graph, cuda_kernels, requires_cuda, run_without_host_sync

OP = torch.ops.nvfp4_gemm._moe_route.default
MAX_EXPERTS = 4096
KINDS = ("random", "skewed", "one_expert", "sentinel", "out_of_range")


def reference_route(idx: torch.Tensor, e: int):
    """The routing moe._Routing built with torch ops before the op, ids outside [0, E) read as E, their rows
    counted into the last expert's group."""
    k = idx.shape[1]
    ids = idx.reshape(-1).to(torch.int64)
    key = torch.where((ids >= 0) & (ids < e), ids, torch.full_like(ids, e))
    _, perm = torch.sort(key, stable=True)
    offs = torch.cumsum(torch.bincount(key, minlength=e + 1)[:e], 0).to(torch.int32)
    offs[-1] = ids.numel()
    row_token = perm // k if k else perm
    inverse = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel()))
    return offs, row_token, inverse


def make_ids(t: int, k: int, e: int, kind: str, seed: int, dtype=torch.int64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":  # distinct experts per token where k <= E (a router's top-k), else any
        if k <= e:
            idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if t else torch.zeros(0, k)
        else:
            idx = torch.randint(0, e, (t, k), generator=g)
    elif kind == "skewed":  # most pairs on a few low experts, many experts empty
        w = 1.0 / (torch.arange(e, dtype=torch.float64) + 1) ** 3
        idx = torch.multinomial(w, t * k, replacement=True, generator=g).reshape(t, k) if t * k else torch.zeros(t, k)
    elif kind == "one_expert":
        idx = torch.full((t, k), e // 2)
    elif kind == "sentinel":  # transformers' expert-parallel sentinel id E on about a quarter of the pairs
        idx = torch.randint(0, e, (t, k), generator=g)
        idx = torch.where(torch.rand(t, k, generator=g) < 0.25, torch.full_like(idx, e), idx)
    elif kind == "out_of_range":  # any id outside [0, E): all one key after the experts
        idx = torch.randint(-3, e + 4, (t, k), generator=g)
    else:
        raise ValueError(kind)
    return idx.to(dtype)


def check_route(idx: torch.Tensor, e: int, got) -> None:
    offs, row_token, inverse = got
    want = reference_route(idx.cpu(), e)
    s = idx.numel()
    assert offs.dtype == torch.int32 and offs.shape == (e,)
    assert row_token.dtype == torch.int64 and row_token.shape == (s,)
    assert inverse.dtype == torch.int64 and inverse.shape == (s,)
    for name, a, b in zip(("offs", "row_token", "inverse"), (offs, row_token, inverse), want):
        assert torch.equal(a.cpu(), b), name


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("kind", KINDS)
def test_cpu_equals_the_torch_reference(kind, dtype):
    for n, (t, k, e) in enumerate(itertools.product((0, 1, 3, 37, 1000), (1, 2, 8), (1, 8, 128, 256))):
        idx = make_ids(t, k, e, kind, seed=n, dtype=dtype)
        check_route(idx, e, OP(idx, e))


def test_the_order_is_torch_sort_stable_with_the_sentinel_last():
    e, k = 8, 4
    idx = make_ids(300, k, e, "sentinel", seed=1)
    ids = idx.reshape(-1)
    expert, perm = torch.sort(ids, stable=True)  # what moe._Routing ran before the op
    offs, row_token, inverse = OP(idx, e)
    assert torch.equal(row_token, perm // k)
    assert torch.equal(inverse[perm], torch.arange(ids.numel()))
    assert torch.equal(torch.empty_like(ids).scatter_(0, inverse, ids), expert)
    assert offs[-2] <= int((ids < e - 1).sum()) and offs[-1] == ids.numel()  # the sentinel pairs close the last group
    # within an expert, ascending pair index
    for x in range(e + 1):
        rows = inverse[ids == x]
        assert torch.equal(rows, torch.sort(rows).values)


def test_non_contiguous_ids_and_k_zero():
    e = 16
    idx = make_ids(40, 6, e, "random", seed=3)
    view = idx.t().contiguous().t()  # the same values, column-major
    assert not view.is_contiguous()
    check_route(view, e, OP(view, e))
    for t, k in ((5, 0), (0, 0), (0, 3)):
        offs, row_token, inverse = OP(torch.zeros(t, k, dtype=torch.int64), e)
        assert torch.equal(offs, torch.zeros(e, dtype=torch.int32)) and row_token.numel() == inverse.numel() == 0


def test_argument_errors_name_the_argument():
    idx = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="top_k_index must be 2-D"):
        OP(idx.reshape(-1), 8)
    with pytest.raises(RuntimeError, match="top_k_index must be 2-D"):
        OP(idx.reshape(2, 2, 2), 8)
    for bad in (torch.float32, torch.int16, torch.uint8):
        with pytest.raises(RuntimeError, match="top_k_index must be int64 or int32"):
            OP(idx.to(bad), 8)
    for bad_e in (0, -1, MAX_EXPERTS + 1):
        with pytest.raises(RuntimeError, match="num_experts must be in"):
            OP(idx, bad_e)
    huge = torch.zeros(1, 1, dtype=torch.int32).expand(2**16, 2**15)  # 2^31 pairs, no memory
    with pytest.raises(RuntimeError, match=r"pairs must be at most 2\^31 - 1"):
        OP(huge, 8)
    OP(idx, MAX_EXPERTS)  # the largest E is taken


@pytest.mark.parametrize("case", ["int64", "int32", "sentinel", "empty"])
def test_opcheck(case):
    idx = {"int64": make_ids(9, 2, 8, "random", 1), "int32": make_ids(9, 8, 8, "random", 2, torch.int32),
           "sentinel": make_ids(9, 4, 8, "sentinel", 3), "empty": torch.zeros(0, 2, dtype=torch.int64)}[case]
    torch.library.opcheck(OP, (idx, 8))


def test_traced_by_torch_compile():
    def route(idx):
        offs, row_token, inverse = moe.moe_route(idx, 8)
        return offs.sum() + row_token.sum() + inverse[:3].sum()

    idx = make_ids(7, 2, 8, "random", seed=4)
    compiled = torch.compile(route, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(idx), route(idx))


# ---------------------------------------------------------------------------------------------------------
# The MoE forward on the op gives the bits of the torch routing it replaces


class _TorchRouting:
    """moe._Routing as it was before the op: torch.sort (stable), zeros + scatter_add_ + cumsum, and the inverse
    permutation by empty + scatter_ + arange."""

    def __init__(self, top_k_index: torch.Tensor, num_experts: int) -> None:
        ids = top_k_index.reshape(-1)
        self.k = top_k_index.shape[-1]
        self.s = ids.numel()
        self.expert, perm = torch.sort(ids, stable=True)
        self.token = perm // self.k
        counts = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
        # (scatter_add_ takes an int64 index only: the torch routing ran on int64 ids alone)
        counts.scatter_add_(0, self.expert.long(), torch.ones_like(self.expert, dtype=torch.int32))
        self.offs = torch.cumsum(counts, 0, dtype=torch.int32)
        self.inverse = torch.empty_like(perm).scatter_(0, perm, torch.arange(self.s, device=ids.device))
        self.num_experts = num_experts


@pytest.fixture(scope="module")
def moe_tests():
    pytest.importorskip("transformers")
    import test_moe

    return test_moe


@pytest.mark.parametrize("mode", ["weight_only", "dynamic", "static", "static_shared"])
@pytest.mark.parametrize("own_parts", [False, True], ids=["shared_gate_up", "own_gate_up"])
def test_forward_bits_unchanged(moe_tests, monkeypatch, mode, own_parts):
    q, _ = moe_tests._random_experts(mode, own_parts)
    for t, kind in ((13, "random"), (1, "random"), (9, "one_expert"), (40, "skewed")):
        x = torch.randn(t, moe_tests.H, generator=torch.Generator().manual_seed(t)).to(torch.bfloat16)
        idx, w = moe_tests._routing(t, kind, seed=t)
        for ids in (idx, idx.to(torch.int32)):
            with torch.no_grad():
                got = q(x, ids, w)
                with monkeypatch.context() as m:
                    m.setattr(moe, "_Routing", _TorchRouting)
                    want = q(x, ids, w)
            assert torch.equal(got, want), (kind, t, ids.dtype)


def test_calibration_observer_unchanged(moe_tests, monkeypatch):
    """calibrate_static reads routing.expert and routing.token: the same input scales as with torch's routing."""
    import copy

    model = moe_tests.tiny("qwen3_moe", layers=1)
    moe.quantize_experts(model)  # dynamic W4A4
    ids = moe_tests._ids(16, seed=5)
    name = "model.layers.0.mlp.experts"
    scales = []
    for routing in (moe._Routing, _TorchRouting):
        m = copy.deepcopy(model)
        with monkeypatch.context() as mp:
            mp.setattr(moe, "_Routing", routing)
            assert moe.calibrate_static(m, [name], lambda mm: mm(ids)) == [name]
        q = m.get_submodule(name)
        scales.append((q.gate_up_proj_input_scale.clone(), q.down_proj_input_scale.clone()))
    assert torch.equal(scales[0][0], scales[1][0]) and torch.equal(scales[0][1], scales[1][1])
    assert len(set(scales[0][0][:, 0].tolist())) > 1


def _sentinel_case(moe_tests, mode, device):
    """An experts module, tokens, and routings with and without ids outside [0, E): the sentinel E, -1 and E + 3
    on some pairs, against the same pairs sent to a valid expert at weight 0."""
    q, _ = moe_tests._random_experts(mode, own_parts=False)
    t = 11
    x = torch.randn(t, moe_tests.H, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    idx, w = moe_tests._routing(t, "random", seed=6)
    bad = idx.clone()
    for (r, c), v in zip(((1, 0), (4, 1), (7, 0), (8, 1)), (moe_tests.E, -1, moe_tests.E + 3, moe_tests.E)):
        bad[r, c] = v
    zero_w = torch.where(bad == idx, w, torch.zeros_like(w))
    return q.to(device), x.to(device), bad.to(device), idx.to(device), w.to(device), zero_w.to(device)


@pytest.mark.parametrize("mode", ["weight_only", "static"])
def test_forward_skips_ids_outside_the_experts(moe_tests, mode):
    """transformers' expert-parallel sentinel (and any id outside [0, E)) contributes nothing, as its experts skip
    it: the output equals the one where those pairs go to a valid expert at weight 0, bit for bit (per-row
    numerics: weight-only and static scales), and nothing is NaN though those rows were never routed."""
    q, x, bad, idx, w, zero_w = _sentinel_case(moe_tests, mode, "cpu")
    with torch.no_grad():
        got, want = q(x, bad, w), q(x, idx, zero_w)
    assert torch.isfinite(got).all()
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------------------
# CUDA


ONE_LAUNCH_PAIRS = 8192  # csrc/cuda/moe_route.h kMoeRouteOneLaunchPairs


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_equals_cpu(kind, dtype):
    cases = list(itertools.product((0, 1, 3, 37, 1000), (1, 2, 8), (1, 8, 128, 256)))
    # the three-launch form (S > 8192), its chunks grown past 256 pairs (S > 262144), large E in one launch
    cases += [(1025, 8, 128), (3000, 8, 256), (40000, 8, 128), (5000, 6, 60), (1024, 8, 512), (1024, 8, 4096),
              (4, 8, 4096), (2000, 8, 4096)]
    for n, (t, k, e) in enumerate(cases):
        idx = make_ids(t, k, e, kind, seed=100 + n, dtype=dtype)
        want = OP(idx, e)
        got = OP(idx.cuda(), e)
        assert all(g.device.type == "cuda" for g in got)
        for name, a, b in zip(("offs", "row_token", "inverse"), got, want):
            assert torch.equal(a.cpu(), b), (name, t, k, e, kind)


@requires_cuda
def test_cuda_forms_and_launches():
    one_launch = torch.ops.nvfp4_gemm._moe_route_one_launch
    for s in (1, 8, 128, 4096, ONE_LAUNCH_PAIRS):
        for e in (1, 128, 256, 512, MAX_EXPERTS):
            assert one_launch(s, e), (s, e)
    assert not one_launch(ONE_LAUNCH_PAIRS + 1, 128)
    for t, k, launches in ((1, 8, 1), (16, 8, 1), (1024, 8, 1), (1025, 8, 3)):
        idx = make_ids(t, k, 128, "random", seed=t).cuda()
        got = cuda_kernels(lambda: OP(idx, 128))
        assert len(got) == launches, got


@requires_cuda
def test_cuda_never_syncs_the_host():
    for t in (16, 2000):
        idx = make_ids(t, 8, 128, "random", seed=t).cuda()
        run_without_host_sync(lambda: OP(idx, 128))


@requires_cuda
@pytest.mark.parametrize("t", [1, 16, 2000])
def test_cuda_graph_replays_new_routing(t):
    e, k = 128, 8
    ids = make_ids(t, k, e, "random", seed=1).cuda()
    graph, out = capture_graph(lambda: OP(ids, e))
    for seed, kind in ((2, "random"), (3, "skewed"), (4, "one_expert"), (5, "sentinel")):
        new = make_ids(t, k, e, kind, seed=seed)
        ids.copy_(new)
        for o in out:
            o.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        check_route(new, e, out)


@requires_cuda
@pytest.mark.parametrize("mode", ["weight_only", "static"])
def test_cuda_forward_skips_ids_outside_the_experts(moe_tests, mode):
    """On CUDA (where offs is never read by the host) the pairs outside [0, E) are computed in the last expert's
    group and dropped: finite, and the CPU's result to the output's rounding (the GPU sums in another order)."""
    q, x, bad, idx, w, zero_w = _sentinel_case(moe_tests, mode, "cpu")
    with torch.no_grad():
        want = q(x, idx, zero_w).float()
        qc = q.to("cuda")
        got = qc(x.cuda(), bad.cuda(), w.cuda()).float().cpu()
    assert torch.isfinite(got).all()
    scale = want.abs().amax(-1, keepdim=True)
    assert ((got - want).abs() <= 4 * torch.finfo(torch.bfloat16).eps * scale).all(), (got - want).abs().max()
