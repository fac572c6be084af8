"""SM120 / SM121 GPU checks (RTX 50, RTX PRO 6000, DGX Spark): every dispatch entry forced on partial tiles
and every output dtype against docs/CONTRACT.md's bound, automatic dispatch, the first-use self-check, the weight-only
form going to the generic path, CUDA-graph replay with alpha read on the device, a side stream.

Skipped, with the reason, on any machine without such a GPU and a build with _C_sm120: these tests have
never run (no SM120 GPU was available to this project). The shared suite (tests/test_mm.py ...) covers the
backend too once `sm120` is in NVFP4_GEMM_TEST_BACKENDS' list (tests/conftest.py).
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, Reference, case_seed, make_inputs, poison_cuda_allocator
from conftest import backend_skip_reason

_reason = backend_skip_reason("sm120")
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _force_sm120(monkeypatch):
    monkeypatch.setenv("NVFP4_GEMM_BACKEND", "sm120")
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)


def _configs() -> list[str]:
    return nvfp4_gemm.configs()["sm120"]


# Partial tiles in M, N and K (K/16 not a multiple of 4), M = 1, N = 8, both sides of every table bound,
# special scales, alpha.
SHAPES = [
    Case(1, 8, 32), Case(1, 4096, 4096, BF16, alpha=0.5), Case(7, 264, 544, F32), Case(16, 1024, 2048),
    Case(127, 136, 1056, BF16), Case(128, 256, 256, alpha=-1.5), Case(129, 384, 512, F32), Case(200, 72, 512),
    Case(256, 512, 1536, BF16), Case(257, 128, 288, F32, alpha=3.0), Case(300, 264, 96),
    Case(65, 96, 320, F16, scales="tiny"), Case(40, 64, 2048, F16, scales="large"),
    Case(70, 80, 512, F32, scales="nan"),
]


@pytest.mark.parametrize("case", SHAPES, ids=lambda c: c.id)
def test_every_config_matches_reference(monkeypatch, case):
    inputs = make_inputs(case, "cuda", seed=case_seed(case))
    ref = Reference(inputs)
    for name in _configs():
        monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        out = torch.full((case.m, case.n), float("nan"), dtype=case.out_dtype, device="cuda")
        nvfp4_gemm.mm(**inputs, out=out)
        ref.check(out, f"config {name}, case {case.id}, seed {case_seed(case)}")


def test_automatic_dispatch_takes_sm120_and_self_check_passes(monkeypatch):
    """Without forcing: every table entry runs (its M range), passes its first-use self-check (on by default
    for sm120; a failure warns and falls back to the generic path, which would still match the reference,
    so the warning is what fails this test), and matches the reference."""
    monkeypatch.delenv("NVFP4_GEMM_BACKEND")
    if os.environ.get("NVFP4_GEMM_SELFCHECK") == "0":
        pytest.skip("NVFP4_GEMM_SELFCHECK=0 turns the first-use self-check off")
    for m in (1, 128, 129, 256, 257, 1024):
        for dt in (F16, BF16, F32):
            case = Case(m, 512, 1024, dt, alpha=0.75)
            inputs = make_inputs(case, "cuda", seed=case_seed(case))
            poison_cuda_allocator(m * 512 * 4, torch.device("cuda"))
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a failed self-check or an unchecked config is an error here
                out = nvfp4_gemm.mm(**inputs)
            Reference(inputs).check(out, f"auto dispatch, case {case.id}")


def test_weight_only_goes_to_the_generic_path(monkeypatch):
    """CUTLASS 4.2 has no SM120 mixed-input (fp16 x NVFP4) GEMM: sm120 refuses the weight-only form by name,
    and automatic dispatch runs it on the generic path."""
    case = Case(16, 256, 512, F16, a_dtype=F16)
    inputs = make_inputs(case, "cuda", seed=case_seed(case))
    with pytest.raises(RuntimeError, match="generic path"):
        nvfp4_gemm.mm(**inputs)
    monkeypatch.delenv("NVFP4_GEMM_BACKEND")
    Reference(inputs).check(nvfp4_gemm.mm(**inputs), "weight-only, automatic dispatch")


def test_cuda_graph_reads_alpha_on_the_device():
    for m in (1, 200, 512):
        case = Case(m, 256, 512, BF16, alpha=1.0)
        inputs = make_inputs(case, "cuda", seed=case_seed(case))
        out = nvfp4_gemm.mm(**inputs)  # eager first: the self-check cannot run during capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = nvfp4_gemm.mm(**inputs)
        for alpha in (0.25, -3.0):
            inputs["alpha"].fill_(alpha)
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            Reference(inputs).check(out, f"graph replay, M={m}, alpha={alpha}")


def test_every_config_on_a_side_stream(monkeypatch):
    case = Case(129, 384, 1024, F16, alpha=0.5)
    inputs = make_inputs(case, "cuda", seed=case_seed(case))
    side = torch.cuda.Stream()
    for name in _configs():
        monkeypatch.setenv("NVFP4_GEMM_CONFIG", name)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = nvfp4_gemm.mm(**inputs)
        torch.cuda.current_stream().wait_stream(side)
        Reference(inputs).check(out, f"config {name} on a side stream")


def test_info_names_the_device_backend():
    info = nvfp4_gemm.info()
    assert info["device_backends"][0] == "sm120", info["device_backends"]
    assert info["backends"]["sm120"]["compiled_for"] == "sm_120f"
