"""The dispatch tables as the arch modules report them, and grouped_mm's dispatch decision under forcing (no GPU
needed: the modules load on any machine)."""
from __future__ import annotations

import re

import nvfp4_gemm


def test_every_backend_lists_its_rules():
    rules = nvfp4_gemm.dispatch_rules()
    configs = nvfp4_gemm.configs()
    assert "cpu" in rules
    for backend, names in configs.items():
        text = rules[backend]
        lines = [line for line in text.splitlines() if line.strip()]
        assert lines, f"{backend} reports no dispatch rules"
        # Rules cover M from 1 upwards, contiguously, and end unbounded.
        lo = 1
        for line in lines:
            m = re.match(r"M (\d+)\.\.(\d+): ", line) or re.match(r"M >= (\d+): ", line)
            assert m, f"{backend}: unexpected rule {line!r}"
            assert int(m.group(1)) == lo, f"{backend}: rule {line!r} does not start at M = {lo}"
            lo = int(m.group(2)) + 1 if m.lastindex == 2 else None
        assert lo is None, f"{backend}: the last rule must be unbounded, got {lines[-1]!r}"
        # Every config a rule names is a compiled config, and every rule names one.
        for line in lines:
            named = [n for n in names if n in line]
            assert named or "generic" in line, f"{backend}: rule {line!r} names no compiled config"


def test_info_carries_the_rules():
    backends = nvfp4_gemm.info()["backends"]
    for backend, text in nvfp4_gemm.dispatch_rules().items():
        if backend in ("cpu", "generic"):
            continue
        assert backends[backend]["dispatch"] == text


def test_forced_nests_and_restores():
    """nvfp4_gemm.testing.forced sets the resolver's process-wide override (torch.ops.nvfp4_gemm._force) field by
    field, nests, and restores the previous one on exit, also after an error; splits out of range are refused."""
    import pytest
    import torch

    from nvfp4_gemm.testing import forced

    op = torch.ops.nvfp4_gemm._force

    def current():
        prev = op("", "", 0)
        op(*prev)
        return tuple(prev)

    assert current() == ("", "", 0)
    with forced(backend="sm90"):
        assert current() == ("sm90", "", 0)
        with forced(config="cfg", splits=3):
            assert current() == ("sm90", "cfg", 3)
        assert current() == ("sm90", "", 0)
        with pytest.raises(ValueError):
            with forced(splits=2):
                raise ValueError("inside")
        assert current() == ("sm90", "", 0)
    assert current() == ("", "", 0)
    with pytest.raises(RuntimeError, match=r"splits must be in \[0, 2\^20\]"):
        op("", "", -1)
    assert current() == ("", "", 0)


# ---------------------------------------------------------------------- grouped_mm under the same resolver

def _grouped_choice():
    """torch.ops.nvfp4_gemm._grouped_choice(sm, t, n, k, g, a): grouped_mm's dispatch decision (the resolver over the
    registered grouped tables, under the forcing in effect) for a device of SM `sm`, without one; CUDA builds only."""
    import pytest
    import torch

    op = getattr(torch.ops.nvfp4_gemm, "_grouped_choice", None)
    if op is None:
        pytest.skip("a CPU-only build: grouped_mm's CUDA dispatch is not compiled")
    return op


def test_grouped_forcing_errors_follow_mm_wording(monkeypatch):
    """grouped_mm resolves through mm's resolver: the same errors, worded as mm's (tests/test_errors.py), for an
    unknown backend name, a backend not compiled and an unknown config name."""
    import pytest

    from nvfp4_gemm.grouped import grouped_backends
    from nvfp4_gemm.testing import forced

    op = _grouped_choice()
    monkeypatch.delenv("NVFP4_GEMM_BACKEND", raising=False)
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)
    with forced(backend="sm75"), pytest.raises(RuntimeError, match=r"nvfp4_gemm: forced backend must be one of auto, "
                                                                    r"generic, sm90, sm100, sm120 .*got 'sm75'"):
        op(90, 64, 128, 256, 4, "e2m1")
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm75")
    with pytest.raises(RuntimeError, match=r"NVFP4_GEMM_BACKEND must be one of auto, generic, sm90, sm100, sm120 "
                                           r"\(cpu is chosen by putting the tensors on the CPU\), got 'sm75'"):
        op(90, 64, 128, 256, 4, "e2m1")
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "auto")
    monkeypatch.setenv("NVFP4_GEMM_CONFIG", "no_such_config")
    with pytest.raises(RuntimeError, match=r"NVFP4_GEMM_CONFIG=no_such_config names no compiled grouped kernel config; "
                                           r"nvfp4_gemm.grouped.grouped_configs\(\) lists them"):
        op(90, 64, 128, 256, 4, "e2m1")
    monkeypatch.delenv("NVFP4_GEMM_CONFIG")
    for name, archs in (("sm90", "9.0a"), ("sm100", "10.0f"), ("sm120", "12.0f")):
        if name in grouped_backends():
            continue
        monkeypatch.setenv("NVFP4_GEMM_BACKEND", name)
        want = (rf"NVFP4_GEMM_BACKEND={name} but that backend was not compiled into this build; rebuild with "
                rf"NVFP4_GEMM_CUDA_ARCHS={archs}")
        with pytest.raises(RuntimeError, match=want):
            op(90, 64, 128, 256, 4, "e2m1")
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "generic")
    assert op(90, 64, 128, 256, 4, "e2m1") == "generic:grouped_simt_64x64"
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "auto")
    # Blackwell: CUTLASS's grouped kernels where built (NVFP4 A only: weight-only goes to the generic kernel)
    want = "sm100:sm100_nvfp4_grouped_128x64x256_1sm_swap" if "sm100" in grouped_backends() else \
        "generic:grouped_simt_64x64"  # 16 rows per group on average: the decode (swapped) config
    assert op(100, 64, 128, 256, 4, "e2m1") == want
    if "sm100" in grouped_backends():
        assert op(100, 4096, 128, 256, 4, "e2m1") == "sm100:sm100_nvfp4_grouped_128x128x256_1sm"
    want = "sm120:sm120_nvfp4_grouped_128x128x128" if "sm120" in grouped_backends() else "generic:grouped_simt_64x64"
    assert op(120, 64, 128, 256, 4, "e2m1") == want
    for sm in (100, 120):
        assert op(sm, 64, 128, 256, 4, "bf16") == "generic:grouped_simt_64x64"


def test_grouped_forcing_on_sm90(monkeypatch):
    """With sm90's grouped kernels in the build (no GPU needed: the decision only): automatic dispatch, a forced
    backend or config that cannot run the problem is an error naming why, a grouped config of a device it cannot
    run on, and a forced dense config, which names no grouped kernel: grouped_mm then follows the forced backend /
    automatic dispatch."""
    import pytest

    from nvfp4_gemm.grouped import grouped_backends, grouped_configs
    from nvfp4_gemm.testing import forced

    op = _grouped_choice()
    if "sm90" not in grouped_backends():
        pytest.skip("this build has no sm90 grouped kernels")
    monkeypatch.delenv("NVFP4_GEMM_BACKEND", raising=False)
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)
    t8, t16, w64, w128, w80, w256, w160, w32, w256t80, w256t128 = grouped_configs()["sm90"]
    assert all(f"_w256xt{t}xk128_" in name for t, name in ((80, w256t80), (128, w256t128)))
    # Automatic (average rows a group): T < 8 G the 8-token config, from 8 G the 16-token one, then the wgmma tiles:
    # 32 tokens from 20 G, 64 from 28 G, 80 from 56 G, 128 from 80 G, 160 from 120 G, 256 from 160 G (G <= 512);
    # the 80- and 128-token ones over 256 weight rows where N > 128 (over 128 rows at N = 128); generic where sm90
    # cannot run it.
    assert op(90, 31, 128, 256, 4, "e2m1") == f"sm90:{t8}"
    assert op(90, 32, 128, 256, 4, "bf16") == f"sm90:{t16}"
    assert op(90, 79, 128, 256, 4, "bf16") == f"sm90:{t16}"
    for a in ("bf16", "f16", "e2m1"):
        assert op(90, 80, 128, 256, 4, a) == f"sm90:{w32}"
        assert op(90, 112, 128, 256, 4, a) == f"sm90:{w64}"
    assert op(90, 111, 128, 256, 4, "bf16") == f"sm90:{w32}"
    assert op(90, 223, 128, 256, 4, "bf16") == f"sm90:{w64}"
    assert op(90, 224, 128, 256, 4, "bf16") == f"sm90:{w80}"
    assert op(90, 319, 128, 256, 4, "e2m1") == f"sm90:{w80}"
    assert op(90, 320, 128, 256, 4, "bf16") == f"sm90:{w128}"
    assert op(90, 479, 128, 256, 4, "e2m1") == f"sm90:{w128}"
    for n in (136, 2048):
        assert op(90, 224, n, 256, 4, "bf16") == f"sm90:{w256t80}"
        assert op(90, 319, n, 256, 4, "f16") == f"sm90:{w256t80}"
        assert op(90, 320, n, 256, 4, "e2m1") == f"sm90:{w256t128}"
        assert op(90, 479, n, 256, 4, "bf16") == f"sm90:{w256t128}"
        assert op(90, 480, n, 256, 4, "bf16") == f"sm90:{w160}"
    assert op(90, 480, 128, 256, 4, "bf16") == f"sm90:{w160}"
    assert op(90, 639, 128, 256, 4, "f16") == f"sm90:{w160}"
    assert op(90, 640, 128, 256, 4, "bf16") == f"sm90:{w256}"
    assert op(90, 2048, 128, 256, 4, "e2m1") == f"sm90:{w256}"
    assert op(90, 640 * 512, 128, 256, 640, "bf16") == f"sm90:{t16}"  # more groups than the wgmma configs take
    assert op(90, 64, 128, 96, 4, "e2m1") == "generic:grouped_simt_64x64"  # K % 256 != 0
    assert op(90, 64, 128, 256, 4, "f32") == "generic:grouped_simt_64x64"
    # Forced by name, a wgmma tile runs outside its band wherever the wgmma configs can (and is refused with the
    # reason where not).
    for name in (w160, w32, w256t80, w256t128):
        with forced(config=name):
            assert op(90, 96, 128, 256, 4, "bf16") == f"sm90:{name}"  # 24 rows a group
            assert op(90, 512, 128, 256, 4, "e2m1") == f"sm90:{name}"  # 128 rows a group
            assert op(90, 5, 128, 256, 4, "f16") == f"sm90:{name}"
            with pytest.raises(RuntimeError, match=rf"forced config={name} cannot run T=64 N=128 K=256 G=513: sm90 "
                                                   rf"grouped {name}: at most 512 groups, got 513"):
                op(90, 64, 128, 256, 513, "bf16")
    with forced(backend="sm90"):
        assert op(90, 64, 128, 256, 4, "e2m1") == f"sm90:{t16}"
        with pytest.raises(RuntimeError, match=r"nvfp4_gemm: forced backend=sm90 has no grouped kernel for T=64 N=128 "
                                               r"K=96 G=4: sm90 grouped: K must be a positive multiple of 256"):
            op(90, 64, 128, 96, 4, "e2m1")
        with pytest.raises(RuntimeError, match=r"forced backend=sm90 \(sm_90a\) cannot run on this SM 10.0 device"):
            op(100, 64, 128, 256, 4, "e2m1")
    with forced(config=t8):
        assert op(90, 64, 128, 256, 4, "e2m1") == f"sm90:{t8}"  # not select's pick: the forced one
        with pytest.raises(RuntimeError, match=rf"forced config={t8} cannot run T=64 N=128 K=256 G=4: sm90 grouped: A "
                                               r"must be packed NVFP4, float16 or bfloat16"):
            op(90, 64, 128, 256, 4, "f32")
        with pytest.raises(RuntimeError, match=rf"forced config={t8} belongs to backend sm90 \(sm_90a\), which cannot "
                                               r"run on this SM 12.0 device"):
            op(120, 64, 128, 256, 4, "e2m1")
    dense = nvfp4_gemm.configs()["sm90"][0]
    with forced(config=dense):
        assert op(90, 64, 128, 256, 4, "e2m1") == f"sm90:{t16}"
        with forced(backend="generic"):
            assert op(90, 64, 128, 256, 4, "e2m1") == "generic:grouped_simt_64x64"
        with forced(backend="sm90"), pytest.raises(RuntimeError, match=r"forced backend=sm90 has no grouped kernel"):
            op(90, 64, 128, 96, 4, "e2m1")
