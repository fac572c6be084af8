"""Tensor parallelism on two GPUs (nvfp4_gemm.parallel, docs/PARALLEL.md). Runs under torchrun, 2 processes:

    export NCCL_NVLS_ENABLE=0   # NVLink multicast off (the lent machines' rule; the script also sets it)
    torchrun --nproc-per-node 2 benchmarks/bench_tp.py --part diag   --json diag.json
    torchrun --nproc-per-node 2 benchmarks/bench_tp.py --part check  --json check.json
    torchrun --nproc-per-node 2 benchmarks/bench_tp.py --part decode --layers-70b 40 --json decode.json

Parts (rank 0 prints; --json PATH gets every record, rewritten after each one so a cut-off run keeps them):
  diag    NCCL inside one torch.cuda.graph. The communicator is made eagerly (init_process_group(device_id=)) and
          five eager all-reduces run before any capture; then chains of 1, 10 and 100 all-reduces of 8K values
          are captured on a dedicated stream, replayed, checked (every value) and timed (us per all-reduce):
          through torch's symmetric-memory one-shot all-reduce (fp32, fp16) first, then the functional
          collective that compiled code uses, then c10d's in-place all_reduce. Every step runs under a watchdog
          (faulthandler: every thread's Python stack is printed and the process exits after --watchdog
          seconds), so a hang ends the run at its place, after the steps before it were recorded.
  check   TP=2 against TP=1 on the same random weights: a Llama with Llama-3-8B's shapes (--layers-8b decoder
          layers; weight-only and dynamic W4A4 NVFP4, quantize_model), logits compared and every NVFP4 layer of
          the first decoder layer checked against docs/CONTRACT.md's bound of its whole weights on the input it saw; a
          Qwen3-MoE-shaped model (Qwen3-30B-A3B's widths, 128 experts, top 8; --layers-moe layers): attention
          NVFP4 tensor parallel, experts expert-parallel (nvfp4_gemm.parallel.ExpertParallel).
  decode  The decode step (batch 1, context --context, compiled with inductor, one CUDA graph per rank captured
          by hand, median of --replays replays: bench_generate.decode_step) for Llama-3-70B's shapes with
          --layers-70b decoder layers (random weights built shard by shard: no rank ever holds the whole fp16
          model), lm_head fp16 (colwise, output gathered, at TP=2). --variants, in this order by default:
          nvfp4-tp1 (weight-only, each rank on its own GPU), nvfp4-tp2-symm and fp16-tp2-symm (symmetric-memory
          one-shot all-reduces, no NCCL in the step), nvfp4-tp2-nccl and fp16-tp2-nccl (NCCL in the graph;
          last, in case it hangs). Targets: NVFP4 TP=2 <= 0.65x TP=1; fp16 TP=2 / NVFP4 TP=2 >= 1.8.

--device cpu runs check and decode on tiny shapes with gloo (no graphs, no compile): checks the script only.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on the lent machines

import torch
import torch.distributed as dist
from torch import nn

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
if os.path.isdir(os.path.join(os.path.dirname(_HERE), "nvfp4_gemm")):
    sys.path.insert(0, os.path.dirname(_HERE))  # the checkout this script is in, not another installed copy
import nvfp4_gemm  # noqa: E402
from nvfp4_gemm import NVFP4Linear, parallel  # noqa: E402
from nvfp4_gemm.formats import to_blocked  # noqa: E402

CONFIG_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False)
CONFIG_70B = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                  num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False)
CONFIG_MOE = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                  num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                  num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=4096,
                  tie_word_embeddings=False)
# name -> (weights, tensor-parallel size, all-reduce). The NCCL ones run last: if NCCL inside a CUDA graph
# hangs (see --part diag), the watchdog ends the run there, after the others have been recorded.
VARIANTS = {"nvfp4-tp1": ("nvfp4", 1, "-"), "nvfp4-tp2-symm": ("nvfp4", 2, "symm"), "fp16-tp2-symm": ("fp16", 2, "symm"),
            "nvfp4-tp2-nccl": ("nvfp4", 2, "nccl"), "fp16-tp2-nccl": ("fp16", 2, "nccl")}
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, max_position_embeddings=256, tie_word_embeddings=False)
TINY_MOE = dict(TINY, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)

RANK = 0
RECORDS: list[dict] = []


def say(*a) -> None:
    if RANK == 0:
        print(*a, flush=True)


def record(args, **rec) -> None:
    RECORDS.append(rec)
    say("  " + json.dumps(rec))
    if args.json and RANK == 0:
        with open(args.json, "w") as f:
            json.dump(RECORDS, f, indent=1)


@contextlib.contextmanager
def watchdog(what: str, seconds: float):
    """Prints every thread's stack and exits the process if the block takes longer than `seconds`."""
    say(f"[{time.strftime('%H:%M:%S')}] {what} ...")
    faulthandler.dump_traceback_later(seconds, exit=True)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    say(f"    {what}: {time.perf_counter() - t0:.1f} s")


# ------------------------------------------------------------------------------------------ diag


def _chain(kind: str, x: torch.Tensor, n: int, world: int, symm=None):
    """n all-reduces in a row, each halved (all ranks hold the same value after the first: 1.5 for 2 ranks)."""
    group_name = dist.group.WORLD.group_name
    y = x
    for _ in range(n):
        if kind == "c10d":
            y = y.clone()
            dist.all_reduce(y)
        elif kind == "funcol":
            y = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(y, "sum", group_name))
        else:
            y = torch.ops.symm_mem.one_shot_all_reduce_copy(symm, y, "sum", group_name)
        y = y * (1.0 / world)
    return y


def diag(args, world: int, dev: torch.device) -> None:
    with watchdog("eager warm-up all-reduces", args.watchdog):
        x = torch.full((8192,), 1.0, dtype=torch.float16, device=dev)
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
    expect = sum(r + 1 for r in range(world)) / world
    # NCCL last: if a capture hangs, the watchdog ends the run there, after the others are recorded
    kinds = [("symm", torch.float32), ("symm", torch.float16), ("funcol", torch.float16), ("c10d", torch.float16)]
    for kind, dtype in kinds:
        symm = None
        if kind == "symm":
            try:
                with watchdog(f"symmetric memory buffer {dtype}", args.watchdog):
                    from torch.distributed import _symmetric_memory as symm_mem

                    symm = symm_mem.empty(8192, dtype=dtype, device=dev)
                    symm_mem.rendezvous(symm, dist.group.WORLD.group_name)
            except Exception as e:  # noqa: BLE001 - reported, the other kinds still run
                record(args, part="diag", kind=kind, dtype=str(dtype), error=f"{type(e).__name__}: {e}")
                continue
        for n in (1, 10, 100):
            rec = dict(part="diag", kind=kind, dtype=str(dtype), allreduces=n)
            try:
                with watchdog(f"{kind} {dtype}: capture {n}", args.watchdog):
                    x = torch.full((8192,), float(RANK + 1), dtype=dtype, device=dev)
                    stream = torch.cuda.Stream()
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        eager = _chain(kind, x, n, world, symm)
                    torch.cuda.current_stream().wait_stream(stream)
                    torch.cuda.synchronize()
                    rec["eager_ok"] = bool((eager == expect).all())
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        out = _chain(kind, x, n, world, symm)
                    torch.cuda.synchronize()
                    rec["captured"] = True
                    out.fill_(0)
                    graph.replay()
                    torch.cuda.synchronize()
                    rec["replay_ok"] = bool((out == expect).all())
                    times = []
                    for _ in range(10):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        dist.barrier()
                        start.record()
                        graph.replay()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end) * 1e3 / n)
                    rec["us_per_allreduce"] = round(statistics.median(times), 2)
                    del graph
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {e}"
            record(args, **rec)
    # Last (it may hang): the first collective of a NEW group inside the capture, no eager warm-up. If the
    # communicator is created lazily, its creation happens during capture: the suspected cause of the hang
    # seen before. The watchdog ends the run here if so; everything above is recorded.
    rec = dict(part="diag", kind="new group, first all-reduce inside the capture", dtype="torch.float16",
               allreduces=1)
    try:
        with watchdog("new group: capture without warm-up", args.watchdog):
            group = dist.new_group(backend="nccl")
            x = torch.full((8192,), float(RANK + 1), dtype=torch.float16, device=dev)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                y = x.clone()
                dist.all_reduce(y, group=group)
            graph.replay()
            torch.cuda.synchronize()
            rec["captured"] = True
            rec["replay_ok"] = bool((y == sum(r + 1 for r in range(world))).all())
            del graph
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"
    record(args, **rec)


# ------------------------------------------------------------------------------------------ models


def _transformers():
    import transformers

    return transformers


def float_llama(cfg_kw: dict, layers: int, dev, dtype, seed: int, family: str = "llama") -> nn.Module:
    """A float model on `dev`, N(0, 1/K) weights (activations near 1), the same on every rank for a seed."""
    tf = _transformers()
    cls = {"llama": tf.LlamaConfig, "qwen3_moe": tf.Qwen3MoeConfig}[family]
    cfg = cls(**{**cfg_kw, "num_hidden_layers": layers})
    cfg._attn_implementation = "sdpa"
    if family == "qwen3_moe":
        # the grouped-GEMM experts skip the expert-parallel sentinel ids; the eager loop cannot take them
        cfg._experts_implementation = "grouped_mm" if dev.type == "cuda" else "batched_mm"
    torch.manual_seed(seed)
    with torch.device(dev):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=g)
    return model


def gather_last(t: torch.Tensor, world: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=-1)


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return dict(max_abs_diff_rel=float((a - b).abs().max() / b.abs().max()),
                norm_rel=float((a - b).norm() / b.norm()),
                top1_agree=float((a.argmax(-1) == b.argmax(-1)).float().mean()))


def check_llama(args, world, dev, mesh, mode: str) -> None:
    from nvfp4_gemm.testing import Reference

    model = float_llama(CONFIG_8B if dev.type == "cuda" else TINY, args.layers_8b, dev, args.dtype, seed=1)
    nvfp4_gemm.quantize_model(model, weight_only=mode == "weight_only", progress=False)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2)).to(dev)
    with torch.no_grad():
        ref = model(ids).logits
    whole = {n: (m.weight.clone(), m.weight_scale.clone(), m.weight_scale_2.clone())
             for n, m in model.named_modules() if isinstance(m, NVFP4Linear) and ".layers.0." in n}
    modes = {n: m.weight_only for n, m in model.named_modules() if n in whole}
    parallel.tensor_parallel(model, mesh)
    seen = {}

    def hook(name):
        def rec(mod, inp, out):
            x, y = inp[0], out
            if mod._tp_shard.style == "rowwise":
                x = gather_last(x, world)
            if mod._tp_shard.style == "colwise":
                y = gather_last(y, world)
            seen[name] = (x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]))
        return rec

    with torch.no_grad():
        logits = model(ids).logits
        hs = [model.get_submodule(n).register_forward_hook(hook(n)) for n in whole]
        model(ids)
        for h in hs:
            h.remove()
    worst = {}
    for name, (w, sf, ws2) in whole.items():
        x, y = seen[name]
        if modes[name]:
            inp = dict(a=x, sfa=None, alpha=ws2)
        else:
            scales = torch.ops.nvfp4_gemm._input_scales(x.contiguous(), ws2, None)
            packed, sfa = nvfp4_gemm.quantize(x.contiguous(), scales[0:1])
            inp = dict(a=packed, sfa=sfa, alpha=scales[2:3])
        inp.update(b=w, sfb=sf, out_dtype=y.dtype)
        worst[name.split("layers.0.")[1]] = round(Reference(inp).ratio(y)[0], 4)
    record(args, part="check", model=f"llama-8B-shapes x{args.layers_8b} layers", mode=mode, world=world,
           spec_ratio_layer0=worst, spec_ok=all(v <= 1 for v in worst.values()), **compare(logits, ref))
    del model


def check_moe(args, world, dev, mesh) -> None:
    model = float_llama(CONFIG_MOE if dev.type == "cuda" else TINY_MOE, args.layers_moe, dev, args.dtype, seed=3,
                        family="qwen3_moe")
    nvfp4_gemm.quantize_model(model, weight_only=True, progress=False)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(4)).to(dev)
    block = model.model.layers[0].mlp
    seen = {}
    hook = block.register_forward_hook(lambda mod, inp, out: seen.update(x=inp[0].detach(), y=out.detach()))
    with torch.no_grad():
        ref = model(ids).logits
    hook.remove()
    from torch.distributed.tensor.parallel import parallelize_module

    parallel.tensor_parallel(model, mesh)
    parallelize_module(model, mesh, {"model.layers.*.mlp.experts": parallel.ExpertParallel()})
    experts = block.experts
    with torch.no_grad():
        logits = model(ids).logits
        y = block(seen["x"])  # the expert-parallel block on the one-process input: only the sum order differs
    block_cmp = {f"block0_{k}": v for k, v in compare(y, seen["y"]).items()}
    record(args, part="check", model=f"qwen3-moe-shapes x{args.layers_moe} layers",
           mode="weight_only: attention tensor parallel, NVFP4 experts expert parallel", world=world,
           experts_type=type(experts).__name__, local_experts=experts.num_experts, **block_cmp,
           **compare(logits, ref))
    del model


def check_generate(args, world, dev, mesh) -> None:
    """A checkpoint (ModelOpt format, weight-only, Llama-3-8B shapes) saved by rank 0, loaded by every rank
    with from_pretrained(tp_plan="auto", device_mesh=) (each rank reads its shards only) and whole
    (device=rank's GPU, TP=1), then greedy generate() on both: the tokens and the first step's logits."""
    import tempfile

    src = os.path.join(tempfile.gettempdir(), "bench_tp_checkpoint")
    cfg = CONFIG_8B if dev.type == "cuda" else TINY
    if RANK == 0:
        model = float_llama(cfg, args.layers_8b, dev, args.dtype if dev.type == "cpu" else torch.float16, seed=7)
        nvfp4_gemm.quantize_model(model, weight_only=True, progress=False)
        nvfp4_gemm.save_pretrained(model, src, format="modelopt", progress=False)
        del model
    dist.barrier()
    cuda = dev.type == "cuda"
    ids = torch.randint(0, cfg["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(8)).to(dev)
    runs = {}
    for name, kw in (("tp1", {}), ("tp2", dict(tp_plan="auto", device_mesh=mesh))):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev) if cuda else 0
        model = nvfp4_gemm.from_pretrained(src, device=dev, progress=False, **kw)
        peak = torch.cuda.max_memory_allocated(dev) - base if cuda else 0
        with torch.no_grad():
            logits = model(ids).logits.float()
            out = model.generate(ids, max_new_tokens=16, do_sample=False)
        runs[name] = dict(peak_load_gb=peak / 1e9, logits=logits, tokens=out[0, ids.shape[1]:].tolist(),
                          sharded=parallel.is_sharded(model))
        del model
    a, b = runs["tp2"], runs["tp1"]
    first = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), None)
    record(args, part="check", model=f"llama-8B-shapes x{args.layers_8b} layers, ModelOpt checkpoint",
           mode="weight_only from_pretrained + generate", world=world, tp2_sharded=a["sharded"],
           peak_load_gb_tp1=round(b["peak_load_gb"], 3), peak_load_gb_tp2=round(a["peak_load_gb"], 3),
           tokens_tp1=b["tokens"], tokens_tp2=a["tokens"], tokens_equal=a["tokens"] == b["tokens"],
           first_token_difference=first, **compare(a["logits"], b["logits"]))


# ------------------------------------------------------------------------------------------ decode


def random_nvfp4(n: int, k: int, dev, g) -> NVFP4Linear:
    """A weight-only layer of random codes (all 16) and e4m3 scales 0.5 .. 3.75, scaled to std ~ 1/sqrt(K)."""
    layer = NVFP4Linear(k, n, bias=False, weight_only=True, device=dev)
    with torch.no_grad():
        layer.weight.copy_(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev, generator=g))
        bits = torch.randint(0x30, 0x46, (n, k // 16), dtype=torch.uint8, device=dev, generator=g)
        layer.weight_scale.copy_(to_blocked(bits.view(torch.float8_e4m3fn)))
        layer.weight_scale_2.fill_(1.0 / (2.93 * 1.6 * k ** 0.5))
    return layer


def decode_model(cfg_kw: dict, layers: int, kind: str, world: int, mesh, dev, seed: int) -> nn.Module:
    """Llama with `layers` decoder layers built shard by shard (the whole model never exists on a rank):
    kind 'nvfp4' (weight-only, fused groups) or 'fp16'; lm_head fp16; world 1 = unsharded."""
    from nvfp4_gemm._checkpoint_load import _materialize_non_persistent

    tf = _transformers()
    cfg = tf.LlamaConfig(**{**cfg_kw, "num_hidden_layers": layers})
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).eval()
    styles = parallel.plan_layers(model, parallel.resolve_plan(model, "auto")) if world > 1 else {}
    group = mesh.get_group() if world > 1 else None
    rank = RANK if world > 1 else 0
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, mod in list(model.named_modules()):
        if type(mod) is not nn.Linear:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        if kind == "nvfp4" and attr != "lm_head":
            new = random_nvfp4(mod.out_features, mod.in_features, dev, g)
            if name in styles:
                parallel.shard_layer(new, styles[name], rank, world, group)
        else:
            new = nn.Linear(mod.in_features, mod.out_features, bias=False, device=dev, dtype=torch.float16)
            with torch.no_grad():
                new.weight.normal_(0.0, mod.in_features ** -0.5, generator=g)
            if name in styles:
                parallel.shard_float_linear(new, styles[name], rank, world, group)
        setattr(parent, attr, new)
    with torch.no_grad():
        for name, p in list(model.named_parameters()):
            if p.is_meta:
                t = torch.empty(p.shape, dtype=p.dtype, device=dev)
                t.normal_(0.0, 1.0, generator=g) if p.dim() == 2 else t.fill_(1.0)
                mod_name, _, attr = name.rpartition(".")
                model.get_submodule(mod_name)._parameters[attr] = nn.Parameter(t, requires_grad=False)
    _materialize_non_persistent(model, dev)
    if kind == "nvfp4":
        nvfp4_gemm.fuse_projections(model)
    return model


def decode(args, world: int, dev: torch.device, mesh) -> None:
    import bench_generate as bg
    from _timing import Timer

    ns = argparse.Namespace(context=args.context, replays=args.replays, profile=args.profile, batch=[1])
    timer = Timer(dev, args.replays)
    cfg = CONFIG_70B if dev.type == "cuda" else TINY
    results = {}
    for variant in args.variants.split(","):
        kind, tp, allreduce = VARIANTS[variant]
        tp = world if tp == 2 else 1
        if allreduce == "symm" and dev.type != "cuda":
            continue
        name = f"{kind} TP={tp} {allreduce}"
        rec = dict(part="decode", model=f"llama-70B-shapes x{args.layers_70b} layers", variant=name, batch=1,
                   context=args.context)
        try:
            with watchdog(f"decode {name}", args.decode_watchdog):
                parallel.use_symmetric_memory(None, enable=False)
                if allreduce == "symm":
                    parallel.use_symmetric_memory(None, max_elements=1 << 20,
                                                  dtypes=(torch.float32,))
                base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
                model = decode_model(cfg, args.layers_70b, kind, tp, mesh, dev, seed=5)
                if dev.type == "cuda":
                    rec["model_gb_per_rank"] = round((torch.cuda.memory_allocated(dev) - base) / 1e9, 2)
                torch._dynamo.reset()
                forward = torch.compile(model, dynamic=False) if args.compile and dev.type == "cuda" else model
                out = bg.decode_step(model, forward, 1, ns, timer)
                rec["step_ms"] = round(out["ms"], 3)
                rec["compile_and_capture_s"] = round(out.get("compile_and_capture_s", 0.0), 1)
                rec["finite"] = bool(torch.isfinite(out["logits"]).all())
                if "profile" in out:
                    rec["profile"] = out["profile"]
                results[name] = out["ms"]
                del model, forward, out
                torch._dynamo.reset()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - reported, the next variant still runs
            rec["error"] = f"{type(e).__name__}: {e}"
            if RANK == 0:
                traceback.print_exc()
        record(args, **rec)
        dist.barrier()
    one = results.get("nvfp4 TP=1 -")
    for allreduce in ("nccl", "symm"):
        two, fp16 = results.get(f"nvfp4 TP={world} {allreduce}"), results.get(f"fp16 TP={world} {allreduce}")
        targets = {}
        if one and two:
            targets["tp2_over_tp1"] = round(two / one, 3)
            targets["tp2_over_tp1<=0.65"] = two / one <= 0.65
        if two and fp16:
            targets["fp16_tp2_over_nvfp4_tp2"] = round(fp16 / two, 3)
            targets["fp16_tp2_over_nvfp4_tp2>=1.8"] = fp16 / two >= 1.8
        if targets:
            record(args, part="targets", allreduce=allreduce, **targets)


def main() -> int:
    global RANK
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", default="diag,check,decode")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--layers-8b", type=int, default=4)
    p.add_argument("--layers-moe", type=int, default=2)
    p.add_argument("--layers-70b", type=int, default=80)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"decode variants, of {list(VARIANTS)}")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--watchdog", type=float, default=30.0, help="seconds per diag step before exiting")
    p.add_argument("--decode-watchdog", type=float, default=300.0, help="seconds per check model / decode variant")
    p.add_argument("--profile", action="store_true", help="decode: one eager call of each compiled step under "
                   "torch.profiler (GPU time per kernel class, the largest kernels)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    parts = [s for s in args.part.split(",") if s]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        # device_id: the NCCL communicator is created now, not lazily inside the first (maybe captured) collective
        dist.init_process_group("nccl", device_id=dev)
        args.dtype = torch.bfloat16
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        args.dtype = torch.float32
        parts = [s for s in parts if s != "diag"]
    RANK, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(dist.group.WORLD, dev.type)
    say(f"bench_tp: world {world}, {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, torch "
        f"{torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if dev.type == 'cuda' else '-'}, "
        f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}, parts {parts}")
    try:
        if "diag" in parts:
            diag(args, world, dev)
        if "check" in parts:
            for mode in ("weight_only", "dynamic"):
                with watchdog(f"check llama {mode}", args.decode_watchdog):
                    check_llama(args, world, dev, mesh, mode)
            # a failed check is recorded with its error and the next one still runs
            for model, check in (("load + generate", check_generate), ("qwen3-moe", check_moe)):
                with watchdog(f"check {model}", args.decode_watchdog):
                    try:
                        check(args, world, dev, mesh)
                    except Exception as e:  # noqa: BLE001
                        record(args, part="check", model=model, error=f"{type(e).__name__}: {e}")
                        if RANK == 0:
                            traceback.print_exc()
        if "decode" in parts:
            decode(args, world, dev, mesh)
    finally:
        if dev.type == "cpu":
            dist.destroy_process_group()
    if dev.type == "cpu":
        return 0
    # NCCL: no destroy_process_group. ncclCommDestroy waits until every CUDA graph that captured a collective
    # on the communicator has been destroyed (NCCL's persistent references), and a graph still referenced
    # anywhere makes it wait forever (pytorch/pytorch#115388): the process ends after a barrier instead.
    with watchdog("final barrier", args.watchdog):
        gc.collect()
        torch.cuda.synchronize()
        dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
