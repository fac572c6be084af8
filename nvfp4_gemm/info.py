"""What this build contains and what will run where: nvfp4_gemm.info() and nvfp4_gemm.configs()."""
from __future__ import annotations

import json
import os

import torch


def _build_info() -> dict:
    try:
        from . import _build_info as b

        return dict(b.BUILD)
    except ImportError:
        return {}


def configs() -> dict[str, list[str]]:
    """Kernel configs per arch backend, by name (what NVFP4_GEMM_CONFIG accepts)."""
    return {name: v["configs"] for name, v in json.loads(torch.ops.nvfp4_gemm._backends_json()).items()}


def dispatch_rules() -> dict[str, str]:
    """What runs for which shape, per backend: each arch module's dispatch table as text (one rule a line,
    first match wins), then the generic path and the CPU backend."""
    rules = {name: v.get("dispatch", "") for name, v in json.loads(torch.ops.nvfp4_gemm._backends_json()).items()}
    if _build_info().get("with_cuda"):
        rules["generic"] = ("every CUDA problem no arch table takes (float32 activations, the weight-only form "
                            "off Hopper): decode to fp16/bf16/fp32, one cuBLAS GEMM\n")
    rules["cpu"] = "every problem on CPU tensors: exact decode, fp32 matmul\n"
    return rules


def info() -> dict:
    """The build (archs, modules, CUTLASS origin), the backends and configs, and what runs on this device."""
    from . import _native

    build = _build_info()
    backends = {"cpu": {"compiled_for": "cpu", "configs": ["decode+fp32 matmul"]}}
    if build.get("with_cuda"):
        backends["generic"] = {"compiled_for": ";".join(build.get("archs", [])), "configs": ["decode+cublas"]}
    backends.update(json.loads(torch.ops.nvfp4_gemm._backends_json()))
    out = {
        "build": build,
        "modules": ["_C", *_native["modules"]],
        "modules_failed_to_load": _native["failed"],
        "backends": backends,
        "forced_backend": os.environ.get("NVFP4_GEMM_BACKEND", "auto"),
        "forced_config": os.environ.get("NVFP4_GEMM_CONFIG"),
    }
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        sm = major * 10 + minor
        arch = list(torch.ops.nvfp4_gemm._backends_for_sm(sm))
        out["device"] = {"name": torch.cuda.get_device_name(), "sm": f"{major}.{minor}"}
        out["device_backends"] = arch + (["generic"] if sm >= 80 else [])
        out["device_note"] = (
            f"shapes go to {arch[0]} where its table has a config, else generic" if arch
            else ("generic (decode + cuBLAS) for every shape" if sm >= 80 else "no usable kernel (needs SM >= 8.0)")
        )
    else:
        out["device"] = {"name": "cpu"}
        out["device_backends"] = ["cpu"]
    return out
