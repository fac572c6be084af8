"""Bandwidth of nvfp4_gemm.quantize on the CUDA device against a device copy measured in the same run.

    python benchmarks/bench_quantize.py [--rows 8192 --k 16384] [--record benchmarks/RESULTS.md]

Quantizes an [8192, 16384] tensor (bf16 is the target case; fp16 and fp32 for reference) with a
per-tensor encode scale held on the device. Bytes counted: x read + packed data and blocked scales
written. The ceiling is `y.copy_(x)` of the same bf16 tensor (read + write). Medians of
triton.testing.do_bench. Target: bf16 quantize >= 80% of the copy bandwidth. Checks first that the
kernel's output matches the CPU implementation bit for bit on the first 256 rows. Prints one table and,
with --record (default benchmarks/RESULTS.md), appends it with the device, date, commit and command.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys

import torch

try:
    import nvfp4_gemm
except ImportError:  # an in-place build run from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nvfp4_gemm

TARGET = 0.80


def bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e-3


def check_rows(x: torch.Tensor, gs: torch.Tensor, packed: torch.Tensor, sf: torch.Tensor, rows: int = 256) -> None:
    """The first `rows` rows (two whole scale row-blocks) against the CPU implementation, bit for bit."""
    want_p, want_sf = nvfp4_gemm.quantize(x[:rows].cpu(), gs.cpu())
    assert torch.equal(packed[:rows].cpu(), want_p), "packed data differs from the CPU implementation"
    n = want_sf.numel()
    assert torch.equal(sf[:n].view(torch.uint8).cpu(), want_sf.view(torch.uint8)), "scales differ from the CPU implementation"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--k", type=int, default=16384)
    ap.add_argument("--record", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"),
                    help="Markdown file the table is appended to ('' for none)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_quantize: needs a CUDA device")
    rows, k = args.rows, args.k
    g = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(rows, k, device="cuda", generator=g, dtype=torch.float32)
    sf_bytes = (-(-rows // 128) * 128) * (-(-(k // 16) // 4) * 4)

    copy_src = base.to(torch.bfloat16)
    copy_dst = torch.empty_like(copy_src)
    t_copy = bench(lambda: copy_dst.copy_(copy_src))
    copy_bw = 2 * copy_src.numel() * 2 / t_copy

    lines = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = base.to(dtype)
        gs = nvfp4_gemm.global_encode_scale(x.float().abs().amax())
        packed, sf = nvfp4_gemm.quantize(x, gs)
        check_rows(x, gs, packed, sf)
        t = bench(lambda: nvfp4_gemm.quantize(x, gs))
        nbytes = x.numel() * x.element_size() + rows * k // 2 + sf_bytes
        bw = nbytes / t
        verdict = ("PASS" if bw >= TARGET * copy_bw else "FAIL") if dtype == torch.bfloat16 else ""
        lines.append(f"| quantize | {str(dtype).replace('torch.', '')} | {rows}x{k} | {t * 1e6:.1f} | "
                     f"{bw / 1e9:.0f} | {100 * bw / copy_bw:.1f}% | {verdict} |")
        del x, packed, sf
    lines.append(f"| copy_ (ceiling) | bfloat16 | {rows}x{k} | {t_copy * 1e6:.1f} | {copy_bw / 1e9:.0f} | 100% | |")
    table = "\n".join(["| op | x dtype | shape | time (us) | GB/s (read + written) | % of copy | >= 80% (bf16) |",
                       "|---|---|---|---|---|---|---|"] + lines)
    device = torch.cuda.get_device_name()
    print(f"{device}\n{table}")
    if args.record:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=root).stdout.strip()
        with open(args.record, "a") as f:
            f.write(f"\n## quantize bandwidth ({device})\n\n{datetime.date.today().isoformat()}, commit "
                    f"{commit or 'unknown'}, `python {' '.join(sys.argv)}`\n\n{table}\n")


if __name__ == "__main__":
    main()
