"""LoRA training step on an NVFP4 weight-only base against a bf16 base (targets: base
weights <= 0.35x bf16's memory, a step <= 1.15x bf16's time).

    python benchmarks/bench_train.py                           # GPU: Llama-3-8B-shaped stack, 4 layers, seq 2048, batch 1
    python benchmarks/bench_train.py --layers 8 --json out.json --profile --breakdown
    python benchmarks/bench_train.py --smoke                   # CPU, a tiny stack, wall clock: checks the script's logic

Its default fits one device call: ~1 min for both variants at 4 layers on an H100 (model set-up included;
each variant's set-up seconds are printed), so a build (~1 min), the GPU tests and this run fit 8 minutes.

The model is a transformers LlamaModel (decoder layers, no LM head; a 256-token vocabulary so the embedding is
negligible) with Llama-3-8B's layer shapes, random weights (the same seed for both bases), in bfloat16.
Variants:
  bf16        the float base; peft's own LoRA layers
  nvfp4-wo    every projection an NVFP4Linear, weight-only (W4A16), quantize_model; nvfp4_gemm.peft's LoRA layers
Both: LoRA rank 16 (alpha 32, fp32 adapters, peft's default) on q, k, v, o, gate, up, down; AdamW on the
adapters; loss = mean square of the last hidden state (in fp32). One step = forward, backward, optimizer step.

Figures per variant: step time (CUDA events around each step, after --warmup steps; median of --steps),
peak memory allocated over the timed steps, and the base projections' weight bytes (bf16: 2 bytes per weight;
NVFP4: packed weight + blocked e4m3 scales + the fp32 scale). Targets: base-weight memory <= 0.35x bf16,
step time <= 1.15x bf16. --profile adds the top CUDA kernels of one NVFP4 step (where the time goes).
--breakdown adds, over 2 more untimed NVFP4 steps, the per-step milliseconds of the NVFP4 base layers' work
from CUDA events: their forward (the nvfp4_gemm.linear calls, one per fused group), and in the backward the
weight decode (autograd.decode_weight: nvfp4_gemm::_decode) and the rest of autograd.grad_input (the cuBLAS
GEMM, alpha, the rounding); the bf16 base's own dx GEMMs are the comparison for the last.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import Timer, run_meta  # noqa: E402

import nvfp4_gemm  # noqa: E402
from nvfp4_gemm import NVFP4Linear  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VARIANTS = ("bf16", "nvfp4-wo")
# hidden, intermediate, heads, kv heads
SHAPES = {"8b": (4096, 14336, 32, 8), "tiny": (64, 128, 4, 2)}
MEMORY_TARGET, TIME_TARGET = 0.35, 1.15


def build(variant: str, shape: str, layers: int, seq: int, device, dtype, seed: int, grad_ckpt: bool):
    import transformers
    from peft import LoraConfig

    from nvfp4_gemm.peft import get_peft_model

    hidden, inter, heads, kv = SHAPES[shape]
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                   max_position_embeddings=seq, dtype=str(dtype).removeprefix("torch."))
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaModel(cfg).to(dtype)
    if variant == "nvfp4-wo":
        nvfp4_gemm.quantize_model(model, weight_only=True, progress=False)
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS)
    model = get_peft_model(model, config)  # plain nn.Linear targets keep peft's own LoRA layer
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model.train()


def base_weight_bytes(model: nn.Module) -> int:
    """Bytes of the base projections' weights (what NVFP4 shrinks): float weight, or packed + scales."""
    total = 0
    for name, m in model.named_modules():
        if isinstance(m, NVFP4Linear):
            total += sum(t.numel() * t.element_size() for t in (m.weight, m.weight_scale, m.weight_scale_2))
        elif type(m) is nn.Linear and name.endswith(".base_layer"):  # peft's LoRA layer around a float projection
            total += m.weight.numel() * m.weight.element_size()
    return total


class StepTimer:
    """Per-step milliseconds: CUDA events around each step on a GPU, the wall clock on the CPU (--smoke)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    @property
    def method(self) -> str:
        return ("CUDA events around each training step (forward, backward, AdamW), median over the timed steps"
                if self.cuda else "CPU wall clock per training step, median (--smoke)")

    def run(self, step, n: int) -> list[float]:
        times = []
        for _ in range(n):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
        return times


class Breakdown:
    """--breakdown: milliseconds per step of the NVFP4 base layers' work, from CUDA events (the wall clock on the
    CPU) around the module-level entries the layers and the backward call, patched for the duration of
    `installed()`: the forward GEMMs (call_linear as nn.py and fused.py call it), the backward's weight decode
    (autograd.decode_weight) and its GEMM (autograd.grad_input, less the decode inside it)."""

    PARTS = ("base forward", "backward decode", "backward GEMM + alpha + rounding")

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.spans: dict[str, list] = {"forward": [], "decode": [], "grad_input": []}

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _wrap(self, key: str, fn):
        def timed(*args, **kwargs):
            start = self._mark()
            out = fn(*args, **kwargs)
            self.spans[key].append((start, self._mark()))
            return out
        return timed

    @contextlib.contextmanager
    def installed(self):
        from nvfp4_gemm import autograd, fused, nn as nvfp4_nn

        targets = [(autograd, "decode_weight", "decode"), (autograd, "grad_input", "grad_input"),
                   (nvfp4_nn, "call_linear", "forward"), (fused, "call_linear", "forward")]
        saved = [(mod, name, getattr(mod, name)) for mod, name, _ in targets]
        for mod, name, key in targets:
            setattr(mod, name, self._wrap(key, getattr(mod, name)))
        try:
            yield self
        finally:
            for mod, name, fn in saved:
                setattr(mod, name, fn)

    def ms_per_step(self, steps: int) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        total = {key: sum(start.elapsed_time(end) if self.cuda else (end - start) * 1e3 for start, end in spans)
                 for key, spans in self.spans.items()}
        return {self.PARTS[0]: total["forward"] / steps, self.PARTS[1]: total["decode"] / steps,
                self.PARTS[2]: (total["grad_input"] - total["decode"]) / steps,
                "calls per step": {key: len(spans) / steps for key, spans in self.spans.items()}}


def measure(variant: str, args, device, dtype, timer: StepTimer) -> dict:
    t_setup = time.perf_counter()
    model = build(variant, args.shape, args.layers, args.seq, device, dtype, args.seed, args.grad_checkpointing)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, 256, (args.batch, args.seq), generator=g).to(device)
    losses = []

    def step():
        out = model(input_ids=ids).last_hidden_state
        loss = out.float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    setup_s = time.perf_counter() - t_setup
    timer.run(step, args.warmup)
    if timer.cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times = timer.run(step, args.steps)
    peak = torch.cuda.max_memory_allocated(device) if timer.cuda else None
    timed_losses = list(losses)  # the warm-up and timed steps' (the profiled and --breakdown ones come later)
    profile = None
    if args.profile and timer.cuda and variant != "bf16":
        from torch.profiler import ProfilerActivity, profile as prof

        with prof(activities=[ProfilerActivity.CUDA]) as p:
            step()
            torch.cuda.synchronize(device)
        profile = p.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    breakdown = None
    if args.breakdown and variant != "bf16":
        steps = 2
        with Breakdown(timer.cuda).installed() as b:
            for _ in range(steps):
                step()
        breakdown = b.ms_per_step(steps)
    row = dict(variant=variant, step_ms=statistics.median(times), step_ms_all=times, peak_bytes=peak,
               setup_s=setup_s, breakdown=breakdown,
               base_weight_bytes=base_weight_bytes(model),
               trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
               losses=[float(x) for x in timed_losses], profile=profile)
    del model, opt, losses
    gc.collect()
    if timer.cuda:
        torch.cuda.empty_cache()
    return row


def verdict(value: float | None, limit: float) -> str:
    return "n/a" if value is None else ("PASS" if value <= limit else "MISS")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; --smoke 2)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default 2048; --smoke 32)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; --smoke 1)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --smoke 3)")
    ap.add_argument("--grad-checkpointing", action="store_true", help="recompute each decoder layer in the backward")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one NVFP4 step")
    ap.add_argument("--breakdown", action="store_true",
                    help="time the NVFP4 layers' forward, backward decode and backward GEMM (2 more steps)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny stack, wall clock: checks the script's logic")
    args = ap.parse_args(argv)
    try:
        import peft  # noqa: F401
    except ImportError:
        raise SystemExit("bench_train: needs peft: pip install --no-deps peft==0.21.2 accelerate==1.15.0")

    if args.smoke:
        torch.set_num_threads(1)  # a shared CI machine: tiny matmuls stall in a thread pool
        device, args.shape = torch.device("cpu"), "tiny"
        defaults = dict(layers=2, seq=32, warmup=1, steps=3)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_train: needs a CUDA device (or --smoke for the CPU check of the script)")
        device, args.shape = torch.device("cuda"), "8b"
        defaults = dict(layers=4, seq=2048, warmup=3, steps=10)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key}: expected a positive integer, got {getattr(args, key)}")
    dtype = torch.bfloat16
    timer = StepTimer(device)
    meta = run_meta(device, Timer(device, args.steps))
    meta.update(timing=timer.method, shape=args.shape, layers=args.layers, seq=args.seq, batch=args.batch,
                warmup=args.warmup, steps=args.steps, grad_checkpointing=args.grad_checkpointing, lora_rank=16,
                dtype=str(dtype))
    print(f"bench_train on {meta['device']}, commit {meta['commit']}: {args.shape} stack x {args.layers} layers, "
          f"seq {args.seq}, batch {args.batch}; {timer.method}", flush=True)
    rows = [measure(v, args, device, dtype, timer) for v in VARIANTS]
    ref, q = rows
    mem_ratio = q["base_weight_bytes"] / ref["base_weight_bytes"]
    time_ratio = q["step_ms"] / ref["step_ms"]
    peak_ratio = q["peak_bytes"] / ref["peak_bytes"] if ref["peak_bytes"] else None
    targets = [dict(name="base-weight memory vs bf16", value=mem_ratio, limit=MEMORY_TARGET,
                    verdict=verdict(mem_ratio, MEMORY_TARGET)),
               dict(name="step time vs bf16", value=time_ratio, limit=TIME_TARGET, verdict=verdict(time_ratio, TIME_TARGET))]
    lines = [f"### bench_train: {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"`{meta['command']}`; torch {meta['torch']}. {timer.method}.", "",
             "| base | step ms | peak memory GiB | base weights MiB | trainable params |", "|---|---|---|---|---|"]
    for r in rows:
        peak = f"{r['peak_bytes'] / 2**30:.2f}" if r["peak_bytes"] is not None else "n/a"
        lines.append(f"| {r['variant']} | {r['step_ms']:.2f} | {peak} | {r['base_weight_bytes'] / 2**20:.3f} | "
                     f"{r['trainable_params']:,} |")
    lines += ["", "| target | value | limit | verdict |", "|---|---|---|---|"]
    for t in targets:
        lines.append(f"| {t['name']} | {t['value']:.3f}x | <= {t['limit']}x | {t['verdict']} |")
    if peak_ratio is not None:
        lines.append(f"\npeak memory NVFP4 / bf16: {peak_ratio:.3f}x")
    lines.append("\nset-up (model, quantization, adapters) s: " +
                 ", ".join(f"{r['variant']} {r['setup_s']:.1f}" for r in rows))
    for r in rows:
        if r["breakdown"]:
            parts = [f"{name} {r['breakdown'][name]:.2f}" for name in Breakdown.PARTS]
            lines.append(f"\n{r['variant']} step of {r['step_ms']:.2f} ms, the NVFP4 layers' share (ms per step, "
                         f"--breakdown): " + ", ".join(parts))
    if args.smoke:
        lines.append("\n(--smoke: CPU figures, the verdicts only exercise the script)")
    text = "\n".join(lines)
    print()
    print(text)
    for r in rows:
        if r["profile"]:
            print(f"\n{r['variant']}: one step's CUDA kernels\n{r['profile']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows, targets=targets, peak_ratio=peak_ratio, report=text), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
