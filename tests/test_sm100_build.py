"""SM100 build checks (issue 3, checks a and b): the _C_sm100 module was built for sm_100f, and its SASS
holds the block-scaled FP4 tensor-core MMA and the tcgen05 scale-factor copy in every GEMM kernel.

A plain sm_100 (non-`f`/`a`) build of these kernels compiles to stubs without tcgen05 instructions, so
this is what proves that the build produced real Blackwell kernels. Needs cuobjdump + nvdisasm
(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm); no GPU.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest
import torch

import nvfp4_gemm
from sm100_host import tools

# SASS names (nvdisasm 13.x) of what the kernels must contain:
#   UTCOMMA / UTCQMMA: tcgen05.mma ... kind::mxf4nvf4.block_scale (".4X": 16-element scale vectors, NVFP4)
#   UTCCP:            tcgen05.cp of the scale factors from shared memory into tensor memory
REQUIRED = {"block-scaled FP4 MMA (UTCOMMA/UTCQMMA)": re.compile(r"\bUTC[OQ]MMA\b"),
            "scale-factor copy (UTCCP)": re.compile(r"\bUTCCP\b")}


def _sm100_module() -> str | None:
    here = os.path.dirname(nvfp4_gemm.__file__)
    hits = sorted(glob.glob(os.path.join(here, "_C_sm100*.so")))
    return hits[0] if hits else None


def _built_with_sm100() -> tuple[bool, str]:
    build = nvfp4_gemm.info()["build"]
    archs = build.get("archs") or []
    wanted = any(a in ("10.0f", "10.0a", "10.3a", "10.0", "10.3") for a in archs)
    return wanted, f"this build's archs are {archs or 'none (CPU-only build)'} (NVFP4_GEMM_CUDA_ARCHS)"


def test_sm100_module_built():
    wanted, why = _built_with_sm100()
    if not wanted:
        pytest.skip(f"_C_sm100 not part of this build: {why}")
    so = _sm100_module()
    assert so, f"the build asked for SM100 ({why}) but nvfp4_gemm/_C_sm100*.so is missing"
    assert "_C_sm100" in nvfp4_gemm.info()["modules"], nvfp4_gemm.info()["modules_failed_to_load"]


def _kernels_sass(so: str) -> dict[str, str]:
    cuobjdump, env, reason = tools.sass_tools_env()
    if reason:
        pytest.skip(reason)
    listing = subprocess.run([cuobjdump, "-lelf", so], capture_output=True, text=True, env=env)
    assert listing.returncode == 0, listing.stderr
    cubins = re.findall(r"ELF file\s+\d+:\s+(\S+)", listing.stdout)
    assert cubins and all("sm_100" in c for c in cubins), f"expected only sm_100 cubins, got {cubins}"
    p = subprocess.run([cuobjdump, "-sass", so], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    kernels: dict[str, str] = {}
    name = None
    for line in p.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            kernels[name] = ""
        elif name:
            kernels[name] += line + "\n"
    return kernels


def test_sm100_sass_has_block_scaled_mma():
    wanted, why = _built_with_sm100()
    so = _sm100_module()
    if not so:
        pytest.skip(f"_C_sm100 not built: {why}")
    kernels = _kernels_sass(so)
    # Dense kernels; the grouped ones (GroupProblemShape) are test_sm100_grouped_sass_has_block_scaled_mma's.
    gemms = {k: v for k, v in kernels.items() if "GemmUniversal" in k and "GroupProblemShape" not in k}
    n_configs = len(nvfp4_gemm.configs().get("sm100", []))
    # Each config holds an fp16, a bf16 and an fp32 kernel.
    assert len(gemms) == 3 * n_configs, f"{len(gemms)} GemmUniversal kernels in the SASS, expected 3 x {n_configs}"
    for what, pattern in REQUIRED.items():
        missing = [k[:120] for k, sass in gemms.items() if not pattern.search(sass)]
        assert not missing, f"{len(missing)} kernels lack the {what}: {missing}"


def test_sm100_grouped_sass_has_block_scaled_mma():
    """Every grouped config's three kernels (issue 40 item 3) are CUTLASS's ptr-array grouped block-scaled kernel with
    the tcgen05 NVFP4 MMA and scale-factor copy in their SASS, beside one argument builder per form."""
    wanted, why = _built_with_sm100()
    so = _sm100_module()
    if not so:
        pytest.skip(f"_C_sm100 not built: {why}")
    kernels = _kernels_sass(so)
    grouped = {k: v for k, v in kernels.items() if "GemmUniversal" in k and "GroupProblemShape" in k}
    n_configs = len(torch.ops.nvfp4_gemm._grouped_configs("sm100"))
    assert n_configs >= 1, "the sm100 module registered no grouped table"
    assert len(grouped) == 3 * n_configs, f"{len(grouped)} grouped GemmUniversal kernels, expected 3 x {n_configs}"
    assert all("MainloopSm100ArrayTmaUmmaWarpSpecializedBlockScaled" in k for k in grouped), list(grouped)[:2]
    for what, pattern in REQUIRED.items():
        missing = [k[:120] for k, sass in grouped.items() if not pattern.search(sass)]
        assert not missing, f"{len(missing)} grouped kernels lack the {what}: {missing}"
    builders = [k for k in kernels if "build_group_arguments" in k]
    assert builders, "no grouped argument builder kernel in the SASS"
