"""How much faster a small-M weight-only GEMM runs when (part of) its weight already sits in L2: the premise of
prefetching the next layer's weight while the kernels between two GEMMs leave DRAM idle (docs/NOTES.md v6).

Per shape: R distinct operand sets (weights > 3x L2), per-call times from one CUDA graph of R calls:
  cold      the GEMM alone (what bench_mm reports);
  warm f    [read the first fraction f of b's bytes and all of sfb, GEMM] minus [the same reads alone]:
            the GEMM's time when that part of its weight is L2-resident.

    python benchmarks/diagnostics/l2_warm_probe.py [--m 1,16] [--shapes NxK,...] [--fractions 0.25,0.5,1]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import nvfp4_gemm  # noqa: E402
from _timing import Reader, Timer, l2_bytes  # noqa: E402
from bench_mm import sets_over_l2  # noqa: E402

SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))


def words(t: torch.Tensor, fraction: float) -> torch.Tensor:
    flat = t.contiguous().view(torch.uint8).view(-1)
    n = int(flat.numel() * fraction) // 64 * 64
    return flat[:n].view(torch.int32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--fractions", default="0.25,0.5,1")
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer, reader, l2 = Timer(dev, 20), Reader(dev), l2_bytes(dev, None)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    print(f"# {torch.cuda.get_device_name()} L2 {l2 / 2**20:.0f} MiB", flush=True)
    for m in (int(v) for v in args.m.split(",")):
        for n, k in shapes:
            sets = sets_over_l2(m, n, k, l2, dev, x_dtype=torch.float16)
            r = len(sets)
            gemm = [lambda s=s: nvfp4_gemm.mm(s["x"], s["b"], None, s["sfb"], alpha=s["alpha"]) for s in sets]
            cold = timer.graph_us(gemm)
            line = [f"({m}, {n}, {k}) R={r}: cold {cold:.2f}"]
            for f in (float(v) for v in args.fractions.split(",")):
                reads = []
                for s in sets:
                    reads.append([reader.call(words(s["b"], f)), reader.call(words(s["sfb"], 1.0))])
                only = timer.graph_us([c for pair in reads for c in pair]) * 2
                both = []
                for pair, g in zip(reads, gemm):
                    both += [pair[0], pair[1], g]
                with_gemm = timer.graph_us(both) * 3
                line.append(f"warm {f:g}: {with_gemm - only:.2f} (reads {only:.2f})")
            print(" ".join(line), flush=True)
            del sets, gemm
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
