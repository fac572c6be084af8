"""nvfp4_gemm.mm against reference_mm on generated cases, for every backend available here."""
from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, case_seed, check_against_reference, make_inputs, poison_cuda_allocator

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

CASES = [
    # M edge values: 1, odd, exactly one 128-row atom, partial second atom; K/16 = 6, 2, 20 (not % 4).
    *[Case(m, 64, 96) for m in (1, 7, 128, 300)],
    Case(1, 8, 32),                                  # smallest N and K
    Case(33, 8, 320),                                # N = 8, K/16 = 20
    Case(130, 136, 256, F32),
    Case(64, 256, 1024, BF16),
    Case(300, 264, 544, F16, alpha=0.37),            # K/16 = 34
    Case(5, 72, 2048, F32, alpha=-1.75),
    Case(256, 512, 1536, BF16, alpha=3.0),
    # scale views and data dtypes
    Case(300, 64, 96, F16, sf_view="2d"),
    Case(300, 64, 96, BF16, sf_view="6d"),
    Case(129, 128, 192, F32, sf_view="6d", data_dtype="fp4x2"),
    Case(7, 64, 96, F16, data_dtype="fp4x2", sf_view="2d"),
    # special scales: zero and subnormal, up to 448 with overflow, NaN
    Case(65, 96, 320, F16, scales="tiny"),
    Case(65, 96, 320, F32, scales="tiny"),
    Case(40, 64, 2048, F16, scales="large"),         # fp16 overflows to +-inf
    Case(40, 64, 2048, BF16, scales="large"),
    Case(40, 64, 2048, F32, scales="large", alpha=0.001),
    Case(70, 80, 512, F16, scales="nan"),
    Case(70, 80, 512, F32, scales="nan", alpha=2.0),
]


def case_inputs(case: Case, device) -> dict:
    """The case's data: its seed is a digest of the case id (see test_case_data_is_the_same_in_every_process)."""
    return make_inputs(case, device, seed=case_seed(case))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_mm_matches_reference(backend, case):
    name, device = backend
    seed = case_seed(case)
    inputs = case_inputs(case, device)
    poison_cuda_allocator(case.m * case.n * torch.finfo(case.out_dtype).bits // 8, device)
    out = nvfp4_gemm.mm(**inputs)
    check_against_reference(out, inputs, f"backend {name}, case {case.id}, replay with "
                                         f"make_inputs(case, {str(device)!r}, seed={seed})")


def _inputs_digest(case: Case) -> int:
    inputs = case_inputs(case, "cpu")
    digest = 0
    for key in ("a", "b", "sfa", "sfb"):
        digest = zlib.crc32(inputs[key].contiguous().view(torch.uint8).numpy().tobytes(), digest)
    return digest


def test_case_data_is_the_same_in_every_process():
    """A case's data depends on the case only: another process (another string-hash seed, as each Python
    process gets) generates the same bytes, so a failure seen once replays anywhere."""
    here = os.path.dirname(os.path.abspath(__file__))
    picked = (CASES[0], CASES[9], CASES[-1])
    code = (f"import sys; sys.path.insert(0, {here!r})\n"
            "import test_mm\n"
            f"print([test_mm._inputs_digest(test_mm.CASES[i]) for i in (0, 9, {len(CASES) - 1})])\n")
    other = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"  # this process's is random, or not 1
    env = dict(os.environ, PYTHONHASHSEED=other)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == str([_inputs_digest(c) for c in picked])


def test_empty_m_gives_empty_result(backend):
    _, device = backend
    inputs = make_inputs(Case(1, 16, 64), device)
    inputs["a"] = inputs["a"][:0]
    inputs["sfa"] = torch.zeros(0, dtype=torch.float8_e4m3fn, device=device)
    out = nvfp4_gemm.mm(**inputs)
    assert out.shape == (0, 16) and out.dtype == torch.float16 and out.device.type == device.type


def test_row_strided_views(backend):
    """Row-sliced views with 16-byte row strides are read in place on every backend."""
    _, device = backend
    case = Case(50, 64, 128)
    big = make_inputs(Case(100, 128, 128), device, seed=3)
    inputs = make_inputs(case, device, seed=4)
    inputs["a"] = big["a"][::2]                     # stride 2 rows = 128 bytes
    inputs["b"] = big["b"][::2]
    inputs["sfa"] = nvfp4_gemm.to_blocked(nvfp4_gemm.from_blocked(big["sfa"], 100, 128)[::2].contiguous())
    inputs["sfb"] = nvfp4_gemm.to_blocked(nvfp4_gemm.from_blocked(big["sfb"], 128, 128)[::2].contiguous())
    check_against_reference(nvfp4_gemm.mm(**inputs), inputs)


def test_output_rounded_once_from_fp32_accumulation(backend):
    """A sum whose exact value lies between two fp16 numbers rounds to the nearest one."""
    _, device = backend
    k = 32
    # a = [1, 1, 0...], b = [1024, 0.5 ...]: exact result 1024.5 is a tie in fp16 (spacing 1 at 1024)
    # -> even (1024); 1024 + 0.5 + 0.5 = 1025 exactly. e4m3 0x38 = 1, 0x78 = 2^8.
    codes_a = torch.zeros(8, k, dtype=torch.uint8)
    codes_a[:, 0] = 2   # 1.0
    codes_a[:, 16] = 2  # 1.0, second scale group
    codes_a[1, 17] = 2  # row 1 adds another 1.0 in group 2
    codes_b = torch.zeros(8, k, dtype=torch.uint8)
    codes_b[:, 0] = 6   # 4.0, times scale 2^8 -> 1024
    codes_b[:, 16] = 1  # 0.5, times scale 1
    codes_b[:, 17] = 1
    sfa = torch.full((8, 2), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sfb = torch.tensor([[0x78, 0x38]] * 8, dtype=torch.uint8).view(torch.float8_e4m3fn)  # 2^8, 1
    a, b = nvfp4_gemm.pack_e2m1(codes_a).to(device), nvfp4_gemm.pack_e2m1(codes_b).to(device)
    out = nvfp4_gemm.mm(a, b, nvfp4_gemm.to_blocked(sfa).to(device), nvfp4_gemm.to_blocked(sfb).to(device))
    assert out[0, 0].item() == 1024.0  # 1024.5 ties to even
    assert out[1, 0].item() == 1025.0  # 1025 exact


def test_the_checker_rejects_what_spec_rejects():
    """nvfp4_gemm.testing.Reference (docs/CONTRACT.md's bound) on hand-made outputs: the reference rounded once
    passes; one element off by twice its bound, a NaN where the reference has none, or a finite value where
    even |ref| - bound overflows fails; inf or a value within the bound where only |ref| + bound overflows
    passes."""
    from nvfp4_gemm.testing import Reference

    case = Case(7, 64, 96)
    inputs = make_inputs(case, "cpu", seed=case_seed(case))
    ref = Reference(inputs)
    good = ref.ref.to(torch.float16)
    assert ref.ratio(good)[0] <= 1.0
    off = good.clone()
    off[3, 5] = float(ref.ref[3, 5] + 2 * ref.bound[3, 5])
    assert ref.ratio(off)[0] > 1.0 and "worst at (3, 5)" in ref.ratio(off)[1]
    nan = good.clone()
    nan[0, 0] = float("nan")
    assert ref.ratio(nan)[0] == float("inf") and "NaN mismatch" in ref.ratio(nan)[1]

    # fp16 overflows from 65520 on. Row 0: well past it; row 1: within the bound of it.
    edge = Reference(inputs)
    edge.ref[0, 0], edge.bound[0, 0] = 70000.0, 40.0
    edge.ref[1, 0], edge.bound[1, 0] = 65510.0, 40.0
    out = edge.ref.to(torch.float16)
    out[1, 0] = 65504.0
    assert edge.ratio(out)[0] <= 1.0
    out[1, 0] = float("inf")
    assert edge.ratio(out)[0] <= 1.0
    out[1, 0] = float("-inf")
    assert edge.ratio(out)[0] > 1.0
    out[1, 0] = 65504.0
    out[0, 0] = 65504.0
    assert edge.ratio(out)[0] == float("inf") and "should overflow to inf" in edge.ratio(out)[1]
