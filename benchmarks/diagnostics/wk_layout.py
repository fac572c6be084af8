"""The K-sliced kernel (csrc/sm90/sm90_wk.cuh) against the automatic dispatch, on row-major and prepared weights:
weight-only fp16 mm, per-call time of R back-to-back calls in one CUDA graph (distinct weights > 3x L2), beside
the read floor of the same bytes and humming W4A16, each forced config checked against the float reference.

    python benchmarks/diagnostics/wk_layout.py [--m 1,16] [--shapes NxK,...] [--configs name,...]
    NVFP4_GEMM_SM90_WK_TILED=1 python benchmarks/diagnostics/wk_layout.py --tiled ...

--tiled (with the variable, read once per process by the sm90 backend) hands the forced configs b's bytes in the
prepared order (nvfp4_gemm/prepared.py's layout, built here with a view and a permute) and skips the row-major
rows (auto, humming), which would misread them.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import nvfp4_gemm  # noqa: E402
from nvfp4_gemm.testing import check_against_reference  # noqa: E402
from _timing import Reader, Timer, env, humming_reason, l2_bytes  # noqa: E402
from bench_mm import build, sets_over_l2  # noqa: E402

SHAPES = ((1024, 4096), (4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))
WK = ("sm90_nvfp4_wk_w128xt8xk256_s4_b2_tma_mma16816", "sm90_nvfp4_wk_w128xt16xk256_s4_b2_tma_mma16816")


def tiled_bytes(b: torch.Tensor) -> torch.Tensor:
    n, kh = b.shape
    return b.view(n // 128, 128, kh // 128, 128).permute(0, 2, 1, 3).contiguous().view(n, kh)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--configs", default=",".join(WK))
    ap.add_argument("--tiled", action="store_true")
    args = ap.parse_args()
    if args.tiled and os.environ.get("NVFP4_GEMM_SM90_WK_TILED") != "1":
        sys.exit("--tiled needs NVFP4_GEMM_SM90_WK_TILED=1 in the environment")
    dev = torch.device("cuda")
    timer, reader, l2 = Timer(dev, 20), Reader(dev), l2_bytes(dev, None)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    hum = not args.tiled and humming_reason(dev) is None
    print(f"# {torch.cuda.get_device_name()} layout={'prepared' if args.tiled else 'row-major'}", flush=True)
    for m in (int(v) for v in args.m.split(",")):
        for n, k in shapes:
            sets = sets_over_l2(m, n, k, l2, dev, x_dtype=torch.float16)
            r = len(sets)
            for s in sets:
                s["bk"] = tiled_bytes(s["b"]) if args.tiled else s["b"]
            line = [f"({m}, {n}, {k}) R={r}:"]
            read = timer.graph_us(build("read", sets, k, dev, reader)[0])
            line.append(f"read {read:.2f}")
            if hum:
                line.append(f"humming {timer.graph_us(build('humming', sets, k, dev, reader)[0]):.2f}")
            if not args.tiled:
                auto = [lambda s=s: nvfp4_gemm.mm(s["x"], s["b"], None, s["sfb"], alpha=s["alpha"]) for s in sets]
                t = timer.graph_us(auto)
                line.append(f"auto {t:.2f} ({t / read:.2f}x)")
            calls = [lambda s=s: nvfp4_gemm.mm(s["x"], s["bk"], None, s["sfb"], alpha=s["alpha"]) for s in sets]
            for cfg in [c for c in args.configs.split(",") if c]:
                tag = cfg.replace("sm90_nvfp4_", "").replace("_mma16816", "")
                try:
                    with env("NVFP4_GEMM_CONFIG", cfg):
                        s0 = sets[0]
                        out = nvfp4_gemm.mm(s0["x"], s0["bk"], None, s0["sfb"], alpha=s0["alpha"])
                        check_against_reference(out, dict(a=s0["x"], b=s0["b"], sfa=None, sfb=s0["sfb"],
                                                          alpha=s0["alpha"], out_dtype=None), f"{cfg} ({m}, {n}, {k})")
                        t = timer.graph_us(calls)
                    line.append(f"{tag} {t:.2f} ({t / read:.2f}x)")
                except (RuntimeError, AssertionError) as e:
                    line.append(f"{tag}: {str(e).splitlines()[0][:120]}")
            print(" ".join(line), flush=True)
            del sets, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
