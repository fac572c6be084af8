"""The whole mixture-of-experts model: transformers Qwen3-MoE with Qwen3-30B-A3B's shapes and random weights, per
variant: the decode step's GPU time at batch 1 / 16 / 64, a 2048-token prefill, memory (quantization included).

    python benchmarks/bench_moe_model.py                         # 48 layers, every variant, batch 1,16,64
    python benchmarks/bench_moe_model.py --quick                 # 4 layers, bf16 + wo + dynamic, batch 1,16 (~4 min)
    python benchmarks/bench_moe_model.py --variants bf16,wo --layers 48 --json out.json
    python benchmarks/bench_moe_model.py --smoke                 # CPU, a tiny Qwen3-MoE, no compile: checks the script

Timing is bench_generate.py's, reused from it: the decode step is the model compiled with torch.compile
(inductor, no inductor CUDA graphs, dynamic=False), one step of `batch` new tokens against a StaticCache
filled to --context tokens by an eager prefill, captured by hand in one CUDA graph and replayed (median of
--replays replays, CUDA events); prefill: --prefill tokens at batch 1, eager, median of 5 runs.

Variants (the same random weights, seeded, for every variant; one model alive at a time):
  bf16               the float model, experts through transformers' grouped_mm backend (torch's grouped GEMM),
                     its fastest experts backend on Hopper (issue 41: batched_mm is slower at batch 1 and runs out
                     of memory at batch 16); the 1.00 of every ratio
  bf16_batched_mm    the same weights through transformers' batched_mm backend (optional)
  wo                 quantize_model(weight_only=True): attention NVFP4Linear W4A16, experts NVFP4Experts
                     weight-only (routers, norms, embeddings and lm_head stay bf16)
  dynamic            W4A4 with per-call input scales (attention and experts)
  static             W4A4 with static input scales from one 256-token calibration forward (each expert its own)
  humming            the wo model with each experts module's two grouped GEMMs run by humming-kernels 0.1.20's
                     MoE W4A16 (grouped-contiguous, on the same NVFP4 expert weights) instead of grouped_mm; the
                     routing, gather, SiLU-and-multiply and combine are wo's own code, attention the same
                     NVFP4Linear layers: the difference is the experts' GEMMs alone
Memory per NVFP4 variant: the bf16 model's bytes, the NVFP4 model's, and the peak during quantization
(torch.cuda.max_memory_allocated over what the bf16 model held before it: issue 41's <= 1.3x).
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if glob.glob(os.path.join(_ROOT, "nvfp4_gemm", "_C*.so")):  # the checkout this script is in, built in place,
    sys.path.insert(0, _ROOT)                                # before any installed copy (which may lack moe)
import nvfp4_gemm  # noqa: E402

from _timing import Timer, md_table, parse_choices, run_meta  # noqa: E402
from bench_generate import Clock, decode_step, model_bytes, parse_ints, prefill, token_ids  # noqa: E402

VARIANTS = ("bf16", "bf16_batched_mm", "wo", "dynamic", "static", "static_shared", "humming")
# Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B), random weights.
CONFIG_30B_A3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                      num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                      num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[], max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=False)
CONFIG_SMOKE = dict(vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                    max_position_embeddings=512, tie_word_embeddings=False)
# issue 41's targets: (label, variant, measure, (comparison, limit)); speedup = bf16 time / variant time. The limits in
# ms are the whole model's (FULL_LAYERS layers): judged only when the run has them all; ratios hold at any depth.
TARGETS = (
    ("decode step batch 1 <= 3.4 ms", "wo", ("ms", 1), ("<=", 3.4)),
    ("decode step batch 1: bf16 / variant >= 2.0", "wo", ("speedup", 1), (">=", 2.0)),
    ("decode step batch 1: humming / variant >= 1.10", "wo", ("humming_over", 1), (">=", 1.10)),
    ("decode step batch 16 <= 12.6 ms", "wo", ("ms", 16), ("<=", 12.6)),
    ("decode step batch 16: bf16 / variant >= 1.8", "wo", ("speedup", 16), (">=", 1.8)),
    ("prefill 2048 <= 80 ms", "wo", ("prefill_ms", None), ("<=", 80.0)),
    ("prefill: variant / bf16 <= 0.9", "wo", ("prefill_ratio", None), ("<=", 0.9)),
    ("quantization peak / bf16 model <= 1.3", "wo", ("quantize_peak_ratio", None), ("<=", 1.3)),
)
CALIB_TOKENS = 256
FULL_LAYERS = 48  # Qwen3-30B-A3B's decoder layers


def build_model(config_kw: dict, layers: int, device: torch.device, dtype: torch.dtype, seed: int,
                experts_impl: str):
    """The float Qwen3-MoE on the device, weights N(0, 1/K) (experts too, per expert), the same for every call
    with the same seed."""
    import transformers

    cfg = transformers.Qwen3MoeConfig(**{**config_kw, "num_hidden_layers": layers})
    cfg._attn_implementation = "sdpa"
    cfg._experts_implementation = experts_impl
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=g)
    return model


def quantize(model, mode: str, device: torch.device, args) -> dict:
    """quantize_model in `mode` (lm_head left bf16), experts included; memory figures."""
    from nvfp4_gemm import moe

    ids = token_ids(1, CALIB_TOKENS, model.config.vocab_size, 21, device)
    calibrate = (lambda m: m(ids)) if mode == "static" else None
    out = {"bf16_model_gb": model_bytes(model) / 1e9}
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    nvfp4_gemm.quantize_model(model, filter=lambda n, m: n != "lm_head", weight_only=mode == "weight_only",
                              calibrate=calibrate, progress=False)  # experts included
    if device.type == "cuda":
        torch.cuda.synchronize()
        out["quantize_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        out["quantize_peak_ratio"] = torch.cuda.max_memory_allocated() / base
    out["quantize_s"] = time.perf_counter() - t0
    out["nvfp4_model_gb"] = model_bytes(model) / 1e9
    out["experts_modules"] = sum(isinstance(m, moe.NVFP4Experts) for m in model.modules())
    out["fused_routers"] = sum(isinstance(m, moe._FusedTopKForward) for m in model.modules())  # their top-k one op
    return out


def share_input_scales(model) -> int:
    """ModelOpt's form of static experts: one input scale for all experts of a module (the largest calibrated one,
    gate and up alike), as its checkpoints carry; returns the modules changed."""
    from nvfp4_gemm import moe

    n = 0
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, moe.NVFP4Experts) and m.static_input_scale:
                m.gate_up_proj_input_scale.fill_(m.gate_up_proj_input_scale.max().item())
                m.down_proj_input_scale.fill_(m.down_proj_input_scale.max().item())
                m.refresh()
                n += 1
    return n


def use_humming_experts(model) -> int:
    """Routes every NVFP4Experts module's grouped GEMMs through humming-kernels' MoE W4A16 on the same
    weights (bench_moe.humming_moe: the copy into humming's schema is verified there); returns the modules."""
    from bench_moe import humming_moe
    from _timing import humming_reason
    from nvfp4_gemm import moe
    from nvfp4_gemm.formats import from_blocked

    why = humming_reason(next(model.parameters()).device)
    if why:
        raise RuntimeError(why)
    count = 0
    for mod in model.modules():
        if not isinstance(mod, moe.NVFP4Experts):
            continue
        if not mod.weight_only or mod.plan()["own_alphas"]:
            raise RuntimeError("humming variant: weight-only experts whose gate and up share weight_scale_2 only")
        e, h, i = mod.num_experts, mod.hidden_dim, mod.intermediate_dim
        lin13 = torch.stack([from_blocked(mod.gate_up_proj_weight_scale[x], 2 * i, h) for x in range(e)])
        lin2 = torch.stack([from_blocked(mod.down_proj_weight_scale[x], h, i) for x in range(e)])
        layers = {"gate_up_proj": humming_moe(mod.gate_up_proj, lin13, mod.gate_up_proj_weight_scale_2[:, 0],
                                              torch.bfloat16),
                  "down_proj": humming_moe(mod.down_proj, lin2, mod.down_proj_weight_scale_2, torch.bfloat16)}
        object.__setattr__(mod, "_humming", layers)
        count += 1
    if count:
        original = moe._gemm

        @torch.compiler.disable  # humming's layer is not traced: a graph break (the step is captured by hand)
        def run(layer, a, layout):
            return layer(a, expert_layout=layout, compute_config={"gemm_type": "grouped_contiguous"})

        def gemm(mod, which, x, routing, gather, out_dtype, part=None):
            layers = mod.__dict__.get("_humming")
            if layers is None or part is not None:
                return original(mod, which, x, routing, gather, out_dtype, part)
            a = x if gather is None else x[gather]
            layout = torch.cat([routing.offs.new_zeros(1), routing.offs]).to(torch.int64)
            return run(layers[which], a, layout)

        moe._gemm = gemm
        model._humming_restore = lambda: setattr(moe, "_gemm", original)
    return count


def time_variant(variant: str, model, args, timer: Timer, clock: Clock, baseline: dict) -> dict:
    rec = dict(variant=variant)
    torch._dynamo.reset()
    forward = torch.compile(model, dynamic=False) if args.compile == "inductor" else model
    from torch._dynamo.utils import counters

    counters.clear()
    for b in args.batch:
        try:
            step = decode_step(model, forward, b, args, timer)
        except torch.OutOfMemoryError as e:
            rec[f"step_ms_b{b}"] = None
            rec[f"error_b{b}"] = f"out of memory: {str(e)[:120]}"
            print(f"    {variant} batch {b}: out of memory", flush=True)
            torch.cuda.empty_cache()
            continue
        logits = step.pop("logits")
        rec[f"step_ms_b{b}"] = step["ms"]
        if "compile_and_capture_s" in step:
            rec[f"compile_and_capture_s_b{b}"] = step["compile_and_capture_s"]
        if "profile" in step:  # one eager step under torch.profiler: GPU time per kernel class
            rec["profile"] = step["profile"]
            cls = step["profile"]["classes"]
            print(f"    {variant} batch {b} profile (eager, {step['profile']['kernels']} kernels): " +
                  ", ".join(f"{c} {v['ms']:.2f} ms / {v['count']}" for c, v in cls.items()), flush=True)
            rp = step["profile"].get("replay")
            if rp and rp.get("kernels"):
                print(f"    {variant} batch {b} graph replay: {rp['kernels']} kernels, span {rp['span_ms']:.3f} ms, "
                      f"kernels busy {rp['busy_ms']:.3f}, idle between kernels {rp['gap_ms']:.3f}", flush=True)
                for t in rp["top"][:25]:
                    print(f"      {t['count']:4d} x {t['us'] / t['count']:7.2f} us + idle {t['gap_us'] / t['count']:5.2f}"
                          f"  {t['cls']:9s} {t['name'][:90]}", flush=True)
        rec[f"finite_b{b}"] = bool(torch.isfinite(logits).all())
        ref = baseline.get(b)
        if ref is not None and ref.shape == logits.shape:
            rec[f"rel_err_vs_bf16_b{b}"] = float((logits - ref).norm() / ref.norm())
            rec[f"top1_vs_bf16_b{b}"] = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
        if variant == "bf16":
            baseline[b] = logits
        print(f"    {variant} batch {b}: {step['ms']:.3f} ms", flush=True)
    if args.compile != "none":
        rec["dynamo_graph_breaks"] = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    del forward
    if args.prefill:
        try:
            rec["prefill_ms"] = prefill(model, args, clock)
            print(f"    {variant} prefill {args.prefill}: {rec['prefill_ms']:.2f} ms", flush=True)
        except torch.OutOfMemoryError as e:
            rec["prefill_ms"] = None
            rec["error_prefill"] = f"out of memory: {str(e)[:120]}"
    return rec


def add_ratios(rows: list[dict], batches: list[int]) -> None:
    base = next((r for r in rows if r["variant"] == "bf16"), None)
    if base is None:
        return
    for r in rows:
        for b in batches:
            a, t = base.get(f"step_ms_b{b}"), r.get(f"step_ms_b{b}")
            if a and t:
                r[f"speedup_b{b}"] = a / t
        if base.get("prefill_ms") and r.get("prefill_ms"):
            r["prefill_ratio"] = r["prefill_ms"] / base["prefill_ms"]
    hum = next((r for r in rows if r["variant"] == "humming"), None)
    if hum is not None:
        for r in rows:
            for b in batches:
                a, t = hum.get(f"step_ms_b{b}"), r.get(f"step_ms_b{b}")
                if a and t:
                    r[f"humming_over_b{b}"] = a / t


def evaluate_targets(rows: list[dict], layers: int = FULL_LAYERS) -> list[dict]:
    out = []
    for label, variant, (measure, b), (op, limit) in TARGETS:
        r = next((x for x in rows if x["variant"] == variant), None)
        key = measure if b is None else (f"step_ms_b{b}" if measure == "ms" else f"{measure}_b{b}")
        absolute = measure in ("ms", "prefill_ms")
        v = None if r is None or (absolute and layers != FULL_LAYERS) else r.get(key)
        ok = None if v is None else (v <= limit if op == "<=" else v >= limit)
        note = f"a {FULL_LAYERS}-layer figure; this run has {layers}" if absolute and layers != FULL_LAYERS else None
        out.append(dict(target=label, variant=variant, value=v, met=ok, note=note))
    return out


def report(meta: dict, rows: list[dict], targets: list[dict], batches: list[int]) -> str:
    def f(x, d=2):
        return "-" if x is None else f"{x:.{d}f}"

    head = ["variant"] + [f"step b{b} ms" for b in batches] + [f"x bf16 b{b}" for b in batches] + \
        [f"humming / variant b{b}" for b in batches] + \
        ["prefill ms", "prefill / bf16", "rel err b1", "top1 b1", "GB", "quant peak / bf16"]
    body = []
    for r in rows:
        body.append([r["variant"]] + [f(r.get(f"step_ms_b{b}"), 3) for b in batches] +
                    [f(r.get(f"speedup_b{b}")) for b in batches] +
                    [f(r.get(f"humming_over_b{b}")) for b in batches] +
                    [f(r.get("prefill_ms")), f(r.get("prefill_ratio")), f(r.get("rel_err_vs_bf16_b1"), 4),
                     f(r.get("top1_vs_bf16_b1")), f(r.get("nvfp4_model_gb") or r.get("bf16_model_gb")),
                     f(r.get("quantize_peak_ratio"))])
    lines = [f"bench_moe_model on {meta['device']}, commit {meta['commit']}, transformers {meta['transformers']}, "
             f"{meta['layers']} layers: {meta['step_timing']}", "", md_table(head, body), ""]
    for t in targets:
        mark = "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")
        if t.get("note"):
            mark += f" ({t['note']})"
        lines.append(f"- {t['target']} ({t['variant']}): {f(t['value'], 3)} -> {mark}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny Qwen3-MoE, no compile or graphs")
    ap.add_argument("--quick", action="store_true", help="4 layers, bf16 + wo + dynamic, batch 1,16, 10 replays")
    ap.add_argument("--variants", default=None, help=f"comma list of {', '.join(VARIANTS)} (default all but "
                                                     f"bf16_batched_mm)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 48; --quick 4; --smoke 2)")
    ap.add_argument("--batch", default=None, help="decode batch sizes (default 1,16,64)")
    ap.add_argument("--context", type=int, default=None, help="tokens in the cache before the step (512)")
    ap.add_argument("--prefill", type=int, default=None, help="prefill tokens, 0 to skip (2048)")
    ap.add_argument("--replays", type=int, default=None, help="graph replays per step time (20)")
    ap.add_argument("--compile", choices=("inductor", "none"), default=None)
    ap.add_argument("--profile", action="store_true",
                    help="profile one eager step at the smallest batch (bench_generate's kernel classes)")
    ap.add_argument("--json", default=None, help="write every figure here (rewritten after each variant)")
    args = ap.parse_args(argv)
    args.generate_tokens = 0

    smoke = args.smoke
    if smoke:
        device = torch.device("cpu")
        defaults = dict(layers=2, batch="1,2", context=16, prefill=16, replays=2, compile="none",
                        variants="bf16,wo,static,static_shared")
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_moe_model needs a CUDA device (--smoke runs the script's logic on the CPU)")
        device = torch.device("cuda")
        defaults = dict(layers=48, batch="1,16,64", context=512, prefill=2048, replays=20, compile="inductor",
                        variants="bf16,wo,dynamic,static,humming")
        if args.quick:
            defaults.update(layers=4, batch="1,16", replays=10, variants="bf16,wo,dynamic")
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    variants = parse_choices(args.variants, VARIANTS, "--variants", empty_ok=False)
    if "bf16" not in variants:
        variants = ["bf16"] + variants
    args.batch = parse_ints(args.batch, "--batch")
    for flag in ("layers", "context", "replays"):
        if getattr(args, flag) <= 0:
            raise SystemExit(f"--{flag}: expected a positive integer, got {getattr(args, flag)}")
    config_kw = CONFIG_SMOKE if smoke else CONFIG_30B_A3B

    import transformers

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    timer = Timer(device, args.replays)
    clock = Clock(device)
    meta = run_meta(device, timer)
    meta.update(variants=variants, layers=args.layers, batch=args.batch, context=args.context, prefill=args.prefill,
                compile=args.compile, transformers=transformers.__version__,
                config={**config_kw, "num_hidden_layers": args.layers},
                step_timing=(f"torch.compile {args.compile} (no inductor CUDA graphs), one step captured in a CUDA "
                             f"graph by hand, median of {args.replays} replays" if timer.cuda else
                             f"eager, CPU wall clock, median of {args.replays}"))
    print(f"bench_moe_model on {meta['device']}, commit {meta['commit']}: {meta['step_timing']}", flush=True)
    dtype = torch.bfloat16
    rows, baseline = [], {}

    def dump(text=None):
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(meta=meta, rows=rows, targets=evaluate_targets(rows, meta["layers"]), report=text), f,
                          indent=1)

    mode_of = {"wo": "weight_only", "dynamic": "dynamic", "static": "static", "static_shared": "static",
               "humming": "weight_only"}
    for variant in variants:
        impl = "batched_mm" if variant == "bf16_batched_mm" else "grouped_mm"
        print(f"  {variant}: building {args.layers} layers", flush=True)
        model = build_model(config_kw, args.layers, device, dtype, seed=0, experts_impl=impl)
        extra = {"bf16_model_gb": model_bytes(model) / 1e9}
        if variant in mode_of:
            extra = quantize(model, mode_of[variant], device, args)
            print(f"  {variant}: quantized in {extra['quantize_s']:.1f} s, {extra['nvfp4_model_gb']:.2f} GB "
                  f"(bf16 {extra['bf16_model_gb']:.2f} GB)", flush=True)
        if variant == "static_shared":
            extra["shared_input_scale_modules"] = share_input_scales(model)
        if variant == "humming":
            try:
                extra["humming_experts_modules"] = use_humming_experts(model)
            except Exception as e:  # noqa: BLE001 - the other variants' figures stand
                rows.append(dict(variant=variant, error=f"{type(e).__name__}: {str(e)[:200]}"))
                print(f"  {variant}: unavailable: {e}", flush=True)
                del model
                gc.collect()
                continue
        try:
            rec = time_variant(variant, model, args, timer, clock, baseline)
        finally:
            getattr(model, "_humming_restore", lambda: None)()
        rec.update(extra)
        rows.append(rec)
        add_ratios(rows, args.batch)
        dump()
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    text = report(meta, rows, evaluate_targets(rows, meta["layers"]), args.batch)
    print()
    print(text)
    dump(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
