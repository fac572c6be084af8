"""The Hopper wgmma kernel's K-split planner (csrc/sm90/split_plan.h) checked on the host, without a GPU.

tests/sm90_host/split_plan_test.cpp compiles against the same header backend.cu plans with and checks an H100's
choices (32 tiles: two clusters of 2 per tile, since an H100 holds 30 clusters of 4, not 32; 64 tiles: one cluster
of 2; more tiles than SMs: one wave of 132 CTAs over them, or whole waves with that turned off; forced counts and
clusters turned off: the balanced split) and, over ~200,000 plans of a sweep, the split's rules: fewer CTAs than
tiles only as one wave, every cluster resident at once, at least two K tiles a slice, the workspace bound, and
workspace sizes that match the split. Nothing here runs a kernel.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CXX = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


@pytest.mark.skipif(_CXX is None, reason="no C++ compiler found (CXX, c++ or g++)")
def test_split_plan(tmp_path):
    exe = str(tmp_path / "split_plan_test")
    src = os.path.join(ROOT, "tests", "sm90_host", "split_plan_test.cpp")
    build = subprocess.run([_CXX, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                            src, "-o", exe], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    print(run.stdout[-2000:])
    assert run.returncode == 0, run.stdout[-6000:]
    assert "split_plan_test: ok" in run.stdout
