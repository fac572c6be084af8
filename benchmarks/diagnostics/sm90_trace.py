"""Timeline of one sm90 launch per shape from the kernel's own %globaltimer stamps (NVFP4_GEMM_SM90_TRACE):
when the prepass runs, when CTAs start, how long each waits for its first stage, the MMA time per K tile,
and what the epilogue (stores, split partials, fix-up) costs. Diagnostics for docs/SM90_NOTES.md.

Needs a diagnostics build (the stamps are compiled in only there):
  NVFP4_GEMM_DIAGNOSTICS=1 NVFP4_GEMM_CUDA_ARCHS=9.0a python setup.py build_ext --inplace
  python benchmarks/diagnostics/sm90_trace.py [M,N,K ...]   (default: the Hopper targets at M <= 512)
Environment as for mm (NVFP4_GEMM_CONFIG, ...). Times in us from the first
CTA's entry.
"""
import os
import statistics
import sys
import tempfile

import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, make_inputs

SHAPES = [(128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048), (16, 4096, 7168), (512, 4096, 7168)]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def analyse(header, rows):
    fields = dict(kv.split("=") for kv in header.split()[2:])
    pre0, pre1 = (int(x) for x in fields["prepass"].split(","))
    t0 = min(r[0] for r in rows)
    us = lambda t: (t - t0) / 1000.0
    seg_n = [r[9] & 0xFF for r in rows]
    per_tile, epi_plain, epi_last, epi_pub, first = [], [], [], [], []
    ends = []
    for r, ns in zip(rows, seg_n):
        first.append(us(r[3]))
        end = 0
        for s in range(min(ns, 2)):
            n_kt = (r[9] >> (16 * (s + 1))) & 0xFFFF
            full, mma, epi = r[3 + 3 * s], r[4 + 3 * s], r[5 + 3 * s]
            if n_kt:
                per_tile.append((mma - full) / 1000.0 / n_kt)
            d = (epi - mma) / 1000.0
            whole = n_kt == int(fields["ktiles"])
            last = (r[9] >> (8 + s)) & 1
            (epi_plain if whole else epi_last if last else epi_pub).append(d)
            end = max(end, epi)
        ends.append(us(end))
    crit = max(range(len(rows)), key=lambda i: ends[i])
    r = rows[crit]
    print(f"  prepass blocks start {us(pre0):6.2f} .. {us(pre1):6.2f} | CTA entry max {us(max(x[0] for x in rows)):5.2f} | "
          f"producer past dependency med {statistics.median(us(x[1]) for x in rows):5.2f} | "
          f"first stage full med {statistics.median(first):5.2f} max {max(first):5.2f}")
    print(f"  MMA per K tile us: med {statistics.median(per_tile):.3f} p10 {pct(per_tile, .1):.3f} "
          f"p90 {pct(per_tile, .9):.3f} | epilogue us: whole-tile med {pct(epi_plain, .5):.2f}, "
          f"publish med {pct(epi_pub, .5):.2f}, fix-up (last) med {pct(epi_last, .5):.2f} max {max(epi_last or [0]):.2f}")
    segs = " ".join(f"[full {us(r[3 + 3 * s]):.2f} mma {us(r[4 + 3 * s]):.2f} epi {us(r[5 + 3 * s]):.2f}]"
                    for s in range(min(r[9] & 0xFF, 2)))
    print(f"  end: med {statistics.median(ends):6.2f} max {max(ends):6.2f}; critical CTA {crit} (SM {r[10]}): {segs}")


def main():
    from nvfp4_gemm import _build_info

    if not _build_info.BUILD.get("diagnostics"):
        sys.exit("sm90_trace: this build has no trace stamps; rebuild with NVFP4_GEMM_DIAGNOSTICS=1 (see the docstring)")
    shapes = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or SHAPES
    os.environ["NVFP4_GEMM_BACKEND"] = "sm90"
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for m, n, k in shapes:
        x = make_inputs(Case(m, n, k), device="cuda", seed=0)
        a, b, sfa, sfb = x["a"], x["b"], x["sfa"], x["sfb"]
        for _ in range(3):
            nvfp4_gemm.mm(a, b, sfa, sfb)
        torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile("r", suffix=".trace") as f:
            for _ in range(3):  # three L2-flushed launches; the last one is shown
                flush.zero_()
                os.environ["NVFP4_GEMM_SM90_TRACE"] = f.name
                nvfp4_gemm.mm(a, b, sfa, sfb)
                del os.environ["NVFP4_GEMM_SM90_TRACE"]
            torch.cuda.synchronize()
            lines = f.read().splitlines()
        launches = [i for i, line in enumerate(lines) if line.startswith("launch")]
        if not launches:
            print(f"({m},{n},{k}): no trace (small-M kernel or tracing unavailable)")
            continue
        i = launches[-1]
        header = lines[i]
        print(f"({m},{n},{k}) {header.split()[1]} {' '.join(header.split()[5:8])}")
        grid = int(header.split("grid=")[1].split()[0])
        analyse(header, [[int(x) for x in line.split()] for line in lines[i + 1:i + 1 + grid]])


if __name__ == "__main__":
    main()
