"""The MoE benchmark of record: one mixture-of-experts layer's expert GEMMs (gate_up, then down) as a model calls
them, nvfp4_gemm.grouped_mm beside what a Hopper user would pick instead.

    python benchmarks/bench_moe.py                        # every model, token count and routing (H200: ~10 min)
    python benchmarks/bench_moe.py --quick                # ~2 minutes: fewer token counts, uniform routing
    python benchmarks/bench_moe.py --smoke                # CPU, tiny shapes, wall clock: checks the script's logic

Models (E experts, top-k, hidden H, expert intermediate I): gate_up is [T*k, H] x [E, 2I, H]^T, down
[T*k, I] x [E, H, I]^T, the token copies sorted by expert (offs). Routing per token count: uniform (each token
picks k distinct experts uniformly) or skewed (Zipf-like expert popularity, seeded). Timing: R layers with their
own expert weights, R the smallest number (>= 2) whose experts HIT by the routing exceed 3x L2 together; one
layer = gate_up + down; the R layers' calls are captured back to back in one CUDA graph, per-layer time =
replay / R, median of --replays replays (benchmarks/_timing.py). Variants, all on the same NVFP4 weights:
  w4a16        nvfp4_gemm.grouped_mm, weight-only: bf16 activations x NVFP4 experts, alpha = weight_scale_2[g]
  w4a4_dyn     grouped_linear (quantize_grouped with dynamic per-expert scales + grouped_mm), both GEMMs
  w4a4_static  grouped_linear with per-expert static input scales
  X[B]         the variant X with NVFP4_GEMM_BACKEND=B (--backends)
  bf16         torch.nn.functional.grouped_mm on bf16 weights decoded beforehand (4x the bytes)
  humming      humming-kernels 0.1.20 MoE W4A16 (grouped-contiguous) on the same NVFP4 weights, when importable
  read         the read floor: bytes of the experts actually hit (packed weights + scales) / measured copy
               bandwidth (a 1 GiB device copy, read + write bytes per second)
Each timed variant's layer-0 outputs are checked against a float32 reference (relative Frobenius error).
Output: a Markdown table and a JSON file in --out (default: $OUT if set, else benchmarks/out).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
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
    Timer, Unavailable, copy_ceiling, env, fmt, free_memory, humming_reason, l2_bytes, md_table, parse_choices,
    run_meta,
)

# name: (experts, top-k, hidden, expert intermediate)
MODELS = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v3": (256, 8, 7168, 2048),
    "mixtral-8x7b": (8, 2, 4096, 14336),
}
TOKENS = (1, 16, 64, 256, 1024, 4096)
ROUTINGS = ("uniform", "skewed")
VARIANTS = ("w4a16", "w4a4_dyn", "w4a4_static", "bf16", "humming", "read")
BACKENDS = ("generic", "sm90", "sm100")
QUICK = dict(tokens=(1, 64, 1024), routings=("uniform",), replays=10)
SMOKE_MODELS = {"tiny": (6, 2, 64, 32), "tiny-wide": (4, 1, 128, 96)}
SMOKE = dict(tokens=(1, 17), l2_bytes=4096, replays=3, copy_bytes=8 << 20)
# Output vs the float32 reference, relative Frobenius: the weight-only forms and bf16 are off by the output rounding
# (~4e-3 in bf16); W4A4 adds the NVFP4 quantization of the activations (~0.1 on Gaussian data). A misplaced
# scale or a wrong expert is far larger.
CHECK_TOL = {"w4a4_dyn": 0.25, "w4a4_static": 0.25}
CHECK_TOL_DEFAULT = 2e-2


def targets_for(model: str):
    """Issue 40's targets as (label, applies(tokens), variant, baselines, limit)."""
    big = model in ("mixtral-8x7b", "deepseek-v3")
    return (
        ("w4a16 <= 0.80 x humming (tokens <= 64)", lambda t: t <= 64, "w4a16", ("humming",), 0.80),
        ("w4a16 <= 0.95 x humming (tokens > 64)", lambda t: t > 64, "w4a16", ("humming",), 0.95),
        ("w4a16 <= 1.5 x read floor (16-64 tokens, large experts)", lambda t: big and 16 <= t <= 64, "w4a16",
         ("read",), 1.5),
        ("w4a4_dyn <= 1.10 x w4a16", lambda t: True, "w4a4_dyn", ("w4a16",), 1.10),
        ("w4a16 < bf16 (tokens <= 256)", lambda t: t <= 256, "w4a16", ("bf16",), 1.0),
        ("w4a4_dyn < bf16 (tokens <= 256)", lambda t: t <= 256, "w4a4_dyn", ("bf16",), 1.0),
        ("w4a4_static < bf16 (tokens <= 256)", lambda t: t <= 256, "w4a4_static", ("bf16",), 1.0),
    )


# ------------------------------------------------------------------------------------------------- data

def expert_bytes(h: int, i: int) -> int:
    """One expert's NVFP4 gate_up and down weights with their e4m3 scales."""
    return 2 * i * h // 2 + 2 * i * h // 16 + h * i // 2 + h * i // 16


class Layer:
    """One MoE layer's experts in NVFP4: w13 [E, 2I, H/2] (gate and up stacked along N), w2 [E, H, I/2], their
    blocked scales [E, Np*Sp] and per-expert decode scales ws2; per-expert static input scales for W4A4."""

    def __init__(self, e: int, h: int, i: int, seed: int, device: torch.device):
        g = torch.Generator(device=device).manual_seed(seed)

        def weight(n: int, k: int):
            packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device=device, generator=g)
            # e4m3 scales 2^-6 .. 2^1, every mantissa: outputs of bf16 activations stay far from any overflow.
            exp = torch.randint(1, 9, (e, n, k // 16), device=device, generator=g)
            man = torch.randint(0, 8, (e, n, k // 16), device=device, generator=g)
            lin = ((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn)
            blocked = torch.stack([nvfp4_gemm.to_blocked(lin[x]) for x in range(e)])
            return packed, blocked, lin

        self.e, self.h, self.i = e, h, i
        self.w13, self.sf13, self.lin13 = weight(2 * i, h)
        self.w2, self.sf2, self.lin2 = weight(h, i)
        self.ws2_13 = (torch.rand(e, device=device, generator=g) * 0.5 + 0.25) / 64
        self.ws2_2 = (torch.rand(e, device=device, generator=g) * 0.5 + 0.25) / 64
        self.in13 = (torch.rand(e, device=device, generator=g) * 0.5 + 0.5) * 4.0 / 2688
        self.in2 = (torch.rand(e, device=device, generator=g) * 0.5 + 0.5) * 4.0 / 2688

    def decoded(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """w13 and w2 decoded (e2m1 x e4m3, exact in bf16; weight_scale_2 not applied): [E, 2I, H], [E, H, I]."""
        return decode_experts(self.w13, self.sf13, dtype), decode_experts(self.w2, self.sf2, dtype)


def decode_experts(packed: torch.Tensor, blocked: torch.Tensor, dtype: torch.dtype, experts=None) -> torch.Tensor:
    """[E, N, K/2] packed + [E, Np*Sp] blocked scales -> [E, N, K] (or only `experts`, stacked) in `dtype`, exact.
    With N a multiple of 128 the experts' blocked scales back to back are the blocked layout of the [E*N, K/16]
    stack, so one decode launch does every expert."""
    e, n, half_k = packed.shape
    if experts is not None:
        return torch.stack([torch.ops.nvfp4_gemm._decode(packed[x], blocked[x], dtype) for x in experts])
    if n % 128 == 0:
        return torch.ops.nvfp4_gemm._decode(packed.reshape(e * n, half_k), blocked.reshape(-1), dtype).view(e, n, -1)
    return torch.stack([torch.ops.nvfp4_gemm._decode(packed[x], blocked[x], dtype) for x in range(e)])


def route(t: int, e: int, k: int, routing: str, seed: int) -> torch.Tensor:
    """topk ids [t, k] (distinct experts per token), on the CPU, seeded."""
    g = torch.Generator().manual_seed(seed)
    if routing == "uniform":
        logits = torch.rand(t, e, generator=g)
    elif routing == "skewed":  # Zipf-like popularity (p ~ 1/rank^1.2 over a seeded expert order), Gumbel top-k
        rank = torch.randperm(e, generator=g).to(torch.float64) + 1
        gumbel = -torch.log(-torch.log(torch.rand(t, e, generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)))
        logits = -1.2 * torch.log(rank) + gumbel
    else:
        raise ValueError(routing)
    return logits.topk(k, dim=1).indices


def grouping(topk: torch.Tensor, e: int) -> tuple[list[int], torch.Tensor]:
    """Tokens per expert and offs (int32 cumulative ends) for the token copies sorted by expert."""
    counts = torch.bincount(topk.reshape(-1), minlength=e)
    return counts.tolist(), counts.cumsum(0).to(torch.int32)


# ----------------------------------------------------------------------------------------------- variants

def _grouped_ref(x: torch.Tensor, packed: torch.Tensor, blocked: torch.Tensor, counts: list[int],
                 scale: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ W_dq[g]^T * scale[g] per group in float32 (the check's reference), each expert hit decoded on its
    own (a whole layer in float32 would not fit for the largest models)."""
    out = torch.zeros((x.shape[0], packed.shape[1]), dtype=torch.float32, device=x.device)
    start = 0
    for gi, m in enumerate(counts):
        if m:
            w = torch.ops.nvfp4_gemm._decode(packed[gi], blocked[gi], torch.float32)
            out[start:start + m] = (x[start:start + m].float() @ w.T) * (1.0 if scale is None else float(scale[gi]))
        start += m
    return out


def build(variant: str, layers: list[Layer], x: torch.Tensor, hmid: torch.Tensor, offs: torch.Tensor,
          counts: list[int]):
    """The R per-layer calls of a variant (each returns (gate_up out, down out)), or Unavailable."""
    gm = nvfp4_gemm.grouped_mm
    base = variant.split("[")[0]
    if base == "w4a16":
        return [lambda L=L: (gm(x, L.w13, None, L.sf13, offs, alpha=L.ws2_13, out_dtype=x.dtype),
                             gm(hmid, L.w2, None, L.sf2, offs, alpha=L.ws2_2, out_dtype=x.dtype)) for L in layers]
    if base in ("w4a4_dyn", "w4a4_static"):
        static = base == "w4a4_static"

        def call(L):  # grouped_linear: quantize_grouped, then grouped_mm with its alpha
            gl = nvfp4_gemm.grouped_linear
            return (gl(x, L.w13, L.sf13, L.ws2_13, offs, L.in13 if static else None),
                    gl(hmid, L.w2, L.sf2, L.ws2_2, offs, L.in2 if static else None))

        return [lambda L=L: call(L) for L in layers]
    if base == "bf16":
        gmm = getattr(torch.nn.functional, "grouped_mm", None)
        if gmm is None:
            raise Unavailable(f"torch {torch.__version__} has no torch.nn.functional.grouped_mm")
        weights = []
        for L in layers:
            w13, w2 = L.decoded(torch.bfloat16)
            # ws2 folded into the bf16 weight would round it; the model-side equivalent is weights stored in bf16,
            # so the baseline multiplies the decoded values as they are and its output is compared unscaled.
            weights.append((w13, w2))
        xb, hb = x.to(torch.bfloat16), hmid.to(torch.bfloat16)
        return [lambda w=w: (gmm(xb, w[0].transpose(-2, -1), offs=offs), gmm(hb, w[1].transpose(-2, -1), offs=offs))
                for w in weights]
    if base == "humming":
        why = humming_reason(x.device)
        if why:
            raise Unavailable(why)
        layout = torch.cat([offs.new_zeros(1), offs]).to(torch.int64)
        pairs = [(humming_moe(L.w13, L.lin13, L.ws2_13, x.dtype), humming_moe(L.w2, L.lin2, L.ws2_2, x.dtype))
                 for L in layers]
        cfg = {"gemm_type": "grouped_contiguous"}
        return [lambda p=p: (p[0](x, expert_layout=layout, compute_config=cfg),
                             p[1](hmid, expert_layout=layout, compute_config=cfg)) for p in pairs]
    raise ValueError(variant)


def humming_moe(packed: torch.Tensor, sf_linear: torch.Tensor, ws2: torch.Tensor, dtype: torch.dtype):
    """A humming-kernels MoE layer (W4A16, ModelOpt NVFP4 weight schema, `num_experts` E) on our NVFP4 weights:
    weight [E, N, K/2] uint8 (element 2i in the low nibble, as here), weight_scale [E, N, K/16] e4m3 LINEAR,
    weight_scale_2 [E, 1] fp32 (humming/schema/modelopt.py: the tensor attrs gain a leading expert dim). Called
    with expert_layout = int64 [E + 1] first-token offsets and compute_config gemm_type=grouped_contiguous
    (humming/testing/runner.py and csrc/launcher/tensor.h of the 0.1.20 wheel). The copy is verified: its
    load_state_dict(strict=False) would skip a misnamed tensor silently; the output check catches the rest."""
    from humming.layer import HummingLayer

    e, n, half_k = packed.shape
    layer = HummingLayer(shape_n=n, shape_k=2 * half_k, weight_config={"quant_method": "modelopt", "quant_algo": "nvfp4"},
                         num_experts=e, torch_dtype=dtype).cuda()
    tensors = {"weight": packed.contiguous(), "weight_scale": sf_linear.contiguous(),
               "weight_scale_2": ws2.reshape(e, 1).to(torch.float32).contiguous()}
    want = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    for name, t in tensors.items():
        if name in want and want[name] != tuple(t.shape):
            tensors[name] = t.reshape(want[name])
    layer.load_from_tensors(tensors)
    for name, t in tensors.items():
        got = getattr(layer, name, None)
        if got is None or not torch.equal(got.view(torch.uint8), t.view(torch.uint8)):
            raise RuntimeError(f"humming adapter: HummingLayer did not take '{name}' (its parameters: {want})")
    layer.transform()
    return layer


# ---------------------------------------------------------------------------------------------------- run

def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    den = float(ref.norm())
    return float((out.float() - ref).norm() / den) if den > 0 else float((out.float() - ref).norm())


def layers_needed(hit_bytes: int, l2: int, cap: int) -> int:
    return max(2, min(cap, math.ceil(3 * l2 / max(hit_bytes, 1)) + (3 * l2 % max(hit_bytes, 1) == 0)))


def run_point(model: str, spec, t: int, routing: str, layers: list[Layer], variants: list[str], timer: Timer,
              l2: int, copy_tbps: float, seed: int, profile: bool = False) -> dict:
    e, topk, h, i = spec
    device = timer.device
    ids = route(t, e, topk, routing, seed)
    counts, offs_cpu = grouping(ids, e)
    offs = offs_cpu.to(device)
    m = t * topk
    hit = sum(c > 0 for c in counts)
    hit_bytes = hit * expert_bytes(h, i)
    r = layers_needed(hit_bytes, l2, len(layers))
    use = layers[:r]
    g = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(m, h, device=device, generator=g, dtype=torch.float32).to(torch.bfloat16)
    hmid = torch.randn(m, i, device=device, generator=g, dtype=torch.float32).to(torch.bfloat16)
    row = dict(model=model, tokens=t, routing=routing, rows=m, experts_hit=hit, hit_bytes=hit_bytes, layers=r,
               max_tokens_per_expert=max(counts), variants={})
    refs = None
    for v in variants:
        backend = v[v.index("[") + 1:-1] if "[" in v else None
        calls = None
        try:
            if v == "read":
                row["variants"][v] = {"us": hit_bytes / (copy_tbps * 1e6)}
                continue
            if backend and device.type != "cuda":
                raise Unavailable("forcing a backend applies to CUDA tensors only")
            with env("NVFP4_GEMM_BACKEND", backend) if backend else contextlib.nullcontext():
                calls = build(v, use, x, hmid, offs, counts)
                rec = {}
                if refs is None:
                    L0 = use[0]
                    refs = (_grouped_ref(x, L0.w13, L0.sf13, counts, L0.ws2_13),
                            _grouped_ref(hmid, L0.w2, L0.sf2, counts, L0.ws2_2),
                            _grouped_ref(x, L0.w13, L0.sf13, counts, None),
                            _grouped_ref(hmid, L0.w2, L0.sf2, counts, None))
                y13, y2 = calls[0]()
                scaled = v.split("[")[0] != "bf16"  # the bf16 baseline's weights carry no weight_scale_2
                rec["rel_err"] = max(rel_err(y13, refs[0] if scaled else refs[2]),
                                     rel_err(y2, refs[1] if scaled else refs[3]))
                del y13, y2
                rec["us"] = timer.graph_us(calls)
                rec["eager_us"] = timer.eager_us(calls)
                if profile and device.type == "cuda":  # one layer's kernels, each with the idle time before it
                    from bench_generate import replay_timeline
                    tl = replay_timeline(calls[0])
                    rec["timeline"] = tl
                    print(f"  {model} T={t} {v}: one layer eager, {tl['kernels']} kernels, busy {tl['busy_ms'] * 1e3:.1f}"
                          f" us, idle {tl['gap_ms'] * 1e3:.1f} us:")
                    for k in tl["top"][:12]:
                        print(f"      {k['count']:3d} x {k['us'] / k['count']:7.2f} us (idle {k['gap_us']:6.1f})  "
                              f"{k['name'][:90]}")
        except Unavailable as ex:
            rec = {"unavailable": str(ex)}
        except Exception as ex:  # one variant's failure must not lose the others' figures
            traceback.print_exc()
            rec = {"error": f"{type(ex).__name__}: {str(ex).splitlines()[0][:200] if str(ex) else ''}"}
        row["variants"][v] = rec
        calls = None
        free_memory(device)
        print(f"  {model} T={t} {routing}: {v}: {json.dumps(rec)}", flush=True)
    return row


def us(row: dict, v: str) -> float | None:
    return row["variants"].get(v, {}).get("us")


def evaluate_targets(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        for label, applies, v, baselines, limit in targets_for(row["model"]):
            if not applies(row["tokens"]) or v not in row["variants"]:
                continue
            num, dens = us(row, v), [us(row, b) for b in baselines]
            x = None if num is None or any(d is None for d in dens) else num / min(dens)
            missing = [b for b in (v,) + baselines if us(row, b) is None]
            out.append(dict(target=label, model=row["model"], tokens=row["tokens"], routing=row["routing"], ratio=x,
                            limit=limit, verdict="n/a" if x is None else ("PASS" if x <= limit else "MISS"),
                            why=f"no time for {', '.join(missing)}" if missing else ""))
    return out


def cell(v: str, rec: dict) -> str:
    if "us" in rec:
        if "eager_us" not in rec:
            return f"{rec['us']:.1f}"
        flag = "" if rec.get("rel_err", 0.0) <= CHECK_TOL.get(v.split("[")[0], CHECK_TOL_DEFAULT) else " (CHECK)"
        return f"{rec['us']:.1f}{flag}"
    return "n/a" if "unavailable" in rec else "error"


def report(meta: dict, ceilings: dict, rows: list[dict], targets: list[dict], variants: list[str]) -> str:
    lines = [f"### bench_moe: {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"`{meta['command']}`; torch {meta['torch']}. {meta['timing']}. One MoE layer's gate_up + down, us per "
             f"layer (graph); read floor at the measured copy bandwidth {ceilings['copy_tbps']:.3g} TB/s (read + write, "
             f"{ceilings['copy_bytes'] >> 20} MiB). R = layers captured per graph (experts hit exceed 3x L2).", ""]
    ratio_cols = [("w4a16", "humming"), ("w4a16", "read"), ("w4a4_dyn", "w4a16"), ("w4a16", "bf16")]
    ratio_cols = [(a, b) for a, b in ratio_cols if a in variants and b in variants]
    for model in dict.fromkeys(r["model"] for r in rows):
        e, k, h, i = meta["models"][model]
        lines += [f"**{model}** (E {e}, top-{k}, H {h}, I {i})", ""]
        header = ["tokens", "routing", "hit", "R"] + variants + [f"{a} / {b}" for a, b in ratio_cols]
        body = []
        for r in (r for r in rows if r["model"] == model):
            ratios = []
            for a, b in ratio_cols:
                ua, ub = us(r, a), us(r, b)
                ratios.append(fmt(None if ua is None or ub is None else ua / ub, 2))
            body.append([r["tokens"], r["routing"], r["experts_hit"], r["layers"]]
                        + [cell(v, r["variants"][v]) for v in variants] + ratios)
        lines += [md_table(header, body), ""]
    notes = sorted({f"{v}: {rec.get('unavailable') or rec.get('error')}" for r in rows for v, rec in r["variants"].items()
                    if "us" not in rec})
    flagged = [f"{r['model']} T={r['tokens']} {r['routing']} {v} rel_err {rec['rel_err']:.3g}" for r in rows
               for v, rec in r["variants"].items()
               if rec.get("rel_err", 0.0) > CHECK_TOL.get(v.split("[")[0], CHECK_TOL_DEFAULT)]
    if notes:
        lines += ["Not timed: " + "; ".join(notes), ""]
    if flagged:
        lines += ["CHECK (output off the float32 reference beyond the variant's tolerance): " + "; ".join(flagged), ""]
    lines.append(md_table(["target (issue 40)", "model", "tokens", "routing", "ratio", "limit", "verdict"],
                          [[t["target"], t["model"], t["tokens"], t["routing"], fmt(t["ratio"], 3), f"{t['limit']:.2f}",
                            t["verdict"] + (f" ({t['why']})" if t["why"] else "")] for t in targets]))
    counts = {v: sum(t["verdict"] == v for t in targets) for v in ("PASS", "MISS", "n/a")}
    lines += ["", f"Targets: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a"
              + (" (--smoke: CPU figures, the verdicts only exercise the script)" if meta["device"] == "cpu" else "")]
    return "\n".join(lines)


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"{flag}: expected a comma list of positive integers, got {text!r}")
    if not vals or any(v < 1 for v in vals):
        raise SystemExit(f"{flag}: expected a comma list of positive integers, got {text!r}")
    return vals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help=f"comma list of {', '.join(MODELS)} (default: all)")
    ap.add_argument("--tokens", default=None, help="comma list of token counts (default 1,16,64,256,1024,4096)")
    ap.add_argument("--routings", default=None, help="comma list of uniform, skewed (default: both)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--backends", default="", help=f"also time w4a16 and w4a4_dyn forced to these ({', '.join(BACKENDS)})")
    ap.add_argument("--replays", type=int, default=None, help="graph replays per median (>= 10; default 20)")
    ap.add_argument("--l2-bytes", type=int, default=None, help="L2 size that sizes R (default: the device's)")
    ap.add_argument("--out", default=None, help="directory for bench_moe.md and bench_moe.json (default $OUT or "
                    "benchmarks/out)")
    ap.add_argument("--quick", action="store_true", help="tokens 1,64,1024, uniform routing, 10 replays (~2 min)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, wall clock, no graphs: checks the logic")
    ap.add_argument("--profile", action="store_true", help="also one eager layer of each variant under torch.profiler: "
                    "time per kernel and the idle time before each (where a variant's time goes)")
    args = ap.parse_args(argv)

    variants = parse_choices(args.variants, VARIANTS, "--variants", empty_ok=False)
    backends = parse_choices(args.backends, BACKENDS, "--backends", empty_ok=True)
    for b in backends:
        variants += [f"{v}[{b}]" for v in ("w4a16", "w4a4_dyn")]
    routings = parse_choices(args.routings, ROUTINGS, "--routings", empty_ok=False) if args.routings else None

    if args.smoke:
        torch.set_num_threads(1)  # tiny matmuls on a shared CI machine stall in a thread pool
        device = torch.device("cpu")
        models = dict(SMOKE_MODELS)
        tokens = parse_ints(args.tokens, "--tokens") if args.tokens else list(SMOKE["tokens"])
        routings = routings or list(ROUTINGS)
        replays = args.replays or SMOKE["replays"]
        l2 = args.l2_bytes or SMOKE["l2_bytes"]
        copy_bytes = SMOKE["copy_bytes"]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_moe: needs a CUDA device (or --smoke for the CPU check of the script)")
        device = torch.device("cuda")
        names = parse_choices(args.models, tuple(MODELS), "--models", empty_ok=False) if args.models else list(MODELS)
        models = {n: MODELS[n] for n in names}
        tokens = parse_ints(args.tokens, "--tokens") if args.tokens else list(QUICK["tokens"] if args.quick else TOKENS)
        routings = routings or list(QUICK["routings"] if args.quick else ROUTINGS)
        replays = args.replays or (QUICK["replays"] if args.quick else 20)
        if replays < 10:
            raise SystemExit(f"--replays: the median needs at least 10 replays, got {replays}")
        l2 = l2_bytes(device, args.l2_bytes)
        copy_bytes = 1 << 30
    out_dir = args.out or os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")

    timer = Timer(device, replays)
    meta = run_meta(device, timer)
    meta.update(variants=variants, models=models, tokens=tokens, routings=routings, l2_bytes_used=l2,
                grouped_backends=nvfp4_gemm.grouped.grouped_backends())
    print(f"bench_moe on {meta['device']}, commit {meta['commit']}; L2 {l2} bytes; {timer.method}", flush=True)
    ceilings = copy_ceiling(timer, copy_bytes)
    free_memory(device)
    print(f"ceilings: {json.dumps(ceilings)}", flush=True)

    rows = []
    for mi, (model, spec) in enumerate(models.items()):
        e, topk, h, i = spec
        # Enough layers for the smallest token count's experts hit to exceed 3x L2 (R is chosen per point).
        least_hit = min(e, min(tokens) * topk) * expert_bytes(h, i)
        n_layers = layers_needed(least_hit, l2, 64)
        print(f"{model}: {n_layers} layers of {e} experts ({n_layers * e * expert_bytes(h, i) / 2**30:.2f} GiB NVFP4)",
              flush=True)
        layers = [Layer(e, h, i, seed=1000 * mi + li, device=device) for li in range(n_layers)]
        for t in tokens:
            for routing in routings:
                rows.append(run_point(model, spec, t, routing, layers, variants, timer, l2, ceilings["copy_tbps"],
                                      seed=7919 * t + (routing == "skewed"), profile=args.profile))
        del layers
        free_memory(device)

    targets = evaluate_targets(rows)
    text = report(meta, ceilings, rows, targets, variants)
    print()
    print(text)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench_moe.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, "bench_moe.json"), "w") as f:
        json.dump(dict(meta=meta, ceilings=ceilings, rows=rows, targets=targets, report=text), f, indent=1)
    print(f"\nwrote {out_dir}/bench_moe.md and bench_moe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
