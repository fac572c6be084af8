"""Build helpers for the SM120 host checks (tests/test_sm120_*.py). No GPU needed anywhere.

The tool lookup (nvcc, cuobjdump, nvdisasm, CUTLASS) and the cached build are sm100_host.tools'; host programs
are compiled with the _C_sm120 module's own flags (build_manifest.py) and cached under
build/sm120_host/<hash of inputs>/, so a rerun with unchanged sources costs nothing.
"""
from __future__ import annotations

from sm100_host.tools import (  # noqa: F401  - re-exported for the SM120 tests
    ROOT, TOOL_WHEELS, _run, build_arch_host_program, cuda_home, cutlass_includes, cutlass_or_skip, find_nvcc,
    sass_tools_env,
)


def build_host_program(name: str, cu: str, cpp: tuple[str, ...] = (), device_flags: bool = False) -> str:
    """Compile tests/sm120_host/<cu> (+ host-compiler .cpp files from csrc/) into a cached executable."""
    return build_arch_host_program("sm120", name, cu, cpp, device_flags)
