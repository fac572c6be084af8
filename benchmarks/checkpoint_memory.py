"""Peak host memory of nvfp4_gemm.from_pretrained on a generated NVFP4 checkpoint of >= 1 GB.

    python benchmarks/checkpoint_memory.py                       # generate under /tmp (once), then measure
    python benchmarks/checkpoint_memory.py --format compressed-tensors --dir /tmp/nvfp4_mem_ct

The checkpoint is a Llama-shaped model (36 layers, hidden 2048, MLP 5632, vocab 32000: 1.18 GB) with
random packed weights and valid scales, written shard by shard with plain safetensors writes (ModelOpt's
or compressed-tensors' names). The load runs in a fresh process: its resident memory right before the call
(after importing torch, transformers and nvfp4_gemm) is the baseline, and the peak is ru_maxrss, the
largest resident set the process ever had. Reported: peak - baseline, as bytes and as a multiple of the
checkpoint's size on disk, and what stays resident after the load (the model itself).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def generate(directory: str, fmt: str, layers: int, shard_bytes: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    os.makedirs(directory, exist_ok=True)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=False, dtype="bfloat16")
    g = torch.Generator().manual_seed(0)
    h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    names = {"weight": "weight", "ws2": "weight_scale_2", "in": "input_scale"} if fmt == "modelopt" else \
        {"weight": "weight_packed", "ws2": "weight_global_scale", "in": "input_global_scale"}

    def quant(prefix, n, k):
        # e4m3 scales drawn from bytes 0x20..0x5F (2^-4 .. 2^3.9): valid, finite, non-zero
        return {f"{prefix}.{names['weight']}": torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
                f"{prefix}.weight_scale": torch.randint(0x20, 0x60, (n, k // 16), dtype=torch.uint8,
                                                        generator=g).view(torch.float8_e4m3fn),
                f"{prefix}.{names['ws2']}": torch.rand((), generator=g).reshape(() if fmt == "modelopt" else (1,)) + 0.5,
                f"{prefix}.{names['in']}": torch.rand((), generator=g).reshape(() if fmt == "modelopt" else (1,)) + 0.5}

    def tensors():
        yield {"model.embed_tokens.weight": torch.randn(cfg.vocab_size, h, generator=g).to(torch.bfloat16)}
        for layer in range(layers):
            p = f"model.layers.{layer}"
            t = {f"{p}.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                 f"{p}.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)}
            for name, n, k in (("self_attn.q_proj", h, h), ("self_attn.k_proj", kv, h), ("self_attn.v_proj", kv, h),
                               ("self_attn.o_proj", h, h), ("mlp.gate_proj", i, h), ("mlp.up_proj", i, h),
                               ("mlp.down_proj", h, i)):
                t.update(quant(f"{p}.{name}", n, k))
            yield t
        yield {"model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
               "lm_head.weight": torch.randn(cfg.vocab_size, h, generator=g).to(torch.bfloat16)}

    shards, current, size = [], {}, 0
    for t in tensors():
        nbytes = sum(x.numel() * x.element_size() for x in t.values())
        if current and size + nbytes > shard_bytes:
            shards.append(list(current))
            save_file(current, os.path.join(directory, f"part{len(shards)}.tmp"))
            current, size = {}, 0
        current.update(t)
        size += nbytes
    shards.append(list(current))
    save_file(current, os.path.join(directory, f"part{len(shards)}.tmp"))
    weight_map = {}
    for j, s in enumerate(shards):
        final = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(directory, f"part{j + 1}.tmp"), os.path.join(directory, final))
        weight_map.update({k: final for k in s})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    cfg_dict = cfg.to_dict()
    if fmt == "modelopt":
        with open(os.path.join(directory, "hf_quant_config.json"), "w") as f:
            json.dump({"producer": {"name": "benchmark"}, "quantization": {
                "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}, f)
    else:
        args = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "symmetric": True, "group_size": 16}
        cfg_dict["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": {**args, "dynamic": False},
                "input_activations": {**args, "dynamic": "local"}, "format": "nvfp4-pack-quantized"}}}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)


def checkpoint_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory) if n.endswith(".safetensors"))


def measure(directory: str, warm: bool) -> dict:
    """Runs in the child process. warm: build the model once on the meta device before the baseline, so that
    the one-time import of transformers' model code (about 0.2 GB resident) is not counted."""
    import torch
    import transformers

    sys.path.insert(0, ROOT)
    import nvfp4_gemm  # noqa: F401
    from nvfp4_gemm.checkpoint import from_pretrained

    if warm:
        with torch.device("meta"):
            transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(directory))
    base = rss_bytes()
    t0 = time.perf_counter()
    model = from_pretrained(directory, device="cpu", progress=False)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    after = rss_bytes()
    size = checkpoint_bytes(directory)
    n_layers = sum(type(m).__name__ == "NVFP4Linear" for m in model.modules())
    return {"checkpoint_bytes": size, "baseline_rss": base, "peak_minus_baseline": peak - base,
            "peak_ratio": (peak - base) / size, "resident_after_minus_baseline": after - base,
            "resident_ratio": (after - base) / size, "load_seconds": round(seconds, 2), "nvfp4_layers": n_layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="checkpoint directory (default /tmp/nvfp4_mem_<format>)")
    ap.add_argument("--format", default="modelopt", choices=("modelopt", "compressed-tensors"))
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--shard-mb", type=int, default=500)
    ap.add_argument("--measure", choices=("cold", "warm"), help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    directory = args.dir or f"/tmp/nvfp4_mem_{args.format.replace('-', '_')}"
    if args.measure:
        print(json.dumps(measure(directory, args.measure == "warm")))
        return
    if not os.path.exists(os.path.join(directory, "config.json")):
        generate(directory, args.format, args.layers, args.shard_mb * 10**6)
    gb = 1e9
    for mode in ("cold", "warm"):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", mode, "--dir", directory],
                             check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if mode == "cold":
            print(f"{args.format} checkpoint {directory}: {r['checkpoint_bytes'] / gb:.3f} GB, "
                  f"{r['nvfp4_layers']} NVFP4 layers")
        what = "first load in the process" if mode == "cold" else "model code already imported"
        print(f"{mode} ({what}): peak host memory (ru_maxrss - RSS before) {r['peak_minus_baseline'] / gb:.3f} GB "
              f"= {r['peak_ratio']:.3f}x the checkpoint; resident after {r['resident_after_minus_baseline'] / gb:.3f} GB "
              f"= {r['resident_ratio']:.3f}x; {r['load_seconds']} s")
        print(json.dumps({"mode": mode, **r}))


if __name__ == "__main__":
    main()
