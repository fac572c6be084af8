"""Times nvfp4_gemm.mm (sm100 backend: CUTLASS block-scaled kernels) against torch._scaled_mm on Blackwell.

Per shape: the dispatch-table entry it gets (from csrc/sm100/generate.py, the table the kernels are
generated from), its CTA tiles and waves on the device's SMs, then -- on an SM100/SM103 device only --
median times of nvfp4_gemm.mm and torch._scaled_mm (fp4 x fp4, blocked e4m3 scales), the GPU MODE
speed-of-light time where the shape has one, and the max error against nvfp4_gemm.reference_mm on a
sampled block.

    python benchmarks/diagnostics/bench_sm100.py [--shapes gpumode|all] [--json OUT.json]

Without a Blackwell GPU it builds the inputs, prints the table's choices and stops, saying so: no
number printed here was measured on SM100.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "csrc", "sm100"))
import generate  # noqa: E402  - the dispatch table itself

import nvfp4_gemm  # noqa: E402
from nvfp4_gemm.testing import median_seconds  # noqa: E402

# GPU MODE nvfp4_gemm benchmark shapes and their B200 speed of light at 1.5 GHz (docs/CONTRACT.md).
GPUMODE = [(128, 7168, 16384, 8.994), (128, 4096, 7168, 2.354), (128, 7168, 2048, 1.333)]
EXTRA = [(1, 7168, 16384, None), (16, 4096, 7168, None), (64, 7168, 2048, None), (512, 4096, 7168, None),
         (1024, 7168, 7168, None), (4096, 7168, 16384, None), (8192, 8192, 8192, None)]
B200_SMS = 148


def table_choice(m: int) -> generate.Config:
    """The rule select.cpp applies to generated/table.inc: first entry with M <= m_max."""
    return next(c for c in generate.TABLE if c.m_max is None or m <= c.m_max)


def tile_summary(cfg: generate.Config, m: int, n: int, k: int, sms: int) -> str:
    mk, nk = (n, m) if cfg.swap_ab else (m, n)
    ctas = math.ceil(mk / cfg.tile_m) * (cfg.tile_m // 128) * math.ceil(nk / cfg.tile_n)
    kb = math.ceil(k / 256)
    return f"{ctas} CTA tiles x {kb} k-blocks = {ctas / sms:.2f} waves on {sms} SMs"


def make_inputs(m: int, n: int, k: int, device: str):
    g = torch.Generator().manual_seed(m * 7 + n * 3 + k)
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, generator=g)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)

    def sf(rows):
        exp = torch.randint(1, 11, (rows, k // 16), generator=g)  # 2^-6 .. 2^3: fp16-safe outputs
        man = torch.randint(0, 8, (rows, k // 16), generator=g)
        return nvfp4_gemm.to_blocked(((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn))

    sfa, sfb = sf(m), sf(n)
    alpha = torch.tensor([1.0], dtype=torch.float32)
    return {key: t.to(device) for key, t in dict(a=a, b=b, sfa=sfa, sfb=sfb, alpha=alpha).items()}


def bench_us(fn) -> float:
    return median_seconds(fn, "cuda") * 1e6


def scaled_mm_fn(inp, n: int):
    """torch._scaled_mm on the same fp4 bytes and blocked scales, or None + why if this torch refuses."""
    a = inp["a"].view(torch.float4_e2m1fn_x2)
    b = inp["b"].view(torch.float4_e2m1fn_x2)
    sfa, sfb = inp["sfa"].view(torch.float8_e4m3fn), inp["sfb"].view(torch.float8_e4m3fn)

    def fn():
        return torch._scaled_mm(a, b.t(), sfa, sfb, out_dtype=torch.float16)

    try:
        fn()
        return fn, None
    except (RuntimeError, TypeError, NotImplementedError) as e:
        return None, str(e).splitlines()[0][:120]


def blackwell_device() -> str | None:
    """None if timing can run here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) not in ((10, 0), (10, 3)):
        return f"device is SM {major}.{minor}, the sm100 kernels need SM 10.0 / 10.3"
    if "sm100" not in nvfp4_gemm.configs():
        return "this build has no _C_sm100 (rebuild with NVFP4_GEMM_CUDA_ARCHS=10.0f)"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="all", choices=["gpumode", "all"])
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    shapes = GPUMODE + (EXTRA if args.shapes == "all" else [])
    why_not = blackwell_device()
    device = "cpu" if why_not else "cuda"
    sms = B200_SMS if why_not else torch.cuda.get_device_properties(0).multi_processor_count

    rows = []
    print(f"{'M':>5} {'N':>6} {'K':>6}  {'config':<40} {'tiles':<48} {'ours us':>8} {'_scaled_mm us':>13} {'SOL us':>7}")
    for m, n, k, sol in shapes:
        cfg = table_choice(m)
        inp = make_inputs(m, n, k, device)  # built in either case: the CPU run exercises everything but timing
        row = dict(m=m, n=n, k=k, config=cfg.name, sol_us=sol, tiles=tile_summary(cfg, m, n, k, sms))
        if not why_not:
            os.environ["NVFP4_GEMM_BACKEND"] = "sm100"
            out = nvfp4_gemm.mm(inp["a"], inp["b"], inp["sfa"], inp["sfb"], alpha=inp["alpha"])
            rows_s = slice(0, min(m, 64))
            ref = nvfp4_gemm.reference_mm(inp["a"][rows_s], inp["b"][:256], nvfp4_gemm.to_blocked(
                nvfp4_gemm.from_blocked(inp["sfa"], m, k)[rows_s]), nvfp4_gemm.to_blocked(
                nvfp4_gemm.from_blocked(inp["sfb"], n, k)[:256]), alpha=inp["alpha"])
            row["max_abs_err_sampled"] = float((out[rows_s, :256].float() - ref.float()).abs().max())
            row["ours_us"] = bench_us(lambda: nvfp4_gemm.mm(inp["a"], inp["b"], inp["sfa"], inp["sfb"], alpha=inp["alpha"]))
            fn, err = scaled_mm_fn(inp, n)
            row["scaled_mm_us"] = bench_us(fn) if fn else None
            row["scaled_mm_note"] = err
        rows.append(row)
        ours = f"{row['ours_us']:8.2f}" if "ours_us" in row else f"{'-':>8}"
        theirs = f"{row['scaled_mm_us']:13.2f}" if row.get("scaled_mm_us") else f"{'-':>13}"
        print(f"{m:>5} {n:>6} {k:>6}  {cfg.name:<40} {row['tiles']:<48} {ours} {theirs} "
              f"{(f'{sol:7.3f}' if sol else '-'):>7}")
    if why_not:
        print(f"\nstopped before timing: {why_not}. Inputs were built and every shape was matched against the "
              "dispatch table (waves assume a 148-SM B200); nothing above was measured on SM100.")
    else:
        ours = [r["ours_us"] for r in rows if r["sol_us"]]
        print(f"\nGPU MODE geometric mean: ours {math.exp(sum(map(math.log, ours)) / len(ours)):.2f} us, "
              f"speed of light 3.04 us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name() if not why_not else "cpu", rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
