"""benchmarks/bench_moe.py in --smoke mode (CPU, tiny MoE shapes, wall clock), as a user runs it: its JSON and
Markdown checked against figures recomputed here (routing counts, experts hit, read floors, ratios, verdicts) and
every timed variant's output check inside the tolerance."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)


def test_bench_moe_smoke(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("NVFP4_GEMM_BACKEND", None)
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "bench_moe.py"), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    data = json.loads((tmp_path / "bench_moe.json").read_text())
    md = (tmp_path / "bench_moe.md").read_text()
    assert data["report"].strip() == md.strip()

    import bench_moe

    meta, rows, targets = data["meta"], data["rows"], data["targets"]
    assert meta["device"] == "cpu" and "--smoke" in meta["command"] and meta["commit"]
    models = meta["models"]
    assert set(models) == set(bench_moe.SMOKE_MODELS)
    assert len(rows) == len(models) * len(bench_moe.SMOKE["tokens"]) * len(bench_moe.ROUTINGS)
    copy_tbps = data["ceilings"]["copy_tbps"]
    for r in rows:
        e, k, h, i = models[r["model"]]
        ids = bench_moe.route(r["tokens"], e, k, r["routing"], seed=7919 * r["tokens"] + (r["routing"] == "skewed"))
        assert ids.shape == (r["tokens"], k)
        assert all(len(set(row.tolist())) == k for row in ids)  # k distinct experts per token
        counts, offs = bench_moe.grouping(ids, e)
        assert int(offs[-1]) == r["rows"] == r["tokens"] * k
        hit = sum(c > 0 for c in counts)
        assert r["experts_hit"] == hit and r["max_tokens_per_expert"] == max(counts)
        assert r["hit_bytes"] == hit * bench_moe.expert_bytes(h, i)
        assert abs(r["variants"]["read"]["us"] - r["hit_bytes"] / (copy_tbps * 1e6)) < 1e-9
        assert r["layers"] >= 2
        for v in ("w4a16", "w4a4_dyn", "w4a4_static", "bf16"):
            rec = r["variants"][v]
            assert "us" in rec and rec["us"] > 0, (r["model"], r["tokens"], v, rec)
            tol = bench_moe.CHECK_TOL.get(v, bench_moe.CHECK_TOL_DEFAULT)
            assert rec["rel_err"] <= tol, (r["model"], r["tokens"], r["routing"], v, rec["rel_err"])
        assert "unavailable" in r["variants"]["humming"]  # humming needs CUDA
    # Verdicts recomputed from the rows.
    for t in targets:
        row = next(r for r in rows if (r["model"], r["tokens"], r["routing"]) == (t["model"], t["tokens"], t["routing"]))
        label = next(x for x in bench_moe.targets_for(t["model"]) if x[0] == t["target"])
        _, _, v, baselines, limit = label
        times = [bench_moe.us(row, b) for b in (v, *baselines)]
        if any(x is None for x in times):
            assert t["verdict"] == "n/a"
        else:
            ratio = times[0] / min(times[1:])
            assert abs(t["ratio"] - ratio) < 1e-12 and t["verdict"] == ("PASS" if ratio <= limit else "MISS")
    assert "w4a16 / humming" in md and "**tiny**" in md


def test_bench_moe_rejects_bad_flags():
    import bench_moe

    for argv, msg in ((["--smoke", "--tokens", "0"], "--tokens"), (["--smoke", "--variants", "x"], "--variants"),
                      (["--smoke", "--routings", "zipf"], "--routings")):
        try:
            bench_moe.main(argv)
        except SystemExit as e:
            assert msg in str(e)
        else:
            raise AssertionError(f"{argv} accepted")


def test_layers_needed_exceeds_three_l2():
    import bench_moe

    for hit, l2 in ((10, 100), (300, 100), (1, 50 << 20), (7 << 20, 50 << 20)):
        r = bench_moe.layers_needed(hit, l2, cap=10**9)
        assert r >= 2 and (r * hit > 3 * l2 or r == 2)
    assert bench_moe.layers_needed(1, 1000, cap=5) == 5
    torch.manual_seed(0)
