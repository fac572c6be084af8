"""Backends under test: every one available on this machine runs the same cases.

A backend that cannot run here is skipped with the reason printed (pytest -rs), never silently passed.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import nvfp4_gemm  # noqa: E402

ALL_BACKENDS = ("cpu", "generic", "sm90", "sm100", "sm120")  # a Blackwell machine runs the suite on its backend


def backend_skip_reason(name: str) -> str | None:
    """None if `name` can run on this machine, else why not."""
    if name == "cpu":
        return None
    if not torch.cuda.is_available():
        return f"backend {name}: no CUDA device on this machine"
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    if name == "generic":
        return None if sm >= 80 else f"backend generic needs SM >= 8.0, device is SM {major}.{minor}"
    if name not in nvfp4_gemm.configs():
        return f"backend {name} not compiled into this build (NVFP4_GEMM_CUDA_ARCHS)"
    if name not in torch.ops.nvfp4_gemm._backends_for_sm(sm):
        return f"backend {name} cannot run on SM {major}.{minor}"
    return None


def selected_backends() -> list[str]:
    """NVFP4_GEMM_TEST_BACKENDS=generic,sm90 narrows the list (e.g. to run the suite on one backend)."""
    env = os.environ.get("NVFP4_GEMM_TEST_BACKENDS")
    return [b.strip() for b in env.split(",")] if env else list(ALL_BACKENDS)


@pytest.fixture(params=selected_backends())
def backend(request, monkeypatch):
    """Yields (backend name, device) with NVFP4_GEMM_BACKEND forced for CUDA backends."""
    name = request.param
    reason = backend_skip_reason(name)
    if reason:
        pytest.skip(reason)
    if name == "cpu":
        monkeypatch.delenv("NVFP4_GEMM_BACKEND", raising=False)
        yield name, torch.device("cpu")
    else:
        monkeypatch.setenv("NVFP4_GEMM_BACKEND", name)
        yield name, torch.device("cuda")


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def skip_refused_weight_only_float32(name: str, mode: str, dtype: torch.dtype) -> None:
    """A forced arch backend (sm90, sm100) refuses weight-only float32 activations: the automatic dispatch
    runs them on the generic path."""
    if mode == "weight_only" and dtype == torch.float32 and name in ("sm90", "sm100"):
        pytest.skip(f"a forced {name} backend refuses float32 activations (they run on the generic path)")


def run_without_host_sync(fn):
    """fn() once to warm up, then again with torch's sync debug mode set to raise on any host synchronization."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def capture_graph(fn):
    """(graph, fn's outputs inside it): fn() warmed up once on a side stream, then captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
