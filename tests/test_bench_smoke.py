"""The GPU benchmarks' logic, run on the CPU: benchmarks/bench_mm.py and benchmarks/bench_model.py in --smoke
mode (tiny shapes, wall clock, no CUDA graphs), each in a subprocess as a user runs it, then their JSON and
printed tables checked against figures recomputed here (operand-set counts, ratios, target verdicts) and
their outputs against the float reference; bench_linear_host.py's table. Each script takes ~5-20 s on a 2-core machine.
Last, the GPU-machine driver benchmarks/device.sh: its steps and its command-line checks (nothing runs)."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import nvfp4_gemm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("NVFP4_GEMM_BACKEND", None)
    return subprocess.run([sys.executable, os.path.join(BENCH, name), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=180)


def assert_ran(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def check_meta(meta: dict) -> None:
    for key in ("device", "torch", "commit", "date", "command", "timing"):
        assert isinstance(meta.get(key), str) and meta[key], f"meta[{key!r}] missing or empty: {meta.get(key)!r}"
    assert meta["device"] == "cpu"
    assert meta["torch"] == torch.__version__
    assert "--smoke" in meta["command"]


def check_verdict(value, limit, verdict) -> None:
    if value is None:
        assert verdict == "n/a"
    else:
        assert verdict == ("PASS" if value <= limit else "MISS"), (value, limit, verdict)


def test_bench_mm_decode_targets():
    """Issue 25's decode-shape targets: ours / humming, and (ours - 2 us) / read against 1.5, on the decode
    shapes only; a row without humming gets n/a, not a verdict."""
    bench_mm = bench_module("bench_mm")

    def row(m, n, k, **us):
        return dict(m=m, n=n, k=k, variants={v: {"us": t} for v, t in us.items()})

    rows = [row(1, 4096, 4096, ours=9.0, read=5.0, humming=12.0), row(16, 6144, 4096, ours=14.0, read=6.0),
            row(1, 7168, 16384, ours=30.0, read=22.0, humming=31.0)]
    got = {(t["target"], t["m"], t["n"]): t for t in bench_mm.evaluate_targets(rows)}
    slack = got[("decode shapes: ours <= 1.5 x read + 2 us", 1, 4096)]
    assert math.isclose(slack["ratio"], (9.0 - 2.0) / 5.0) and slack["verdict"] == "PASS"
    assert got[("decode shapes: ours <= 1.5 x read + 2 us", 16, 6144)]["verdict"] == "MISS"  # (14 - 2) / 6 = 2
    assert math.isclose(got[("decode shapes: ours <= 0.8 x humming", 1, 4096)]["ratio"], 0.75)
    assert got[("decode shapes: ours <= 0.8 x humming", 16, 6144)]["verdict"] == "n/a"
    assert ("decode shapes: ours <= 0.8 x humming", 1, 7168) not in got  # not a decode shape
    assert got[("ours <= 0.95 x humming", 1, 7168)]["verdict"] == "MISS"  # 30 / 31 > 0.95
    assert bench_mm.SHAPES[-6:] == tuple((m, n, 4096) for m in (1, 16) for n in (1024, 4096, 6144))


def test_bench_mm_smoke(tmp_path):
    out = tmp_path / "mm.json"
    proc = run_script("bench_mm.py", "--smoke", "--backends", "sm90", "--json", str(out))
    assert_ran(proc)
    data = json.loads(out.read_text())
    check_meta(data["meta"])
    assert data["meta"]["read_kernel"] == "torch.sum"
    c = data["ceilings"]
    assert c["copy_tbps"] > 0 and c["mm_tflops"] > 0
    assert math.isclose(c["copy_tbps"], 2 * c["copy_bytes"] / c["copy_us"] / 1e6, rel_tol=1e-9)

    shapes = [(r["m"], r["n"], r["k"]) for r in data["rows"]]
    assert shapes == [(1, 64, 256), (16, 64, 128), (130, 48, 256), (512, 16, 64)]
    for r in data["rows"]:
        m, n, k = r["m"], r["n"], r["k"]
        # R: the fewest sets (>= 2) whose packed weights and scales exceed 3x L2, capped at --max-sets (8).
        wb = n * k // 2 + n * k // 16
        want = 2
        while want * wb <= 3 * r["l2_bytes"]:
            want += 1
        assert r["sets"] == min(want, 8), (m, n, k, r["sets"], want)
        assert r["read_bytes"] == (m + n) * k // 2 + (m + n) * k // 16
        v = r["variants"]
        assert list(v) == ["ours", "ours[sm90]", "wo_fp16", "wo_bf16", "cublas", "humming", "read"]
        for name in ("ours", "cublas", "read"):
            assert v[name]["us"] > 0 and v[name]["eager_us"] > 0, (name, v[name])
        # The script checks each variant's output against its own float32 reference; on the CPU both
        # ours and cuBLAS-on-dequantized-operands are exact up to fp16 output rounding.
        for name in ("ours", "cublas"):
            assert v[name]["rel_err"] < 2e-3, (m, n, k, name, v[name]["rel_err"])
        assert "CUDA" in v["humming"]["unavailable"]
        assert "CUDA" in v["ours[sm90]"]["unavailable"]
        for name in ("wo_fp16", "wo_bf16"):  # timed once mm has the weight-only form, else says why not
            assert ("us" in v[name] and v[name]["rel_err"] < 1e-2) or "weight-only" in v[name]["unavailable"], v[name]
        assert math.isclose(r["ratios"]["ours/read"], v["ours"]["us"] / v["read"]["us"], rel_tol=1e-9)
        assert math.isclose(r["read_tbps"], r["read_bytes"] / v["read"]["us"] / 1e6, rel_tol=1e-9)
        assert r["ratios"]["ours/min(humming,cublas)"] is None  # humming has no time here

    targets = data["targets"]
    # The smoke shapes are none of the decode shapes, so their two targets do not appear.
    assert {t["target"] for t in targets} == {
        "ours <= 0.95 x humming", "weight-only fp16 <= 0.95 x humming", "weight-only bf16 <= 0.95 x humming",
        "ours <= 1.10 x read floor, M = 1 and 16"}
    rows = {(r["m"], r["n"], r["k"]): r for r in data["rows"]}
    for t in targets:
        row = rows[(t["m"], t["n"], t["k"])]
        if "read floor" in t["target"]:
            assert t["m"] in (1, 16)
            assert math.isclose(t["ratio"], row["ratios"]["ours/read"], rel_tol=1e-9)
        else:
            assert t["ratio"] is None and t["verdict"] == "n/a"  # humming has no time on the CPU
        check_verdict(t["ratio"], t["limit"], t["verdict"])

    text = proc.stdout
    assert data["report"] in text
    assert "| M | N | K | R | ours | ours[sm90] | wo_fp16 | wo_bf16 | cublas | humming | read |" in text
    for m, n, k in shapes:
        assert f"| {m} | {n} | {k} | " in text
    assert "| target (issue 11) | M, N, K | ratio | limit | verdict |" in text
    counts = {x: sum(t["verdict"] == x for t in targets) for x in ("PASS", "MISS", "n/a")}
    assert f"Targets: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a" in text


def test_bench_model_smoke(tmp_path):
    out, png = tmp_path / "model.json", tmp_path / "model.png"
    proc = run_script("bench_model.py", "--smoke", "--json", str(out), "--png", str(png))
    assert_ran(proc)
    data = json.loads(out.read_text())
    check_meta(data["meta"])
    variants = ["fp16", "bf16", "dynamic", "static", "wo_fp16", "wo_bf16", "mm", "humming"]
    ms = [1, 16, 128]
    rows = {(r["variant"], r["m"]): r for r in data["rows"]}
    assert sorted(rows) == sorted((v, m) for v in variants for m in ms)
    assert all(r["stack"] == "tiny" for r in data["rows"])
    for m in ms:
        base = rows[("fp16", m)]
        for v in ("fp16", "bf16", "dynamic", "static", "mm"):
            r = rows[(v, m)]
            assert r["finite"], r
            for key in ("graph_us", "eager_us", "host_us"):
                assert r[key] > 0, (v, m, key, r[key])
            assert math.isclose(r["graph_ratio"], r["graph_us"] / base["graph_us"], rel_tol=1e-9)
            assert math.isclose(r["host_ratio"], r["host_us"] / base["host_us"], rel_tol=1e-9)
            assert math.isclose(r["eager_over_graph"], r["eager_us"] / r["graph_us"], rel_tol=1e-9)
        assert base["graph_ratio"] == 1.0
        assert math.isclose(rows[("dynamic", m)]["over_static"],
                            rows[("dynamic", m)]["graph_us"] / rows[("static", m)]["graph_us"], rel_tol=1e-9)
        assert "CUDA" in rows[("humming", m)]["unavailable"]
        for v in ("wo_fp16", "wo_bf16"):  # timed once NVFP4Linear has weight_only=, else says why not
            r = rows[(v, m)]
            why = r.get("unavailable", "")
            assert ("graph_us" in r and r["finite"]) or "weight_only" in why or "weight-only" in why, r

    targets = data["targets"]
    assert targets and all(t["stack"] == "tiny" for t in targets)
    for t in targets:
        r = rows[(t["variant"], t["m"])]
        measure = {"graph time / fp16 nn.Linear's": "graph_ratio", "dynamic / static graph time": "over_static",
                   "eager / graph time, M >= 128": "eager_over_graph",
                   "eager host time / fp16 nn.Linear's": "host_ratio"}[t["target"]]
        assert t["value"] == r.get(measure)
        check_verdict(t["value"], t["limit"], t["verdict"])
    eager_ms = {t["m"] for t in targets if t["target"].startswith("eager / graph")}
    assert eager_ms == {128}
    graph_limits = {(t["variant"], t["m"]): t["limit"] for t in targets if t["target"] == "graph time / fp16 nn.Linear's"}
    assert graph_limits[("static", 1)] == 0.33 and graph_limits[("static", 128)] == 0.60
    assert ("static", 16) in graph_limits and not any(m == 64 for _, m in graph_limits)

    text = proc.stdout
    assert data["report"] in text
    assert "| graph_us | M=1 | M=16 | M=128 |" in text
    assert "| target | variant | M=1 | M=16 | M=128 |" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib not importable" in text
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def bench_module(name: str):
    sys.path.insert(0, BENCH)
    return __import__(name)


@pytest.mark.parametrize("script, args, words", [
    ("bench_mm", ["--smoke", "--shapes", "16x60x256"], ["--shapes", "multiple of 8"]),
    ("bench_mm", ["--smoke", "--variants", "ours,magic"], ["--variants", "cublas"]),
    ("bench_mm", ["--smoke", "--backends", "sm75"], ["--backends", "sm90"]),
    ("bench_model", ["--smoke", "--m", "0"], ["--m", "positive"]),
    ("bench_model", ["--smoke", "--variants", "fp8"], ["--variants", "wo_bf16"]),
])
def test_bad_arguments(script, args, words):
    with pytest.raises(SystemExit) as e:
        bench_module(script).main(args)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_weight_only_variant_follows_contract(monkeypatch):
    """bench_mm's weight-only variants call mm(a, b, None, sfb, alpha=) with `a` the dequantized activations in
    fp16 / bf16 (interface contract 1). Until mm has that form here, an emulation computed from what it is
    handed stands in: the variant's output must then match alpha * A @ B^T."""
    bench_mm = bench_module("bench_mm")
    real_mm = nvfp4_gemm.mm
    seen = []

    def mm_with_weight_only(a, b, sfa, sfb, alpha=None, out_dtype=None):
        if sfa is not None:
            return real_mm(a, b, sfa, sfb, alpha=alpha, out_dtype=out_dtype or torch.float16)
        seen.append(a.dtype)
        k = b.shape[1] * 2
        c = a.double() @ nvfp4_gemm.dequantize(b, sfb, k, torch.float64).T
        return (c * (1.0 if alpha is None else float(alpha))).to(out_dtype or a.dtype)

    monkeypatch.setattr(nvfp4_gemm, "mm", mm_with_weight_only)
    m, n, k = 5, 24, 96
    sets = [bench_mm.make_set(m, n, k, seed=s, device=torch.device("cpu")) for s in (7, 8)]
    reader = bench_mm.Reader(torch.device("cpu"))
    for variant, dtype in (("wo_fp16", torch.float16), ("wo_bf16", torch.bfloat16)):
        calls, scale = bench_mm.build(variant, sets, k, torch.device("cpu"), reader)
        assert len(calls) == 2
        for s, call in zip(sets, calls):
            out = call()
            assert out.dtype == dtype and out.shape == (m, n)
            ref = (nvfp4_gemm.dequantize(s["a"], s["sfa"], k) @ nvfp4_gemm.dequantize(s["b"], s["sfb"], k).T) * float(s["alpha"])
            assert bench_mm.rel_err(out, ref, scale) < (1e-3 if dtype == torch.float16 else 8e-3)
        assert seen[-1] == dtype


def test_bench_methods_smoke(tmp_path):
    """benchmarks/bench_methods.py --smoke: the tiny stack's timings, the mse / rtn ratio and its verdict, as
    the JSON and the printed table give them."""
    out = tmp_path / "methods.json"
    proc = run_script("bench_methods.py", "--smoke", "--repeats", "2", "--json", str(out))
    assert_ran(proc)
    data = json.loads(out.read_text())
    check_meta(data["meta"])
    assert data["elements"] == 2 * (96 * 64 + 64 * 64 + 256 * 64 + 64 * 128)
    assert set(data["median_s"]) == {"rtn", "mse", "mse+hessian", "piece: per-tensor amax", "piece: quantize kernel",
                                     "piece: search kernel"}
    for name, runs in data["seconds"].items():
        assert len(runs) == 2 and all(t > 0 for t in runs)
        assert math.isclose(data["median_s"][name], sum(runs) / 2, rel_tol=1e-12)
    ratio = data["median_s"]["mse"] / data["median_s"]["rtn"]
    assert math.isclose(data["mse_over_rtn"], ratio, rel_tol=1e-12)
    check_verdict(ratio, data["target"], data["verdict"])
    assert f"mse / rtn = {ratio:.2f}" in proc.stdout


def test_bench_linear_host_smoke():
    """benchmarks/bench_linear_host.py on the CPU: a row per variant and bias, ratios to F.linear's time."""
    proc = run_script("bench_linear_host.py", "--device", "cpu", "--k", "64", "--calls", "3", "--replays", "1")
    assert_ran(proc)
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("F.linear", "nn.Linear", "NVFP4Linear", "  torch.ops"))]
    names = [" ".join(r[:-2]) for r in rows]  # name, bias (no launch count on the CPU)
    expected = ["F.linear", "nn.Linear"] + [v for mode in ("dynamic", "static", "weight_only")
                                            for v in (f"NVFP4Linear {mode}", f"torch.ops.nvfp4_gemm.linear {mode}")]
    assert names == [f"{n} {bias}" for bias in ("False", "True") for n in expected], names
    for i, r in enumerate(rows):
        us, ratio = float(r[-2]), float(r[-1].rstrip("x"))
        ref = float(rows[0 if i < len(expected) else len(expected)][-2])  # F.linear's row, same bias
        assert us > 0 and math.isclose(ratio, us / ref, abs_tol=0.006 + 0.01 * us / ref), (r, ref)


def test_bench_train_smoke(tmp_path):
    """benchmarks/bench_train.py --smoke: both bases train (finite losses), the base-weight bytes match the
    formats' sizes recomputed here, ratios and verdicts follow from the rows."""
    pytest.importorskip("peft", reason="peft is not installed: `pip install --no-deps peft==0.21.2 accelerate==1.15.0`")
    out = tmp_path / "train.json"
    proc = run_script("bench_train.py", "--smoke", "--breakdown", "--json", str(out))
    assert_ran(proc)
    data = json.loads(out.read_text())
    check_meta(data["meta"])
    rows = {r["variant"]: r for r in data["rows"]}
    assert list(rows) == ["bf16", "nvfp4-wo"]
    # --breakdown: the NVFP4 base's GEMMs per step. Per layer 6 forwards (gate / up fuse: N = 128 each; q / k / v
    # do not: N = 64, 32, 32), the same 6 backwards but in layer 0 only o, gate/up and down (the embedding output
    # needs no gradient): 12 forwards, 9 decodes, each decode inside one grad_input.
    b = rows["nvfp4-wo"]["breakdown"]
    assert rows["bf16"]["breakdown"] is None
    assert b["calls per step"] == {"forward": 12, "decode": 9, "grad_input": 9}
    assert all(b[part] > 0 for part in ("base forward", "backward decode", "backward GEMM + alpha + rounding"))
    assert "the NVFP4 layers' share (ms per step, --breakdown): base forward" in proc.stdout
    # The tiny stack: hidden 64, MLP 128, 4 heads of 16, 2 KV heads; 2 layers; LoRA rank 16 on every projection.
    shapes = [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)]  # (N, K)
    layers = data["meta"]["layers"]
    assert layers == 2
    bf16 = layers * sum(2 * n * k for n, k in shapes)
    nvfp4 = layers * sum(n * k // 2 + nvfp4_gemm.blocked_shape(n, k)[0] * nvfp4_gemm.blocked_shape(n, k)[1] + 4
                         for n, k in shapes)
    assert rows["bf16"]["base_weight_bytes"] == bf16
    assert rows["nvfp4-wo"]["base_weight_bytes"] == nvfp4
    for r in rows.values():
        assert r["trainable_params"] == layers * sum(16 * (n + k) for n, k in shapes)
        assert len(r["step_ms_all"]) == data["meta"]["steps"] and all(t > 0 for t in r["step_ms_all"])
        assert math.isclose(r["step_ms"], sorted(r["step_ms_all"])[len(r["step_ms_all"]) // 2], rel_tol=1e-12)
        assert len(r["losses"]) == data["meta"]["warmup"] + data["meta"]["steps"]
        assert all(math.isfinite(x) and x > 0 for x in r["losses"])
        assert r["peak_bytes"] is None  # no CUDA memory stats on the CPU
    mem, step = data["targets"]
    assert math.isclose(mem["value"], nvfp4 / bf16, rel_tol=1e-12)
    assert math.isclose(step["value"], rows["nvfp4-wo"]["step_ms"] / rows["bf16"]["step_ms"], rel_tol=1e-12)
    check_verdict(mem["value"], 0.35, mem["verdict"])
    check_verdict(step["value"], 1.15, step["verdict"])
    assert f"| base-weight memory vs bf16 | {mem['value']:.3f}x | <= 0.35x | {mem['verdict']} |" in proc.stdout


def test_bench_generate_smoke(tmp_path):
    """benchmarks/bench_generate.py --smoke: a tiny Llama through every variant on the CPU; the JSON's ratios and
    verdicts recomputed here, fused variants running 4 NVFP4 GEMMs per layer and unfused 7 with bit-identical
    logits, humming reported missing, the memory figures present."""
    out = tmp_path / "generate.json"
    proc = run_script("bench_generate.py", "--smoke", "--json", str(out))
    assert_ran(proc)
    data = json.loads(out.read_text())
    check_meta(data["meta"])
    layers, batches = data["meta"]["layers"], data["meta"]["batch"]
    assert batches == [1, 2]
    rows = {r["variant"]: r for r in data["rows"]}
    assert list(rows) == ["fp16", "wo", "wo_unfused", "humming", "static", "static_unfused", "dynamic",
                          "dynamic_unfused"]
    assert "CUDA" in rows["humming"]["missing"]
    fp16 = rows["fp16"]
    for v, r in rows.items():
        if v == "humming":
            continue
        assert "error" not in r, r
        for b in batches:
            assert r[f"step_ms_b{b}"] > 0 and r[f"finite_b{b}"]
            assert math.isclose(r[f"speedup_b{b}"], fp16[f"step_ms_b{b}"] / r[f"step_ms_b{b}"], rel_tol=1e-9)
        assert math.isclose(r["prefill_ratio"], r["prefill_ms"] / fp16["prefill_ms"], rel_tol=1e-9)
        assert r["generate_tok_s"] > 0
        calls = r["profile"]["nvfp4_linear_calls"]
        assert calls == (0 if v == "fp16" else layers * (4 if not v.endswith("_unfused") else 7)), (v, calls)
        assert r["profile"]["classes"]["gemm"]["count"] >= calls + 1  # + the float lm_head
        assert r["profile"]["classes"]["attention"]["count"] >= layers
        if v != "fp16":
            assert 0 < r["rel_err_vs_fp16_b1"] < 1, (v, r["rel_err_vs_fp16_b1"])
            assert r["fused_parts"] == (layers * 5 if not v.endswith("_unfused") else 0)
            assert r["nvfp4_model_bytes"] < r["float_model_bytes"]
        if v.endswith("_unfused"):
            assert all(r[f"bit_identical_to_fused_b{b}"] for b in batches), r
    targets = data["targets"]
    assert {(t["variant"], t["key"]) for t in targets} >= {("wo", "speedup_b1"), ("dynamic", "speedup_b16"),
                                                           ("wo", "over_humming_b1"), ("dynamic", "prefill_ratio")}
    for t in targets:
        x = rows.get(t["variant"], {}).get(t["key"])
        assert t["value"] == x
        if x is None:
            assert t["verdict"] == "n/a"
        else:
            ok = {">=": x >= t["limit"], "<=": x <= t["limit"], ">": x > t["limit"]}[t["op"]]
            assert t["verdict"] == ("PASS" if ok else "MISS"), t
    assert all(t["verdict"] == "n/a" for t in targets if "humming" in t["key"])  # no humming time on the CPU
    text = proc.stdout
    assert data["report"] in text
    assert "| variant | step b1 ms (fp16 / it) | step b2 ms (fp16 / it) |" in text
    assert "Unfused logits bit-identical to fused (same NVFP4 tensors): wo_unfused b1: yes" in text


def test_bench_generate_smoke_own_scales(tmp_path):
    """--own-scales: every fused group runs with per-part alphas, still 4 NVFP4 GEMMs per layer (7 unfused),
    and the unfused logits are bit for bit the fused ones."""
    out = tmp_path / "generate.json"
    proc = run_script("bench_generate.py", "--smoke", "--own-scales", "--inductor-pdl", "--variants",
                      "wo,wo_unfused,dynamic,dynamic_unfused", "--prefill", "0", "--generate-tokens", "0",
                      "--json", str(out))
    assert_ran(proc)
    data = json.loads(out.read_text())
    assert data["meta"]["own_scales"] is True and "--own-scales" in data["report"]
    assert data["meta"]["inductor_pdl"] is True and "--inductor-pdl" in data["report"]
    layers, batches = data["meta"]["layers"], data["meta"]["batch"]
    rows = {r["variant"]: r for r in data["rows"]}
    assert list(rows) == ["fp16", "wo", "wo_unfused", "dynamic", "dynamic_unfused"]
    for v, r in rows.items():
        assert "error" not in r, r
        if v == "fp16":
            continue
        assert r["own_alpha_groups"] == layers * 2
        assert r["fused_parts"] == (0 if v.endswith("_unfused") else layers * 5)
        assert r["profile"]["nvfp4_gemm_calls"] == layers * (7 if v.endswith("_unfused") else 4), v
        if v.endswith("_unfused"):
            assert all(r[f"bit_identical_to_fused_b{b}"] for b in batches), r


@pytest.mark.parametrize("args, words", [
    (["--smoke", "--variants", "fp8"], ["--variants", "dynamic_unfused"]),
    (["--smoke", "--batch", "0"], ["--batch", "positive"]),
    (["--smoke", "--layers", "0"], ["--layers", "positive"]),
    (["--smoke", "--context", "100000"], ["--context", "positions"]),
])
def test_bench_generate_bad_arguments(args, words):
    with pytest.raises(SystemExit) as e:
        bench_module("bench_generate").main(args)
    for w in words:
        assert w in str(e.value), str(e.value)


DRIVER = os.path.join(BENCH, "device.sh")


def driver_steps() -> list[str]:
    text = open(DRIVER).read()
    block = text.split("STEPS=(", 1)[1].split(")", 1)[0]
    return block.split()


def run_driver(*args: str, out: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DIAG"}
    return subprocess.run(["bash", DRIVER, *args], capture_output=True, text=True, cwd=ROOT, env=dict(env, OUT=out),
                          timeout=60)


def test_device_driver_steps_are_documented_and_handled():
    """Each step device.sh accepts has its branch of the step `case` and a line in the header (--help)."""
    assert subprocess.run(["bash", "-n", DRIVER]).returncode == 0
    steps = driver_steps()
    assert len(steps) == len(set(steps)) and {"build", "tests", "sanitize", "generate"} <= set(steps)
    text = open(DRIVER).read()
    for s in steps:
        assert re.search(rf"^    {s}\)$", text, re.M), f"no case branch for step {s}"
    proc = run_driver("--help", out=os.devnull)
    assert proc.returncode == 0, proc.stderr
    for s in steps:
        assert re.search(rf"^  {s} ", proc.stdout, re.M), f"step {s} missing from the header"


@pytest.mark.parametrize("args, words", [
    (["build", "tests", "nosuchstep"], ["unknown step 'nosuchstep'", "build diagbuild tests"]),
    (["build", "diag"], ["diag step needs DIAG"]),
    ([], ["Steps"]),
])
def test_device_driver_refuses_a_bad_command_line(tmp_path, args, words):
    """A bad command line exits 2 before any set-up: $OUT is not even created."""
    out = tmp_path / "out"
    proc = run_driver(*args, out=str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    assert not out.exists()


def test_source_commit(monkeypatch, tmp_path):
    """The commit a benchmark files its figures under: NVFP4_GEMM_COMMIT where set; else git's HEAD, marked
    +dirty once a tracked file differs from it; "unknown" outside a git tree."""
    import shutil

    timing = bench_module("_timing")
    monkeypatch.setenv("NVFP4_GEMM_COMMIT", "abc123")
    assert timing.source_commit() == "abc123"
    monkeypatch.delenv("NVFP4_GEMM_COMMIT")
    if shutil.which("git") is None:
        pytest.skip("no git")
    # A throwaway repository holding a copy of _timing.py under benchmarks/, as the project holds it.
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    shutil.copy(os.path.join(BENCH, "_timing.py"), repo / "benchmarks" / "_timing.py")
    (repo / "tracked.txt").write_text("one\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(git + args, cwd=repo, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    code = "import sys; sys.path.insert(0, 'benchmarks'); import _timing; print(_timing.source_commit())"
    env = {k: v for k, v in os.environ.items() if k != "NVFP4_GEMM_COMMIT"}

    def commit_of(cwd) -> str:
        return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=120).stdout.strip()

    assert commit_of(repo) == head
    (repo / "tracked.txt").write_text("two\n")
    assert commit_of(repo) == head + "+dirty"
    (repo / "untracked.txt").write_text("new\n")  # untracked files do not count
    (repo / "tracked.txt").write_text("one\n")
    assert commit_of(repo) == head
    outside = tmp_path / "plain" / "benchmarks"
    outside.mkdir(parents=True)
    shutil.copy(os.path.join(BENCH, "_timing.py"), outside / "_timing.py")
    assert commit_of(outside.parent) == "unknown"
