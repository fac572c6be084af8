"""Builds nvfp4_gemm: the core module _C and, with a CUDA build of torch, one module per arch family.

    pip install --no-build-isolation .          # or: python setup.py build_ext --inplace

Environment:
    NVFP4_GEMM_CUDA_ARCHS  "9.0a;10.0f" etc. (default: this machine's GPU, or every supported arch)
    CUTLASS_DIR            a CUTLASS checkout (else third_party/cutlass, else the nvidia-cutlass package)
    MAX_JOBS               parallel compile jobs (default: cores, capped by free memory at ~7 GiB a job)
    NVFP4_GEMM_CPU_ONLY=1  build the CPU backend only, even with a CUDA build of torch
    NVFP4_GEMM_DIAGNOSTICS=1  a diagnostics build: kernel timeline traces compiled in (docs/SM90_NOTES.md);
                           slower, never for production
    NVFP4_GEMM_DEFINES     "NVFP4_NAME=INT ...": compile-time switches of kernel experiments, for A/B builds
Sources and flags come from build_manifest.py, which CMakeLists.txt reads too.
"""
from __future__ import annotations

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_manifest as bm  # noqa: E402

# torch locates the toolkit through CUDA_HOME or an nvcc on PATH; a toolkit at the default prefix that is
# on neither is still the one to use.
if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ and os.path.isfile("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils import cpp_extension as ce  # noqa: E402

ROOT = bm.ROOT


def log(msg: str) -> None:
    print(f"[nvfp4_gemm build] {msg}", flush=True)


def cuda_wanted() -> bool:
    if os.environ.get("NVFP4_GEMM_CPU_ONLY") == "1":
        log("NVFP4_GEMM_CPU_ONLY=1: building the CPU backend only")
        return False
    if torch.version.cuda is None:
        log(f"torch {torch.__version__} has no CUDA: building the CPU backend only")
        return False
    if ce.CUDA_HOME is None or not os.path.isfile(os.path.join(ce.CUDA_HOME, "bin", "nvcc")):
        log(f"no nvcc under CUDA_HOME={ce.CUDA_HOME}: building the CPU backend only (set CUDA_HOME to a CUDA toolkit)")
        return False
    return True


def shared_libstdcxx_compiler() -> None:
    """Keep libstdc++ shared with torch's.

    Some CUDA images set CXX to a g++ whose shared objects carry their own static libstdc++ (no
    libstdc++.so.6 among their needed libraries). iostream calls in the extension then run against an
    uninitialised second copy and crash (seen on the H100 image: formatting an integer in an error
    message). Such a compiler is swapped for the system g++, found by linking a probe library with it.
    """
    import shutil
    import subprocess
    import tempfile

    cxx = os.environ.get("CXX")
    system_cxx = "/usr/bin/g++" if os.path.exists("/usr/bin/g++") else shutil.which("g++")
    if not cxx or not system_cxx or os.path.realpath(cxx) == os.path.realpath(system_cxx):
        return
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write("#include <sstream>\nstd::string probe(long v) { std::ostringstream os; os << v; return os.str(); }\n")
        try:
            subprocess.run([cxx, "-shared", "-fPIC", src, "-o", lib], check=True, capture_output=True)
            needed = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return
    if "libstdc++" in needed:
        return
    if os.environ.get("NVFP4_GEMM_KEEP_CXX") == "1":
        log(f"warning: CXX={cxx} links libstdc++ statically; kept because NVFP4_GEMM_KEEP_CXX=1")
        return
    log(f"CXX={cxx} links libstdc++ statically; using {system_cxx} so the extension shares torch's libstdc++ "
        "(NVFP4_GEMM_KEEP_CXX=1 keeps it)")
    os.environ["CXX"] = system_cxx
    cc = os.path.join(os.path.dirname(system_cxx), "gcc")
    if os.path.exists(cc):
        os.environ["CC"] = cc


def default_max_jobs() -> None:
    if "MAX_JOBS" in os.environ:
        return
    jobs = os.cpu_count() or 1
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        jobs = max(1, min(jobs, avail_kb // (7 * 1024 * 1024)))  # SM100 CUTLASS TUs peak at 5-6.7 GB each
    except (OSError, StopIteration):
        pass
    os.environ["MAX_JOBS"] = str(jobs)


def extensions():
    with_cuda = cuda_wanted()
    archs = bm.requested_archs() if with_cuda else []
    if with_cuda:
        log(f"CUDA {torch.version.cuda}, archs {';'.join(archs)} (NVFP4_GEMM_CUDA_ARCHS)")
    if bm.diagnostics_build():
        log("NVFP4_GEMM_DIAGNOSTICS=1: a diagnostics build (kernel traces compiled in; not for production)")
    experiment = bm.experiment_defines()
    if experiment:
        log(f"NVFP4_GEMM_DEFINES: an experiment build ({' '.join(experiment)}; not for production)")
    mods = bm.enabled_modules(archs, with_cuda)
    cutlass_inc, cutlass_origin = [], None
    if any(m.needs_cutlass for m, _ in mods):
        cutlass_inc, cutlass_origin = bm.cutlass_include_dirs()
        log(f"CUTLASS headers from {cutlass_origin}")
    wheel_inc, wheel_lib = bm.cuda_library_dirs(ce.CUDA_HOME, log) if with_cuda else ([], [])

    exts = []
    for m, gencode in mods:
        sources = m.sources(with_cuda)
        if not sources:
            continue
        includes = [os.path.join(ROOT, d) for d in bm.INCLUDE_DIRS] + (cutlass_inc if m.needs_cutlass else [])
        defines = (["-DNVFP4_GEMM_WITH_CUDA"] if with_cuda else []) + bm.diagnostics_flags() + experiment
        cxx = list(bm.COMMON_CXX_FLAGS) + defines
        name = f"nvfp4_gemm.{m.name}"
        if with_cuda:
            log(f"module {m.name}: {len(sources)} sources, {' '.join(gencode)}")
            exts.append(
                ce.CUDAExtension(
                    name,
                    sources,
                    include_dirs=includes + wheel_inc,
                    library_dirs=wheel_lib,
                    libraries=[bm.cublas_link_name(wheel_lib, ce.CUDA_HOME)] if m.arch_family is None else [],
                    extra_compile_args={"cxx": cxx, "nvcc": list(bm.COMMON_NVCC_FLAGS) + defines + list(m.nvcc_flags) + gencode},
                    extra_link_args=[f"-Wl,-rpath,{d}" for d in wheel_lib],
                    py_limited_api=False,
                )
            )
        else:
            log(f"module {m.name}: {len(sources)} sources (CPU)")
            exts.append(ce.CppExtension(name, sources, include_dirs=includes, extra_compile_args={"cxx": cxx}))

    build = {
        "with_cuda": with_cuda,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if with_cuda else None,
        "archs": archs,
        "modules": [e.name.split(".")[-1] for e in exts],
        "cutlass": cutlass_origin,
        "diagnostics": bm.diagnostics_build(),
    }
    with open(os.path.join(ROOT, "nvfp4_gemm", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py: what this build of nvfp4_gemm contains.\n")
        f.write(f"BUILD = {build!r}\n")
    return exts


shared_libstdcxx_compiler()
default_max_jobs()
setup(
    name="nvfp4_gemm",
    version="0.1.0",
    description="NVFP4 block-scaled GEMM for PyTorch: CUTLASS SM100 kernels, a fused Hopper kernel, CUDA and CPU fallbacks",
    packages=["nvfp4_gemm"],
    python_requires=">=3.10",
    install_requires=["torch>=2.8"],
    ext_modules=extensions(),
    cmdclass={"build_ext": ce.BuildExtension.with_options(use_ninja=True)},
    zip_safe=False,
)
