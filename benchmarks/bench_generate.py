"""The whole model (the benchmark of record): a transformers Llama with Llama-3-8B's shapes and random
weights, per variant: the decode step's GPU time at batch 1 and 16, a 2048-token prefill, generate() tokens/s,
memory (quantization included) and where one step's time goes.

    python benchmarks/bench_generate.py [--variants fp16,wo,...] [--layers 32] [--batch 1,16] [--json out.json]
    python benchmarks/bench_generate.py --smoke     # CPU, a tiny Llama, wall clock, no compile: checks the script

Decode step: the model compiled with torch.compile (inductor, default mode: no inductor CUDA graphs,
dynamic=False), one step of `batch` new tokens against a StaticCache already filled to --context tokens by an
eager prefill, captured by hand in one CUDA graph (after warm-up calls that compile it) and replayed: median
of --replays replays, CUDA events between consecutive replays (the GPU first sleeps ~2 ms so the host queues
every replay). Each replay writes the next cache position (transformers' StaticCache advances its own
counter), so the cache has --context + 64 + 2 * --replays slots; SDPA attends over all of them with a mask.
Prefill: --prefill tokens at batch 1, eager (GEMM-bound), into a fresh static cache, logits of the last
token only; median of 5 runs between CUDA events. generate(): --generate-tokens new tokens after a 64-token
prompt, greedy, static cache, eager (disable_compile: transformers would otherwise compile with inductor's
CUDA graphs), wall clock between synchronizes, median of 3; secondary (it moves +-15% between runs on a shared
host). Profile: one eager call of the compiled step under torch.profiler (and, on CUDA, one replay of its
graph: each kernel's time and the idle time before it); every GPU kernel is put in GEMM
(ours, cuBLAS, humming), attention (SDPA's kernels), input quantization (our amax / quantize kernels) or the
rest, by name; its kernel count is the launches per step.

Variants (the same random weights, seeded, for every variant; one model alive at a time):
  fp16              the float model (the 1.00 of every ratio)
  wo, wo_unfused    quantize_model(weight_only=True), fused q/k/v and gate/up (default) / the same NVFP4
                    tensors with one GEMM per projection (unfuse_projections)
  humming           humming-kernels W4A16 on wo's NVFP4 tensors, one layer per projection (_timing's adapter,
                    behind a custom op so that torch.compile keeps it whole); 'missing' where not importable
  static, static_unfused     W4A4 with input scales calibrated on one 256-token forward
  dynamic, dynamic_unfused   W4A4, input scales per call
--own-scales: after quantize_model, each fused group's later parts get a weight_scale_2 one ulp (k, up) or two
(v) above the first part's and fuse_projections fuses them again, so every fused variant runs its groups with
per-part alphas (nvfp4_gemm.fused.linear_parts: one GEMM at alpha 1 into fp32, each part's alpha after), as a
checkpoint whose parts kept their own scales does; the _unfused variants run the same tensors one GEMM per
projection. Compare with a run without it for the shared-alpha figures.
--inductor-pdl: inductor generates its Triton kernels as programmatic dependent launches (gdc_wait before
what depends on the kernel ahead, gdc_launch_dependents after its loads), for every variant of the run. Our
GEMMs are programmatic dependents already and release their successor after their main loop; with it, a GEMM
that follows a Triton kernel (a norm, the SiLU-and-multiply) may start its prologue and weight prefetch while
that kernel finishes, and the Triton kernel after it likewise. Compare with a run without it.
lm_head stays fp16 in every variant (as in NVFP4 checkpoints). Memory, per NVFP4 family: the float model's
bytes, the NVFP4 model's bytes, and the peak during quantize_model (torch.cuda.max_memory_allocated, the float
model resident), checked against what was allocated before it (the float model) plus four times the largest
float Linear (one layer's quantization work space): quantize_model must free each float weight as it goes.

--smoke runs all of it on the CPU with a 2-layer, 128-wide Llama: no compile, no graphs, wall clock; the
figures mean nothing (tests/test_bench_smoke.py runs it).
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
import traceback

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import nvfp4_gemm
except ImportError:  # an in-place build run from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nvfp4_gemm

from _timing import Timer, fmt, free_memory, humming_reason, humming_w4a16, md_table, parse_choices, run_meta  # noqa: E402

VARIANTS = ("fp16", "wo", "wo_unfused", "humming", "static", "static_unfused", "dynamic", "dynamic_unfused")
# variant -> (quantize_model mode, fused); the variants of one mode share one quantization
MODE_OF = {"wo": "weight_only", "wo_unfused": "weight_only", "humming": "weight_only", "static": "static",
           "static_unfused": "static", "dynamic": "dynamic", "dynamic_unfused": "dynamic"}
FUSED = {"wo", "static", "dynamic"}
# Llama-3-8B (config.json of meta-llama/Meta-Llama-3-8B), random weights.
CONFIG_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
CONFIG_SMOKE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=512,
                    tie_word_embeddings=False)
# The whole-model targets, on the H100: (label, variant, measure, (comparison, limit)).
# speedup = fp16 time / variant time.
TARGETS = (
    ("decode step batch 1: fp16 / variant >= 2.0", "wo", ("speedup", 1), (">=", 2.0)),
    ("decode step batch 16: fp16 / variant >= 1.5", "wo", ("speedup", 16), (">=", 1.5)),
    ("decode step batch 1: fp16 / variant >= 1.7", "dynamic", ("speedup", 1), (">=", 1.7)),
    ("decode step batch 16: fp16 / variant >= 1.2", "dynamic", ("speedup", 16), (">=", 1.2)),
    ("prefill: variant / fp16 <= 0.95", "wo", ("prefill_ratio", None), ("<=", 0.95)),
    ("prefill: variant / fp16 <= 0.95", "dynamic", ("prefill_ratio", None), ("<=", 0.95)),
    ("decode step batch 1: humming / variant > 1", "wo", ("over_humming", 1), (">", 1.0)),
    ("decode step batch 16: humming / variant > 1", "wo", ("over_humming", 16), (">", 1.0)),
)
PROMPT = 64            # generate()'s prompt length
CALIB_TOKENS = 256     # the static variants' calibration forward
PREFILL_RUNS = 5
GENERATE_RUNS = 3
WORK_SPACE_LAYERS = 4  # quantize_model's allowance over the float model, in largest-float-Linear units

# ------------------------------------------------------------------------------------------ humming op

_HUMMING: list = []  # index -> (humming callable, N)


@torch.library.custom_op("nvfp4_bench::humming_linear", mutates_args=())
def _humming_linear(x: torch.Tensor, index: int) -> torch.Tensor:
    f, n = _HUMMING[index]
    return f(x.reshape(-1, x.shape[-1]).contiguous()).reshape(*x.shape[:-1], n)


@_humming_linear.register_fake
def _(x, index):
    return x.new_empty((*x.shape[:-1], _HUMMING[index][1]))


class HummingLinear(nn.Module):
    """A projection run by humming-kernels W4A16 on an NVFP4Linear's tensors (one custom op per call)."""

    def __init__(self, layer: nvfp4_gemm.NVFP4Linear) -> None:
        super().__init__()
        if layer.bias is not None:
            raise ValueError("the humming variant has no bias (the Llama projections have none)")
        self.index = len(_HUMMING)
        _HUMMING.append((humming_w4a16(layer.weight, layer.weight_scale, layer.weight_scale_2, torch.float16),
                         layer.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.nvfp4_bench.humming_linear(x, self.index)


def to_humming(model: nn.Module) -> None:
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, nvfp4_gemm.NVFP4Linear):
                setattr(mod, child_name, HummingLinear(child))
                free_memory(torch.device("cuda"))

# ------------------------------------------------------------------------------------------ the model


def build_model(config_kw: dict, layers: int, device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    """The float Llama, made on the device, weights N(0, 1/K) (activations keep a std near 1, so fp16 neither
    overflows nor flushes to zero), the same for every call with the same seed."""
    import transformers

    cfg = transformers.LlamaConfig(**{**config_kw, "num_hidden_layers": layers})
    cfg._attn_implementation = "sdpa"
    with torch.device(device):  # made in `dtype` directly: an fp32 8B model would not leave room for much else
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=g)
    return model


def model_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def largest_linear_bytes(model: nn.Module) -> int:
    return max(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))


def token_ids(batch: int, length: int, vocab: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).to(device)

# ------------------------------------------------------------------------------------------ measurements


class Clock:
    """GPU time between CUDA events, or the wall clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def ms(self, f) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            f()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        f()
        return (time.perf_counter() - t0) * 1e3


def new_cache(model: nn.Module, max_len: int):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


def set_length(cache, n: int) -> None:
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False):
            layer.cumulative_length.fill_(n)


def decode_step(model, forward, batch: int, args, timer: Timer) -> dict:
    """Prefill --context tokens eagerly into a static cache, then time one compiled decode step (module
    docstring). Returns ms, and the step's logits (fp32, CPU) for the accuracy columns."""
    device = timer.device
    vocab = model.config.vocab_size
    cache = new_cache(model, args.context + 64 + 2 * args.replays)
    with torch.no_grad():
        model(token_ids(batch, args.context, vocab, 11, device), past_key_values=cache, use_cache=True,
              logits_to_keep=1)
        ids = token_ids(batch, 1, vocab, 12, device)

        def step():
            return forward(input_ids=ids, past_key_values=cache, use_cache=True).logits

        out = {}
        if timer.cuda:
            t0 = time.perf_counter()
            for _ in range(2):  # compiles, then runs once more: nothing lazy is left for the capture
                set_length(cache, args.context)
                step()
            set_length(cache, args.context)
            graph, outs = timer.capture([step])  # warm-up (compiles), capture, one replay
            out["compile_and_capture_s"] = time.perf_counter() - t0
            set_length(cache, args.context)
            graph.replay()
            out["logits"] = outs[0].float().cpu()
            set_length(cache, args.context)
            out["ms"] = statistics.median(timer._intervals_ms(graph.replay, sleep_first=True))
            if args.profile and batch == min(args.batch):
                set_length(cache, args.context)
                replay_profile = replay_timeline(graph.replay)
            del graph, outs
        else:
            times = []
            for _ in range(args.replays):
                set_length(cache, args.context)
                t0 = time.perf_counter()
                logits = step()
                times.append((time.perf_counter() - t0) * 1e3)
            out["ms"] = statistics.median(times)
            out["logits"] = logits.float().cpu()
        if args.profile and batch == min(args.batch):
            set_length(cache, args.context)
            out["profile"] = profile_step(step, device)
            if timer.cuda:
                out["profile"]["replay"] = replay_profile
    del cache
    return out


KERNEL_CLASSES = (  # first match wins, on the lower-case kernel (GPU) or op (CPU) name
    ("collective", ("nccl", "all_reduce", "allreduce", "one_shot", "all_gather")),
    ("attention", ("flash", "fmha", "attention", "attn", "softmax")),
    ("quantize", ("quantize", "quant_a", "dynamic_scales", "static_scales", "zero_counters", "input_scales")),
    ("gemm", ("gemm", "small_m_kernel", "xmma", "cutlass", "gemv", "decode_kernel", "decode_a_kernel", "order_a16",
              "humming", "nvfp4_gemm::linear", "nvfp4_gemm::mm", "aten::mm", "aten::addmm", "aten::bmm", "matmul",
              "sm90_", "nvjet")),
)


def classify(name: str) -> str:
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def replay_timeline(replay) -> dict:
    """One replay of the step's CUDA graph under torch.profiler: its kernels in the order they ran, each with its
    own time and the idle time between the end of the kernel before and its start (launch latency and
    dependencies: what a graph still pays per kernel), summed per kernel name."""
    from torch.autograd import DeviceType

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    kernels = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                      if e.device_type == DeviceType.CUDA), key=lambda k: k[0])
    if not kernels:
        return {"kernels": 0}
    per_name: dict = {}
    prev_end = kernels[0][0]
    for start, end, name in kernels:
        rec = per_name.setdefault(name, {"count": 0, "us": 0.0, "gap_us": 0.0, "cls": classify(name)})
        rec["count"] += 1
        rec["us"] += end - start
        rec["gap_us"] += max(0.0, start - prev_end)
        prev_end = max(prev_end, end)
    busy = sum(r["us"] for r in per_name.values())
    top = sorted(per_name.items(), key=lambda kv: -(kv[1]["us"] + kv[1]["gap_us"]))
    return {"kernels": len(kernels), "span_ms": (prev_end - kernels[0][0]) / 1e3, "busy_ms": busy / 1e3,
            "gap_ms": sum(r["gap_us"] for r in per_name.values()) / 1e3,
            "top": [dict(name=n[:120], **r) for n, r in top[:40]]}


def profile_step(step, device: torch.device) -> dict:
    """One eager call of the step under torch.profiler: time and count per class (GPU kernels on CUDA, the ops'
    self CPU time on the CPU), and the largest entries."""
    from torch.autograd import DeviceType

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    want = DeviceType.CUDA if device.type == "cuda" else DeviceType.CPU
    classes = {c: {"ms": 0.0, "count": 0} for c in [k for k, _ in KERNEL_CLASSES] + ["other"]}
    top = []
    linear_calls = 0
    for e in prof.key_averages():
        if e.device_type == DeviceType.CPU and e.key == "nvfp4_gemm::linear":
            linear_calls += e.count
        if e.device_type != want:
            continue
        us = e.self_device_time_total if want == DeviceType.CUDA else e.self_cpu_time_total
        c = classify(e.key)
        classes[c]["ms"] += us / 1e3
        classes[c]["count"] += e.count
        top.append((us / 1e3, e.count, c, e.key[:120]))
    top.sort(reverse=True)
    # NVFP4 GEMMs issued: linear calls, fused groups with per-part alphas (the _linear_parts op when compiled,
    # its own mm call in eager code), and no mm called from inside either.
    outer = ("nvfp4_gemm::linear", "nvfp4_gemm::_linear_parts")

    def inside(e) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name in outer:
                return True
            p = p.cpu_parent
        return False

    gemm_calls = sum(1 for e in prof.events() if e.device_type == DeviceType.CPU and (
        e.name in outer or (e.name == "nvfp4_gemm::mm" and not inside(e))))
    return {"unit": "GPU kernels" if want == DeviceType.CUDA else "CPU ops (self time)", "classes": classes,
            "nvfp4_linear_calls": linear_calls, "nvfp4_gemm_calls": gemm_calls,
            "kernels": sum(v["count"] for v in classes.values()), "total_ms": sum(v["ms"] for v in classes.values()),
            "top": [dict(ms=t[0], count=t[1], cls=t[2], name=t[3]) for t in top[:12]]}


def prefill(model, args, clock: Clock) -> float:
    cache = new_cache(model, args.prefill)
    ids = token_ids(1, args.prefill, model.config.vocab_size, 13, next(model.parameters()).device)
    times = []
    with torch.no_grad():
        for i in range(PREFILL_RUNS + 1):
            set_length(cache, 0)
            t = clock.ms(lambda: model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1))
            if i:  # the first run initializes the cache and warms up
                times.append(t)
    del cache
    return statistics.median(times)


def generate_tps(model, args, clock: Clock) -> float:
    ids = token_ids(1, PROMPT, model.config.vocab_size, 14, next(model.parameters()).device)
    n = args.generate_tokens
    times = []
    with torch.no_grad():
        for i in range(GENERATE_RUNS + 1):
            t = clock.ms(lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                                cache_implementation="static", disable_compile=True, pad_token_id=0))
            if i:
                times.append(t)
    return n / (statistics.median(times) / 1e3)

# ------------------------------------------------------------------------------------------ variants


def time_variant(variant: str, model, args, timer: Timer, clock: Clock, baseline: dict) -> dict:
    rec = dict(variant=variant)
    torch._dynamo.reset()
    forward = model
    if args.compile == "inductor":
        forward = torch.compile(model, dynamic=False)
    gemm_layers = sum(isinstance(m, (nvfp4_gemm.NVFP4Linear, nn.Linear, HummingLinear)) for m in model.modules())
    fused = sum(isinstance(m, nvfp4_gemm.fused.FusedNVFP4Linear) for m in model.modules())
    rec["linear_modules"] = gemm_layers
    rec["fused_parts"] = fused
    from torch._dynamo.utils import counters

    counters.clear()
    for b in args.batch:
        step = decode_step(model, forward, b, args, timer)
        logits = step.pop("logits")
        rec[f"step_ms_b{b}"] = step["ms"]
        if "compile_and_capture_s" in step:
            rec[f"compile_and_capture_s_b{b}"] = step["compile_and_capture_s"]
        if "profile" in step:
            rec["profile"] = step["profile"]
        rec[f"finite_b{b}"] = bool(torch.isfinite(logits).all())
        ref = baseline.get(("fp16", b))
        if ref is not None and ref.shape == logits.shape:
            rec[f"rel_err_vs_fp16_b{b}"] = float((logits - ref).norm() / ref.norm())
            rec[f"top1_vs_fp16_b{b}"] = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
        if variant in FUSED:
            baseline[(variant, b)] = logits
        elif variant.endswith("_unfused") and (variant[: -len("_unfused")], b) in baseline:
            rec[f"bit_identical_to_fused_b{b}"] = bool(torch.equal(logits, baseline[(variant[: -len("_unfused")], b)]))
        if variant == "fp16":
            baseline[("fp16", b)] = logits
        print(f"    {variant} batch {b}: {step['ms']:.3f} ms", flush=True)
    if args.compile != "none":  # a graph break splits the step into several compiled graphs
        rec["dynamo_graph_breaks"] = sum(counters["graph_break"].values())
        rec["dynamo_unique_graphs"] = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    del forward
    if args.prefill:
        rec["prefill_ms"] = prefill(model, args, clock)
        print(f"    {variant} prefill {args.prefill}: {rec['prefill_ms']:.2f} ms", flush=True)
    if args.generate_tokens:
        rec["generate_tok_s"] = generate_tps(model, args, clock)
        print(f"    {variant} generate: {rec['generate_tok_s']:.1f} tok/s", flush=True)
    return rec


def give_parts_own_scales(model: nn.Module) -> int:
    """--own-scales (module docstring): part i > 0 of each fused group gets weight_scale_2 i ulps above part 0's,
    then the groups are fused again, with per-part alphas. Returns the number of such groups."""
    groups = {id(m._group): m._group for m in model.modules() if isinstance(m, nvfp4_gemm.fused.FusedNVFP4Linear)}
    with torch.no_grad():
        for g in groups.values():
            first = g.parts[0].weight_scale_2
            for i, p in enumerate(g.parts[1:], 1):
                ws2 = first.clone()
                for _ in range(i):
                    ws2 = torch.nextafter(ws2, torch.full_like(ws2, float("inf")))
                p.weight_scale_2.copy_(ws2)
    nvfp4_gemm.fuse_projections(model)
    own = {id(m._group) for m in model.modules()
           if isinstance(m, nvfp4_gemm.fused.FusedNVFP4Linear) and m._group.valid and m._group.own_alphas}
    if len(own) != len(groups):
        raise RuntimeError(f"--own-scales: {len(own)} of {len(groups)} fused groups run with per-part alphas")
    return len(own)


def run_family(mode: str | None, variants: list[str], args, timer: Timer, clock: Clock, baseline: dict,
               config_kw: dict, add_row) -> None:
    """Builds the float model, quantizes it for `mode` (measuring memory), then times each of `variants`
    (fused first, then the same tensors unfused, then humming on them), handing each row to add_row."""
    device = timer.device
    free_memory(device)
    cuda = device.type == "cuda"
    mem = {}
    t0 = time.perf_counter()
    model = build_model(config_kw, args.layers, device, torch.float16 if cuda else torch.float32, seed=1)
    mem["float_model_bytes"] = model_bytes(model)
    mem["largest_linear_bytes"] = largest_linear_bytes(model)
    if cuda:  # the peak of quantize_model itself, the float model resident (as for a user quantizing in place)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        mem["allocated_before_quantize_bytes"] = torch.cuda.memory_allocated(device)
    if mode is not None:
        calib = token_ids(1, min(CALIB_TOKENS, args.context), model.config.vocab_size, 15, device)
        nvfp4_gemm.quantize_model(model, weight_only=mode == "weight_only", progress=False,
                                  filter=lambda name, m: not name.endswith("lm_head"),
                                  calibrate=(lambda m: m(calib, use_cache=False)) if mode == "static" else None)
        mem["nvfp4_model_bytes"] = model_bytes(model)
        if cuda:
            torch.cuda.synchronize()
            mem["quantize_peak_bytes"] = torch.cuda.max_memory_allocated(device)
            mem["quantize_peak_limit_bytes"] = (mem["allocated_before_quantize_bytes"]
                                                + WORK_SPACE_LAYERS * mem["largest_linear_bytes"])
        if args.own_scales:
            mem["own_alpha_groups"] = give_parts_own_scales(model)
    mem["build_s"] = time.perf_counter() - t0
    print(f"  {mode or 'fp16'}: model built in {mem['build_s']:.1f} s; {json.dumps(mem)}", flush=True)
    order = [v for v in VARIANTS if v in variants]
    for v in order:
        if v.endswith("_unfused") or v == "humming":
            if any(isinstance(m, nvfp4_gemm.fused.FusedNVFP4Linear) for m in model.modules()):
                nvfp4_gemm.unfuse_projections(model)
                free_memory(device)
        rec = dict(variant=v, **mem)
        try:
            if v == "humming":
                why = humming_reason(device)
                if why:
                    add_row(dict(rec, missing=why))
                    print(f"    humming: missing ({why})", flush=True)
                    continue
                to_humming(model)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            rec.update(time_variant(v, model, args, timer, clock, baseline))
            if cuda:
                rec["run_peak_bytes"] = torch.cuda.max_memory_allocated(device)
        except Exception as e:  # one variant's failure must not lose the others' figures
            traceback.print_exc()
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        add_row(rec)
    del model
    _HUMMING.clear()
    gc.collect()
    free_memory(device)

# ------------------------------------------------------------------------------------------ report


def add_ratios(rows: list[dict], batches: list[int]) -> None:
    by = {r["variant"]: r for r in rows}
    fp16, hum = by.get("fp16", {}), by.get("humming", {})
    for r in rows:
        for b in batches:
            t = r.get(f"step_ms_b{b}")
            if t is None:
                continue
            if fp16.get(f"step_ms_b{b}"):
                r[f"speedup_b{b}"] = fp16[f"step_ms_b{b}"] / t
            if hum.get(f"step_ms_b{b}"):
                r[f"over_humming_b{b}"] = hum[f"step_ms_b{b}"] / t
        if r.get("prefill_ms") and fp16.get("prefill_ms"):
            r["prefill_ratio"] = r["prefill_ms"] / fp16["prefill_ms"]


def evaluate_targets(rows: list[dict]) -> list[dict]:
    by = {r["variant"]: r for r in rows}
    out = []
    for label, variant, (measure, b), (op, limit) in TARGETS:
        key = measure if b is None else f"{measure}_b{b}"
        x = by.get(variant, {}).get(key)
        ok = None if x is None else {">=": x >= limit, "<=": x <= limit, ">": x > limit}[op]
        out.append(dict(target=label, variant=variant, key=key, value=x, limit=limit, op=op,
                        verdict="n/a" if ok is None else ("PASS" if ok else "MISS")))
    seen = set()
    for r in rows:
        if "quantize_peak_bytes" in r and r["quantize_peak_limit_bytes"] not in seen:
            seen.add(r["quantize_peak_limit_bytes"])
            x, limit = r["quantize_peak_bytes"], r["quantize_peak_limit_bytes"]
            out.append(dict(target=f"quantize_model peak <= float model + {WORK_SPACE_LAYERS} x largest Linear",
                            variant=MODE_OF[r["variant"]], key="quantize_peak_bytes", value=x, limit=limit, op="<=",
                            verdict="PASS" if x <= limit else "MISS"))
    return out


def gb(x) -> str:
    return "-" if x is None else f"{x / 1e9:.2f}"


def report(meta: dict, rows: list[dict], targets: list[dict], batches: list[int]) -> str:
    lines = [f"### bench_generate: {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"`{meta['command']}`; torch {meta['torch']}, transformers {meta['transformers']}; Llama "
             f"{meta['layers']} layers, hidden {meta['config']['hidden_size']}; decode step: {meta['step_timing']}; "
             f"context {meta['context']}, prefill {meta['prefill']} tokens (eager), generate {meta['generate_tokens']} "
             f"tokens (eager, static cache)."
             + (" --own-scales: every fused group's parts have their own weight_scale_2 (per-part alphas)."
                if meta.get("own_scales") else "")
             + (" --inductor-pdl: inductor's Triton kernels launch as programmatic dependents in every variant."
                if meta.get("inductor_pdl") else "")]
    header = (["variant"] + [f"step b{b} ms (fp16 / it)" for b in batches]
              + ["prefill ms (it / fp16)", "generate tok/s", "kernels / step", "GEMM / attn / quant / other ms (count)",
                 "logits vs fp16: rel err, top-1", "model GB", "quantize peak GB"])
    body = []
    for r in rows:
        if "missing" in r or "error" in r:
            body.append([r["variant"], f"{'missing' if 'missing' in r else 'error'}: {r.get('missing') or r.get('error')}"]
                        + [""] * (len(header) - 2))
            continue
        cells = [r["variant"]]
        for b in batches:
            t = r.get(f"step_ms_b{b}")
            cells.append("-" if t is None else f"{t:.3f} ({fmt(r.get(f'speedup_b{b}'), 2)}x)"
                         + ("" if r.get(f"finite_b{b}", True) else " NONFINITE"))
        cells.append("-" if r.get("prefill_ms") is None else f"{r['prefill_ms']:.2f} ({fmt(r.get('prefill_ratio'), 2)})")
        cells.append(fmt(r.get("generate_tok_s"), 1))
        p = r.get("profile")
        cells.append(str(p["kernels"]) if p else "-")
        cells.append(" / ".join(f"{p['classes'][c]['ms']:.2f} ({p['classes'][c]['count']})"
                                for c in ("gemm", "attention", "quantize", "other")) if p else "-")
        b0 = batches[0]
        cells.append("-" if r.get(f"rel_err_vs_fp16_b{b0}") is None else
                     f"{r[f'rel_err_vs_fp16_b{b0}']:.3f}, {r[f'top1_vs_fp16_b{b0}']:.2f}")
        cells.append(gb(r.get("nvfp4_model_bytes", r.get("float_model_bytes"))))
        cells.append(gb(r.get("quantize_peak_bytes")))
        body.append(cells)
    lines += ["", md_table(header, body)]
    bits = [f"{r['variant']} b{b}: {'yes' if r[f'bit_identical_to_fused_b{b}'] else 'NO'}"
            for r in rows for b in batches if f"bit_identical_to_fused_b{b}" in r]
    if bits:
        lines += ["", "Unfused logits bit-identical to fused (same NVFP4 tensors): " + "; ".join(bits)]
    breaks = [f"{r['variant']} {r['dynamo_graph_breaks']} ({r['dynamo_unique_graphs']} graphs)" for r in rows
              if "dynamo_graph_breaks" in r]
    if breaks:
        lines += ["", "torch.compile graph breaks in the decode step: " + "; ".join(breaks)]
    profs = [(r["variant"], r["profile"]) for r in rows if r.get("profile")]
    if profs:
        lines += ["", f"Where one step's time goes (batch {batches[0]}, {profs[0][1]['unit']}, largest entries):"]
        for v, p in profs:
            lines.append(f"- {v}: " + "; ".join(f"{t['cls']} {t['ms']:.3f} ms x{t['count']} {t['name'][:60]}"
                                                for t in p["top"][:5]))
    if targets:
        lines += ["", "Targets (issue 26):", "",
                  md_table(["target", "variant", "value", "verdict"],
                           [[t["target"], t["variant"],
                             "n/a" if t["value"] is None else (gb(t["value"]) + f" GB <= {gb(t['limit'])} GB"
                                                                if t["key"] == "quantize_peak_bytes" else
                                                                f"{t['value']:.2f} {t['op']} {t['limit']}"),
                             t["verdict"]] for t in targets])]
        counts = {x: sum(t["verdict"] == x for t in targets) for x in ("PASS", "MISS", "n/a")}
        lines += ["", f"Targets: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a"
                  + (" (--smoke: CPU figures, the verdicts only exercise the script)" if meta["device"] == "cpu" else "")]
    return "\n".join(lines)

# ------------------------------------------------------------------------------------------ main


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v]
    except ValueError:
        vals = []
    if not vals or any(v <= 0 for v in vals):
        raise SystemExit(f"{flag}: expected a comma list of positive integers, got {text!r}")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny Llama, no compile or graphs")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 32; --smoke 2)")
    ap.add_argument("--batch", default=None, help="decode batch sizes (default 1,16; --smoke 1,2)")
    ap.add_argument("--context", type=int, default=None, help="tokens in the cache before the step (512; --smoke 16)")
    ap.add_argument("--prefill", type=int, default=None, help="prefill tokens, 0 to skip (2048; --smoke 32)")
    ap.add_argument("--generate-tokens", type=int, default=None, help="generate() new tokens, 0 to skip (32; --smoke 3)")
    ap.add_argument("--replays", type=int, default=None, help="graph replays per step time (20; --smoke 3)")
    ap.add_argument("--compile", choices=("inductor", "none"), default=None,
                    help="how the decode step is compiled (inductor; --smoke none)")
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profile of one step")
    ap.add_argument("--inductor-pdl", action="store_true",
                    help="inductor's Triton kernels as programmatic dependent launches, in every variant of the run "
                         "(torch._inductor.config.triton.enable_pdl; module docstring)")
    ap.add_argument("--own-scales", action="store_true",
                    help="the fused groups' parts get their own weight scales (per-part alphas; module docstring)")
    ap.add_argument("--json", default=None, help="write every figure here (rewritten after each variant)")
    args = ap.parse_args(argv)

    variants = parse_choices(args.variants, VARIANTS, "--variants", empty_ok=False)
    if "fp16" not in variants:
        variants = ["fp16"] + variants  # every ratio is to fp16 of the same run
    smoke = args.smoke
    if smoke:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_generate needs a CUDA device (--smoke runs the script's logic on the CPU)")
        device = torch.device("cuda")
    defaults = dict(layers=2, batch="1,2", context=16, prefill=32, generate_tokens=3, replays=3, compile="none") \
        if smoke else dict(layers=32, batch="1,16", context=512, prefill=2048, generate_tokens=32, replays=20,
                           compile="inductor")
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.batch = parse_ints(args.batch, "--batch")
    for flag in ("layers", "context", "replays"):
        if getattr(args, flag) <= 0:
            raise SystemExit(f"--{flag}: expected a positive integer, got {getattr(args, flag)}")
    for flag in ("prefill", "generate_tokens"):
        if getattr(args, flag) < 0:
            raise SystemExit(f"--{flag.replace('_', '-')}: expected an integer >= 0, got {getattr(args, flag)}")
    config_kw = CONFIG_SMOKE if smoke else CONFIG_8B
    if args.context + 64 + 2 * args.replays > config_kw["max_position_embeddings"] \
            or args.prefill > config_kw["max_position_embeddings"]:
        raise SystemExit(f"--context / --prefill: at most {config_kw['max_position_embeddings']} positions "
                         f"(context + 64 + 2 x replays, prefill)")

    import transformers

    import torch._inductor.config as inductor_config

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    inductor_config.triton.enable_pdl = args.inductor_pdl
    timer = Timer(device, args.replays)
    clock = Clock(device)
    meta = run_meta(device, timer)
    meta.update(own_scales=args.own_scales, inductor_pdl=args.inductor_pdl, variants=variants, layers=args.layers,
                batch=args.batch, context=args.context, prefill=args.prefill,
                generate_tokens=args.generate_tokens, compile=args.compile, transformers=transformers.__version__,
                config={**config_kw, "num_hidden_layers": args.layers},
                step_timing=(f"torch.compile {args.compile} (no inductor CUDA graphs), one step captured in a CUDA "
                             f"graph by hand, median of {args.replays} replays" if timer.cuda else
                             f"{'eager' if args.compile == 'none' else 'torch.compile ' + args.compile}, CPU wall "
                             f"clock, median of {args.replays}"))
    print(f"bench_generate on {meta['device']}, commit {meta['commit']}: {meta['step_timing']}", flush=True)

    rows, baseline = [], {}

    def dump(text=None):
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(meta=meta, rows=rows, targets=evaluate_targets(rows), report=text), f, indent=1)

    def add_row(rec: dict) -> None:  # the JSON is rewritten at once: a run cut off by a time limit keeps it
        rows.append(rec)
        add_ratios(rows, args.batch)
        dump()

    families = [None] + [m for m in ("weight_only", "static", "dynamic") if any(MODE_OF.get(v) == m for v in variants)]
    for mode in families:
        vs = ["fp16"] if mode is None else [v for v in variants if MODE_OF.get(v) == mode]
        run_family(mode, vs, args, timer, clock, baseline, config_kw, add_row)
    targets = evaluate_targets(rows)
    text = report(meta, rows, targets, args.batch)
    print()
    print(text)
    dump(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
