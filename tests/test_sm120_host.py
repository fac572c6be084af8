"""SM120 / SM121 kernels verified on the host, without such a GPU.

Each test compiles a small C++ program from tests/sm120_host/ against the headers the kernels use
(csrc/sm120/operands.h, sm120_gemm.cuh, the generated table) and runs it on the CPU:
  layout_test:         CUTLASS's SF layouts as the SM120 launcher builds them == docs/CONTRACT.md's blocked offsets;
  reference_test:      CUTLASS's host block-scaled GEMM over the launcher's operands == reference_mm, and
                       CUTLASS's view of every e2m1 element == nvfp4_gemm.dequantize (nibble order);
  can_implement_test:  every table entry passes CUTLASS's can_implement where the table picks it (RTX 5090,
                       RTX PRO 6000, GB10 SM counts), and refusals come back as messages.
Nothing here runs a kernel; nothing here says anything about SM120 timing or that the kernels ran.
"""
from __future__ import annotations

import os
import struct
import subprocess

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import check_against_reference, make_inputs
from sm120_host import tools
# The SM100 host test's cases and file helpers: the same docs/CONTRACT.md corner cases run through both launchers.
from test_sm100_host import _DT_CODE, REFERENCE_CASES, _padded, _read, _write

pytestmark = pytest.mark.skipif(tools.find_nvcc() is None, reason="nvcc not found: the SM120 host checks compile C++ with it")


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
        "can_implement_test", "can_implement_test.cu", cpp=("csrc/sm120/api.cpp", "csrc/sm120/select.cpp"),
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


@pytest.mark.parametrize("case,pad", REFERENCE_CASES, ids=[f"{c.id}-pad{p}" for c, p in REFERENCE_CASES])
def test_cutlass_host_reference_agrees(reference_exe, tmp_path, case, pad):
    inp = make_inputs(case, seed=case.m * 37 + case.k)
    m, n, k = case.m, case.n, case.k
    a, b = _padded(inp["a"].view(torch.uint8), pad), _padded(inp["b"].view(torch.uint8), 2 * pad)
    ldc = n + (8 if pad else 0)
    alpha = 1.0 if inp["alpha"] is None else float(inp["alpha"].item())
    d = tmp_path
    with open(d / "meta.txt", "w") as f:
        f.write(f"{m} {n} {k} {a.shape[1]} {b.shape[1]} {ldc} {_DT_CODE[case.out_dtype]}\n")
    _write(d / "a.bin", a)
    _write(d / "b.bin", b)
    _write(d / "sfa.bin", inp["sfa"])
    _write(d / "sfb.bin", inp["sfb"])
    with open(d / "alpha.bin", "wb") as f:
        f.write(struct.pack("<f", alpha))
    # Poison: a d.bin left from anything else must not pass for the program's output.
    with open(d / "d.bin", "wb") as f:
        f.write(b"\xff" * (m * ldc * torch.finfo(case.out_dtype).bits // 8))
    _run(reference_exe, str(d))

    # C = what CUTLASS's reference computed through the SM120 launcher's operand description.
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
