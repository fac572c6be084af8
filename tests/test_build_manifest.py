"""build_manifest.py's build-time switches (CPU only): the experiment defines of NVFP4_GEMM_DEFINES reach the
compiler only in the form the kernels read, and anything else stops the build with what was expected."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import build_manifest as bm  # noqa: E402


def test_experiment_defines_pass_through(monkeypatch):
    monkeypatch.setenv("NVFP4_GEMM_DEFINES", " NVFP4_SM90_WG_STEP_PIPELINE=1  NVFP4_X2=-3 ")
    assert bm.experiment_defines() == ["-DNVFP4_SM90_WG_STEP_PIPELINE=1", "-DNVFP4_X2=-3"]
    monkeypatch.delenv("NVFP4_GEMM_DEFINES")
    assert bm.experiment_defines() == []


@pytest.mark.parametrize("bad", ["FOO=1", "NVFP4_X", "NVFP4_X=1.5", "NVFP4_X=1;rm", "-DNVFP4_X=1", "nvfp4_x=1"])
def test_experiment_defines_reject_anything_else(monkeypatch, bad):
    monkeypatch.setenv("NVFP4_GEMM_DEFINES", f"NVFP4_OK=1 {bad}")
    with pytest.raises(SystemExit, match="NVFP4_GEMM_DEFINES: expected NVFP4_NAME=INTEGER items, got"):
        bm.experiment_defines()
