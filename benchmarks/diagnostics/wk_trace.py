"""Timeline of the K-sliced kernel (csrc/sm90/sm90_wk.cuh) from its own %globaltimer stamps: when CTAs start,
how long the first stage takes to land, the main loop, the K-slice sum, the split counter and the fix-up.
Each traced launch is alone on the GPU (the backend synchronizes after it) with a weight not in L2 (R distinct
operand sets over 3x L2). Times in us from the launch's first CTA entry; p50 / max over CTAs, median over launches.

Needs a diagnostics build:
  NVFP4_GEMM_DIAGNOSTICS=1 NVFP4_GEMM_CUDA_ARCHS=9.0a python setup.py build_ext --inplace
  python benchmarks/diagnostics/wk_trace.py [--m 1,16] [--shapes NxK,...] [--config name] [--time]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import nvfp4_gemm  # noqa: E402
from _timing import Timer, env, l2_bytes  # noqa: E402
from bench_mm import sets_over_l2  # noqa: E402

SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))


def launches(path: str):
    """[(header, rows)] of the trace file; rows are lists of 16 ints per CTA."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("launch "):
                out.append((line.split()[1], []))
            else:
                out[-1][1].append([int(v) for v in line.split()])
    return out


def summarize(rows):
    t0 = min(r[0] for r in rows)
    us = lambda v: (v - t0) / 1e3
    p50 = lambda xs: statistics.median(xs) if xs else float("nan")
    last = [r for r in rows if r[9] == 1]
    return {
        "span": max(us(r[6]) for r in rows),
        "entry_max": max(us(r[0]) for r in rows),
        "first_p50": p50([(r[2] - r[0]) / 1e3 for r in rows]),
        "first_max": max((r[2] - r[0]) / 1e3 for r in rows),
        "loop_p50": p50([(r[3] - r[2]) / 1e3 for r in rows]),
        "loop_max": max((r[3] - r[2]) / 1e3 for r in rows),
        "loop_end_max": max(us(r[3]) for r in rows),
        "ksum_p50": p50([(r[4] - r[3]) / 1e3 for r in rows]),
        "counter_p50": p50([(r[5] - r[4]) / 1e3 for r in rows if r[5]]),
        "fixup_p50": p50([(r[6] - r[5]) / 1e3 for r in last]),
        "fixup_max": max([(r[6] - r[5]) / 1e3 for r in last], default=float("nan")),
        "sms": len({r[10] for r in rows}),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--config", default=None, help="force a config (NVFP4_GEMM_CONFIG); default: the dispatch")
    ap.add_argument("--time", action="store_true", help="also the per-call time in a CUDA graph of the R calls")
    args = ap.parse_args()
    timer = Timer(torch.device("cuda"), 20)
    dev = torch.device("cuda")
    l2 = l2_bytes(dev, None)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    keys = ("span", "entry_max", "first_p50", "first_max", "loop_p50", "loop_max", "loop_end_max", "ksum_p50",
            "counter_p50", "fixup_p50", "fixup_max")
    print("# shape config grid | " + " ".join(keys) + " | SMs", flush=True)
    for m in (int(v) for v in args.m.split(",")):
        for n, k in shapes:
            sets = sets_over_l2(m, n, k, l2, dev, x_dtype=torch.float16)
            call = lambda s: nvfp4_gemm.mm(s["x"], s["b"], None, s["sfb"], alpha=s["alpha"])
            with env("NVFP4_GEMM_CONFIG", args.config):
                for s in sets:
                    call(s)
                torch.cuda.synchronize()
                with tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "trace.txt")
                    with env("NVFP4_GEMM_SM90_TRACE", path):
                        for _ in range(3):
                            for s in sets:
                                call(s)
                    torch.cuda.synchronize()
                    got = launches(path) if os.path.exists(path) else []
                graph = f" graph {timer.graph_us([lambda s=s: call(s) for s in sets]):.2f}" if args.time else ""
            if not got:
                print(f"({m}, {n}, {k}): no K-sliced launch traced (another config ran)", flush=True)
                continue
            sums = [summarize(rows) for _, rows in got]
            med = {key: statistics.median(s_[key] for s_ in sums) for key in keys}
            name = got[0][0].replace("sm90_nvfp4_", "").replace("_mma16816", "")
            print(f"({m}, {n}, {k}) {name} {len(got[0][1])} | " + " ".join(f"{med[key]:.2f}" for key in keys)
                  + f" | {sums[0]['sms']}{graph}", flush=True)
            del sets
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
