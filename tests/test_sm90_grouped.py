"""The sm90 grouped (mixture-of-experts) kernels, through the private op torch.ops.nvfp4_gemm._sm90_grouped_test
(one launch of the GroupedBackendApi table on the current stream; nvfp4_gemm.grouped_mm is the public op):
random routings against docs/CONTRACT.md's float64 reference per group, outputs poisoned with NaN first, empty groups,
one group holding every row, groups of one row, T not a multiple of anything, fp16 / bf16 activations and
NVFP4 A, every output dtype, per-group alpha, forced split counts, the same bits as the dense sm90 mm per group,
garbage routing staying inside C, and a CUDA graph replayed while the routing changes."""
from __future__ import annotations

import ctypes
import os
import random
import sys
import zlib

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.formats import round_up, to_blocked
from nvfp4_gemm.testing import Reference
from conftest import backend_skip_reason


def _skip_reason():
    reason = backend_skip_reason("sm90")
    if reason is not None:
        return reason
    if not hasattr(torch.ops.nvfp4_gemm, "_sm90_grouped_test"):
        return "this build's _C_sm90 has no grouped kernels"
    return None


_reason = _skip_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
E2M1 = "e2m1"
CONFIGS = (-1, 0, 1)  # select's pick, the 8- and 16-token configs
# The wgmma configs (64-, 128-, 80-, 256-, 160- and 32-row token tiles of 128 weight rows, then 80- and 128-row token
# tiles of 256 weight rows: four consumer warpgroups), by index and name.
WGMMA_CONFIGS = {2: "sm90_nvfp4_grouped_w128xt64xk256_s4_b1_ws_rs", 3: "sm90_nvfp4_grouped_w128xt128xk128_s5_b1_ws_rs",
                 4: "sm90_nvfp4_grouped_w128xt80xk256_s3_b1_ws_rs", 5: "sm90_nvfp4_grouped_w128xt256xk128_s3_b1_ws_rs",
                 6: "sm90_nvfp4_grouped_w128xt160xk128_s4_b1_ws_rs", 7: "sm90_nvfp4_grouped_w128xt32xk256_s6_b1_ws_rs",
                 8: "sm90_nvfp4_grouped_w256xt80xk128_s5_b1_ws_rs", 9: "sm90_nvfp4_grouped_w256xt128xk128_s4_b1_ws_rs"}
WGMMA_IDS = {2: "t64", 3: "t128", 4: "t80", 5: "t256", 6: "t160", 7: "t32", 8: "w256t80", 9: "w256t128"}
# The dense configs whose pipelines they share.
DENSE_OF = {2: "sm90_nvfp4_w128xt64xk256_s4_b1_ws_rs", 3: "sm90_nvfp4_w128xt128xk128_s5_b1_ws_rs",
            5: "sm90_nvfp4_w128xt256xk128_s3_b1_ws_rs", 7: "sm90_nvfp4_w128xt32xk256_s6_b1_ws_rs"}


@pytest.fixture(autouse=True)
def _automatic_splits():
    yield
    torch.ops.nvfp4_gemm._sm90_grouped_force_splits(0)


def _scales(shape, g, kind="typical"):
    """e4m3 bytes over many binades ('typical' 2^-6 .. 2^3, every mantissa; 'tiny' zero and subnormal)."""
    lo, hi = {"typical": (1, 11), "tiny": (0, 3)}[kind]
    exp = torch.randint(lo, hi, shape, device="cuda", generator=g)
    man = torch.randint(0, 8, shape, device="cuda", generator=g)
    bits = ((exp << 3) | man).to(torch.uint8)
    if kind == "tiny":
        bits[torch.rand(shape, device="cuda", generator=g) < 0.15] = 0
    return bits.view(torch.float8_e4m3fn)


def make_grouped(counts, n, k, a_kind, *, out_dtype=F16, alpha=True, seed=0, scales="typical", extra_sfa_rows=0):
    """Random grouped inputs: B [G, N, K/2] (all 16 codes), per-group blocked sfb, A either 16-bit activations
    over eight binades (with zeros) or packed NVFP4 with the grouped blocked sfa (each group's rows blocked on
    their own from a 128-row boundary), offs the cumulative counts, alpha [G] of both signs."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    G, T = len(counts), sum(counts)
    b = torch.randint(0, 256, (G, n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    sfb = torch.stack([to_blocked(_scales((n, k // 16), gen, scales)) for _ in range(G)])
    starts = [sum(counts[:i]) for i in range(G)]
    sfa, sfa_rows, group_sfa = None, 0, [None] * G
    if a_kind == E2M1:
        a = torch.randint(0, 256, (T, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
        lin = _scales((T, k // 16), gen, scales)
        parts = []
        for i, (s, m) in enumerate(zip(starts, counts)):
            if m:
                group_sfa[i] = to_blocked(lin[s:s + m])
                parts.append(group_sfa[i].view(torch.uint8))
        sfa_rows = max(128, sum(round_up(m, 128) for m in counts)) + extra_sfa_rows
        kp = round_up(k // 16, 4)
        flat = torch.zeros(sfa_rows * kp, dtype=torch.uint8, device="cuda")
        used = torch.cat(parts) if parts else flat[:0]
        flat[:used.numel()] = used
        sfa = flat.view(torch.float8_e4m3fn)
    else:
        a = torch.randn(T, k, device="cuda", generator=gen) * torch.exp2(
            torch.randint(-4, 4, (T, k), device="cuda", generator=gen).float())
        a[torch.rand(T, k, device="cuda", generator=gen) < 0.05] = 0.0
        a = a.to(a_kind)
    al = None
    if alpha:
        al = (torch.rand(G, device="cuda", generator=gen) + 0.25) * torch.where(
            torch.rand(G, device="cuda", generator=gen) < 0.3, -1.0, 1.0)
    offs = torch.tensor([s + m for s, m in zip(starts, counts)], dtype=torch.int32, device="cuda")
    return dict(a=a, b=b, sfa=sfa, sfb=sfb, offs=offs, alpha=al, out_dtype=out_dtype, sfa_rows=sfa_rows,
                counts=list(counts), starts=starts, group_sfa=group_sfa)


def run_grouped(x, config=-1, out=None):
    T, n = x["a"].shape[0], x["b"].shape[1]
    if out is None:
        out = torch.full((T, n), float("nan"), dtype=x["out_dtype"], device="cuda")
    torch.ops.nvfp4_gemm._sm90_grouped_test(x["a"], x["b"], x["sfa"], x["sfb"], x["offs"], x["alpha"], out, config,
                                            x["sfa_rows"])
    return out


def check_grouped(x, out, context=""):
    """Every group's rows against docs/CONTRACT.md's reference of that group alone (NaN poison: unwritten rows fail)."""
    k = x["b"].shape[2] * 2
    for i, (s, m) in enumerate(zip(x["starts"], x["counts"])):
        if m == 0:
            continue
        inputs = dict(a=x["a"][s:s + m], b=x["b"][i], sfa=x["group_sfa"][i], sfb=x["sfb"][i],
                      alpha=None if x["alpha"] is None else x["alpha"][i:i + 1], out_dtype=x["out_dtype"])
        Reference(inputs).check(out[s:s + m], f"{context} group {i} rows [{s}, {s + m}) k {k}")


def random_counts(rng, G, T, skew):
    """T rows over G groups: uniform, or skewed (a few groups take most, many stay empty)."""
    w = [rng.paretovariate(0.7) if skew else 1.0 for _ in range(G)]
    counts = [0] * G
    for _ in range(T):
        counts[rng.choices(range(G), weights=w)[0]] += 1
    return counts


def test_api_table_registered():
    addr = torch.ops.nvfp4_gemm._grouped_api_sm90()
    assert addr != 0
    assert ctypes.c_int32.from_address(addr).value == 3  # kGroupedAbiVersion, the table's first field


@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
def test_random_routings(a_kind):
    """Random G, N, K (K % 256 == 0), T (not a multiple of anything), routing uniform or skewed (empty groups),
    every output dtype, alpha or none, each config."""
    rng = random.Random(4011 + zlib.crc32(str(a_kind).encode()))  # the same cases in every process
    for case in range(12):
        G = rng.choice([1, 2, 3, 8, 17, 64])
        n = rng.choice([8, 120, 128, 136, 384, 1000])
        k = 256 * rng.choice([1, 2, 3, 7, 12])
        T = rng.choice([1, 3, 7, 13, 37, 61, 133])
        counts = random_counts(rng, G, T, skew=rng.random() < 0.5)
        out_dtype = rng.choice([F16, BF16, F32])
        alpha = rng.random() < 0.7
        config = CONFIGS[case % len(CONFIGS)]
        x = make_grouped(counts, n, k, a_kind, out_dtype=out_dtype, alpha=alpha, seed=case)
        out = run_grouped(x, config)
        check_grouped(x, out, f"case {case} G {G} N {n} T {T} counts {counts} out {out_dtype} config {config}")


@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
@pytest.mark.parametrize("shape", ["one_group_all", "last_group_all", "ones", "one_row", "sparse", "wide_group"])
def test_edge_routings(a_kind, shape):
    n, k = 264, 512
    counts = {
        "one_group_all": [0, 0, 0, 0, 41, 0, 0, 0, 0],
        "last_group_all": [0] * 8 + [23],
        "ones": [1] * 9,
        "one_row": [0, 1, 0, 0, 0, 0, 0, 0, 0],
        "sparse": [2, 0, 0, 5, 0, 1, 0, 0, 3],
        "wide_group": [1, 0, 150, 2, 0, 0, 0, 0, 1],  # a group spanning two 128-row sfa blocks
    }[shape]
    for config in CONFIGS:
        x = make_grouped(counts, n, k, a_kind, out_dtype=F32, seed=len(shape) + config)
        check_grouped(x, run_grouped(x, config), f"{shape} config {config}")


@pytest.mark.parametrize("a_kind", [F16, E2M1], ids=["f16", "e2m1"])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("config", [0, 1], ids=["t8", "t16"])
def test_forced_splits(a_kind, splits, config):
    """Split-K over CTAs (partials summed in split order by the last arriver), K 14 stages: uneven splits; a group
    of 21 rows gives the 16-token config a chunk of 5 rows beside a full one."""
    torch.ops.nvfp4_gemm._sm90_grouped_force_splits(splits)
    x = make_grouped([3, 0, 1] if config == 0 else [3, 21, 1], 136, 256 * 14, a_kind, out_dtype=F32, seed=splits)
    first = run_grouped(x, config)
    check_grouped(x, first, f"splits {splits} config {config}")
    again = run_grouped(x, config)
    assert torch.equal(first, again), "split sums differ between two runs"


def test_tiny_scales_and_bf16_out():
    x = make_grouped([5, 0, 2, 9], 256, 1024, BF16, out_dtype=BF16, scales="tiny", seed=3)
    check_grouped(x, run_grouped(x), "tiny scales")
    x = make_grouped([5, 0, 2, 9], 256, 1024, E2M1, out_dtype=F16, scales="tiny", seed=4)
    check_grouped(x, run_grouped(x), "tiny scales e2m1")


@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
@pytest.mark.parametrize("config", [0, 1], ids=["t8", "t16"])
def test_many_items_per_cta(a_kind, config):
    """Many short work items per CTA (N 8192: 64 row blocks; K of one and two stages): 207 rows over 18 groups make
    34 / 23 chunks of 8 / 16 rows, 2176 / 1472 items over 264 CTAs on an H100 / H200, more per CTA than its item
    ring (s_items: 5 / 4 entries) holds, the producer stages and items ahead."""
    counts = [5, 0, 9, 1, 40, 3, 0, 2, 17, 8, 8, 30, 12, 25, 7, 33, 1, 6]
    for k in (256, 512):
        x = make_grouped(counts, 8192, k, a_kind, out_dtype=BF16, seed=k + config)
        check_grouped(x, run_grouped(x, config), f"counts {counts} k {k} config {config}")


@pytest.mark.parametrize("a_kind", [BF16, E2M1], ids=["bf16", "e2m1"])
def test_select_rows_per_group(a_kind):
    """select by average rows per group: T < 8 G (the 8-token config) and from 8 G (the 16-token config),
    groups of tens of rows beside empty and one-row groups; each against the reference."""
    for counts in ([9, 0, 14, 1], [20, 0, 19, 1], [70, 0, 1, 33], [150, 0, 40, 90]):
        x = make_grouped(counts, 264, 768, a_kind, out_dtype=BF16, seed=sum(counts))
        check_grouped(x, run_grouped(x), f"select counts {counts}")


@pytest.mark.parametrize("config", sorted(WGMMA_CONFIGS), ids=[WGMMA_IDS[c] for c in sorted(WGMMA_CONFIGS)])
@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
def test_wgmma_config_random_routings(a_kind, config):
    """A wgmma config on routings of tens to hundreds of rows per group (uniform and skewed: empty groups, one
    group holding most rows, groups of one row), T not a multiple of 64, N not a multiple of 128, every output dtype,
    alpha or none; and select takes the 64-token one from 24 rows per group on average."""
    rng = random.Random(40 + config)
    for case in range(10):
        G = rng.choice([1, 3, 8, 33])
        T = rng.randint(1, 200 * G)
        n = rng.choice([136, 256, 392])
        k = 256 * rng.choice([1, 3, 8])
        counts = random_counts(rng, G, T, skew=case % 2 == 1)
        out_dtype = (F16, BF16, F32)[case % 3]
        x = make_grouped(counts, n, k, a_kind, out_dtype=out_dtype, alpha=case % 4 != 0, seed=100 + case)
        check_grouped(x, run_grouped(x, config), f"case {case} G {G} N {n} K {k} counts {counts} out {out_dtype}")
    counts = [100, 0, 1, 60]
    x = make_grouped(counts, 256, 512, a_kind, out_dtype=F16, seed=3)
    with nvfp4_gemm.testing.recorded_choices() as lines:
        out = nvfp4_gemm.grouped_mm(x["a"], x["b"], x["sfa"], x["sfb"], x["offs"], alpha=x["alpha"], out_dtype=F16)
    check_grouped(x, out, "select")
    assert any(WGMMA_CONFIGS[2] in line for line in lines), lines


@pytest.mark.parametrize("a_kind", [BF16, E2M1], ids=["bf16", "e2m1"])
def test_select_wgmma_tile_by_rows_per_group(a_kind):
    """select's wgmma tiles by average rows per group (grouped_backend.cu): the 32-token one from 20, the 64-token
    one from 28, the 80-token one from 56, the 128-token one from 80 (both over 256 weight rows, as N = 264 > 128),
    the 160-token one from 120 (one tile holds a group of ~128 whole), the 256-token one from 160; each against the
    reference."""
    for counts, config in (([20, 30, 25, 21], 7), ([40, 0, 30, 50], 2), ([70, 0, 60, 100], 8),
                           ([100, 0, 150, 130], 9), ([130, 120, 125, 135], 6), ([300, 0, 200, 200], 5)):
        x = make_grouped(counts, 264, 512, a_kind, out_dtype=BF16, seed=sum(counts))
        with nvfp4_gemm.testing.recorded_choices() as lines:
            out = nvfp4_gemm.grouped_mm(x["a"], x["b"], x["sfa"], x["sfb"], x["offs"], alpha=x["alpha"],
                                        out_dtype=BF16)
        check_grouped(x, out, f"select counts {counts}")
        assert any(WGMMA_CONFIGS[config] in line for line in lines), (counts, lines)


@pytest.mark.parametrize("config,counts", [(6, [128, 117, 139, 0, 160, 161, 1, 125, 150]),
                                           (7, [16, 32, 33, 0, 24, 1, 31, 17, 20, 64])], ids=["t160", "t32"])
@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
def test_wgmma_tiles_160_and_32_on_their_groups(a_kind, config, counts):
    """The 160- and 32-token wgmma tiles forced on the groups they are meant for: the 160-token one on groups of
    ~128 +- 11 rows (one tile each; 160 rows fill it, 161 spill one row into a second tile), the 32-token one on 16-32
    rows (32 fill it, 33 and 64 take two tiles); an empty group and a one-row group beside them, N not a multiple of
    128, every output dtype, against the reference."""
    for i, out_dtype in enumerate((F16, BF16, F32)):
        x = make_grouped(counts, 264, 1280, a_kind, out_dtype=out_dtype, alpha=i != 2, seed=70 + i)
        check_grouped(x, run_grouped(x, config), f"config {config} counts {counts} out {out_dtype}")


# The 256-row weight tiles' groups: each token tile's size filled (80, 128) and spilled by one row (81, 129), an empty
# and a one-row group beside groups of a few tiles.
W256_COUNTS = {8: [80, 81, 0, 1, 64, 72, 160, 17], 9: [128, 117, 129, 0, 1, 139, 256, 40]}


@pytest.mark.parametrize("n", [384, 640, 264, 136])
@pytest.mark.parametrize("config", [8, 9], ids=["w256t80", "w256t128"])
@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
def test_wgmma_256_row_tiles_on_their_groups(a_kind, config, n):
    """The 256-row weight tiles (four consumer warpgroups) forced on groups that fill a token tile and spill one row
    past it, against the reference, every output dtype. N = 384, 640 and 264 end in a tail tile whose second 128-row
    scale block lies past the group's scales (its box reloads the group's last block; those rows are B's zero fill and
    never stored); N = 136 ends inside the second block."""
    for i, out_dtype in enumerate((F16, BF16, F32)):
        x = make_grouped(W256_COUNTS[config], n, 1280, a_kind, out_dtype=out_dtype, alpha=i != 2, seed=90 + i)
        check_grouped(x, run_grouped(x, config), f"config {config} N {n} counts {x['counts']} out {out_dtype}")


@pytest.mark.parametrize("config,narrow", [(9, 3), (8, 4)], ids=["w256t128-vs-t128", "w256t80-vs-t80"])
@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
def test_wgmma_256_row_tiles_same_bits_as_128_row(a_kind, config, narrow):
    """A 256-row weight tile's outputs are bit for bit the 128-row tile's: each output's sum is one consumer
    warpgroup's, over the same decoded B and A, in the same K order (64-K blocks, four k16 steps each, one accumulator
    at 80 tokens and more), whatever the stage width (KT 128 against 256 at 80 tokens) or the fragment sets (one at
    128 tokens). Outputs poisoned (NaN) first."""
    for n in (384, 640, 136):
        for out_dtype in (F32, BF16):
            x = make_grouped(W256_COUNTS[config], n, 1024, a_kind, out_dtype=out_dtype, seed=n)
            wide, ref = run_grouped(x, config), run_grouped(x, narrow)
            assert torch.equal(wide, ref), f"N {n} out {out_dtype}: {WGMMA_CONFIGS[config]} != {WGMMA_CONFIGS[narrow]}"


@pytest.mark.parametrize("config", sorted(DENSE_OF), ids=[WGMMA_IDS[c] for c in sorted(DENSE_OF)])
@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
def test_wgmma_config_same_bits_as_dense_mm(a_kind, config):
    """Each group's rows are bit for bit the dense wgmma config's of the same pipeline on that group alone (one
    split): the same decode, the same tiles from the group's first row, the same MMA order, alpha and rounding."""
    x = make_grouped([70, 0, 129, 1, 64, 300], 264, 1024, a_kind, out_dtype=BF16, seed=21)
    out = run_grouped(x, config)
    with nvfp4_gemm.testing.forced(backend="sm90", config=DENSE_OF[config], splits=1):
        for i, (s, m) in enumerate(zip(x["starts"], x["counts"])):
            if m == 0:
                continue
            dense = nvfp4_gemm.mm(x["a"][s:s + m], x["b"][i], x["group_sfa"][i], x["sfb"][i], x["alpha"][i:i + 1],
                                  out_dtype=BF16)
            assert torch.equal(out[s:s + m], dense), f"group {i}: grouped wgmma != dense {DENSE_OF[config]}"


def test_wgmma_config_refuses_too_many_groups():
    x = make_grouped([1] * 513, 128, 256, BF16)
    for config in WGMMA_CONFIGS:
        with pytest.raises(RuntimeError, match="at most 512 groups, got 513"):
            run_grouped(x, config)


@pytest.mark.parametrize("a_kind", [F16, BF16, E2M1], ids=["f16", "bf16", "e2m1"])
def test_same_bits_as_dense_mm(a_kind, monkeypatch):
    """With one split per tile, each group's rows are bit for bit the dense sm90 K-sliced kernel's (one split) on
    that group alone: same decode, same MMA order, same slice sums, same alpha and rounding."""
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm90")
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)
    x = make_grouped([4, 0, 16, 1, 9], 384, 2048, a_kind, out_dtype=F16, seed=11)
    torch.ops.nvfp4_gemm._sm90_grouped_force_splits(1)
    with nvfp4_gemm.testing.forced(backend="sm90", splits=1):
        for config in (0, 1):
            out = run_grouped(x, config)
            for i, (s, m) in enumerate(zip(x["starts"], x["counts"])):
                if m == 0:
                    continue
                dense = nvfp4_gemm.mm(x["a"][s:s + m], x["b"][i], x["group_sfa"][i], x["sfb"][i],
                                      x["alpha"][i:i + 1], out_dtype=F16)
                assert torch.equal(out[s:s + m], dense), f"config {config} group {i}: grouped != dense mm"


def test_empty_and_zero_rows():
    """Every group empty but one row-less T: T = 0 writes nothing; all-empty-but-last routings write every row."""
    x = make_grouped([0, 0, 0], 128, 256, F16, seed=1)
    out = run_grouped(x)
    assert out.shape == (0, 128)
    x = make_grouped([0, 0, 0], 128, 256, E2M1, seed=1)
    assert run_grouped(x).shape == (0, 128)


@pytest.mark.parametrize("a_kind", [F16, E2M1], ids=["f16", "e2m1"])
def test_garbage_offsets_stay_in_bounds(a_kind):
    """Decreasing, negative and past-T offsets: clamped on the device, no fault, nothing written outside C
    (guard rows around the output keep their poison)."""
    x = make_grouped([3, 5, 2, 6], 136, 512, a_kind, out_dtype=F32, seed=5)
    T, n = 16, 136
    for offs in ([9, 4, 20, 16], [-5, 3, 99, 2], [16, 16, 16, 16], [0, 0, 0, 0], [2**31 - 1, -2**31, 7, 16]):
        x["offs"] = torch.tensor(offs, dtype=torch.int32, device="cuda")
        buf = torch.full((T + 64, n), -7.0, dtype=F32, device="cuda")
        out = buf[32:32 + T]
        for config in (0, *WGMMA_CONFIGS):
            run_grouped(x, config, out=out)
            torch.cuda.synchronize()
            assert (buf[:32] == -7.0).all() and (buf[32 + T:] == -7.0).all(), f"offs {offs}: wrote outside C"


@pytest.mark.parametrize("config", [0, 1, 2, 3, 4, 6, 7, 8, 9],
                         ids=["t8", "t16", "wgmma64", "wgmma128", "wgmma80", "wgmma160", "wgmma32", "w256t80",
                              "w256t128"])
def test_sfa_too_small_for_routing_gives_nan_rows(config):
    """The routing needs 384 padded sfa rows but the buffer holds 128 (the binding cannot see offs): group 0's rows
    are right, groups 1 and 2 (whose scales start at padded rows 128 and 256) come out NaN, never read past."""
    x = make_grouped([60, 30, 10], 136, 512, E2M1, seed=11)
    kp = round_up(512 // 16, 4)
    x["sfa"] = x["sfa"].view(torch.uint8)[:128 * kp].clone().view(torch.float8_e4m3fn)
    x["sfa_rows"] = 128
    out = run_grouped(x, config)
    torch.cuda.synchronize()
    assert torch.isnan(out[60:].float()).all()
    x["counts"], x["starts"] = [60], [0]
    check_grouped(x, out, f"config {config}")


@pytest.mark.parametrize("a_kind,config", [(BF16, 0), (E2M1, 0), (BF16, 2), (F16, 3), (E2M1, 2)],
                         ids=["bf16", "e2m1", "bf16-t64", "f16-t128", "e2m1-t64"])
def test_graph_replay_follows_routing(a_kind, config):
    """A captured grouped call replayed after offs changed in place: each replay follows its routing (the work
    list is built on the device)."""
    G, n, k = 6, 256, 1024  # K 4 stages: two automatic splits of 2 (the capture's split counters)
    routings = [[2, 0, 5, 1, 0, 4], [0, 12, 0, 0, 0, 0], [1, 1, 1, 1, 1, 7], [0, 0, 0, 0, 0, 12]]
    cap = round_up(12 + G * 127, 128)  # sfa capacity for any routing of 12 rows over 6 groups (common/grouped.h)
    # Same seed: same B and scales; one sfa capacity, so each routing's sfa can be copied into the captured buffer.
    xs = [make_grouped(c, n, k, a_kind, out_dtype=F16, seed=0,
                       extra_sfa_rows=cap - max(128, sum(round_up(m, 128) for m in c))) for c in routings]
    x = xs[0]
    offs = x["offs"].clone()
    sfa = None if x["sfa"] is None else x["sfa"].clone()
    out = torch.full((12, n), float("nan"), dtype=F16, device="cuda")
    run_grouped(dict(x, offs=offs, sfa=sfa), config, out=out)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_grouped(dict(x, offs=offs, sfa=sfa), config, out=out)
    for xi in xs:
        offs.copy_(xi["offs"])
        x["a"].copy_(xi["a"])
        if sfa is not None:
            sfa.copy_(xi["sfa"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_grouped(xi, out, f"replay with counts {xi['counts']}")


def test_refusals_name_the_reason():
    x = make_grouped([2, 3], 128, 256, F16)
    x32 = dict(x, a=x["a"].float())
    with pytest.raises(RuntimeError, match="float32 activations"):
        run_grouped(x32, 0, out=torch.empty(5, 128, dtype=F16, device="cuda"))
    y = make_grouped([2, 3], 128, 288, F16)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        run_grouped(y, 0)


def test_many_groups_decode_shape():
    """A decode step of a 256-expert layer: 16 tokens x top-8 = 128 rows over 256 experts (most groups empty or
    of one row), K 7168, NVFP4 and bf16 A."""
    rng = random.Random(7)
    counts = [0] * 256
    for _ in range(16):
        for e in rng.sample(range(256), 8):
            counts[e] += 1
    for a_kind in (BF16, E2M1):
        x = make_grouped(counts, 512, 7168, a_kind, out_dtype=BF16, seed=2)
        check_grouped(x, run_grouped(x), f"decode 256 experts {a_kind}")


@pytest.mark.skipif(not hasattr(nvfp4_gemm, "grouped_mm"), reason="nvfp4_gemm.grouped_mm not in this build yet")
@pytest.mark.parametrize("a_kind", [F16, E2M1], ids=["f16", "e2m1"])
def test_public_op_on_sm90(a_kind, monkeypatch):
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm90")
    x = make_grouped([3, 0, 9, 1], 256, 1024, a_kind, out_dtype=F16, seed=9)
    out = nvfp4_gemm.grouped_mm(x["a"], x["b"], x["sfa"], x["sfb"], x["offs"], alpha=x["alpha"], out_dtype=F16)
    check_grouped(x, out, "grouped_mm")


def test_workspace_counters_and_sanitize_cases(capsys):
    """The sanitizer case script (empty groups, one group holding every row, groups of one row, T = 37, a group over
    two sfa blocks, forced splits, garbage routing) with the counter slots off, so that split launches count on
    workspace counters zeroed ahead of them (the path taken once a process's slots run out)."""
    import runpy

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "benchmarks", "diagnostics", "sm90_grouped_sanitize_cases.py")
    prev = torch.ops.nvfp4_gemm._sm90_grouped_workspace_counters(True)
    argv = sys.argv
    try:
        sys.argv = [script]
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
        torch.ops.nvfp4_gemm._sm90_grouped_workspace_counters(prev)
    assert "sm90 grouped sanitize cases ran" in capsys.readouterr().out
