"""SM90-only checks beyond the shared suite: every dispatch entry forced on partial tiles, a randomized
sweep of >= 300 shapes, bitwise determinism, CUDA graph capture and a non-default stream.

The sweep's shapes reach 4096 x 8192 x 16384, too large for the CPU float64 reference of cases.py, so
these tests check on the GPU in float64 with the same SPEC.md bound (nvfp4_gemm.testing.Reference). Failure
messages carry the seed of _gpu_inputs, so a case replays.
"""
from __future__ import annotations

import math
import os
import random

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, Reference, case_seed, make_inputs, poison_cuda_allocator, run_after_slow_producer
from conftest import backend_skip_reason

_reason = backend_skip_reason("sm90")
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")

SWEEP_CASES = int(os.environ.get("NVFP4_GEMM_SM90_SWEEP", "300"))


@pytest.fixture(autouse=True)
def _force_sm90(monkeypatch):
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm90")
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)


def _gpu_inputs(m, n, k, out_dtype=torch.float16, alpha=None, scales="typical", seed=0):
    """Like cases.make_inputs, generated on the GPU (the CPU generator is too slow for 4096 x 16384)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)

    def scales_for(rows):
        lo, hi = {"typical": (1, 11), "wide": (1, 13), "tiny": (0, 3)}[scales]
        exp = torch.randint(lo, hi, (rows, k // 16), device="cuda", generator=g)
        man = torch.randint(0, 8, (rows, k // 16), device="cuda", generator=g)
        lin = ((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn)
        return nvfp4_gemm.to_blocked(lin)

    al = None if alpha is None else torch.tensor([alpha], dtype=torch.float32, device="cuda")
    return dict(a=a, b=b, sfa=scales_for(m), sfb=scales_for(n), alpha=al, out_dtype=out_dtype)


def _check_gpu(out, inputs, context=""):
    """SPEC.md's bound (nvfp4_gemm.testing.Reference), computed on the GPU."""
    Reference(inputs).check(out, context)


def _configs():
    """The configs that take NVFP4 activations at any K (the K-sliced "_wk_" ones need K % 256 == 0:
    _wk_configs)."""
    return [c for c in nvfp4_gemm.configs().get("sm90", []) if "_wk_" not in c]


def _wk_configs():
    return [c for c in nvfp4_gemm.configs().get("sm90", []) if "_wk_" in c]


# M, N and partial tiles for the K-sliced kernel (K % 256 == 0): past TOKENS (several launches), across A's
# 128-row scale blocks (M = 136: rows 128.. read the second block), N off the 128-row blocks.
_WK_SHAPES = ((1, 8, 256), (7, 136, 768), (16, 264, 1536), (13, 200, 2048), (40, 136, 512), (136, 264, 256))


@pytest.mark.parametrize("splits", [0, 1, 3])
def test_wk_configs_on_nvfp4_a(monkeypatch, force_splits, splits):
    """The K-sliced configs, forced, on NVFP4 activations (packed A through TMA, its scale atoms by bulk copy,
    decoded in the consumer warps), every output dtype, poisoned output memory, automatic and forced K splits."""
    force_splits(splits)
    for i, name in enumerate(_wk_configs()):
        monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        for j, (m, n, k) in enumerate(_WK_SHAPES):
            seed = 100 * i + 10 * j + splits
            dt = (torch.float16, torch.bfloat16, torch.float32)[(i + j) % 3]
            inputs = _gpu_inputs(m, n, k, dt, alpha=(None, -0.75)[j % 2], scales=("typical", "tiny")[j % 2], seed=seed)
            poison_cuda_allocator(m * n * 4, torch.device("cuda"))
            _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"{name} on ({m}, {n}, {k}), splits {splits}, seed {seed}")


def test_wk_configs_on_padded_nvfp4_rows(monkeypatch):
    """Packed A and B whose rows are further apart than K/2 bytes (views into wider buffers): the K-sliced
    configs' TMA maps take the row strides as they are."""
    for i, name in enumerate(_wk_configs()):
        monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        inputs = _gpu_inputs(12, 136, 512, alpha=0.5, seed=60 + i)
        for key in ("a", "b"):
            t = inputs[key]
            wide = torch.randint(0, 256, (t.shape[0], t.shape[1] + 16), dtype=torch.uint8, device="cuda")
            wide[:, : t.shape[1]] = t
            inputs[key] = wide[:, : t.shape[1]]
        _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"{name} on padded rows, seed {60 + i}")


@pytest.mark.parametrize("shape", [(1, 8, 32), (7, 136, 96), (100, 264, 544), (300, 200, 1056)])
def test_every_config_on_partial_tiles(monkeypatch, shape):
    """Each dispatch entry, forced, on shapes with M, N and K all off their tile sizes (K/16 % 4 != 0)."""
    m, n, k = shape
    for i, name in enumerate(_configs()):
        monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        inputs = _gpu_inputs(m, n, k, seed=17 * i + m)
        _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"{name} on {shape}, _gpu_inputs seed {17 * i + m}")


@pytest.fixture
def force_splits():
    """Sets the sm90 split count for the following calls (the override is read once per process, so tests
    change it through the module's hook) and restores the previous value afterwards."""
    previous = []

    def force(n: int) -> None:
        old = torch.ops.nvfp4_gemm._sm90_force_splits(n)
        if not previous:
            previous.append(old)

    yield force
    if previous:
        torch.ops.nvfp4_gemm._sm90_force_splits(previous[0])


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_forced_splits(force_splits, splits):
    force_splits(splits)
    # (3, 1032, 1312): small-M, 9 row blocks (the last ragged) x 6 K blocks (the last partial: K % 256 = 32).
    for m, n, k in ((1, 1024, 4096), (130, 392, 2080), (257, 136, 1024), (3, 1032, 1312)):
        inputs = _gpu_inputs(m, n, k, out_dtype=torch.float32, alpha=-0.75, seed=m)
        _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"splits {splits}, ({m}, {n}, {k}), seed {m}")


# Switches read once per process (NVFP4_GEMM_SM90_CLUSTER, _STAGED_C, ...) need a process each: _outputs_in_child
# runs `cases` ((m, n, k, output dtype name, forced config or "")) in a fresh interpreter with `env_vars` set (no
# inherited NVFP4_GEMM_CONFIG / _SM90_SPLITS), checks each output against SPEC.md's bound there, and returns them.
_CHILD_CHECK = """
import os, sys, torch, nvfp4_gemm
sys.path.insert(0, {tests!r})
from test_sm90 import _gpu_inputs, _check_gpu
ENV = {label!r}
outs = []
for i, (m, n, k, dt, cfg) in enumerate({cases!r}):
    if cfg:
        os.environ["NVFP4_GEMM_CONFIG"] = cfg
    else:
        os.environ.pop("NVFP4_GEMM_CONFIG", None)
    inputs = _gpu_inputs(m, n, k, out_dtype=getattr(torch, dt), alpha=-0.75, seed={seed} + i)
    out = nvfp4_gemm.mm(**inputs)
    _check_gpu(out, inputs, f"({{m}}, {{n}}, {{k}}) {{dt}} {{cfg}}, seed {{{seed} + i}}, {{ENV}}")
    outs.append(out.cpu())
torch.save(outs, {path!r})
"""


def _outputs_in_child(tmp_path, tag, cases, env_vars, seed):
    import subprocess
    import sys

    path = str(tmp_path / f"{tag}.pt")
    code = _CHILD_CHECK.format(tests=os.path.dirname(__file__), label=str(env_vars), cases=cases, seed=seed,
                               path=path)
    env = dict(os.environ, NVFP4_GEMM_BACKEND="sm90")
    env.pop("NVFP4_GEMM_CONFIG", None)
    env.pop("NVFP4_GEMM_SM90_SPLITS", None)
    env.update(env_vars)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(path)


def test_cluster_split(tmp_path):
    """Where the wgmma kernel splits each tile's K over clusters (backend.cu choose_split), against the
    balanced split over the grid (NVFP4_GEMM_SM90_CLUSTER=0, read once per process: one process each). Both
    meet SPEC.md's bound; the two splits cut K at different places, so their float32 sums round differently
    somewhere, which shows that the cluster split ran. Shapes, on an H100: 32 tiles x 56 K tiles (two clusters of
    2 per tile, their rows summed through the workspace), 4 tiles x 17 K tiles with a ragged last one (clusters
    of 6), 8 tiles of 64 tokens x 16 K tiles (clusters of 8), 32 tiles of 64 tokens x 8 K tiles (two clusters of
    2)."""
    shapes = [(128, 4096, 7168), (130, 392, 2080), (64, 1024, 4096), (64, 4096, 2048)]
    cases = [(m, n, k, "float32", "") for m, n, k in shapes]
    results = {cluster: _outputs_in_child(tmp_path, f"cluster{cluster}", cases,
                                          {"NVFP4_GEMM_SM90_CLUSTER": cluster}, seed=40)
               for cluster in ("1", "0")}
    differs = [shape for shape, on, off in zip(shapes, results["1"], results["0"]) if not torch.equal(on, off)]
    assert differs, "the cluster split gave the balanced split's bits on every shape: did it run?"


def test_one_wave_over_more_tiles(force_splits):
    """More tiles than SMs: the plan (split_plan.h choose_grid) runs one wave of CTAs over contiguous ranges of
    (tile, K tile) units, each range holding whole tiles between a partial first and last one, against one CTA per
    whole tile (1 split forced: no partial sums). Shapes, on an H100: 330 tiles of 64 tokens x 2 K tiles (5 K tiles a
    CTA, so a range spans up to four tiles); gate_up of an 8B model at M = 128 (224 tiles x 32 K tiles); 136 tiles
    of 256 tokens with M and K ragged. Both meet SPEC.md's bound, a second call gives the same bits, and the two
    plans sum K in different pieces, so the float32 results differ somewhere, which shows that the split ran."""
    differs = []
    for i, (m, n, k) in enumerate([(64, 42240, 512), (128, 28672, 4096), (200, 17408, 1056)]):
        inputs = _gpu_inputs(m, n, k, out_dtype=torch.float32, alpha=-0.75, seed=60 + i)
        force_splits(0)
        out = nvfp4_gemm.mm(**inputs)
        _check_gpu(out, inputs, f"one wave, ({m}, {n}, {k}), seed {60 + i}")
        assert torch.equal(out, nvfp4_gemm.mm(**inputs)), f"({m}, {n}, {k}): two calls differ"
        force_splits(1)
        whole = nvfp4_gemm.mm(**inputs)
        _check_gpu(whole, inputs, f"one CTA per tile, ({m}, {n}, {k}), seed {60 + i}")
        if not torch.equal(out, whole):
            differs.append((m, n, k))
    assert differs, "the one-wave split gave the unsplit bits on every shape: did it run?"


def test_epilogue_variants_are_bitwise_equal(tmp_path):
    """The wgmma kernel's two output paths give the same bits: a tile staged in shared memory and copied out with
    16-byte stores, or stored quad by quad (NVFP4_GEMM_SM90_STAGED_C=0), each within SPEC.md's bound. Whole tiles
    (one split forced) on every token tile's config, float32 staged at 32 and 64 tokens and stored quad by quad at
    128 / 256; split tiles with the cluster split off: the balanced split (48 tiles), one wave over 224 tiles, 256
    tokens with M and N ragged."""
    t = {n: next(c for c in _configs() if f"xt{n}xk" in c and "_b1_" in c) for n in (32, 64, 128, 256)}
    whole = [(32, 1024, 1024, "float32", t[32]), (64, 1024, 1024, "bfloat16", t[64]),
             (64, 1024, 1024, "float32", t[64]), (128, 1024, 2048, "float16", t[128]),
             (128, 1024, 2048, "float32", t[128]), (200, 1032, 2080, "float16", t[256])]
    split = [(128, 6144, 4096, "float16", ""), (128, 28672, 1024, "bfloat16", ""), (200, 1032, 2080, "float16", ""),
             (200, 1032, 2080, "float32", "")]
    results = {}
    for group, cases, extra in (("whole", whole, {"NVFP4_GEMM_SM90_SPLITS": "1"}),
                                ("split", split, {"NVFP4_GEMM_SM90_CLUSTER": "0"})):
        for staged in ("1", "0"):
            results[group, staged] = (cases, _outputs_in_child(tmp_path, f"epilogue_{group}_{staged}", cases,
                                                               dict(extra, NVFP4_GEMM_SM90_STAGED_C=staged), seed=80))
    for group in ("whole", "split"):
        cases, want = results[group, "1"]
        for case, got, ref in zip(cases, results[group, "0"][1], want):
            assert torch.equal(got, ref), f"{group} {case}: stored quad by quad differs from staged"


def test_decode_exact_for_extreme_scales():
    """Subnormal scales and large ones stay exact through the kernel's decode scaling."""
    for m, n, k, scales in ((3, 136, 544, "tiny"), (64, 256, 1024, "wide"), (200, 128, 2080, "typical")):
        inputs = _gpu_inputs(m, n, k, out_dtype=torch.float32, scales=scales, seed=m)
        _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"({m}, {n}, {k}) {scales}, seed {m}")


def test_random_sweep():
    """>= 300 random shapes: M 1..4096, N % 8 == 0 up to 8192, K % 32 == 0 up to 16384, random scale
    ranges and output dtypes. Log-uniform sizes so both small and large tiles get many cases."""
    rng = random.Random(2026)
    fails = []
    for i in range(SWEEP_CASES):
        m = min(4096, max(1, int(math.exp(rng.uniform(0, math.log(4096))))))
        n = min(8192, max(8, 8 * int(math.exp(rng.uniform(0, math.log(1024))))))
        k = min(16384, max(32, 32 * int(math.exp(rng.uniform(0, math.log(512))))))
        if m * n * k > 4096 * 4096 * 4096:  # keeps the float64 reference under a second
            k = max(32, (4096 * 4096 * 4096 // (m * n)) // 32 * 32)
        dt = rng.choice([torch.float16, torch.bfloat16, torch.float32])
        alpha = rng.choice([None, 0.5, -2.0])
        scales = rng.choice(["typical", "wide", "tiny"]) if dt != torch.float16 else rng.choice(["typical", "tiny"])
        inputs = _gpu_inputs(m, n, k, dt, alpha, scales, seed=i)
        try:
            _check_gpu(nvfp4_gemm.mm(**inputs), inputs)
        except AssertionError as e:
            fails.append(f"({m},{n},{k}) {dt} alpha={alpha} {scales} seed={i}: {e}")
    assert not fails, f"{len(fails)} of {SWEEP_CASES} failed:\n" + "\n".join(fails[:20])


def _small_m_configs():
    return [c for c in _configs() if "_smallm_" in c]


def test_small_m_sweep(monkeypatch, force_splits):
    """The small-M streaming kernel (sm90_small_m.cuh): automatic selection (M <= 32) and every small-M
    config forced, on random M <= 40 (past a config's TOKENS it runs in several launches), N up to 8192,
    K up to 16384 (K/16 % 4 != 0 and K % 256 != 0 included), random split counts."""
    rng = random.Random(7)
    fails = []
    for i in range(80):
        m = rng.randint(1, 40)
        n = 8 * rng.randint(1, 1024)
        k = 32 * rng.randint(1, 512)
        dt = rng.choice([torch.float16, torch.bfloat16, torch.float32])
        alpha = rng.choice([None, 0.5, -2.0])
        cfg = rng.choice([None] + _small_m_configs())
        splits = rng.choice([0, 1, 2, 3, 7])  # 0: automatic
        if cfg is None and m > 32:
            m = rng.randint(1, 32)
        monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)
        if cfg:
            monkeypatch.setenv("NVFP4_GEMM_CONFIG", cfg)
        force_splits(splits)
        scales = rng.choice(["typical", "tiny"]) if dt == torch.float16 else rng.choice(["typical", "wide", "tiny"])
        inputs = _gpu_inputs(m, n, k, dt, alpha, scales, seed=100 + i)
        try:
            _check_gpu(nvfp4_gemm.mm(**inputs), inputs)
        except (AssertionError, RuntimeError) as e:
            fails.append(f"({m},{n},{k}) {dt} alpha={alpha} cfg={cfg} splits={splits} seed={100 + i}: {e}")
    assert not fails, f"{len(fails)} failed:\n" + "\n".join(fails[:20])


def _printed_configs(code: str, backend: str = "sm90") -> list[str]:
    """Runs `code` in a fresh process (NVFP4_GEMM_PRINT_CONFIGS is read once per process) with
    NVFP4_GEMM_BACKEND=backend and returns the dispatch lines it printed, in order."""
    import subprocess
    import sys

    env = dict(os.environ, NVFP4_GEMM_PRINT_CONFIGS="1", NVFP4_GEMM_BACKEND=backend)
    env.pop("NVFP4_GEMM_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [ln for ln in out.stderr.splitlines() if ln.startswith("[nvfp4_gemm]")]


@pytest.mark.parametrize("k", [4096, 4128])
def test_small_m_is_selected(k):
    """M <= 32 (configs.h kSmallMMaxM: where it measured faster) dispatches to the small-M kernels, larger M
    to a wgmma config (what NVFP4_GEMM_PRINT_CONFIGS reports); of those, M <= 16 with K % 256 == 0 to the
    K-sliced kernel (configs.h kWkPick8 / kWkPick), M 17..32 or K % 256 != 0 to the small-M kernel."""
    code = ("import torch, nvfp4_gemm\n"
            "for m in (1, 8, 9, 16, 17, 32, 33):\n"
            f"    a = torch.randint(0, 256, (m, {k // 2}), dtype=torch.uint8, device='cuda')\n"
            f"    b = torch.randint(0, 256, (1024, {k // 2}), dtype=torch.uint8, device='cuda')\n"
            f"    sf = lambda r: nvfp4_gemm.to_blocked(torch.full((r, {k // 16}), 0x38, dtype=torch.uint8, device='cuda').view(torch.float8_e4m3fn))\n"
            "    nvfp4_gemm.mm(a, b, sf(m), sf(1024))\n"
            "torch.cuda.synchronize()\n")
    picked = {int(ln.split(" m=")[1].split()[0]): ln for ln in _printed_configs(code)}
    for m in (1, 8):
        assert ("_wk_w128xt8x" if k % 256 == 0 else "_smallm_") in picked[m], picked
    for m in (9, 16):
        assert ("_wk_w128xt16x" if k % 256 == 0 else "_smallm_") in picked[m], picked
    for m in (17, 32):
        assert "_smallm_" in picked[m], picked
    assert "_smallm_" not in picked[33] and "_wk_" not in picked[33], picked


def test_deep_small_m_config_for_unsplit_grids():
    """configs.h kDeepSmallM: at M <= 8, a problem the 8-token config would run unsplit below one wave of the
    16-token config (N = 28672 on an H100's 132 SMs; K = 2080, since at K % 256 == 0 the K-sliced kernel takes
    M <= 16) takes the 16-token config; one it splits (N = 4096) keeps the 8-token config. Both results within
    SPEC.md's bound."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # 2 x SMs - 40 row blocks (224 on 132 SMs): too many for a second split of the 8-token config (3 CTAs per
    # SM), and within one wave of the 16-token config (2 per SM).
    n_deep = 128 * (2 * sms - 40)
    code = ("import torch, nvfp4_gemm\n"
            "from nvfp4_gemm.testing import Reference\n"
            f"for m, n in ((1, {n_deep}), (8, {n_deep}), (1, 4096), (9, {n_deep})):\n"
            "    g = torch.Generator(device='cuda').manual_seed(m + n)\n"
            "    a = torch.randint(0, 256, (m, 1040), dtype=torch.uint8, device='cuda', generator=g)\n"
            "    b = torch.randint(0, 256, (n, 1040), dtype=torch.uint8, device='cuda', generator=g)\n"
            "    sf = lambda r: nvfp4_gemm.to_blocked(torch.full((r, 130), 0x38, dtype=torch.uint8, device='cuda').view(torch.float8_e4m3fn))\n"
            "    x = dict(a=a, b=b, sfa=sf(m), sfb=sf(n), alpha=None, out_dtype=torch.float16)\n"
            "    Reference(x).check(nvfp4_gemm.mm(**x), f'm={m} n={n}')\n"
            "torch.cuda.synchronize()\n")
    lines = _printed_configs(code)
    assert len(lines) == 4, lines
    assert all("_smallm_w128xt16_" in ln for ln in (lines[0], lines[1], lines[3])), lines
    assert "_smallm_w128xt8_" in lines[2], lines


@pytest.mark.parametrize("m", [1, 8, 16, 32])
@pytest.mark.parametrize("n, k", [(65536, 256), (65536, 512), (49152, 768), (28672, 4096), (1032, 8224)])
def test_small_m_grids_past_one_wave(m, n, k):
    """Small-M grids of every kind at automatic dispatch: unsplit grids of 512 and 384 row blocks at short K
    (N = 65536, 49152), past one wave wherever they outnumber the config's CTA slots; a wide unsplit or split
    grid (N = 28672); 33 K splits summed per row block with a ragged last row block and K % 256 != 0
    (N = 1032, K = 8224). Output memory is poisoned first, so an unwritten element shows."""
    inputs = _gpu_inputs(m, n, k, out_dtype=(torch.float16, torch.bfloat16, torch.float32)[m % 3], alpha=-0.5,
                         seed=m + n + k)
    poison_cuda_allocator(m * n * 4, torch.device("cuda"))
    _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"({m}, {n}, {k}), seed {m + n + k}")


def test_large_m_goes_generic_unless_forced():
    """Automatic dispatch hands M >= configs.h kPreferGenericFromM (2048) to the generic path, where it
    measured faster; NVFP4_GEMM_BACKEND=sm90 still runs the Hopper kernel there."""
    code = ("import torch, nvfp4_gemm\n"
            "for m in (2047, 2048):\n"
            "    a = torch.randint(0, 256, (m, 512), dtype=torch.uint8, device='cuda')\n"
            "    b = torch.randint(0, 256, (256, 512), dtype=torch.uint8, device='cuda')\n"
            "    sf = lambda r: nvfp4_gemm.to_blocked(torch.full((r, 64), 0x38, dtype=torch.uint8, device='cuda').view(torch.float8_e4m3fn))\n"
            "    nvfp4_gemm.mm(a, b, sf(m), sf(256))\n"
            "torch.cuda.synchronize()\n")
    for backend, want_2048 in (("auto", "generic"), ("sm90", "sm90:")):
        picked = {int(ln.split(" m=")[1].split()[0]): ln for ln in _printed_configs(code, backend)}
        assert picked[2047].startswith("[nvfp4_gemm] sm90:"), picked
        assert picked[2048].startswith(f"[nvfp4_gemm] {want_2048}"), picked


@pytest.mark.parametrize("shape", [(1, 7168, 16384), (16, 4096, 7168), (128, 7168, 2048), (300, 4096, 1024)])
def test_bitwise_deterministic(shape):
    inputs = _gpu_inputs(*shape, seed=5)
    first = nvfp4_gemm.mm(**inputs)
    for _ in range(19):
        assert torch.equal(nvfp4_gemm.mm(**inputs).view(torch.int16), first.view(torch.int16))


def test_every_config_on_a_side_stream(monkeypatch):
    """Each dispatch entry, forced, with its inputs still being produced on a side stream and only that
    stream synchronized before the check (testing.run_after_slow_producer): a kernel, split fix-up or
    decode prepass launched on another stream reads zeros or is unfinished when checked."""
    for i, name in enumerate(_configs() + _wk_configs()):
        monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        m = 8 if "_smallm_" in name else 16 if "_wk_" in name else 300
        k = 2048 if "_wk_" in name else 2080
        inputs = _gpu_inputs(m, 1024, k, alpha=1.5, seed=31 + i)
        out, _ = run_after_slow_producer(nvfp4_gemm.mm, inputs)
        _check_gpu(out, inputs, f"{name} on a side stream, ({m}, 1024, {k}), seed {31 + i}")


@pytest.mark.parametrize("shape", [(128, 1024, 2048), (8, 1024, 8192)])
def test_cuda_graph_on_a_side_stream(shape):
    inputs = _gpu_inputs(*shape, alpha=1.5, seed=9)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on the capture stream, as CUDA graphs want
        nvfp4_gemm.mm(**inputs)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = nvfp4_gemm.mm(**inputs)
    inputs["alpha"].fill_(-3.0)  # alpha is read on the device at replay time
    graph.replay()
    torch.cuda.synchronize()
    _check_gpu(captured, inputs, f"graph replay of {shape}, seed 9")


def test_shared_suite_cases_on_sm90():
    """The shared generator (cases.make_inputs) with its special scales, through the sm90 kernels."""
    from nvfp4_gemm.testing import check_against_reference

    for case in (Case(300, 264, 544, torch.float16, alpha=0.37), Case(70, 80, 512, torch.float32, scales="nan"),
                 Case(40, 64, 2048, torch.float16, scales="large"), Case(65, 96, 320, torch.float32, scales="tiny")):
        inputs = make_inputs(case, "cuda", seed=case_seed(case))
        check_against_reference(nvfp4_gemm.mm(**inputs), inputs, f"{case.id}, seed {case_seed(case)}")
