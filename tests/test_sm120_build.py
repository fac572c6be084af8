"""SM120 build checks: the _C_sm120 module was built for sm_120f (one cubin for SM 12.0 and 12.1), and the
SASS of every GEMM kernel in it holds the block-scaled FP4 warp MMA with e4m3 (UE4M3) scales on 16-element
vectors. A kernel compiled without the arch-specific target would lack it (CUTLASS compiles the MMA to a
trap), so this is what proves that the build produced real SM120 kernels. Needs cuobjdump + nvdisasm
(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm); no GPU. Says nothing about the kernels running.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest
import torch

import nvfp4_gemm
from sm120_host import tools

# nvdisasm 13.x spelling of mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X
# .f32.e2m1.e2m1.f32.ue4m3: OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X.
BLOCK_SCALED_MMA = re.compile(r"\bOMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X\b")
SM120_ARCHS = ("12.0f", "12.0a", "12.1a", "12.1f")


def _sm120_module() -> str | None:
    here = os.path.dirname(nvfp4_gemm.__file__)
    hits = sorted(glob.glob(os.path.join(here, "_C_sm120*.so")))
    return hits[0] if hits else None


def _built_with_sm120() -> tuple[bool, str]:
    archs = nvfp4_gemm.info()["build"].get("archs") or []
    return any(a in SM120_ARCHS for a in archs), f"this build's archs are {archs or 'none (CPU-only build)'} (NVFP4_GEMM_CUDA_ARCHS)"


def test_sm120_module_built():
    wanted, why = _built_with_sm120()
    if not wanted:
        pytest.skip(f"_C_sm120 not part of this build: {why}")
    assert _sm120_module(), f"the build asked for SM120 ({why}) but nvfp4_gemm/_C_sm120*.so is missing"
    info = nvfp4_gemm.info()
    assert "_C_sm120" in info["modules"], info["modules_failed_to_load"]
    assert info["backends"]["sm120"]["compiled_for"] == "sm_120f"


def test_sm120_sass_has_block_scaled_mma():
    so = _sm120_module()
    if not so:
        pytest.skip(f"_C_sm120 not built: {_built_with_sm120()[1]}")
    cuobjdump, env, reason = tools.sass_tools_env()
    if reason:
        pytest.skip(reason)
    listing = subprocess.run([cuobjdump, "-lelf", so], capture_output=True, text=True, env=env)
    assert listing.returncode == 0, listing.stderr
    cubins = re.findall(r"ELF file\s+\d+:\s+(\S+)", listing.stdout)
    assert cubins and all("sm_120" in c for c in cubins), f"expected only sm_120 family cubins, got {cubins}"
    p = subprocess.run([cuobjdump, "-sass", so], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.findall(r"arch = (\S+)", p.stdout) and set(re.findall(r"arch = (\S+)", p.stdout)) == {"sm_120f"}, \
        "every cubin must be the sm_120f family target (runs on SM 12.0 and 12.1)"
    kernels: dict[str, str] = {}
    name = None
    for line in p.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            kernels[name] = ""
        elif name:
            kernels[name] += line + "\n"
    # Dense kernels, then the grouped ones (GroupProblemShape: CUTLASS's ptr-array grouped kernel, issue 42 item 2).
    gemms = {k: v for k, v in kernels.items() if "GemmUniversal" in k and "GroupProblemShape" not in k}
    grouped = {k: v for k, v in kernels.items() if "GemmUniversal" in k and "GroupProblemShape" in k}
    n_configs = len(nvfp4_gemm.configs().get("sm120", []))
    n_grouped = len(torch.ops.nvfp4_gemm._grouped_configs("sm120"))
    # Each config holds an fp16, a bf16 and an fp32 kernel.
    assert n_configs and len(gemms) == 3 * n_configs, \
        f"{len(gemms)} GemmUniversal kernels in the SASS, expected 3 x {n_configs}"
    assert n_grouped and len(grouped) == 3 * n_grouped, \
        f"{len(grouped)} grouped GemmUniversal kernels in the SASS, expected 3 x {n_grouped}"
    missing = [k[:120] for k, sass in {**gemms, **grouped}.items() if not BLOCK_SCALED_MMA.search(sass)]
    assert not missing, f"{len(missing)} kernels lack the block-scaled FP4 MMA (OMMA.SF ... E2M1.E2M1.UE4M3.4X): {missing}"
    # Every kernel is the SM120 block-scaled mainloop, never another arch's collective.
    assert all("MainloopSm120TmaWarpSpecializedBlockScaled" in k for k in gemms), list(gemms)[:3]
    assert all("MainloopSm120ArrayTmaWarpSpecializedBlockScaled" in k for k in grouped), list(grouped)[:3]
    assert any("build_group_arguments" in k for k in kernels), "no grouped argument builder kernel in the SASS"
