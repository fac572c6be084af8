"""benchmarks/bench_moe_model.py --smoke: the whole-model MoE benchmark's logic on the CPU (a tiny Qwen3-MoE, no
compile, no graphs): every variant quantizes (experts included), runs decode steps and a prefill, and the
report and JSON come out with finite logits."""
from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("transformers")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))


def test_bench_moe_model_smoke(tmp_path, capsys):
    import bench_moe_model

    out = tmp_path / "moe.json"
    assert bench_moe_model.main(["--smoke", "--json", str(out)]) == 0
    doc = json.load(open(out))
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"bf16", "wo", "static", "static_shared"}
    for name, r in rows.items():
        assert r["finite_b1"] and r["finite_b2"] and r["step_ms_b1"] > 0 and r["prefill_ms"] > 0, name
        if name != "bf16":
            assert r["experts_modules"] == r["fused_routers"] == 2 and r["nvfp4_model_gb"] < r["bf16_model_gb"]
    assert rows["static_shared"]["shared_input_scale_modules"] == 2
    assert "| wo |" in doc["report"] and "decode step batch 1" in capsys.readouterr().out
