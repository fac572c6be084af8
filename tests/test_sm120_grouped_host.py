"""SM120 / SM121 grouped (mixture-of-experts) kernels verified on the host, without such a GPU (issue 42 item 2).

The SM120 grouped kernels take the same per-group arguments as SM100's unswapped form (csrc/common/cutlass_grouped.h;
csrc/sm120/grouped_gemm.cuh static_asserts that its kernel's strides and scale-factor layouts are those types), so
the argument checks are the SM100 host programs (host code only, the same build and cache as
tests/test_sm100_grouped_host.py's):
  grouped_layout_test:         every group's operands and scale-factor layout == docs/CONTRACT.md's grouped layout;
  grouped_reference_test:      CUTLASS's host block-scaled GEMM over the builder's per-group arguments (unswapped)
                               == nvfp4_gemm.grouped_mm on CPU tensors;
and the SM120 table's own:
  grouped_can_implement_test:  the grouped config passes CUTLASS's can_implement wherever the table sends a problem
                               (RTX 5090, RTX PRO 6000, GB10 SM counts), fits 99 KB of shared memory, refusals
                               come back as messages.
Nothing here runs a kernel; nothing here says anything about SM120 timing or that the kernels ran.
"""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing_grouped import grouped_reference, make_grouped_inputs
from sm100_host import tools as sm100_tools
from sm120_host import tools
from test_sm100_grouped_host import REFERENCE_CASES, _host_reference

pytestmark = pytest.mark.skipif(tools.find_nvcc() is None, reason="nvcc not found: the SM120 host checks compile C++ with it")

_cutlass_or_skip = tools.cutlass_or_skip


@pytest.fixture(scope="module")
def glayout_exe():
    _cutlass_or_skip()
    return sm100_tools.build_host_program("grouped_layout_test", "grouped_layout_test.cu")  # host-only: one build


@pytest.fixture(scope="module")
def greference_exe():
    _cutlass_or_skip()
    return sm100_tools.build_host_program("grouped_reference_test", "grouped_reference_test.cu")


@pytest.fixture(scope="module")
def gcan_implement_exe():
    _cutlass_or_skip()
    return tools.build_host_program(
        "grouped_can_implement_test", "grouped_can_implement_test.cu",
        cpp=("csrc/sm120/grouped_api.cpp", "csrc/sm120/select.cpp"), device_flags=True,
    )


def _run(exe: str, *args: str) -> str:
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=900)
    print(p.stdout)
    assert p.returncode == 0, f"{os.path.basename(exe)} failed:\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def test_grouped_operand_layouts_match_spec(glayout_exe):
    assert "grouped_layout_test: OK" in _run(glayout_exe)


def test_grouped_can_implement_every_config(gcan_implement_exe):
    out = _run(gcan_implement_exe)
    assert "grouped_can_implement_test: OK" in out
    assert "ceil(T/G) >= 1: sm120_nvfp4_grouped_128x128x128" in out
    assert "bytes of shared memory" in out


@pytest.mark.parametrize("case,pad", REFERENCE_CASES, ids=[f"{c.id}-pad{p}" for c, p in REFERENCE_CASES])
def test_cutlass_host_reference_agrees_grouped(greference_exe, tmp_path, case, pad):
    inputs = make_grouped_inputs(case, "cpu", seed=case.t * 31 + case.k + case.g)
    out = _host_reference(greference_exe, tmp_path, inputs, False, pad)
    cpu = nvfp4_gemm.grouped_mm(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], inputs["offs"],
                                alpha=inputs["alpha"], out_dtype=case.out_dtype)
    assert torch.equal(torch.isnan(out), torch.isnan(cpu))
    grouped_reference(inputs).check(out, f"CUTLASS host reference over the grouped arguments ({case.id})")
