"""Build helpers for the SM120 host checks (tests/test_sm120_*.py). No GPU needed anywhere.

The tool lookup (nvcc, cuobjdump, nvdisasm, CUTLASS) is sm100_host.tools'; this adds the SM120 sources,
flags and cache: host programs are compiled with the _C_sm120 module's own flags (build_manifest.py) and
cached under build/sm120_host/<hash of inputs>/, so a rerun with unchanged sources costs nothing.
"""
from __future__ import annotations

import glob
import hashlib
import os

from sm100_host.tools import (  # noqa: F401  - re-exported for the SM120 tests
    ROOT, TOOL_WHEELS, _manifest, _run, cuda_home, cutlass_includes, cutlass_or_skip, find_nvcc, sass_tools_env,
)

HOST_DIR = os.path.join(ROOT, "tests", "sm120_host")
SM120_DIR = os.path.join(ROOT, "csrc", "sm120")
CACHE = os.path.join(ROOT, "build", "sm120_host")


def module():
    """The _C_sm120 entry of build_manifest.MODULES."""
    return next(m for m in _manifest().MODULES if m.name == "_C_sm120")


def nvcc_flags(device: bool) -> list[str]:
    """The module's own nvcc flags (build_manifest.py); `device` adds its sm_120f target."""
    bm = _manifest()
    flags = [f for f in bm.COMMON_NVCC_FLAGS if not f.startswith(("-U", "-O"))]
    flags += [f"-I{os.path.join(ROOT, d)}" for d in bm.INCLUDE_DIRS] + [f"-I{d}" for d in cutlass_includes()]
    if device:
        flags += bm.gencode(module().arch_family)
    return flags


def _inputs_hash(files: list[str], flags: list[str]) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    deps = files + sorted(glob.glob(os.path.join(SM120_DIR, "*.h")) + glob.glob(os.path.join(SM120_DIR, "*.cuh")))
    deps += sorted(glob.glob(os.path.join(SM120_DIR, "generated", "*.inc")))
    common = os.path.join(ROOT, "csrc", "common")
    deps += sorted(glob.glob(os.path.join(common, "*.h")) + glob.glob(os.path.join(common, "*.cuh")))
    deps += sorted(glob.glob(os.path.join(ROOT, "tests", "sm100_host", "*.h")))  # headers the host programs share
    for f in deps:
        h.update(f.encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


def build_host_program(name: str, cu: str, cpp: tuple[str, ...] = (), device_flags: bool = False) -> str:
    """Compile tests/sm120_host/<cu> (+ host-compiler .cpp files from csrc/) into a cached executable."""
    nvcc = find_nvcc()
    assert nvcc, "nvcc not found"
    flags = nvcc_flags(device_flags)
    src = os.path.join(HOST_DIR, cu)
    cpp_paths = [os.path.join(ROOT, c) for c in cpp]
    out_dir = os.path.join(CACHE, f"{name}-{_inputs_hash([src, *cpp_paths], flags)}")
    exe = os.path.join(out_dir, name)
    if os.path.isfile(exe):
        return exe
    os.makedirs(out_dir, exist_ok=True)
    objs = []
    for c in cpp_paths:
        obj = os.path.join(out_dir, os.path.basename(c) + ".o")
        cuda_inc = os.path.join(cuda_home(), "include")
        _run([os.environ.get("CXX", "c++"), "-std=c++17", "-O1", "-c", c, "-o", obj, f"-I{ROOT}/csrc", f"-I{cuda_inc}"])
        objs.append(obj)
    _run([nvcc, *flags, "-O1", "-o", exe + ".tmp", src, *objs])
    os.replace(exe + ".tmp", exe)
    return exe
