"""The SM120 dispatch table is the one source of truth: generated files are current, listings agree, and
the module's dispatch is visible in info(), configs() and dispatch_rules()."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

import nvfp4_gemm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEN = os.path.join(ROOT, "csrc", "sm120", "generate.py")


def _table():
    """csrc/sm120/generate.py under its own module name (sm100's generator is also called `generate`)."""
    spec = importlib.util.spec_from_file_location("sm120_generate", GEN)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sm120_generate"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_generated_files_are_current():
    p = subprocess.run([sys.executable, GEN, "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_table_covers_every_m_and_names_are_procedural():
    gen = _table()
    names = [c.name for c in gen.TABLE]
    assert 2 <= len(names) <= 4 and len(set(names)) == len(names), "keep the table small: every TU costs CI minutes"
    for c in gen.TABLE:
        assert re.fullmatch(r"sm120_nvfp4_\d+x\d+x(128|256)", c.name), c.name
        assert c.why, f"{c.name} has no reason"
        assert os.path.isfile(os.path.join(ROOT, "csrc", "sm120", "generated", c.name + ".cu"))
    assert gen.TABLE[-1].m_max is None
    # Decode sizes get their own entry.
    assert gen.TABLE[0].m_max is not None and gen.TABLE[0].m_max <= 128


def _built():
    if "sm120" not in nvfp4_gemm.configs():
        pytest.skip("_C_sm120 not in this build: nvfp4_gemm.configs() has no sm120 entry (NVFP4_GEMM_CUDA_ARCHS=12.0f)")


def test_built_module_lists_the_table():
    _built()
    gen = _table()
    assert nvfp4_gemm.configs()["sm120"] == [c.name for c in gen.TABLE]
    rules = nvfp4_gemm.dispatch_rules()["sm120"].splitlines()
    lo = 1
    for rule, c in zip(rules, gen.TABLE, strict=True):
        assert rule == (f"M {lo}..{c.m_max}: {c.name}" if c.m_max is not None else f"M >= {lo}: {c.name}")
        lo = (c.m_max or 0) + 1
    info = nvfp4_gemm.info()
    assert info["backends"]["sm120"]["compiled_for"] == "sm_120f"
    assert info["backends"]["sm120"]["configs"] == [c.name for c in gen.TABLE]


def test_dispatch_by_compute_capability():
    """SM 12.0 and 12.1 go to sm120 (and to no other arch module); SM 9.0 / 10.0 / 10.3 never do."""
    _built()
    import torch

    for sm in (120, 121):
        assert list(torch.ops.nvfp4_gemm._backends_for_sm(sm)) == ["sm120"], sm
    for sm in (80, 90, 100, 103, 110):
        assert "sm120" not in torch.ops.nvfp4_gemm._backends_for_sm(sm), sm


def test_grouped_table_is_small_and_names_are_procedural():
    gen = _table()
    names = [c.name for c in gen.GROUPED_TABLE]
    assert 1 <= len(names) <= 2 and len(set(names)) == len(names), "keep the grouped table small: every TU costs CI minutes"
    for c in gen.GROUPED_TABLE:
        assert re.fullmatch(r"sm120_nvfp4_grouped_\d+x\d+x(128|256)", c.name), c.name
        assert c.why, f"{c.name} has no reason"
        assert os.path.isfile(os.path.join(ROOT, "csrc", "sm120", "generated", c.name + ".cu"))
    assert gen.GROUPED_TABLE[-1].rows_max is None


def test_built_module_lists_the_grouped_table():
    import torch

    if "sm120" not in list(torch.ops.nvfp4_gemm._grouped_backends()):
        pytest.skip("_C_sm120 with grouped kernels not in this build (NVFP4_GEMM_CUDA_ARCHS=12.0f)")
    gen = _table()
    assert list(torch.ops.nvfp4_gemm._grouped_configs("sm120")) == [c.name for c in gen.GROUPED_TABLE]
