"""Dense sm90 configs side by side: each config forced (testing.forced) over the same operand sets in one process,
so an A/B of two kernel forms needs one build. Per shape: R operand sets whose weights exceed 3x L2 (bench_mm's
sets), the R calls captured back to back in one CUDA graph, per-call time = replay / R, median of --replays replays;
the relative error of the first set's output against the float32 reference beside each time.

    python benchmarks/diagnostics/sm90_config_bench.py --shapes 128x4096x7168,1536x4096x14336 \\
        --configs sm90_nvfp4_w128xt128xk128_s5_b1_ws_rs,sm90_nvfp4_w128xt256xk128_s3_b1_ws_rs [--forms wo,w4a4]

Forms: wo = weight-only fp16 activations (the NVFP4 A dequantized), w4a4 = packed NVFP4 A."""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import nvfp4_gemm
from nvfp4_gemm.testing import forced

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _timing import Timer  # noqa: E402
from bench_mm import parse_shapes, rel_err, sets_over_l2  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", required=True, help="MxNxK,...")
    ap.add_argument("--configs", required=True,
                    help="comma list of nvfp4_gemm.configs() names (sm90); auto: the sm90 backend's own choice")
    ap.add_argument("--forms", default="wo", help="comma list of wo, w4a4")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sm90_config_bench: needs a CUDA device")
    configs, forms = args.configs.split(","), args.forms.split(",")
    if set(forms) - {"wo", "w4a4"}:
        raise SystemExit(f"--forms: expected wo and / or w4a4, got {args.forms!r}")
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    timer = Timer(dev, args.replays)
    rows = []
    print("| M x N x K | form | " + " | ".join(configs) + " |")
    print("|---|---|" + "---|" * len(configs))
    for si, (m, n, k) in enumerate(parse_shapes(args.shapes)):
        sets = sets_over_l2(m, n, k, l2, dev, seed0=100 * si, x_dtype=torch.float16)
        s0 = sets[0]
        ref = (nvfp4_gemm.dequantize(s0["a"], s0["sfa"], k) @ nvfp4_gemm.dequantize(s0["b"], s0["sfb"], k).T
               ) * float(s0["alpha"])
        for form in forms:
            if form == "wo":
                calls = [lambda s=s: nvfp4_gemm.mm(s["x"], s["b"], None, s["sfb"], alpha=s["alpha"]) for s in sets]
            else:
                calls = [lambda s=s: nvfp4_gemm.mm(s["a"], s["b"], s["sfa"], s["sfb"], alpha=s["alpha"]) for s in sets]
            cells = []
            for cfg in configs:
                try:
                    with forced(backend="sm90", config=None if cfg == "auto" else cfg):
                        err = rel_err(calls[0](), ref, 1.0)
                        t = timer.graph_us(calls)
                    rows.append(dict(m=m, n=n, k=k, form=form, config=cfg, us=t, rel_err=err))
                    cells.append(f"{t:.1f} ({err:.1e})")
                except RuntimeError as e:  # a config that cannot run the shape says why; the others still run
                    rows.append(dict(m=m, n=n, k=k, form=form, config=cfg, error=str(e)[:200]))
                    cells.append(f"n/a: {str(e)[:80]}")
            print(f"| {m} x {n} x {k} | {form} | " + " | ".join(cells) + " |", flush=True)
        del sets, ref
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
