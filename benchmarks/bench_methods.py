"""Time of the weight quantization methods on a Llama-3-8B-shaped stack of weights (the speed target:
"mse" takes <= 2x the time of "rtn" on the H100).

    python benchmarks/bench_methods.py [--repeats 5] [--json out.json] [--record benchmarks/RESULTS.md]
    python benchmarks/bench_methods.py --smoke      # CPU, a tiny stack, wall clock: checks the script's logic

The stack is the model benchmark's (bench_model.py): 8 layers of qkv 6144x4096, o 4096x4096, gate_up
28672x4096, down 4096x14336, fp16, N(0, 1/K), distinct per matrix, generated on the device (3.5 GB). One
stack time = every matrix through nvfp4_gemm.methods.quantize_weight(w, method) back to back, between two
torch.cuda.synchronize() calls (wall clock); the figure is the median over --repeats runs, after one
warm-up run, the methods taking turns. Methods:
  rtn          the default: per-tensor amax (finite_amax), then the quantize kernel
  mse          rtn's per-tensor scale, then the block-scale search kernel (csrc/quant/mse.cu)
  mse+hessian  the same with column weights (hessian=, a random positive diagonal here)
and the pieces, timed the same way over the stack: the per-tensor amax alone, the quantize kernel alone,
the search kernel alone (encode scale computed beforehand). Before timing, the search kernel's output for
the first 128 rows of the first gate_up matrix is checked against the CPU implementation, bit for bit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import nvfp4_gemm
except ImportError:  # an in-place build run from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nvfp4_gemm

from _timing import Timer, md_table, run_meta  # noqa: E402
from nvfp4_gemm.methods import quantize_weight  # noqa: E402
from nvfp4_gemm.quantize import finite_amax, global_encode_scale  # noqa: E402

STACK = dict(layers=8, linears=(("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                                ("down", 4096, 14336)))
SMOKE_STACK = dict(layers=2, linears=(("qkv", 96, 64), ("o", 64, 64), ("gate_up", 256, 64), ("down", 64, 128)))
TARGET = 2.0  # mse time / rtn time
CHECK_ROWS = 128


def build_stack(spec: dict, device: torch.device) -> list[torch.Tensor]:
    weights = []
    for layer in range(spec["layers"]):
        for j, (_, n, k) in enumerate(spec["linears"]):
            g = torch.Generator(device=device).manual_seed(1000 * layer + j)
            weights.append((torch.randn(n, k, device=device, generator=g) * k ** -0.5).to(torch.float16))
    return weights


def column_weights(weights: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """A positive diagonal per distinct K (what a Hessian's diagonal looks like: energies over binades)."""
    out = {}
    for w in weights:
        k = w.shape[1]
        if k not in out:
            g = torch.Generator(device=w.device).manual_seed(k)
            out[k] = torch.exp2(torch.randn(k, device=w.device, generator=g) * 2)
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stack_seconds(fn, weights: list[torch.Tensor], device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for w in weights:
        fn(w)
    sync(device)
    return time.perf_counter() - t0


def check_against_cpu(w: torch.Tensor) -> None:
    """The device's search on the first CHECK_ROWS rows of w against the CPU implementation, bit for bit
    (same encode scale: the whole tensor's)."""
    gs = global_encode_scale(finite_amax(w))
    got = torch.ops.nvfp4_gemm.quantize_mse(w, gs)
    want = torch.ops.nvfp4_gemm.quantize_mse(w[:CHECK_ROWS].cpu(), gs.cpu())
    for a, b, name in zip(got[:2], want[:2], ("packed codes", "scale bytes")):
        if not torch.equal(a[:CHECK_ROWS].cpu(), b):
            raise SystemExit(f"bench_methods: the search's {name} on {w.device} differ from the CPU implementation")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per median (default 5, --smoke 3)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--record", default="", help="Markdown file the table is appended to (default: none)")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny stack, wall clock: checks the logic")
    args = ap.parse_args(argv)
    if args.smoke:
        device, spec, repeats = torch.device("cpu"), SMOKE_STACK, args.repeats or 3
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_methods: needs a CUDA device (or --smoke for the CPU check of the script)")
        device, spec, repeats = torch.device("cuda"), STACK, args.repeats or 5
    if repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {repeats}")

    weights = build_stack(spec, device)
    diag = column_weights(weights)
    gate_up = weights[[name for name, _, _ in spec["linears"]].index("gate_up")]
    check_against_cpu(gate_up)
    encode = [global_encode_scale(finite_amax(w)) for w in weights]
    by_id = {id(w): gs for w, gs in zip(weights, encode)}

    variants = {
        "rtn": lambda w: quantize_weight(w, "rtn"),
        "mse": lambda w: quantize_weight(w, "mse"),
        "mse+hessian": lambda w: quantize_weight(w, "mse", hessian=diag[w.shape[1]]),
        "piece: per-tensor amax": lambda w: global_encode_scale(finite_amax(w)),
        "piece: quantize kernel": lambda w: nvfp4_gemm.quantize(w, by_id[id(w)]),
        "piece: search kernel": lambda w: torch.ops.nvfp4_gemm.quantize_mse(w, by_id[id(w)]),
    }
    for fn in variants.values():  # warm-up: allocations, first launches
        stack_seconds(fn, weights, device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(stack_seconds(fn, weights, device))
    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["mse"] / median["rtn"]

    elements = sum(w.numel() for w in weights)
    meta = run_meta(device, Timer(device, repeats))
    meta["timing"] = (f"wall clock between torch.cuda.synchronize() calls around the whole stack, median of "
                      f"{repeats} runs after one warm-up" if device.type == "cuda" else
                      f"CPU wall clock, median of {repeats} runs after one warm-up (--smoke)")
    shapes = ", ".join(f"{name} {n}x{k}" for name, n, k in spec["linears"])
    rows = [[name, f"{median[name]:.4f}", f"{median[name] / median['rtn']:.2f}",
             f"{elements / median[name] / 1e9:.1f}"] for name in variants]
    table = md_table(["method", "stack time (s)", "/ rtn", "G weights / s"], rows)
    verdict = "PASS" if ratio <= TARGET else "MISS"
    lines = [f"### Weight quantization methods: {meta['device']}, {meta['date']}, commit {meta['commit'][:12]}",
             f"Command: `{meta['command']}`. Stack: {spec['layers']} layers of {shapes}, fp16 "
             f"({elements / 1e9:.2f} G weights). Timing: {meta['timing']}.",
             "", table, "",
             f"mse / rtn = {ratio:.2f} (target <= {TARGET:.1f}: {verdict}"
             + (", --smoke: CPU figures, the verdict only exercises the script)" if args.smoke else ")")]
    text = "\n".join(lines)
    print(text)
    result = {"meta": meta, "stack": spec, "elements": elements, "repeats": repeats, "seconds": times,
              "median_s": median, "mse_over_rtn": ratio, "target": TARGET, "verdict": verdict}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.record:
        with open(args.record, "a") as f:
            f.write("\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
