"""The linear layers of a Llama-3-8B-shaped and a 70B-shaped decoder, each variant timed as one CUDA graph per
stack forward and eagerly, relative to fp16 nn.Linear in the same run.

    python benchmarks/bench_model.py [--json out.json] [--png out.png] [--stacks 8b,70b] [--m 1,16,...]
    python benchmarks/bench_model.py --smoke       # CPU, a tiny stack, wall clock: checks the script's logic

A stack forward calls every linear in model order (per layer: qkv, o, gate_up, down); each reads the
previous one's output, so the GPU runs them one after the other as in a model. Weights are random
(N(0, 1/K), distinct per linear), built layer by layer on the device; one variant's stack is alive at a time.
Variants:
  fp16, bf16          nn.Linear (cuBLAS) in that dtype: the baseline, fp16 is 1.00
  dynamic, static     NVFP4Linear.from_linear, W4A4, input scale per call / calibrated (fixed amax)
  wo_fp16, wo_bf16    NVFP4Linear.from_linear(weight_only=True), activations in that dtype
  mm                  nvfp4_gemm.mm alone on activations quantized beforehand (no quantization in the forward)
  humming             humming-kernels W4A16 on the same NVFP4 weights, fp16 activations, when importable
Per (stack, variant, M): graph time per forward (median of --replays replays), eager time per forward, and
the host time to issue one eager forward (GPU idle at the start).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import traceback

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import nvfp4_gemm
except ImportError:  # an in-place build run from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nvfp4_gemm

from _timing import (  # noqa: E402
    parse_choices,
    Timer, Unavailable, fmt, free_memory, humming_reason, humming_w4a16, md_table, run_meta, weight_only_mm_reason,
)

NVFP4_MODES = ("dynamic", "static", "wo_fp16", "wo_bf16")
# NVFP4Linear's targets, on the 8B stack: (label, variants, measure, limit per M: a dict {M: limit}, or a
# function of M giving the limit or None where the target does not apply).
TARGETS = (
    ("graph time / fp16 nn.Linear's", ("wo_fp16", "wo_bf16", "static"), "graph_ratio",
     {1: 0.33, 16: 0.40, 128: 0.60, 512: 1.00, 2048: 1.05}),
    ("dynamic / static graph time", ("dynamic",), "over_static", lambda m: 1.10),
    ("eager / graph time, M >= 128", NVFP4_MODES, "eager_over_graph", lambda m: 1.15 if m >= 128 else None),
    ("eager host time / fp16 nn.Linear's", NVFP4_MODES, "host_ratio", lambda m: 1.00),
)
TARGET_STACK = "8b"

# (name, N, K) per linear of one decoder layer; the next linear's K never exceeds the previous N.
STACKS = {
    "8b": dict(layers=8, linears=(("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                                  ("down", 4096, 14336))),
    # hidden 8192, intermediate 28672, 64 query heads and 8 KV heads of 128: qkv = 8192 + 2 * 1024.
    "70b": dict(layers=2, linears=(("qkv", 10240, 8192), ("o", 8192, 8192), ("gate_up", 57344, 8192),
                                   ("down", 8192, 28672))),
}
M_LIST = (1, 16, 64, 128, 512, 2048)
VARIANTS = ("fp16", "bf16", "dynamic", "static", "wo_fp16", "wo_bf16", "mm", "humming")
# The static input scale's calibrated amax. Activations here have std ~1, so |x| <= 8 leaves little
# saturation; the time does not depend on the value.
STATIC_INPUT_AMAX = 8.0

SMOKE_STACKS = {"tiny": dict(layers=2, linears=(("qkv", 96, 64), ("o", 64, 64), ("gate_up", 256, 64), ("down", 64, 128)))}
SMOKE_M = (1, 16, 128)
SMOKE_REPLAYS = 3


def x_dtype(variant: str) -> torch.dtype:
    return torch.bfloat16 if variant in ("bf16", "wo_bf16") else torch.float16


def random_weight(stack_index: int, layer: int, j: int, n: int, k: int, device: torch.device) -> torch.Tensor:
    """fp32 [N, K] from N(0, 1/K): activations keep a std near 1 through the stack, so fp16 neither
    overflows nor flushes to zero; the seed is the linear's position."""
    g = torch.Generator(device=device).manual_seed(1_000_000 * stack_index + 100 * layer + j)
    return torch.randn(n, k, generator=g, device=device) * k**-0.5


def as_linear(w: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
    lin.weight = nn.Parameter(w, requires_grad=False)
    return lin


class MmAlone:
    """nvfp4_gemm.mm on a fixed input quantized beforehand (prepare(m)): the GEMM's share of a forward."""

    def __init__(self, layer: nvfp4_gemm.NVFP4Linear, seed: int) -> None:
        self.layer, self.seed = layer, seed

    def prepare(self, m: int) -> None:
        k = self.layer.in_features
        g = torch.Generator(device=self.layer.weight.device).manual_seed(self.seed + m)
        x = torch.randn(m, k, generator=g, device=self.layer.weight.device).to(torch.float16)
        gs = nvfp4_gemm.global_encode_scale(x.float().abs().amax())
        self.packed, self.sf = nvfp4_gemm.quantize(x, gs)
        self.alpha = (1.0 / gs) * self.layer.weight_scale_2

    def __call__(self, _h: torch.Tensor) -> torch.Tensor:
        lay = self.layer
        return nvfp4_gemm.mm(self.packed, lay.weight, self.sf, lay.weight_scale, alpha=self.alpha)


def weight_only_reason(device: torch.device) -> str | None:
    """None if NVFP4Linear can be weight-only here: from_linear takes weight_only= (contract 3) and mm has
    the weight-only form its forward calls (contract 1); the two land on main separately."""
    if "weight_only" not in inspect.signature(nvfp4_gemm.NVFP4Linear.from_linear).parameters:
        return "NVFP4Linear.from_linear has no weight_only= here (the weight-only layer is not on this branch)"
    return weight_only_mm_reason(device)


def build_stack(variant: str, stack_index: int, spec: dict, device: torch.device) -> list[tuple]:
    """[(callable x -> y, K)] for every linear of the stack in model order. Float weights are made one
    linear at a time and dropped as soon as the variant's own form exists."""
    if variant in ("wo_fp16", "wo_bf16") and weight_only_reason(device):
        raise Unavailable(weight_only_reason(device))
    if variant == "humming" and humming_reason(device):
        raise Unavailable(humming_reason(device))
    out = []
    amax = torch.tensor(STATIC_INPUT_AMAX, device=device)
    for layer in range(spec["layers"]):
        for j, (_name, n, k) in enumerate(spec["linears"]):
            w = random_weight(stack_index, layer, j, n, k, device)
            if variant in ("fp16", "bf16"):
                f = as_linear(w.to(x_dtype(variant)))
            elif variant == "dynamic":
                f = nvfp4_gemm.NVFP4Linear.from_linear(as_linear(w.half()))
            elif variant == "static":
                f = nvfp4_gemm.NVFP4Linear.from_linear(as_linear(w.half()), input_amax=amax)
            elif variant in ("wo_fp16", "wo_bf16"):
                f = nvfp4_gemm.NVFP4Linear.from_linear(as_linear(w.to(x_dtype(variant))), weight_only=True)
            elif variant == "mm":
                f = MmAlone(nvfp4_gemm.NVFP4Linear.from_linear(as_linear(w.half())), seed=100 * layer + j)
            elif variant == "humming":
                q = nvfp4_gemm.NVFP4Linear.from_linear(as_linear(w.half()))
                f = humming_w4a16(q.weight, q.weight_scale, q.weight_scale_2, torch.float16)
                del q
            else:
                raise ValueError(f"unknown variant {variant!r}")
            del w
            out.append((f, k))
    return out


def forward(linears: list[tuple], x: torch.Tensor) -> torch.Tensor:
    h = x
    for f, k in linears:
        if h.shape[1] != k:
            # The leading M*K elements of the previous output, viewed as [M, K]: the data dependence of a
            # model (attention output into o, SiLU(gate) * up into down) without an extra kernel, which
            # would cost every variant the same.
            h = h.reshape(-1)[: h.shape[0] * k].view(h.shape[0], k)
        h = f(h)
    return h


def time_variant(variant: str, stack_index: int, stack: str, spec: dict, ms: list[int], timer: Timer) -> list[dict]:
    device = timer.device
    hidden = spec["linears"][0][2]
    try:
        linears = build_stack(variant, stack_index, spec, device)
    except Unavailable as e:
        return [dict(stack=stack, variant=variant, m=m, unavailable=str(e)) for m in ms]
    except Exception as e:  # one variant's failure must not lose the others' figures
        traceback.print_exc()
        return [dict(stack=stack, variant=variant, m=m, error=f"{type(e).__name__}: {str(e)[:200]}") for m in ms]
    rows = []
    for m in ms:
        rec = dict(stack=stack, variant=variant, m=m)
        try:
            for f, _ in linears:
                if isinstance(f, MmAlone):
                    f.prepare(m)
            g = torch.Generator(device=device).manual_seed(m)
            x = torch.randn(m, hidden, generator=g, device=device).to(x_dtype(variant))
            with torch.inference_mode():
                rec["finite"] = bool(torch.isfinite(forward(linears, x)).all())
                calls = [lambda: forward(linears, x)]
                rec["graph_us"] = timer.graph_us(calls)
                rec["eager_us"] = timer.eager_us(calls)
                rec["host_us"] = timer.host_us(calls)
        except Exception as e:
            traceback.print_exc()
            rec = dict(stack=stack, variant=variant, m=m, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        rows.append(rec)
        print(f"  {stack} {variant} M={m}: {json.dumps(rec)}", flush=True)
        free_memory(device)
    del linears
    free_memory(device)
    return rows


def add_ratios(rows: list[dict]) -> None:
    by = {(r["stack"], r["variant"], r["m"]): r for r in rows}

    def get(stack, variant, m, key):
        return by.get((stack, variant, m), {}).get(key)

    for r in rows:
        if "graph_us" not in r:
            continue
        s, m = r["stack"], r["m"]
        pairs = dict(graph_ratio=(r["graph_us"], get(s, "fp16", m, "graph_us")),
                     eager_ratio=(r["eager_us"], get(s, "fp16", m, "eager_us")),
                     host_ratio=(r["host_us"], get(s, "fp16", m, "host_us")),
                     over_static=(r["graph_us"], get(s, "static", m, "graph_us")),
                     eager_over_graph=(r["eager_us"], r["graph_us"]))
        for key, (num, den) in pairs.items():
            r[key] = None if den is None else num / den


def evaluate_targets(rows: list[dict], stack: str) -> list[dict]:
    by = {(r["variant"], r["m"]): r for r in rows if r["stack"] == stack}
    ms = sorted({r["m"] for r in rows if r["stack"] == stack})
    out = []
    for label, variants, measure, limits in TARGETS:
        for v in variants:
            for m in ms:
                limit = limits.get(m) if isinstance(limits, dict) else limits(m)
                if limit is None:
                    continue
                x = by.get((v, m), {}).get(measure)
                out.append(dict(target=label, stack=stack, variant=v, m=m, value=x, limit=limit,
                                verdict="n/a" if x is None else ("PASS" if x <= limit else "MISS")))
    return out


def report(meta: dict, rows: list[dict], targets: list[dict], stacks: list[str], variants: list[str], ms: list[int]) -> str:
    by = {(r["stack"], r["variant"], r["m"]): r for r in rows}
    lines = [f"### bench_model: {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"`{meta['command']}`; torch {meta['torch']}. {meta['timing']}. Per stack forward."]

    def cell(stack, v, m, key, ratio_key):
        r = by.get((stack, v, m), {})
        if key not in r:
            return "n/a" if "unavailable" in r else "error"
        flag = "" if r.get("finite", True) else " NONFINITE"
        return f"{fmt(r.get(ratio_key), 2)} ({r[key]:.0f})" + flag

    for stack in stacks:
        lines += ["", f"{stack} stack ({meta['stacks'][stack]['layers']} layers): "
                  "CUDA graph, ratio to fp16 nn.Linear (us) | eager, eager / graph (us) | host us per forward, ratio to fp16's"]
        header = ["variant"] + [f"M={m}" for m in ms]
        for key, ratio_key in (("graph_us", "graph_ratio"), ("eager_us", "eager_over_graph"), ("host_us", "host_ratio")):
            lines += ["", md_table([f"{key}"] + header[1:], [[v] + [cell(stack, v, m, key, ratio_key) for m in ms] for v in variants])]
    notes = sorted({f"{r['variant']}: {r.get('unavailable') or r.get('error')}" for r in rows if "graph_us" not in r})
    if notes:
        lines += ["", "Not timed: " + "; ".join(notes)]
    if targets:
        tstack = targets[0]["stack"]
        tms = sorted({t["m"] for t in targets})
        cells = {}
        for t in targets:
            cells.setdefault((t["target"], t["variant"]), {})[t["m"]] = (
                f"{fmt(t['value'], 2)} <= {t['limit']:.2f} {t['verdict']}" if t["value"] is not None else "n/a")
        lines += ["", f"Targets (issue 12, {tstack} stack):", "",
                  md_table(["target", "variant"] + [f"M={m}" for m in tms],
                           [[label, v] + [c.get(m, "") for m in tms] for (label, v), c in cells.items()])]
        counts = {x: sum(t["verdict"] == x for t in targets) for x in ("PASS", "MISS", "n/a")}
        lines += ["", f"Targets: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a"
                  + (" (--smoke: CPU figures, the verdicts only exercise the script)" if meta["device"] == "cpu" else "")]
    return "\n".join(lines)


def chart(path: str, rows: list[dict], stacks: list[str], variants: list[str], ms: list[int], timer_cuda: bool) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable: no chart"
    by = {(r["stack"], r["variant"], r["m"]): r for r in rows}
    # Only variants with figures get a bar and a legend entry; colours stay tied to the variant.
    shown = [v for v in variants if v != "fp16" and any(r.get("graph_ratio") is not None for r in rows if r["variant"] == v)]
    fig, axes = plt.subplots(len(stacks), 1, figsize=(10, 3.6 * len(stacks)), squeeze=False)
    width = 0.8 / max(1, len(shown))
    for ax, stack in zip(axes[:, 0], stacks):
        for i, v in enumerate(shown):
            ys = [by.get((stack, v, m), {}).get("graph_ratio") for m in ms]
            xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(ms))]
            ax.bar([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], width, label=v,
                   color=f"C{VARIANTS.index(v)}")
        ax.axhline(1.0, color="k", linewidth=0.8)
        if stack == TARGET_STACK:
            limits = TARGETS[0][3]
            for j, m in enumerate(ms):
                if m in limits:
                    ax.plot([j - 0.45, j + 0.45], [limits[m]] * 2, "r--", linewidth=1)
        ax.set_xticks(range(len(ms)), [f"M={m}" for m in ms])
        ax.set_ylabel("time / fp16 nn.Linear")
        ax.set_title(f"{stack} stack, {'one CUDA graph per forward' if timer_cuda else 'CPU wall clock (--smoke)'}"
                     + (" (red: weight-only / static targets)" if stack == TARGET_STACK else ""), fontsize=9)
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"chart written to {path}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stacks", default="8b,70b", help="comma list of 8b, 70b")
    ap.add_argument("--layers", default=None, help="override layer counts, e.g. 8b=4,70b=1")
    ap.add_argument("--m", default=None, help=f"comma list of token counts (default {','.join(map(str, M_LIST))})")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--replays", type=int, default=None, help="replays per median (>= 10; default 20, --smoke 3)")
    ap.add_argument("--json", default=None, help="write every figure and the run's metadata to this file")
    ap.add_argument("--png", default=None, help="write a chart of the graph ratios (needs matplotlib)")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny stack, wall clock, no graphs: checks the logic")
    args = ap.parse_args(argv)

    variants = parse_choices(args.variants, VARIANTS, "--variants", empty_ok=False)
    if "fp16" not in variants:  # every ratio is to it
        variants.insert(0, "fp16")
    variants.sort(key=VARIANTS.index)  # fp16 first, static before dynamic's ratio is read
    try:
        ms = [int(x) for x in args.m.split(",")] if args.m else None
    except ValueError:
        raise SystemExit(f"--m: expected a comma list of positive integers, got {args.m!r}")
    if ms is not None and (not ms or min(ms) < 1):
        raise SystemExit(f"--m: expected a comma list of positive integers, got {args.m!r}")

    if args.smoke:
        # One thread: on a shared CI machine, torch's default thread pool stalls tiny matmuls for tens of ms.
        torch.set_num_threads(1)
        device, replays = torch.device("cpu"), args.replays or SMOKE_REPLAYS
        catalog, ms, target_stack = SMOKE_STACKS, ms or list(SMOKE_M), "tiny"
        stacks = list(SMOKE_STACKS)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_model: needs a CUDA device (or --smoke for the CPU check of the script)")
        device, replays = torch.device("cuda"), args.replays or 20
        if replays < 10:
            raise SystemExit(f"--replays: the median needs at least 10 replays, got {replays}")
        catalog, ms, target_stack = STACKS, ms or list(M_LIST), TARGET_STACK
        stacks = [s for s in args.stacks.split(",") if s]
        if not stacks or any(s not in STACKS for s in stacks):
            raise SystemExit(f"--stacks: expected a comma list of {', '.join(STACKS)}, got {args.stacks!r}")
    specs = {s: dict(catalog[s]) for s in stacks}
    for item in (args.layers.split(",") if args.layers else []):
        name, _, count = item.partition("=")
        if name not in specs or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--layers: expected STACK=COUNT items for the stacks run ({', '.join(specs)}), got {item!r}")
        specs[name]["layers"] = int(count)

    timer = Timer(device, replays)
    meta = run_meta(device, timer)
    meta.update(variants=variants, m=ms, stacks={s: dict(layers=specs[s]["layers"], linears=specs[s]["linears"]) for s in stacks},
                static_input_amax=STATIC_INPUT_AMAX)
    print(f"bench_model on {meta['device']}, commit {meta['commit']}; {timer.method}", flush=True)
    rows = []
    for s in stacks:
        for v in variants:
            rows += time_variant(v, list(catalog).index(s), s, specs[s], ms, timer)
    add_ratios(rows)
    targets = evaluate_targets(rows, target_stack) if target_stack in stacks else []
    text = report(meta, rows, targets, stacks, variants, ms)
    print()
    print(text)
    if args.png:
        print(chart(args.png, rows, stacks, variants, ms, timer.cuda))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows, targets=targets, report=text), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
