"""Build and tool lookup for the SM100 host checks (tests/test_sm100_*.py). No GPU needed anywhere.

Host programs are compiled with the toolkit's nvcc against the same CUTLASS headers and flags as the
_C_sm100 module (build_manifest.py), and cached under build/sm100_host/<hash of inputs>/ so that a rerun
with unchanged sources costs nothing. The SM120 checks (sm120_host/tools.py) build theirs through the same
functions (build_arch_host_program).
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST_DIR = os.path.join(ROOT, "tests", "sm100_host")

# The SASS tools are not part of a pip CUDA toolkit's nvcc; their wheels put them here.
TOOL_WHEELS = "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"


def _manifest():
    sys.path.insert(0, ROOT)
    try:
        import build_manifest

        return build_manifest
    finally:
        sys.path.pop(0)


def cuda_home() -> str | None:
    """A toolkit with both nvcc and its runtime headers (a bare bin/nvcc wrapper elsewhere is not one)."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        CUDA_HOME = None
    which = shutil.which("nvcc")
    from_path = os.path.dirname(os.path.dirname(os.path.realpath(which))) if which else None
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", CUDA_HOME, from_path):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")) and os.path.isfile(
                os.path.join(home, "include", "cuda_runtime_api.h")):
            return home
    return None


def find_nvcc() -> str | None:
    home = cuda_home()
    return os.path.join(home, "bin", "nvcc") if home else None


def find_tool(name: str) -> str | None:
    """cuobjdump / nvdisasm: PATH, the toolkit, or the nvidia-cuda-* wheels in site-packages."""
    if shutil.which(name):
        return shutil.which(name)
    nvcc = find_nvcc()
    if nvcc and os.path.isfile(os.path.join(os.path.dirname(nvcc), name)):
        return os.path.join(os.path.dirname(nvcc), name)
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}:
        for hit in sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", name))):
            return hit
    return None


def sass_tools_env() -> tuple[str | None, dict, str | None]:
    """(cuobjdump path, env with nvdisasm on PATH, reason if either is missing)."""
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if not cuobjdump or not nvdisasm:
        missing = " and ".join(n for n, p in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if not p)
        return None, {}, f"{missing} not found: pip install {TOOL_WHEELS}"
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    return cuobjdump, env, None


def cutlass_includes() -> list[str]:
    inc, _ = _manifest().cutlass_include_dirs()
    return inc


def cutlass_or_skip() -> None:
    """Skips the calling test where no CUTLASS checkout or wheel is found (the reason is the lookup's)."""
    import pytest

    try:
        cutlass_includes()
    except RuntimeError as e:
        pytest.skip(str(e))


def arch_nvcc_flags(arch: str, device: bool) -> list[str]:
    """The _C_<arch> module's own nvcc flags (build_manifest.py); `device` adds its target (sm_100f, sm_120f)."""
    bm = _manifest()
    flags = [f for f in bm.COMMON_NVCC_FLAGS if not f.startswith(("-U", "-O"))]
    flags += [f"-I{os.path.join(ROOT, d)}" for d in bm.INCLUDE_DIRS] + [f"-I{d}" for d in cutlass_includes()]
    if device:
        mod = next(m for m in bm.MODULES if m.name == f"_C_{arch}")
        flags += bm.gencode(mod.arch_family)
    return flags


def _inputs_hash(arch: str, files: list[str], flags: list[str]) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    arch_dir = os.path.join(ROOT, "csrc", arch)
    deps = files + sorted(glob.glob(os.path.join(arch_dir, "*.h")) + glob.glob(os.path.join(arch_dir, "*.cuh")))
    deps += sorted(glob.glob(os.path.join(arch_dir, "generated", "*.inc")))
    common = os.path.join(ROOT, "csrc", "common")
    deps += sorted(glob.glob(os.path.join(common, "*.h")) + glob.glob(os.path.join(common, "*.cuh")))
    deps += sorted(glob.glob(os.path.join(HOST_DIR, "*.h")))  # headers the host programs of both archs share
    for f in deps:
        h.update(f.encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


def build_arch_host_program(arch: str, name: str, cu: str, cpp: tuple[str, ...] = (),
                            device_flags: bool = False) -> str:
    """Compile tests/<arch>_host/<cu> (+ host-compiler .cpp files from csrc/) with the _C_<arch> module's flags
    into an executable cached under build/<arch>_host/<name>-<hash of the inputs>/."""
    nvcc = find_nvcc()
    assert nvcc, "nvcc not found"
    flags = arch_nvcc_flags(arch, device_flags)
    src = os.path.join(ROOT, "tests", f"{arch}_host", cu)
    cpp_paths = [os.path.join(ROOT, c) for c in cpp]
    out_dir = os.path.join(ROOT, "build", f"{arch}_host", f"{name}-{_inputs_hash(arch, [src, *cpp_paths], flags)}")
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


def build_host_program(name: str, cu: str, cpp: tuple[str, ...] = (), device_flags: bool = False) -> str:
    """Compile tests/sm100_host/<cu> (+ host-compiler .cpp files from csrc/) into a cached executable."""
    return build_arch_host_program("sm100", name, cu, cpp, device_flags)


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nfailed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}")
