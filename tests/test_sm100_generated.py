"""The SM100 dispatch table is the one source of truth: generated files are current, listings agree."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import nvfp4_gemm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEN = os.path.join(ROOT, "csrc", "sm100", "generate.py")


def _table():
    sys.path.insert(0, os.path.dirname(GEN))
    try:
        import generate

        return generate
    finally:
        sys.path.pop(0)


def test_generated_files_are_current():
    p = subprocess.run([sys.executable, GEN, "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_table_covers_every_m_and_names_are_procedural():
    gen = _table()
    names = [c.name for c in gen.TABLE]
    assert 4 <= len(names) <= 8 and len(set(names)) == len(names)
    for c in gen.TABLE:
        assert re.fullmatch(r"sm100_nvfp4_\d+x\d+x256_c\dx\d_[12]sm(_sk)?(_swap)?", c.name), c.name
        assert c.why, f"{c.name} has no reason"
        assert os.path.isfile(os.path.join(ROOT, "csrc", "sm100", "generated", c.name + ".cu"))
    assert gen.TABLE[-1].m_max is None


def test_built_module_lists_the_table():
    listed = nvfp4_gemm.configs().get("sm100")
    if listed is None:
        pytest.skip("_C_sm100 not in this build: nvfp4_gemm.configs() has no sm100 entry")
    assert listed == [c.name for c in _table().TABLE]


def test_bench_sm100_runs_up_to_the_gpu():
    """benchmarks/diagnostics/bench_sm100.py builds inputs and maps every shape onto the table on any machine."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = os.path.join(ROOT, "benchmarks", "diagnostics", "bench_sm100.py")
    p = subprocess.run([sys.executable, script, "--shapes", "gpumode"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "sm100_nvfp4_" in p.stdout
    if "stopped before timing" not in p.stdout:
        assert "GPU MODE geometric mean" in p.stdout


def test_grouped_table_is_small_and_names_are_procedural():
    gen = _table()
    names = [c.name for c in gen.GROUPED_TABLE]
    assert 1 <= len(names) <= 2 and len(set(names)) == len(names), "keep the grouped table small: every TU costs CI minutes"
    for c in gen.GROUPED_TABLE:
        assert re.fullmatch(r"sm100_nvfp4_grouped_128x(64|128|192|256)x256_1sm(_swap)?", c.name), c.name
        assert c.why, f"{c.name} has no reason"
        assert os.path.isfile(os.path.join(ROOT, "csrc", "sm100", "generated", c.name + ".cu"))
    assert gen.GROUPED_TABLE[-1].rows_max is None
    # Decode (a few rows per group) gets its own entry, with the rows on the MMA's 64-wide N side.
    assert gen.GROUPED_TABLE[0].swap_ab and gen.GROUPED_TABLE[0].tile_n == 64


def test_built_module_lists_the_grouped_table():
    import torch

    if "sm100" not in list(torch.ops.nvfp4_gemm._grouped_backends()):
        pytest.skip("_C_sm100 with grouped kernels not in this build (NVFP4_GEMM_CUDA_ARCHS=10.0f)")
    gen = _table()
    assert list(torch.ops.nvfp4_gemm._grouped_configs("sm100")) == [c.name for c in gen.GROUPED_TABLE]
