"""Times nvfp4_gemm.mm (sm90 backend) against the ceilings measured in the same run.

Per shape: our time, cuBLAS fp16 on operands dequantized beforehand ("predecoded"), the generic path
(decode + cuBLAS), TFLOP/s, GB/s on the bytes the op must read (packed A and B, scales) and write, and
those as % of the measured fp16 matmul rate and device-copy bandwidth. Medians of triton's do_bench
(L2 flushed between repetitions). Writes JSON, a PNG chart (if matplotlib is there) and a Markdown
section to --out; RESULTS.md gets that section appended by whoever runs it.

    python benchmarks/diagnostics/bench_sm90.py --out benchmarks/out [--shapes targets|all] [--splits 1,2,4]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess

import torch

import nvfp4_gemm
from nvfp4_gemm.testing import forced

TARGETS = [  # (M, N, K, target kind, target value)
    (128, 7168, 16384, "ratio", 0.50),
    (128, 4096, 7168, "ratio", 0.40),
    (128, 7168, 2048, "ratio", 0.40),
    (1, 7168, 16384, "bw", 0.85),
    (16, 4096, 7168, "bw", 0.75),
    (512, 4096, 7168, "ratio", 1.00),
    (2304, 4608, 7168, "ratio", 1.05),
]
SMALL = [(1, 7168, 16384, "bw", 0.85), (8, 7168, 16384, None, None), (16, 4096, 7168, "bw", 0.75),
         (32, 4096, 7168, None, None), (1, 4096, 7168, None, None)]
EXTRA = [(8, 7168, 16384, None, None), (64, 7168, 16384, None, None), (256, 7168, 16384, None, None),
         (1024, 7168, 7168, None, None), (4096, 8192, 16384, None, None)]


def bench(fn, warmup=25, rep=100):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e-3


def inputs_for(m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)

    def sf(rows):  # 2^-6 .. 2^1: fp16 outputs stay finite up to K = 16384
        exp = torch.randint(1, 9, (rows, k // 16), device="cuda", generator=g)
        man = torch.randint(0, 8, (rows, k // 16), device="cuda", generator=g)
        return nvfp4_gemm.to_blocked(((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn))

    return dict(a=a, b=b, sfa=sf(m), sfb=sf(n))


def ceilings():
    x = torch.empty(1 << 29, dtype=torch.float16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    t = bench(lambda: y.copy_(x))
    copy_bw = 2 * x.numel() * 2 / t
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    t = bench(lambda: a @ b.T)
    return copy_bw, 2 * 8192**3 / t


def with_env(env: dict, fn):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if v is not None})
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_shape(m, n, k, copy_bw, mm_rate, splits_list, configs_list=()):
    inp = inputs_for(m, n, k)
    ad = nvfp4_gemm.dequantize(inp["a"], inp["sfa"], k, torch.float16)
    bd = nvfp4_gemm.dequantize(inp["b"], inp["sfb"], k, torch.float16)
    t_cublas = bench(lambda: ad @ bd.T)
    ref = (ad.float() @ bd.float().T)
    row = dict(m=m, n=n, k=k, cublas_us=t_cublas * 1e6)
    out = with_env({"NVFP4_GEMM_BACKEND": "sm90"}, lambda: nvfp4_gemm.mm(**inp))
    row["max_rel_err_vs_fp32"] = float(((out.float() - ref).abs().max() / ref.abs().max()).item())
    row["sm90_us"] = with_env({"NVFP4_GEMM_BACKEND": "sm90"}, lambda: bench(lambda: nvfp4_gemm.mm(**inp))) * 1e6
    row["generic_us"] = with_env({"NVFP4_GEMM_BACKEND": "generic"}, lambda: bench(lambda: nvfp4_gemm.mm(**inp))) * 1e6
    for cfg in configs_list:  # forced configs, e.g. the wgmma one against the small-M kernel
        row[f"cfg:{cfg}"] = with_env({"NVFP4_GEMM_BACKEND": "sm90", "NVFP4_GEMM_CONFIG": cfg},
                                     lambda: bench(lambda: nvfp4_gemm.mm(**inp))) * 1e6
    for s in splits_list:  # a forced split count (nvfp4_gemm.testing.forced)
        with forced(backend="sm90", splits=int(s)):
            row[f"sm90_split{s}_us"] = bench(lambda: nvfp4_gemm.mm(**inp)) * 1e6
    must_read = m * k // 2 + n * k // 2 + inp["sfa"].numel() + inp["sfb"].numel() + m * n * 2
    t = row["sm90_us"] * 1e-6
    row["tflops"] = 2 * m * n * k / t / 1e12
    row["gbps"] = must_read / t / 1e9
    row["pct_mm"] = 100 * 2 * m * n * k / t / mm_rate
    row["pct_copy"] = 100 * must_read / t / copy_bw
    row["ratio_vs_cublas"] = row["sm90_us"] / row["cublas_us"]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--shapes", default="targets", choices=["targets", "all", "small"])
    ap.add_argument("--configs", default="", help="comma list of sm90 config names to time as well (forced); "
                    "'auto': for each shape the small-M config and the wgmma config of its token tile")
    ap.add_argument("--splits", default="", help="comma list of forced split counts to time as well")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    splits_list = [int(s) for s in args.splits.split(",") if s]
    copy_bw, mm_rate = ceilings()
    shapes = SMALL if args.shapes == "small" else TARGETS + (EXTRA if args.shapes == "all" else [])
    rows = []
    names = nvfp4_gemm.configs().get("sm90", [])
    for m, n, k, kind, target in shapes:
        if args.configs == "auto":
            tok = next(t for t in (8, 16, 32, 64, 128, 256) if m <= t)
            cfgs = [c for c in names if f"xt{tok}x" in c or f"xt{tok}_" in c]
        else:
            cfgs = [c for c in args.configs.split(",") if c]
        r = run_shape(m, n, k, copy_bw, mm_rate, splits_list, cfgs)
        r["target"] = None if kind is None else (f"<= {target:.2f}x cuBLAS" if kind == "ratio" else f">= {100 * target:.0f}% copy")
        r["met"] = None if kind is None else (r["ratio_vs_cublas"] <= target if kind == "ratio" else r["pct_copy"] >= 100 * target)
        rows.append(r)
        print(json.dumps(r), flush=True)
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    gpu_mode = [r for r in rows if (r["m"], r["n"], r["k"]) in ((128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048))]
    geo = gm([r["sm90_us"] for r in gpu_mode]) / gm([r["cublas_us"] for r in gpu_mode]) if gpu_mode else float("nan")
    try:  # the device tool's copy of the tree has no .git: pass NVFP4_GEMM_COMMIT there
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    commit = commit or os.environ.get("NVFP4_GEMM_COMMIT", "?")
    meta = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(), commit=commit,
                torch=torch.__version__, copy_tbps=copy_bw / 1e12, mm_tflops=mm_rate / 1e12, gpu_mode_geomean_ratio=geo)
    json.dump(dict(meta=meta, rows=rows), open(os.path.join(args.out, "bench_sm90.json"), "w"), indent=1)

    lines = [f"### sm90 — {meta['device']}, {meta['date']}, commit {commit}", "",
             f"`python benchmarks/diagnostics/bench_sm90.py --shapes {args.shapes}`; medians of triton do_bench (L2 flushed). "
             f"Ceilings measured in the run: copy {meta['copy_tbps']:.2f} TB/s (read+write, 1 GiB), fp16 cuBLAS "
             f"8192^3 {meta['mm_tflops']:.0f} TFLOP/s. GPU MODE geomean ratio vs predecoded cuBLAS: {geo:.3f} (target <= 0.42).", "",
             "| M | N | K | sm90 us | cuBLAS predecoded us | ratio | generic us | TFLOP/s | GB/s | % mm | % copy | target | met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['m']} | {r['n']} | {r['k']} | {r['sm90_us']:.1f} | {r['cublas_us']:.1f} | {r['ratio_vs_cublas']:.3f} | "
                     f"{r['generic_us']:.1f} | {r['tflops']:.0f} | {r['gbps']:.0f} | {r['pct_mm']:.0f} | {r['pct_copy']:.0f} | "
                     f"{r['target'] or ''} | {'' if r['met'] is None else ('yes' if r['met'] else 'no')} |")
    cfg_rows = [r for r in rows if any(key.startswith("cfg:") for key in r)]
    if cfg_rows:
        lines += ["", "Forced configs (us): " + "; ".join(
            f"({r['m']},{r['n']},{r['k']}): " + ", ".join(f"{key[4:]}={v:.1f}" for key, v in r.items() if key.startswith("cfg:"))
            for r in cfg_rows)]
    if splits_list:
        lines += ["", "Forced split-K (us): " + "; ".join(
            f"({r['m']},{r['n']},{r['k']}): " + ", ".join(f"s{s}={r[f'sm90_split{s}_us']:.1f}" for s in splits_list) for r in rows)]
    md = "\n".join(lines) + "\n"
    open(os.path.join(args.out, "bench_sm90.md"), "w").write(md)
    print(md)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(10, 4))
        labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rows]
        xs = range(len(rows))
        ax.bar([x - 0.3 for x in xs], [r["sm90_us"] for r in rows], 0.3, label="sm90")
        ax.bar(list(xs), [r["cublas_us"] for r in rows], 0.3, label="cuBLAS fp16 predecoded")
        ax.bar([x + 0.3 for x in xs], [r["generic_us"] for r in rows], 0.3, label="generic")
        floor = [max(2 * r["m"] * r["n"] * r["k"] / mm_rate, r["gbps"] * r["sm90_us"] * 1e-6 * 1e9 / copy_bw) * 1e6 for r in rows]
        ax.scatter(list(xs), floor, marker="_", s=400, color="k", label="max(mm ceiling, copy ceiling)")
        ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("us")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "bench_sm90.png"), dpi=120)
    except ImportError:
        print("matplotlib not installed: no chart")


if __name__ == "__main__":
    main()
