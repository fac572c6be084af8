"""nvfp4_gemm.mm against what a Hopper user would pick instead, timed the way a model calls a GEMM.

    python benchmarks/bench_mm.py [--backends sm90,generic] [--json out.json] [--shapes 128x7168x16384,...]
    python benchmarks/bench_mm.py --smoke          # CPU, tiny shapes, wall clock: checks the script's logic

Per shape (M, N, K): R distinct operand sets whose weights (packed B + its scales) together exceed 3x the
L2 size; the R calls of a variant are captured back to back in one CUDA graph, per-call time = replay time
/ R, median of --replays replays (CUDA events); the eager per-call time of the same calls beside it.
Variants, all in the same run:
  ours         nvfp4_gemm.mm, W4A4, automatic dispatch (alpha on the device, fp16 out, as NVFP4Linear calls it)
  ours[B]      the same with NVFP4_GEMM_BACKEND=B, for each B of --backends
  wo_fp16      ours weight-only: mm(a_fp16, b, None, sfb, alpha=) with A = the dequantized NVFP4 activations
  wo_bf16      the same with bf16 activations
  cublas       torch.mm on fp16 operands dequantized beforehand
  humming      humming-kernels W4A16 (fp16 activations) on the same NVFP4 weights, when importable
  read         the read floor: a kernel that only reads as many bytes as ours must (A, B packed, both scales)
Ceilings measured in the run: a 1 GiB device copy (TB/s, read + write) and an 8192^3 fp16 torch.mm (TFLOP/s).
Each variant's output on the first set is checked against a float32 reference (relative Frobenius error).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import nvfp4_gemm
except ImportError:  # an in-place build run from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nvfp4_gemm

from _timing import (  # noqa: E402
    parse_choices,
    Reader, Timer, Unavailable, copy_ceiling, env, fmt, free_memory, humming_reason, humming_w4a16, l2_bytes,
    matmul_ceiling, md_table, run_meta, weight_only_mm_reason,
)

# The Hopper kernels' targets (H100, graph per-call times): (label, the shapes (m, n, k) it applies to, timed variant,
# baselines (the ratio is to the fastest of them), largest ratio that passes, slack in us taken off the timed
# variant first: "<= 1.5 x read + 2 us" is (ours - 2) / read <= 1.5).
_DECODE_NK = ((1024, 4096), (4096, 4096), (6144, 4096))
TARGETS = (
    ("ours <= 0.95 x humming", lambda m, n, k: True, "ours", ("humming",), 0.95, 0.0),
    ("weight-only fp16 <= 0.95 x humming", lambda m, n, k: True, "wo_fp16", ("humming",), 0.95, 0.0),
    ("weight-only bf16 <= 0.95 x humming", lambda m, n, k: True, "wo_bf16", ("humming",), 0.95, 0.0),
    ("ours <= 1.10 x read floor, M = 1 and 16", lambda m, n, k: m in (1, 16), "ours", ("read",), 1.10, 0.0),
    ("decode shapes: ours <= 0.8 x humming", lambda m, n, k: (n, k) in _DECODE_NK, "ours", ("humming",), 0.80, 0.0),
    ("decode shapes: ours <= 1.5 x read + 2 us", lambda m, n, k: (n, k) in _DECODE_NK, "ours", ("read",), 1.50, 2.0),
)

# Nine shapes (GPU MODE's three at M = 128, then M = 1 .. 8192 on weights of the same sizes), then the small
# decode GEMMs of an 8B-class model (k/v, o, fused q/k/v) at M = 1 and 16.
SHAPES = ((128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048), (1, 7168, 16384), (16, 4096, 7168),
          (64, 7168, 2048), (512, 4096, 7168), (2304, 4608, 7168), (8192, 7168, 2048)) + tuple(
              (m, n, k) for m in (1, 16) for n, k in _DECODE_NK)
VARIANTS = ("ours", "wo_fp16", "wo_bf16", "cublas", "humming", "read")
BACKENDS = ("generic", "sm90", "sm100")

# --smoke: tiny shapes on the CPU (M = 130 and K/16 = 4 exercise the blocked-scale padding), an L2 size that
# gives a few sets per shape, small ceilings.
SMOKE_SHAPES = ((1, 64, 256), (16, 64, 128), (130, 48, 256), (512, 16, 64))
SMOKE = dict(l2_bytes=8192, max_sets=8, replays=3, copy_bytes=8 << 20, mm_n=256)
GPU = dict(copy_bytes=1 << 30, mm_n=8192)
# A variant whose output differs more than this from the float32 reference is flagged: output rounding is
# ~1e-3 (fp16) / ~4e-3 (bf16); a wrong scale layout or adapter is far larger.
CHECK_TOL = 2e-2


def make_set(m: int, n: int, k: int, seed: int, device: torch.device) -> dict:
    """Random NVFP4 operands: uniform bytes (all 16 e2m1 codes), e4m3 scales 2^-6 .. 2^1 with every
    mantissa (fp16 outputs stay finite up to K = 16384), alpha 0.5; generated on the device."""
    g = torch.Generator(device=device).manual_seed(seed)

    def scales(rows: int) -> torch.Tensor:
        exp = torch.randint(1, 9, (rows, k // 16), device=device, generator=g)
        man = torch.randint(0, 8, (rows, k // 16), device=device, generator=g)
        return nvfp4_gemm.to_blocked(((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn))

    return dict(a=torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device=device, generator=g),
                b=torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=g),
                sfa=scales(m), sfb=scales(n), alpha=torch.full((1,), 0.5, dtype=torch.float32, device=device))


def read_bytes(m: int, n: int, k: int) -> int:
    """What ours must read: packed A and B, and the (unpadded) scales of both."""
    return (m + n) * k // 2 + (m + n) * (k // 16)


def weight_bytes(n: int, k: int) -> int:
    return n * k // 2 + n * (k // 16)


def sets_over_l2(m: int, n: int, k: int, l2: int, device: torch.device, seed0: int = 0,
                 max_sets: int | None = None, x_dtype: torch.dtype | None = None) -> list[dict]:
    """The smallest number (>= 2, at most max_sets) of make_set operand sets whose weights together exceed
    3x L2, seeds seed0, seed0 + 1, ...; with x_dtype each also carries x, its A decoded to that dtype (the
    weight-only form's activations)."""
    r = max(2, 3 * l2 // weight_bytes(n, k) + 1)
    if max_sets:
        r = min(r, max_sets)
    sets = [make_set(m, n, k, seed=seed0 + i, device=device) for i in range(r)]
    if x_dtype is not None:
        for s in sets:
            s["x"] = nvfp4_gemm.dequantize(s["a"], s["sfa"], k, x_dtype)
    return sets


def build(variant: str, sets: list[dict], k: int, device: torch.device, reader: Reader) -> tuple[list, float | None]:
    """The R calls of a variant (one per operand set), and the factor its output needs to match
    alpha * A @ B^T (None: no output to check)."""
    deq = nvfp4_gemm.dequantize
    if variant == "ours" or variant.startswith("ours["):
        return [lambda s=s: nvfp4_gemm.mm(s["a"], s["b"], s["sfa"], s["sfb"], alpha=s["alpha"]) for s in sets], 1.0
    if variant in ("wo_fp16", "wo_bf16"):
        why = weight_only_mm_reason(device)
        if why:
            raise Unavailable(why)
        dt = torch.float16 if variant == "wo_fp16" else torch.bfloat16
        acts = [deq(s["a"], s["sfa"], k, dt) for s in sets]
        return [lambda s=s, a=a: nvfp4_gemm.mm(a, s["b"], None, s["sfb"], alpha=s["alpha"]) for s, a in zip(sets, acts)], 1.0
    if variant == "cublas":
        ops = [(deq(s["a"], s["sfa"], k, torch.float16), deq(s["b"], s["sfb"], k, torch.float16)) for s in sets]
        return [lambda a=a, b=b: torch.mm(a, b.t()) for a, b in ops], float(sets[0]["alpha"])
    if variant == "humming":
        why = humming_reason(device)
        if why:
            raise Unavailable(why)
        # The repack into humming's layout happens here, once, outside the timing.
        layers = [(humming_w4a16(s["b"], s["sfb"], s["alpha"], torch.float16), deq(s["a"], s["sfa"], k, torch.float16))
                  for s in sets]
        return [lambda f=f, a=a: f(a) for f, a in layers], 1.0
    if variant == "read":
        m, n = sets[0]["a"].shape[0], sets[0]["b"].shape[0]
        bufs = [reader.buffer(read_bytes(m, n, k), seed=1000 + i) for i in range(len(sets))]
        return [reader.call(b) for b in bufs], None
    raise ValueError(f"unknown variant {variant!r}")


def rel_err(out: torch.Tensor, ref: torch.Tensor, scale: float) -> float:
    diff = out.float() * scale - ref
    return float(diff.norm() / ref.norm()) if torch.isfinite(out).all() else float("inf")


def run_shape(m: int, n: int, k: int, variants: list[str], timer: Timer, reader: Reader, l2: int,
              max_sets: int | None, shape_index: int) -> dict:
    device = timer.device
    wb = weight_bytes(n, k)
    sets = sets_over_l2(m, n, k, l2, device, seed0=100 * shape_index, max_sets=max_sets)
    r = len(sets)
    s0 = sets[0]
    ref = (nvfp4_gemm.dequantize(s0["a"], s0["sfa"], k) @ nvfp4_gemm.dequantize(s0["b"], s0["sfb"], k).T) * float(s0["alpha"])
    row = dict(m=m, n=n, k=k, sets=r, weight_bytes_total=r * wb, l2_bytes=l2, read_bytes=read_bytes(m, n, k), variants={})
    for v in variants:
        backend = v[5:-1] if v.startswith("ours[") else None
        calls = None
        try:
            if backend and device.type != "cuda":
                raise Unavailable("forcing a backend applies to CUDA tensors only")
            with env("NVFP4_GEMM_BACKEND", backend) if backend else contextlib.nullcontext():
                calls, scale = build(v, sets, k, device, reader)
                rec = {}
                if scale is not None:
                    rec["rel_err"] = rel_err(calls[0](), ref, scale)
                rec["us"] = timer.graph_us(calls)
                rec["eager_us"] = timer.eager_us(calls)
        except Unavailable as e:
            rec = {"unavailable": str(e)}
        except Exception as e:  # one variant's failure must not lose the others' figures
            traceback.print_exc()
            rec = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        row["variants"][v] = rec
        calls = None  # drops the variant's operands (dequantized copies, humming layers) before the next
        free_memory(device)
        print(f"  {m}x{n}x{k} {v}: {json.dumps(rec)}", flush=True)
    del sets, ref
    free_memory(device)
    row["ratios"] = {
        "ours/min(humming,cublas)": ratio(row, "ours", ("humming", "cublas")),
        "ours/read": ratio(row, "ours", ("read",)),
        "wo_fp16/humming": ratio(row, "wo_fp16", ("humming",)),
        "wo_bf16/humming": ratio(row, "wo_bf16", ("humming",)),
    }
    read_us = us(row, "read")
    row["read_tbps"] = None if read_us is None else row["read_bytes"] / read_us / 1e6
    return row


def us(row: dict, v: str) -> float | None:
    return row["variants"].get(v, {}).get("us")


def ratio(row: dict, v: str, baselines: tuple[str, ...], slack_us: float = 0.0) -> float | None:
    num, dens = us(row, v), [us(row, b) for b in baselines]
    if num is None or any(d is None for d in dens):
        return None
    return (num - slack_us) / min(dens)


def evaluate_targets(rows: list[dict]) -> list[dict]:
    out = []
    for label, applies, v, baselines, limit, slack in TARGETS:
        for row in rows:
            if not applies(row["m"], row["n"], row["k"]):
                continue
            x = ratio(row, v, baselines, slack)
            missing = [b for b in (v,) + baselines if us(row, b) is None]
            out.append(dict(target=label, m=row["m"], n=row["n"], k=row["k"], ratio=x, limit=limit,
                            verdict="n/a" if x is None else ("PASS" if x <= limit else "MISS"),
                            why=f"no time for {', '.join(missing)}" if missing else ""))
    return out


def cell(rec: dict) -> str:
    if "us" in rec:
        flag = "" if rec.get("rel_err", 0.0) <= CHECK_TOL else " (CHECK)"
        return f"{rec['us']:.1f} / {rec['eager_us']:.1f}{flag}"
    return "n/a" if "unavailable" in rec else "error"


def report(meta: dict, ceilings: dict, rows: list[dict], targets: list[dict], variants: list[str]) -> str:
    lines = [f"### bench_mm: {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"`{meta['command']}`; torch {meta['torch']}. {meta['timing']}. Times in us per call, graph / eager. "
             f"Ceilings: copy {ceilings['copy_tbps']:.3g} TB/s (read + write, {ceilings['copy_bytes'] >> 20} MiB), "
             f"fp16 torch.mm {ceilings['mm_n']}^3 {ceilings['mm_tflops']:.4g} TFLOP/s; read floor by {meta['read_kernel']}.", ""]
    header = ["M", "N", "K", "R"] + variants + ["ours / min(h, cuBLAS)", "ours / read", "wo16 / h", "wobf16 / h", "read TB/s"]
    body = []
    for r in rows:
        body.append([r["m"], r["n"], r["k"], r["sets"]] + [cell(r["variants"][v]) for v in variants]
                    + [fmt(x, 2) for x in r["ratios"].values()] + [fmt(r["read_tbps"], 3 if meta["device"] == "cpu" else 2)])
    lines.append(md_table(header, body))
    notes = sorted({f"{v}: {rec.get('unavailable') or rec.get('error')}" for r in rows for v, rec in r["variants"].items()
                    if "us" not in rec})
    flagged = [f"{r['m']}x{r['n']}x{r['k']} {v} rel_err {rec['rel_err']:.3g}" for r in rows
               for v, rec in r["variants"].items() if rec.get("rel_err", 0.0) > CHECK_TOL]
    if notes:
        lines += ["", "Not timed: " + "; ".join(notes)]
    if flagged:
        lines += ["", f"CHECK (output off the float32 reference by more than {CHECK_TOL}): " + "; ".join(flagged)]
    lines += ["", md_table(["target (issue 11)", "M, N, K", "ratio", "limit", "verdict"],
                           [[t["target"], f"{t['m']}, {t['n']}, {t['k']}", fmt(t["ratio"], 3), f"{t['limit']:.2f}",
                             t["verdict"] + (f" ({t['why']})" if t["why"] else "")] for t in targets])]
    counts = {v: sum(t["verdict"] == v for t in targets) for v in ("PASS", "MISS", "n/a")}
    lines += ["", f"Targets: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a"
              + (" (--smoke: CPU figures, the verdicts only exercise the script)" if meta["device"] == "cpu" else "")]
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        try:
            m, n, k = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: expected MxNxK items separated by commas, got {item!r}")
        if m < 1 or n % 8 or n < 8 or k % 32 or k < 32:
            raise SystemExit(f"--shapes: {item} needs M >= 1, N a positive multiple of 8, K a positive multiple of 32")
        shapes.append((m, n, k))
    return shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: issue 11's nine shapes and six decode shapes)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--backends", default="", help=f"comma list of backends to force as well ({', '.join(BACKENDS)})")
    ap.add_argument("--replays", type=int, default=None, help="graph replays per median (>= 10; default 20, --smoke 3)")
    ap.add_argument("--json", default=None, help="write every figure and the run's metadata to this file")
    ap.add_argument("--l2-bytes", type=int, default=None, help="L2 size that sizes R (default: the device's)")
    ap.add_argument("--max-sets", type=int, default=None, help="cap R (quick runs only: weights may then stay in L2)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, wall clock, no graphs: checks the logic")
    args = ap.parse_args(argv)

    variants = parse_choices(args.variants, VARIANTS, "--variants", empty_ok=False)
    backends = parse_choices(args.backends, BACKENDS, "--backends", empty_ok=True)
    if "ours" in variants:  # the forced backends sit beside automatic dispatch in the table
        i = variants.index("ours") + 1
        variants[i:i] = [f"ours[{b}]" for b in backends]
    else:
        variants += [f"ours[{b}]" for b in backends]

    shapes = parse_shapes(args.shapes) if args.shapes else None
    if args.smoke:
        # One thread: on a shared CI machine, torch's default thread pool stalls tiny matmuls for tens of ms.
        torch.set_num_threads(1)
        device = torch.device("cpu")
        replays = args.replays or SMOKE["replays"]
        l2 = args.l2_bytes or SMOKE["l2_bytes"]
        max_sets = args.max_sets or SMOKE["max_sets"]
        ceil_args = SMOKE
        shapes = shapes or list(SMOKE_SHAPES)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_mm: needs a CUDA device (or --smoke for the CPU check of the script)")
        device = torch.device("cuda")
        replays = args.replays or 20
        if replays < 10:
            raise SystemExit(f"--replays: the median needs at least 10 replays, got {replays}")
        l2 = l2_bytes(device, args.l2_bytes)
        max_sets = args.max_sets
        ceil_args = GPU
        shapes = shapes or list(SHAPES)

    timer, reader = Timer(device, replays), Reader(device)
    meta = run_meta(device, timer)
    meta["read_kernel"] = reader.kind
    meta["variants"] = variants
    meta["cuda_fp16_reduced_precision_reduction"] = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    print(f"bench_mm on {meta['device']}, commit {meta['commit']}; L2 {l2} bytes; {timer.method}", flush=True)
    ceilings = {**copy_ceiling(timer, ceil_args["copy_bytes"]), **matmul_ceiling(timer, ceil_args["mm_n"])}
    free_memory(device)
    print(f"ceilings: {json.dumps(ceilings)}", flush=True)

    rows = [run_shape(m, n, k, variants, timer, reader, l2, max_sets, i) for i, (m, n, k) in enumerate(shapes)]
    targets = evaluate_targets(rows)
    text = report(meta, ceilings, rows, targets, variants)
    print()
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, ceilings=ceilings, rows=rows, targets=targets, report=text), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
