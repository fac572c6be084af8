"""The main job: `python -m nvfp4_gemm` verifies and times nvfp4_gemm.mm on this machine's device.

For each default shape (the three GPU MODE benchmark shapes, decode and prefill shapes) it runs mm on the
CUDA device if there is one (else the CPU), checks the result against the float64 reference with
SPEC.md's bound, and prints time, TFLOP/s, GB/s (bytes mm must move: packed A and B, scales, C) and the
worst error as a fraction of the bound (<= 1 passes). Exit status 1 if any shape fails.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from . import info, mm
from .testing import Case, error_ratio, make_inputs, median_seconds

GPU_MODE_SHAPES = [(128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048)]
EXTRA_SHAPES = [(1, 7168, 16384), (16, 4096, 7168), (512, 4096, 7168), (2304, 4608, 7168)]
CPU_SHAPES = GPU_MODE_SHAPES + EXTRA_SHAPES[:2]


def bytes_moved(m: int, n: int, k: int, out_dtype: torch.dtype) -> int:
    scales = (m + n) * (k // 16)
    return (m + n) * k // 2 + scales + m * n * torch.finfo(out_dtype).bits // 8


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nvfp4_gemm", description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--shapes", default=None, help="M,N,K;M,N,K;... (default: built-in list)")
    p.add_argument("--out-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--json", default=None, help="also write the table as JSON to this path")
    args = p.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dtype = getattr(torch, args.out_dtype)
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    else:
        shapes = GPU_MODE_SHAPES + EXTRA_SHAPES if device.type == "cuda" else CPU_SHAPES

    inf = info()
    dev_name = inf["device"]["name"] + (f" (SM {inf['device']['sm']})" if "sm" in inf["device"] else "")
    print(f"nvfp4_gemm on {dev_name}; backends here: {', '.join(inf['device_backends'])}; "
          f"forced: {inf['forced_backend']}")
    header = f"{'M':>6} {'N':>6} {'K':>6}  {'time us':>10} {'TFLOP/s':>8} {'GB/s':>8}  {'err/bound':>9}  ok"
    print(header)
    print("-" * len(header))
    rows, failed = [], 0
    for i, (m, n, k) in enumerate(shapes):
        inputs = make_inputs(Case(m, n, k, out_dtype, alpha=0.5), device, seed=i)
        out = mm(**inputs)
        worst, msg = error_ratio(out, inputs)
        ok = worst <= 1.0
        failed += not ok
        t = median_seconds(lambda: mm(**inputs), device)
        tflops = 2 * m * n * k / t * 1e-12
        gbs = bytes_moved(m, n, k, out_dtype) / t * 1e-9
        print(f"{m:>6} {n:>6} {k:>6}  {t * 1e6:>10.1f} {tflops:>8.2f} {gbs:>8.1f}  {worst:>9.3f}  "
              f"{'yes' if ok else 'NO: ' + msg}", flush=True)
        rows.append(dict(m=m, n=n, k=k, time_us=t * 1e6, tflops=tflops, gbs=gbs, err_over_bound=worst, ok=ok))
        del inputs, out
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev_name, "out_dtype": args.out_dtype, "info": inf, "rows": rows}, f, indent=1)
    print(f"{len(shapes) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
