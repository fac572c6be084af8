"""SM100 kernels verified on the host, without a Blackwell GPU (issue 3, checks c, d, e).

Each test compiles a small C++ program from tests/sm100_host/ against the headers the kernels use
(csrc/sm100/operands.h, sm100_gemm.cuh, the generated table) and runs it on the CPU:
  (c) layout_test:         CUTLASS's SF layouts as the launcher builds them == docs/CONTRACT.md's blocked offsets;
  (d) reference_test:      CUTLASS's host block-scaled GEMM over the launcher's operands == reference_mm,
                           and CUTLASS's view of every e2m1 element == nvfp4_gemm.dequantize (nibble order);
  (e) can_implement_test:  every table entry passes CUTLASS's can_implement where the table picks it, and
                           refusals come back as messages.
Nothing here runs a kernel; nothing here says anything about SM100 timing.
"""
from __future__ import annotations

import ctypes
import os
import struct
import subprocess

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, check_against_reference, make_inputs
from sm100_host import tools

pytestmark = pytest.mark.skipif(tools.find_nvcc() is None, reason="nvcc not found: the SM100 host checks compile C++ with it")


_cutlass_or_skip = tools.cutlass_or_skip


@pytest.fixture(scope="module")
def layout_exe():
    _cutlass_or_skip()
    return tools.build_host_program("layout_test", "layout_test.cu")


@pytest.fixture(scope="module")
def reference_exe():
    _cutlass_or_skip()
    return tools.build_host_program("reference_test", "reference_test.cu")


@pytest.fixture(scope="module")
def can_implement_exe():
    _cutlass_or_skip()
    return tools.build_host_program(
        "can_implement_test", "can_implement_test.cu", cpp=("csrc/sm100/api.cpp", "csrc/sm100/select.cpp"),
        device_flags=True,
    )


def _run(exe: str, *args: str) -> str:
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)
    print(p.stdout)
    assert p.returncode == 0, f"{os.path.basename(exe)} failed:\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def test_sf_layout_matches_spec(layout_exe):
    out = _run(layout_exe)
    assert "layout_test: OK" in out


def test_can_implement_every_dispatch_entry(can_implement_exe):
    out = _run(can_implement_exe)
    assert "can_implement_test: OK" in out
    assert "can_implement refused" in out and "this kernel needs K % 32 == 0" in out


# docs/CONTRACT.md "Checking numbers": M not a multiple of 128, K/16 not a multiple of 4, M = 1, N = 8, all output
# dtypes, alpha, zero / subnormal / large (inf) / NaN scales; padded rows (lda, ldb > K/2; ldc > N).
REFERENCE_CASES = [
    (Case(1, 8, 32), 0),
    (Case(1, 264, 96, torch.bfloat16, alpha=0.75), 16),
    (Case(3, 16, 160, torch.float32), 0),
    (Case(127, 24, 544, alpha=2.0), 32),
    (Case(129, 136, 1056, torch.bfloat16), 0),
    (Case(200, 72, 512, torch.float32, alpha=0.3125), 16),
    (Case(64, 40, 256, scales="tiny"), 0),
    (Case(130, 48, 288, scales="large"), 0),
    (Case(130, 48, 288, torch.float32, scales="large"), 16),
    (Case(70, 32, 512, torch.bfloat16, scales="nan"), 0),
    (Case(256, 256, 1024), 0),
]

_DT_CODE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def _write(path, t: torch.Tensor) -> None:
    b = t.contiguous().view(torch.uint8).reshape(-1)
    with open(path, "wb") as f:
        f.write(ctypes.string_at(b.data_ptr(), b.numel()))


def _read(path, dtype: torch.dtype) -> torch.Tensor:
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).view(dtype)


def _padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """Rows `pad` bytes longer than the data (junk in the gap), as a non-contiguous caller buffer."""
    if pad == 0:
        return t
    g = torch.Generator().manual_seed(7)
    full = torch.randint(0, 256, (t.shape[0], t.shape[1] + pad), dtype=torch.uint8, generator=g)
    full[:, : t.shape[1]] = t.view(torch.uint8)
    return full


@pytest.mark.parametrize("swap", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("case,pad", REFERENCE_CASES, ids=[f"{c.id}-pad{p}" for c, p in REFERENCE_CASES])
def test_cutlass_host_reference_agrees(reference_exe, tmp_path, case, pad, swap):
    inp = make_inputs(case, seed=case.m * 31 + case.k)
    m, n, k = case.m, case.n, case.k
    a, b = _padded(inp["a"].view(torch.uint8), pad), _padded(inp["b"].view(torch.uint8), 2 * pad)
    ldc = n + (8 if pad else 0)
    alpha = 1.0 if inp["alpha"] is None else float(inp["alpha"].item())
    d = tmp_path
    with open(d / "meta.txt", "w") as f:
        f.write(f"{m} {n} {k} {a.shape[1]} {b.shape[1]} {ldc} {int(swap)} {_DT_CODE[case.out_dtype]}\n")
    _write(d / "a.bin", a)
    _write(d / "b.bin", b)
    _write(d / "sfa.bin", inp["sfa"])
    _write(d / "sfb.bin", inp["sfb"])
    with open(d / "alpha.bin", "wb") as f:
        f.write(struct.pack("<f", alpha))
    _run(reference_exe, str(d))

    # C = what CUTLASS's reference computed through the launcher's operand description.
    out = _read(d / "d.bin", case.out_dtype).reshape(m, ldc)[:, :n]
    check_against_reference(out, inp)
    ref = nvfp4_gemm.reference_mm(inp["a"], inp["b"], inp["sfa"], inp["sfb"], alpha=inp["alpha"], out_dtype=case.out_dtype)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))

    # Nibble order and scale mapping, element by element: CUTLASS's float_e2m1_t view x its SF tensor.
    for name, packed, sf, rows in (("a", inp["a"], inp["sfa"], m), ("b", inp["b"], inp["sfb"], n)):
        got = _read(d / f"deq_{name}.bin", torch.float32).reshape(rows, k)
        want = nvfp4_gemm.dequantize(packed, sf, k, torch.float32)
        same = (got == want) | (torch.isnan(got) & torch.isnan(want))
        assert same.all(), (
            f"operand {name}: CUTLASS reads {int((~same).sum())} elements differently from dequantize, first at "
            f"{(~same).nonzero()[0].tolist()}"
        )
