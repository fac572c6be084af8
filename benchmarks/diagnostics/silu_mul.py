"""Is a fused SiLU-and-multiply after the gate/up GEMM worth a kernel of ours?

With fused projections the MLP computes act(gate) * up on the two halves of one [M, 2 * 14336] GEMM output
(strided views). This times, per M, in one CUDA graph each (median of the replays, _timing.Timer):
  eager        F.silu(gate) * up as transformers' LlamaMLP runs it (two kernels, the halves strided)
  compiled     the same under torch.compile (inductor emits one fused kernel)
  contiguous   eager on contiguous gate / up (what the unfused layers hand over)
  read floor   one read of the [M, 2 * 14336] fp16 output and one write of [M, 14336] (a device copy of
               that many bytes)
If `compiled` is at the floor, a kernel of ours can only win where the model runs eagerly.

    python benchmarks/diagnostics/silu_mul.py [--m 1,16,128,2048]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _timing import Timer  # noqa: E402

INTERMEDIATE = 14336


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16,128,2048")
    ap.add_argument("--replays", type=int, default=50)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("silu_mul.py needs a CUDA device")
    timer = Timer(torch.device("cuda"), args.replays)
    compiled = torch.compile(lambda g, u: F.silu(g) * u)
    print(f"{'M':>6} {'eager us':>9} {'compiled us':>12} {'contiguous us':>14} {'floor us':>9}")
    for m in (int(v) for v in args.m.split(",")):
        y = torch.randn(m, 2 * INTERMEDIATE, device="cuda", dtype=torch.float16)
        gate, up = y.split(INTERMEDIATE, dim=-1)
        gc, uc = gate.contiguous(), up.contiguous()
        src = torch.empty(m * 3 * INTERMEDIATE, device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        figures = [timer.graph_us([lambda: F.silu(gate) * up]), timer.graph_us([lambda: compiled(gate, up)]),
                   timer.graph_us([lambda: F.silu(gc) * uc]), timer.graph_us([lambda: dst.copy_(src)]) / 2]
        print(f"{m:>6} " + " ".join(f"{f:>{w}.2f}" for f, w in zip(figures, (9, 12, 14, 9))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
