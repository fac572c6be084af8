"""The Hopper kernels' host-side pieces checked without a GPU: the dispatch (the table of csrc/sm90/generate.py, its
rendered files, the decision over a grid of shapes, the binding layer's resolver), the wgmma kernel's K-split planner
(csrc/sm90/split_plan.h) and the FP4 decode every sm90 kernel shares (csrc/sm90/fp4_decode.cuh).

tests/sm90_host/split_plan_test.cpp compiles against the same header backend.cu plans with and checks an H100's
choices (32 tiles: two clusters of 2 per tile, since an H100 holds 30 clusters of 4, not 32; 64 tiles: one cluster
of 2; more tiles than SMs: one wave of 132 CTAs over them, or whole waves with that turned off; forced counts and
clusters turned off: the balanced split) and, over ~200,000 plans of a sweep, the split's rules: fewer CTAs than
tiles only as one wave, every cluster resident at once, at least two K tiles a slice, the workspace bound, and
workspace sizes that match the split. tests/sm90_host/decode_word_test.cu checks the decode over every 32-bit word.
Nothing here runs a kernel.
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


_NVCC = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")


@pytest.mark.skipif(_NVCC is None, reason="no nvcc found (PATH or /usr/local/cuda/bin)")
def test_decode_word_every_word(tmp_path):
    """csrc/sm90/fp4_decode.cuh's decode_word / decode_word_bf16 (the B decode of every sm90 kernel, and A's in the
    small-M ones) against the e2m1 values over all 2^32 words, compiled for the host
    (tests/sm90_host/decode_word_test.cu)."""
    exe = str(tmp_path / "decode_word_test")
    src = os.path.join(ROOT, "tests", "sm90_host", "decode_word_test.cu")
    build = subprocess.run([_NVCC, "-std=c++17", "-O2", "-I", os.path.join(ROOT, "csrc"), src, "-o", exe],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "decode_word_test: ok" in run.stdout


@pytest.mark.skipif(_CXX is None, reason="no C++ compiler found (CXX, c++ or g++)")
def test_grouped_schedule(tmp_path):
    """csrc/sm90/grouped_schedule.h (the grouped kernel's work list, split count and item mapping) over random and
    garbage routings: every (group, chunk, row block, split) exactly once, inside its group, T and the buffers
    (tests/sm90_host/grouped_schedule_test.cpp)."""
    exe = str(tmp_path / "grouped_schedule_test")
    src = os.path.join(ROOT, "tests", "sm90_host", "grouped_schedule_test.cpp")
    build = subprocess.run([_CXX, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                            src, "-o", exe], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:]
    assert "grouped_schedule_test: ok" in run.stdout


def test_dispatch_listing_unchanged():
    """The SM90 dispatch decision over a grid of shapes, modes, output dtypes and SM counts (automatic, forced, and
    the chosen config's workspace, i.e. its split plan) is what tests/sm90_host/dispatch_listing.txt.gz records:
    a change to the dispatch code that moves any shape shows up here as a diff. After a deliberate change of the
    table, rewrite the file with `python3 tests/sm90_host/build_dispatch_listing.py --out /tmp/l.txt && gzip -9 -n
    -c /tmp/l.txt > tests/sm90_host/dispatch_listing.txt.gz`."""
    if _NVCC is None:
        pytest.skip("no nvcc found (PATH or /usr/local/cuda/bin)")
    import difflib
    import gzip
    import sys

    try:
        import build_manifest as bm  # noqa: F401

        bm.cutlass_include_dirs()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"CUTLASS headers not found ({e})")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "sm90_host", "build_dispatch_listing.py")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-4000:]
    with gzip.open(os.path.join(ROOT, "tests", "sm90_host", "dispatch_listing.txt.gz"), "rt") as f:
        want = f.read()
    if r.stdout != want:
        diff = list(difflib.unified_diff(want.splitlines(), r.stdout.splitlines(), "recorded", "now", lineterm="", n=0))
        pytest.fail(f"{len(diff)} diff lines; first ones:\n" + "\n".join(diff[:40]))


def _sm90_table():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("sm90_generate", os.path.join(ROOT, "csrc", "sm90", "generate.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_generated_files_are_current():
    """csrc/sm90/generated/ (instantiation TUs, table.inc, configs.md) is what generate.py renders from its table."""
    import sys

    r = subprocess.run([sys.executable, os.path.join(ROOT, "csrc", "sm90", "generate.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_table_has_reasons_and_every_m_a_rule():
    gen = _sm90_table()
    names = [c.name for c in gen.CONFIGS]
    assert len(set(names)) == len(names)
    for c in gen.CONFIGS:
        assert c.why and c.kind == "dense", c
        for suffix, _, _ in c.instantiations():
            assert os.path.isfile(os.path.join(ROOT, "csrc", "sm90", "generated", f"{c.name}_{suffix}.cu"))
    for r in gen.RULES:
        assert r.why, r
    # The walk of select() on the table alone: at every M each mode ends on a rule that names a config or a
    # refusal, never only on `prefer` rules.
    for m in list(range(1, 300)) + [2047, 2048, 8192, 1 << 20]:
        for mode in gen.MODES:
            hits = [r for r in gen.RULES if r.m_min <= m and (r.m_max is None or m <= r.m_max) and mode in r.modes]
            assert any(not r.prefer and r.config is not gen.GENERIC for r in hits), (m, mode)


def test_built_module_lists_the_table():
    import nvfp4_gemm

    listed = nvfp4_gemm.configs().get("sm90")
    if listed is None:
        pytest.skip("_C_sm90 not in this build: nvfp4_gemm.configs() has no sm90 entry")
    gen = _sm90_table()
    assert listed == [c.name for c in gen.CONFIGS]
    assert nvfp4_gemm.dispatch_rules()["sm90"] == gen.rules_text()


@pytest.mark.skipif(_CXX is None, reason="no C++ compiler found (CXX, c++ or g++)")
def test_resolver(tmp_path):
    """csrc/bindings/resolve.h over two fake dense arch tables and a fake grouped one
    (tests/sm90_host/resolve_test.cpp): a forced config or backend that cannot run a problem is an error naming why for every op (a decline for an
    optional fused form), wrong names are errors in both, automatic dispatch takes the first backend that selects;
    the grouped table under the same rules and words, a forced dense config not applying to it."""
    exe = str(tmp_path / "resolve_test")
    src = os.path.join(ROOT, "tests", "sm90_host", "resolve_test.cpp")
    build = subprocess.run([_CXX, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                            src, "-o", exe], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "resolve_test: ok" in run.stdout, run.stdout[-4000:]
