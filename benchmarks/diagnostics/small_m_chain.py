"""The small-M kernel as a decoder calls it: per-call time of R back-to-back calls in one CUDA graph (distinct
weights > 3x L2), for the 8B stack's four linear shapes at a few token counts, against the read floor of the
same bytes and humming W4A16; each split count forced in turn; and the kernels a call runs (torch.profiler
over one replay), to separate kernel time from the gaps between kernels.

    python benchmarks/diagnostics/small_m_chain.py [--m 1,16] [--splits 0,1,2,4,8,16] [--shapes NxK,...]
        [--configs sm90_nvfp4_smallm_w128xt8_kb16_d2_b3_r0_mma16816,...] [--weight-only]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import nvfp4_gemm  # noqa: E402
from _timing import Reader, Timer, env, humming_reason, l2_bytes  # noqa: E402
from bench_mm import build, sets_over_l2  # noqa: E402

SHAPES_8B = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


def kernels_per_call(timer: Timer, calls) -> dict:
    """GPU time per call of each kernel in one replay of the calls' graph (torch.profiler)."""
    g, outs = timer.capture(calls)  # noqa: F841 - outs live as long as the graph
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name.split("<")[0][:40]] += e.device_time_total / len(calls)
    return dict(per)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--splits", default="0,1,2,4,8,16", help="0: automatic")
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--configs", default=None, help="comma list of sm90 config names to force as well")
    ap.add_argument("--weight-only", action="store_true",
                    help="time the weight-only form mm(x_fp16, b, None, sfb) instead of W4A4")
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer, reader, l2 = Timer(dev, 20), Reader(dev), l2_bytes(dev, None)
    shapes = SHAPES_8B if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    hum = humming_reason(dev) is None
    for m in (int(v) for v in args.m.split(",")):
        for n, k in shapes:
            sets = sets_over_l2(m, n, k, l2, dev, x_dtype=torch.float16 if args.weight_only else None)
            r = len(sets)
            if args.weight_only:  # fp16 activations: the dequantized A of each set
                ours = [lambda s=s: nvfp4_gemm.mm(s["x"], s["b"], None, s["sfb"], alpha=s["alpha"]) for s in sets]
            else:
                ours = [lambda s=s: nvfp4_gemm.mm(s["a"], s["b"], s["sfa"], s["sfb"], alpha=s["alpha"]) for s in sets]
            line = [f"({m}, {n}, {k}) R={r}:"]
            read = timer.graph_us(build("read", sets, k, dev, reader)[0])
            line.append(f"read {read:.2f}")
            if hum:
                line.append(f"humming {timer.graph_us(build('humming', sets, k, dev, reader)[0]):.2f}")
            for sp in (int(v) for v in args.splits.split(",")):
                torch.ops.nvfp4_gemm._force("", "", sp)
                t = timer.graph_us(ours)
                line.append(f"{'auto' if sp == 0 else f's{sp}'} {t:.2f} ({t / read:.2f}x)")
            torch.ops.nvfp4_gemm._force("", "", 0)
            for cfg in args.configs.split(",") if args.configs else []:  # each small-M config forced in turn
                try:
                    with env("NVFP4_GEMM_CONFIG", cfg):
                        t = timer.graph_us(ours)
                    line.append(f"{cfg.split('_w128x')[1].split('_mma')[0]} {t:.2f} ({t / read:.2f}x)")
                except RuntimeError as e:
                    line.append(f"{cfg}: {str(e).splitlines()[0][:80]}")
            ks = kernels_per_call(timer, ours)
            line.append("kernels/call: " + ", ".join(f"{name} {t:.2f}" for name, t in ks.items()))
            print(" ".join(line), flush=True)
            del sets, ours
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
