"""How much faster a small-M weight-only GEMM runs when (part of) its weight already sits in L2: the premise of
prefetching the next GEMM's weight while the kernels between two GEMMs leave DRAM idle (measured: docs/history/2026-11-27.md, v6;
the prefetch lost in the model, docs/NOTES.md section 6).

Per shape: R distinct operand sets (weights > 3x L2), per-call times from one CUDA graph per variant:
  chain     R GEMMs back to back (what bench_mm reports; each overlaps the one ahead through PDL)
  after W   [W, GEMM] per set minus [W] per set: the GEMM after a kernel W that does not trigger programmatic
            launch, as in a model, where
    decoy   W reads a same-shaped tensor that is not this GEMM's weight: the baseline of the two below
    stage0  W reads what the GEMM's first pipeline stage needs: the first 128 bytes of every weight row and
            the first 4 scale atoms of every 128-row block
    full    W reads all of b and sfb
So stage0 - decoy and full - decoy are what an L2 prefetch of that part would save, launch for launch.

    python benchmarks/diagnostics/l2_warm_probe.py [--m 1,16] [--shapes NxK,...]
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


def stage0_reader(b: torch.Tensor, sfb: torch.Tensor, k: int):
    """One kernel-pair that reads the lines the first 256-K stage of every 128-row block reads."""
    atoms = sfb.contiguous().view(torch.uint8).view(-1, k // 64, 512)

    def run():
        return b[:, :128].sum(dtype=torch.int32), atoms[:, :4].sum(dtype=torch.int32)

    return run


def full_reader(reader: Reader, b: torch.Tensor, sfb: torch.Tensor):
    words = [t.contiguous().view(torch.uint8).view(-1) for t in (b, sfb)]
    words = [w[: w.numel() // 64 * 64].view(torch.int32) for w in words]
    calls = [reader.call(w) for w in words]

    def run():
        return [c() for c in calls]

    return run


def after(timer: Timer, warms: list, gemms: list) -> float:
    """Per-call time of the GEMMs when each follows its warm-up kernel, the warm-ups' own time taken out."""
    alone = timer.graph_us(warms)
    both = timer.graph_us([f for pair in zip(warms, gemms) for f in pair]) * 2
    return both - alone


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--shapes", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer, reader, l2 = Timer(dev, 20), Reader(dev), l2_bytes(dev, None)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    print(f"# {torch.cuda.get_device_name()} L2 {l2 / 2**20:.0f} MiB; us per call", flush=True)
    for m in (int(v) for v in args.m.split(",")):
        for n, k in shapes:
            sets = sets_over_l2(m, n, k, l2, dev, x_dtype=torch.float16)
            gemms = [lambda s=s: nvfp4_gemm.mm(s["x"], s["b"], None, s["sfb"], alpha=s["alpha"]) for s in sets]
            decoy_b, decoy_sf = torch.empty_like(sets[0]["b"]), torch.empty_like(sets[0]["sfb"])
            row = {"chain": timer.graph_us(gemms)}
            row["decoy stage0"] = after(timer, [stage0_reader(decoy_b, decoy_sf, k)] * len(sets), gemms)
            row["stage0"] = after(timer, [stage0_reader(s["b"], s["sfb"], k) for s in sets], gemms)
            row["decoy full"] = after(timer, [full_reader(reader, decoy_b, decoy_sf)] * len(sets), gemms)
            row["full"] = after(timer, [full_reader(reader, s["b"], s["sfb"]) for s in sets], gemms)
            print(f"({m}, {n}, {k}) R={len(sets)}: " + "  ".join(f"{key} {v:.2f}" for key, v in row.items()), flush=True)
            del sets, gemms, decoy_b, decoy_sf
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
