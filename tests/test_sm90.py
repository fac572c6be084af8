"""SM90-only checks beyond the shared suite: every dispatch entry forced on partial tiles, a randomized
sweep of >= 300 shapes, bitwise determinism, CUDA graph capture and a non-default stream.

The sweep's shapes reach 4096 x 8192 x 16384, too large for the CPU float64 reference of cases.py, so
these tests check on the GPU in float64 with the same docs/CONTRACT.md bound (nvfp4_gemm.testing.Reference). Failure
messages carry the seed of _gpu_inputs, so a case replays.
"""
from __future__ import annotations

import contextlib
import math
import os
import random

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import (Case, Reference, case_seed, forced, make_inputs, poison_cuda_allocator,
                                recorded_choices, run_after_slow_producer)
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
    """docs/CONTRACT.md's bound (nvfp4_gemm.testing.Reference), computed on the GPU."""
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
    """Sets the sm90 split count of the following calls (nvfp4_gemm.testing.forced) until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda n: stack.enter_context(forced(splits=n))


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_forced_splits(force_splits, splits):
    force_splits(splits)
    # (3, 1032, 1312): small-M, 9 row blocks (the last ragged) x 6 K blocks (the last partial: K % 256 = 32).
    for m, n, k in ((1, 1024, 4096), (130, 392, 2080), (257, 136, 1024), (3, 1032, 1312)):
        inputs = _gpu_inputs(m, n, k, out_dtype=torch.float32, alpha=-0.75, seed=m)
        _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"splits {splits}, ({m}, {n}, {k}), seed {m}")


def test_cluster_split(force_splits):
    """Where the wgmma kernel splits each tile's K over clusters (backend.cu, split_plan.h choose_split), against
    one CTA per whole tile (1 split forced, which also turns the cluster split off). Both meet docs/CONTRACT.md's bound; the
    two cut K at different places, so their float32 sums round differently somewhere, which shows that the split
    ran. Shapes, on an H100: 32 tiles x 56 K tiles (two clusters of 2 per tile, their rows summed through the
    workspace), 4 tiles x 17 K tiles with a ragged last one (clusters of 6), 8 tiles of 64 tokens x 16 K tiles
    (clusters of 8), 32 tiles of 64 tokens x 8 K tiles (two clusters of 2)."""
    differs = []
    for i, (m, n, k) in enumerate([(128, 4096, 7168), (130, 392, 2080), (64, 1024, 4096), (64, 4096, 2048)]):
        inputs = _gpu_inputs(m, n, k, out_dtype=torch.float32, alpha=-0.75, seed=40 + i)
        force_splits(0)
        out = nvfp4_gemm.mm(**inputs)
        _check_gpu(out, inputs, f"cluster split, ({m}, {n}, {k}), seed {40 + i}")
        force_splits(1)
        whole = nvfp4_gemm.mm(**inputs)
        _check_gpu(whole, inputs, f"one CTA per tile, ({m}, {n}, {k}), seed {40 + i}")
        if not torch.equal(out, whole):
            differs.append((m, n, k))
    assert differs, "the cluster split gave the unsplit bits on every shape: did it run?"


def test_one_wave_over_more_tiles(force_splits):
    """More tiles than SMs: the plan (split_plan.h choose_grid) runs one wave of CTAs over contiguous ranges of
    (tile, K tile) units, each range holding whole tiles between a partial first and last one, against one CTA per
    whole tile (1 split forced: no partial sums). Shapes, on an H100: 330 tiles of 64 tokens x 2 K tiles (5 K tiles a
    CTA, so a range spans up to four tiles); gate_up of an 8B model at M = 128 (224 tiles x 32 K tiles); 136 tiles
    of 256 tokens with M and K ragged. Both meet docs/CONTRACT.md's bound, a second call gives the same bits, and the two
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


def test_epilogue_paths(force_splits):
    """The wgmma kernel's output path, within docs/CONTRACT.md's bound: every tile staged in shared memory, in rounds
    of token rows where a float32 tile does not fit the stage (72 of 128, 136 of 256 rows), copied out with 16-byte
    stores (mm takes N % 8 == 0, so C rows stay 16-byte aligned; the element-by-element copy is for a grouped out=
    view that is not). Whole tiles (one split forced) on every token tile's config, then split tiles: the balanced
    split (48 tiles), one wave over 224 tiles, 256 tokens with M and N ragged."""
    t = {n: next(c for c in _configs() if f"xt{n}xk" in c and "_b1_" in c) for n in (32, 64, 128, 256)}
    whole = [(32, 1024, 1024, "float32", t[32]), (64, 1024, 1024, "bfloat16", t[64]),
             (64, 1024, 1024, "float32", t[64]), (128, 1024, 2048, "float16", t[128]),
             (128, 1024, 2048, "float32", t[128]), (200, 1032, 2080, "float16", t[256]),
             (256, 1032, 1024, "float32", t[256]), (128, 1040, 2048, "float32", t[128])]
    split = [(128, 6144, 4096, "float16", None), (128, 28672, 1024, "bfloat16", None),
             (200, 1032, 2080, "float16", None), (200, 1032, 2080, "float32", None),
             (200, 1048, 2080, "float32", None)]
    for splits, cases in ((1, whole), (0, split)):
        force_splits(splits)
        for i, (m, n, k, dt, cfg) in enumerate(cases):
            inputs = _gpu_inputs(m, n, k, out_dtype=getattr(torch, dt), alpha=-0.75, seed=80 + i)
            with forced(config=cfg) if cfg else contextlib.nullcontext():
                out = nvfp4_gemm.mm(**inputs)
            _check_gpu(out, inputs, f"({m}, {n}, {k}) {dt} {cfg or 'automatic'}, splits {splits}, seed {80 + i}")


# The dense configs of four consumer warpgroups (256 weight rows a tile; csrc/sm90/generate.py WG128_W256, WG64_W256),
# picked by the least-cost rules, and the 128-row config whose bits they repeat. All three hold one accumulator set,
# so each output's sums run in K order whatever the token tile, KT and tile width (each output row's sums come from
# one warpgroup; wgmma's N does not change an element's sum): a whole tile gives the same bits, and so does a forced
# split count f where f divides every tile's K tiles of 256 (each tile's K is then cut at the same places and summed
# in CTA order).
W256_CONFIGS = ("sm90_nvfp4_w256xt128xk128_s4_b1_ws_rs", "sm90_nvfp4_w256xt64xk256_s3_b1_ws_rs")
W256_TWIN = "sm90_nvfp4_w128xt128xk128_s5_b1_ws_rs"
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _in_form(inputs, form, seed):
    """_gpu_inputs as packed NVFP4 A ("w4a4") or as 16-bit activations ("f16", "bf16": the weight-only form)."""
    if form == "w4a4":
        return inputs
    m, k = inputs["a"].shape[0], inputs["a"].shape[1] * 2
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.float16 if form == "f16" else torch.bfloat16)
    return dict(inputs, a=a, sfa=None)


def _forced_mm(inputs, config, splits):
    """mm with `config` and `splits` forced, into poisoned output memory (an element no CTA wrote reads as NaN)."""
    m, n = inputs["a"].shape[0], inputs["b"].shape[0]
    poison_cuda_allocator(m * n * 4, torch.device("cuda"))
    with forced(config=config, splits=splits):
        return nvfp4_gemm.mm(**inputs)


@pytest.mark.parametrize("form", ["w4a4", "f16", "bf16"])
@pytest.mark.parametrize("splits", [1, 2, 4])
def test_w256_configs_bitwise_as_w128(form, splits):
    """The 256-row configs, forced, bit for bit the 128-row config of one accumulator set (W256_TWIN) and within
    docs/CONTRACT.md's bound: one CTA per whole tile (1 split) on N tails whose last tile ends in its first 128-row
    block (N % 256 of 8 and 128: its second block's scale box is the last block again, over B's zero rows) or in its
    second (136, 200, 232), K tails (K % 128 of 32 and 96, K / 16 % 4 != 0), M off every token tile; then the balanced
    split with 2 and 4 CTAs a tile (K a multiple of 1024, so both configs cut each tile's K at the same places). Every
    output dtype, NVFP4 and 16-bit A, outputs poisoned."""
    if splits == 1:
        shapes = ((1, 8, 32), (64, 264, 2048), (100, 384, 544), (128, 456, 2080), (200, 1000, 96), (300, 1288, 1376),
                  (130, 392, 2080))
    else:
        shapes = ((128, 1000, 2048), (200, 264, 4096), (64, 6144, 1024), (300, 392, 3072))
    for i, cfg in enumerate(W256_CONFIGS):
        for j, (m, n, k) in enumerate(shapes):
            seed = 1000 + 100 * i + 10 * j + splits
            dt = _OUT_DTYPES[(i + j + splits) % 3]
            inputs = _in_form(_gpu_inputs(m, n, k, dt, alpha=(-0.75, None)[j % 2], seed=seed), form, seed)
            what = f"{cfg} {form} on ({m}, {n}, {k}) {dt}, splits {splits}, seed {seed}"
            out = _forced_mm(inputs, cfg, splits)
            _check_gpu(out, inputs, what)
            twin = _forced_mm(inputs, W256_TWIN, splits)
            assert torch.equal(out, twin), f"{what}: differs from {W256_TWIN}"


@pytest.mark.parametrize("form", ["w4a4", "f16", "bf16"])
def test_w256_configs_automatic_splits(form):
    """The 256-row configs, forced, under the plan's own split (split_plan.h choose_split; the figures are the plan on
    132 SMs): the balanced split (16 tiles of 128 tokens x 56 K tiles over 132 CTAs; 6 tiles of 64 tokens with N
    and K ragged over 54), one wave over more tiles than SMs (136 tiles of 128 tokens with M and K ragged; 224 and
    165 tiles of 64 tokens, the latter 2 K tiles a tile so a range spans several), the cluster split (128 tokens: 4
    tiles in clusters of 8, 28 in clusters of 4; 64 tokens: 28 tiles in clusters of 4, and 32 tiles as two clusters
    of 2 each, their rows summed through the workspace). Each within docs/CONTRACT.md's bound, a second call gives the
    same bits, and against one CTA per whole tile (1 split forced) the float32 results differ somewhere, which shows
    that the splits ran."""
    shapes = {W256_CONFIGS[0]: ((128, 4096, 7168), (200, 17408, 1056), (100, 1024, 4096), (128, 7168, 2048)),
              W256_CONFIGS[1]: ((130, 392, 2080), (128, 28672, 4096), (64, 42240, 512), (64, 7168, 2048),
                                (128, 4096, 7168))}
    differs = []
    for i, cfg in enumerate(W256_CONFIGS):
        for j, (m, n, k) in enumerate(shapes[cfg]):
            seed = 2000 + 100 * i + 10 * j
            dt = _OUT_DTYPES[(i + j) % 3]
            inputs = _in_form(_gpu_inputs(m, n, k, dt, alpha=-0.75, seed=seed), form, seed)
            what = f"{cfg} {form} on ({m}, {n}, {k}) {dt}, seed {seed}"
            out = _forced_mm(inputs, cfg, 0)
            _check_gpu(out, inputs, what)
            assert torch.equal(out, _forced_mm(inputs, cfg, 0)), f"{what}: two calls differ"
            if dt == torch.float32:
                whole = _forced_mm(inputs, cfg, 1)
                _check_gpu(whole, inputs, f"{what}, one CTA per tile")
                if not torch.equal(out, whole):
                    differs.append((cfg, m, n, k))
    assert differs, "the automatic splits gave the unsplit bits on every float32 shape: did they run?"


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


def test_small_m_sweep(force_splits):
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
        scales = rng.choice(["typical", "tiny"]) if dt == torch.float16 else rng.choice(["typical", "wide", "tiny"])
        inputs = _gpu_inputs(m, n, k, dt, alpha, scales, seed=100 + i)
        try:
            with forced(config=cfg or "", splits=splits):
                _check_gpu(nvfp4_gemm.mm(**inputs), inputs)
        except (AssertionError, RuntimeError) as e:
            fails.append(f"({m},{n},{k}) {dt} alpha={alpha} cfg={cfg} splits={splits} seed={100 + i}: {e}")
    assert not fails, f"{len(fails)} failed:\n" + "\n".join(fails[:20])


def _sf(rows, k):
    return nvfp4_gemm.to_blocked(torch.full((rows, k // 16), 0x38, dtype=torch.uint8, device="cuda")
                                 .view(torch.float8_e4m3fn))


def _picked(shapes, n, k, backend="sm90"):
    """What dispatch ran (nvfp4_gemm.testing.recorded_choices) for packed A at each M of `shapes`, N, K, by M."""
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    with forced(backend=backend), recorded_choices() as lines:
        for m in shapes:
            a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda")
            nvfp4_gemm.mm(a, b, _sf(m, k), _sf(n, k))
    torch.cuda.synchronize()
    return {int(ln.split(" m=")[1].split()[0]): ln for ln in lines}


@pytest.mark.parametrize("k", [4096, 4128])
def test_small_m_is_selected(k):
    """M <= 32 (the rules of csrc/sm90/generate.py: where it measured faster) dispatches to the small-M kernels,
    larger M to a wgmma config; of those, M <= 16 with K % 256 == 0 to the K-sliced kernel, M 17..32 or
    K % 256 != 0 to the small-M kernel."""
    picked = _picked((1, 8, 9, 16, 17, 32, 33), 1024, k)
    for m in (1, 8):
        assert ("_wk_w128xt8x" if k % 256 == 0 else "_smallm_") in picked[m], picked
    for m in (9, 16):
        assert ("_wk_w128xt16x" if k % 256 == 0 else "_smallm_") in picked[m], picked
    for m in (17, 32):
        assert "_smallm_" in picked[m], picked
    assert "_smallm_" not in picked[33] and "_wk_" not in picked[33], picked


def test_deep_small_m_config_for_unsplit_grids():
    """The rule "unsplit_small_m8" (csrc/sm90/generate.py): at M <= 8, a problem the 8-token config would run
    unsplit below one wave of the 16-token config (N = 28672 on an H100's 132 SMs; K = 2080, since at K % 256 == 0 the K-sliced kernel takes
    M <= 16) takes the 16-token config; one it splits (N = 4096) keeps the 8-token config. Both results within
    docs/CONTRACT.md's bound."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # 2 x SMs - 40 row blocks (224 on 132 SMs): too many for a second split of the 8-token config (3 CTAs per
    # SM), and within one wave of the 16-token config (2 per SM).
    n_deep = 128 * (2 * sms - 40)
    with forced(backend="sm90"), recorded_choices() as lines:
        for m, n in ((1, n_deep), (8, n_deep), (1, 4096), (9, n_deep)):
            g = torch.Generator(device="cuda").manual_seed(m + n)
            a = torch.randint(0, 256, (m, 1040), dtype=torch.uint8, device="cuda", generator=g)
            b = torch.randint(0, 256, (n, 1040), dtype=torch.uint8, device="cuda", generator=g)
            x = dict(a=a, b=b, sfa=_sf(m, 2080), sfb=_sf(n, 2080), alpha=None, out_dtype=torch.float16)
            Reference(x).check(nvfp4_gemm.mm(**x), f"m={m} n={n}")
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


@pytest.mark.parametrize("shape", [(2000, 4096, 14336), (2600, 520, 16416)])
def test_m_in_launches_past_the_decode_workspace(shape):
    """Decoded A past its 40 MiB bound (backend.cu kMaxADecBytes) runs M in several launches of whole token tiles,
    as many a launch as the split model prices lowest (split_plan.h chunk_token_tiles): 2000 rows at K = 14336 (28
    KiB of decoded A a row) are 8 tiles of 256 rows, at most 5 a launch, run as 4 + 4 with a ragged last tile;
    2600 rows at K = 16416 (not a multiple of 64) with N off the 128-row tiles. Output memory is poisoned first, so
    a row no launch wrote shows; every row meets docs/CONTRACT.md's bound."""
    m, n, k = shape
    inputs = _gpu_inputs(m, n, k, alpha=0.75, seed=m + k)
    poison_cuda_allocator(m * n * 2, torch.device("cuda"))
    _check_gpu(nvfp4_gemm.mm(**inputs), inputs, f"({m}, {n}, {k}), seed {m + k}")


def test_large_m_goes_generic_unless_forced():
    """Automatic dispatch hands M >= 2048 to the generic path (a rule of csrc/sm90/generate.py), where it
    measured faster; a forced sm90 backend still runs the Hopper kernel there."""
    for backend, want_2048 in (("auto", "generic"), ("sm90", "sm90:")):
        picked = _picked((2047, 2048), 256, 1024, backend)
        assert picked[2047].startswith("sm90:"), picked
        assert picked[2048].startswith(want_2048), picked


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
