"""Loads the core native module and every arch module that was built (torchao-style, by glob)."""
from __future__ import annotations

import glob
import importlib
import os

import torch


def load_native() -> dict:
    from . import _C  # noqa: F401  - registers the schema and the CPU / CUDA implementations

    here = os.path.dirname(__file__)
    loaded, failed = [], {}
    for path in sorted(glob.glob(os.path.join(here, "_C_sm*.*"))):
        name = os.path.basename(path).split(".")[0]
        if name in loaded or name in failed:
            continue
        try:
            importlib.import_module(f"{__package__}.{name}")
            loaded.append(name)
        except ImportError as e:  # a module built against another torch / CUDA: report, keep the rest
            failed[name] = str(e)
    backends = list(torch.ops.nvfp4_gemm._register_backends())
    return {"modules": loaded, "failed": failed, "backends": backends}
