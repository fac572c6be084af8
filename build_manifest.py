"""The one list of native modules, their sources, arch targets and flags.

Both build systems read this file: setup.py imports it, CMakeLists.txt runs `python build_manifest.py
--cmake` and reads what it prints. Nothing about sources or flags is written down anywhere else.

Arch strings follow TORCH_CUDA_ARCH_LIST spelling: "9.0a", "10.0f", "8.0". NVFP4_GEMM_CUDA_ARCHS picks
them ("9.0a;10.0f"); unset, the build takes the local GPU's arch, or every supported arch when no GPU is
visible. Arch-specific modules build only with their own `a`/`f` target, never with a plain sm_100
(which would compile tcgen05 / wgmma kernels to stubs).
"""
from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.abspath(__file__))

# Every arch the project knows how to build. "8.0" is the floor of the generic CUDA path (bf16 MMA in
# cuBLAS, cp.async); 9.0a adds the Hopper wgmma module; 10.0f the Blackwell tcgen05 family module
# (sm_100 and sm_103 alike); 12.0f the GeForce / workstation Blackwell module (one sm_120f cubin runs on
# SM 12.0 and 12.1).
ALL_ARCHS = ("8.0", "9.0a", "10.0f", "12.0f")


@dataclass(frozen=True)
class Module:
    name: str                     # Python module name under nvfp4_gemm/
    cpp_globs: tuple[str, ...]    # sources built in every configuration (C++ only)
    cuda_globs: tuple[str, ...] = ()  # sources built only when torch has CUDA
    arch_family: str | None = None    # None: generic (every requested arch, plain sm_XY); "9.0a", "10.0f": exactly that target
    accepts: tuple[str, ...] = ()     # requested arch strings that enable this module
    needs_cutlass: bool = False
    nvcc_flags: tuple[str, ...] = field(default_factory=tuple)

    def sources(self, with_cuda: bool) -> list[str]:
        globs = self.cpp_globs + (self.cuda_globs if with_cuda else ())
        out: list[str] = []
        for g in globs:
            out.extend(sorted(glob.glob(os.path.join(ROOT, g))))
        return [os.path.relpath(p, ROOT) for p in out]


MODULES = (
    # Schema, input checks, dispatch, CPU reference backend, generic CUDA backend (decode + cuBLAS).
    Module(
        name="_C",
        cpp_globs=("csrc/bindings/*.cpp", "csrc/cpu/*.cpp"),
        cuda_globs=("csrc/bindings/cuda/*.cpp", "csrc/cuda/*.cu",
                    "csrc/quant/*.cu"),  # NVFP4 quantization kernel (issue 5)
    ),
    # Hopper: fused decode + fp16 wgmma kernels.
    Module(
        name="_C_sm90",
        cpp_globs=(),
        cuda_globs=("csrc/sm90/*.cpp", "csrc/sm90/*.cu", "csrc/sm90/generated/*.cu"),
        arch_family="9.0a",
        accepts=("9.0a",),
        needs_cutlass=True,
    ),
    # Blackwell: CUTLASS block-scaled GemmUniversal kernels.
    Module(
        name="_C_sm100",
        cpp_globs=(),
        cuda_globs=("csrc/sm100/*.cpp", "csrc/sm100/*.cu", "csrc/sm100/generated/*.cu"),
        arch_family="10.0f",
        accepts=("10.0f", "10.0a", "10.3a"),
        needs_cutlass=True,
    ),
    # Blackwell GeForce / RTX PRO / DGX Spark: CUTLASS block-scaled GemmUniversal on the warp-level MMA.
    Module(
        name="_C_sm120",
        cpp_globs=(),
        cuda_globs=("csrc/sm120/*.cpp", "csrc/sm120/*.cu", "csrc/sm120/generated/*.cu"),
        arch_family="12.0f",
        accepts=("12.0f", "12.0a", "12.1a", "12.1f"),
        needs_cutlass=True,
    ),
)

COMMON_CXX_FLAGS = ("-O3", "-std=c++17")
COMMON_NVCC_FLAGS = (
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
    "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",
    # torch's CUDA extension flags turn these off; CUTLASS needs the half / bf16 operators.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
)
INCLUDE_DIRS = ("csrc",)


def diagnostics_build() -> bool:
    """NVFP4_GEMM_DIAGNOSTICS=1 at build time: compile the kernels' diagnostics in (the sm90 timeline trace,
    docs/SM90_NOTES.md). Never in a release build: it adds stamps to the kernels and syncs per launch."""
    return os.environ.get("NVFP4_GEMM_DIAGNOSTICS", "") == "1"


def diagnostics_flags() -> list[str]:
    """Compiler defines of a diagnostics build ([] otherwise), for host and device code alike."""
    return ["-DNVFP4_GEMM_DIAGNOSTICS=1"] if diagnostics_build() else []


def experiment_defines() -> list[str]:
    """NVFP4_GEMM_DEFINES="NVFP4_NAME=INT ..." at build time: compile-time switches of kernel experiments (each
    named in the kernel source that reads it), for A/B builds on the GPU machine; never in a release build.
    Anything else in the variable stops the build with what it expected."""
    defines = []
    for item in os.environ.get("NVFP4_GEMM_DEFINES", "").split():
        if not re.fullmatch(r"NVFP4_[A-Z0-9_]+=-?[0-9]+", item):
            raise SystemExit(f"NVFP4_GEMM_DEFINES: expected NVFP4_NAME=INTEGER items, got {item!r}")
        defines.append("-D" + item)
    return defines


def requested_archs() -> list[str]:
    env = os.environ.get("NVFP4_GEMM_CUDA_ARCHS", "").replace(",", ";").strip()
    if env:
        return [a.strip() for a in env.split(";") if a.strip()]
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return [{9: "9.0a", 10: "10.0f", 12: "12.0f"}.get(major, f"{major}.{minor}")]
    except Exception:  # noqa: BLE001 - torch absent or without a driver: build everything
        pass
    return list(ALL_ARCHS)


def _plain(arch: str) -> str:
    return arch.rstrip("af")


def gencode(arch: str) -> list[str]:
    """-gencode flags for one arch string ("9.0a" -> sm_90a SASS)."""
    num = arch.replace(".", "")
    return [f"-gencode=arch=compute_{num},code=sm_{num}"]


def enabled_modules(archs: list[str], with_cuda: bool) -> list[tuple[Module, list[str]]]:
    """(module, nvcc gencode flags) for every module this build makes."""
    out = []
    for m in MODULES:
        if m.arch_family is None:
            if not with_cuda:
                out.append((m, []))
                continue
            plain = sorted({_plain(a) for a in archs}, key=float)
            flags = [f for a in plain for f in gencode(a)]
            # PTX of the newest plain arch too, so a GPU newer than the build still runs the generic path.
            newest = plain[-1].replace(".", "")
            flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
            out.append((m, flags))
        elif with_cuda and any(a in m.accepts for a in archs):
            out.append((m, gencode(m.arch_family)))
    return out


def cutlass_include_dirs() -> tuple[list[str], str]:
    """CUTLASS headers: $CUTLASS_DIR, else third_party/cutlass, else the nvidia-cutlass package."""
    candidates = []
    if os.environ.get("CUTLASS_DIR"):
        candidates.append(("CUTLASS_DIR", os.environ["CUTLASS_DIR"]))
    candidates.append(("third_party/cutlass", os.path.join(ROOT, "third_party", "cutlass")))
    for origin, base in candidates:
        if os.path.isfile(os.path.join(base, "include", "cutlass", "cutlass.h")):
            return [os.path.join(base, "include"), os.path.join(base, "tools", "util", "include")], f"{origin} ({base})"
    try:
        import cutlass_library

        base = os.path.join(os.path.dirname(cutlass_library.__file__), "source")
        if os.path.isfile(os.path.join(base, "include", "cutlass", "cutlass.h")):
            return [os.path.join(base, "include"), os.path.join(base, "tools", "util", "include")], (
                f"nvidia-cutlass package ({base})"
            )
    except ImportError:
        pass
    raise RuntimeError(
        "CUTLASS headers not found: set CUTLASS_DIR to a CUTLASS checkout, populate third_party/cutlass, "
        "or `pip install nvidia-cutlass==4.2.0.0`"
    )


def cuda_library_dirs(cuda_home: str, log=print) -> tuple[list[str], list[str]]:
    """Include and library dirs for the CUDA libraries (cuBLAS ...) of torch's CUDA wheels (nvidia/cu13/...).

    torch's CUDA headers include cuBLAS / cuSPARSE / cuSOLVER headers, which a compiler-only toolkit does
    not ship. The wheel's include dir also holds its own runtime headers, which must not shadow the
    toolkit's: so only the headers missing from the toolkit are exposed, via links in build/.
    """
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    toolkit_inc = os.path.join(cuda_home, "include")
    shim = os.path.join(ROOT, "build", "cuda_wheel_headers")
    libs, linked = [], 0
    for base in list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []:
        for sub in sorted(os.listdir(base)):
            inc, lib = os.path.join(base, sub, "include"), os.path.join(base, sub, "lib")
            if not os.path.isfile(os.path.join(inc, "cublas_v2.h")):
                continue
            libs.append(lib)
            os.makedirs(shim, exist_ok=True)
            for name in os.listdir(inc):
                src, dst = os.path.join(inc, name), os.path.join(shim, name)
                if os.path.exists(os.path.join(toolkit_inc, name)) or os.path.lexists(dst):
                    continue
                os.symlink(src, dst)
                linked += 1
    if linked:
        log(f"{linked} CUDA library headers linked from torch's CUDA wheels into {shim}")
    return ([shim] if os.path.isdir(shim) else []), libs


def cublas_link_name(lib_dirs: list[str], cuda_home: str) -> str:
    """What to pass to -l for cuBLAS: 'cublas', or ':libcublas.so.N' where only the versioned file exists
    (torch's CUDA wheels ship no unversioned link)."""
    for d in [os.path.join(cuda_home, "lib64"), *lib_dirs]:
        if os.path.exists(os.path.join(d, "libcublas.so")):
            return "cublas"
    for d in lib_dirs:
        versioned = sorted(glob.glob(os.path.join(d, "libcublas.so.*")))
        if versioned:
            return ":" + os.path.basename(versioned[0])
    return "cublas"


def _cmake() -> None:
    """Print `set(...)` lines for CMakeLists.txt: the torch-free kernel sources of each arch module."""
    archs = requested_archs()
    inc, origin = cutlass_include_dirs()
    print(f'set(NVFP4_CUTLASS_INCLUDE_DIRS "{";".join(inc)}")')
    print(f'set(NVFP4_CUTLASS_ORIGIN "{origin}")')
    print(f'set(NVFP4_COMMON_NVCC_FLAGS "{";".join(COMMON_NVCC_FLAGS + tuple(diagnostics_flags() + experiment_defines()))}")')
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    lib_inc, lib_dirs = cuda_library_dirs(cuda_home, log=lambda _m: None)
    print(f'set(NVFP4_CUDA_LIBRARY_INCLUDE_DIRS "{";".join(lib_inc)}")')
    print(f'set(NVFP4_CUDA_LIBRARY_DIRS "{";".join(lib_dirs)}")')
    for m, flags in enabled_modules(archs, with_cuda=True):
        # Kernel TUs only: the torch-facing .cpp files (bindings, module.cpp) are for setup.py.
        kernels = [s for s in m.sources(True) if s.endswith(".cu")]
        print(f'set(NVFP4{m.name}_SOURCES "{";".join(kernels)}")')
        print(f'set(NVFP4{m.name}_GENCODE "{";".join(flags)}")')
    print(f'set(NVFP4_MODULES "{";".join(m.name for m, _ in enabled_modules(archs, True))}")')


if __name__ == "__main__":
    if sys.argv[1:] == ["--cmake"]:
        _cmake()
    else:
        for m, flags in enabled_modules(requested_archs(), with_cuda=True):
            print(m.name, m.sources(True), flags)
