"""The main job: `python -m nvfp4_gemm` verifies and times nvfp4_gemm.mm on this machine's device.

For each default shape (the three GPU MODE benchmark shapes, decode and prefill shapes) it runs mm on the
CUDA device if there is one (else the CPU), checks the result against the float64 reference with
docs/CONTRACT.md's bound, and prints time, TFLOP/s, GB/s (bytes mm must move: packed A and B, scales, C) and the
worst error as a fraction of the bound (<= 1 passes). Exit status 1 if any shape fails.

`python -m nvfp4_gemm --selftest` instead runs every dispatch entry of this machine (each kernel config of
the backends that can run on the local GPU, forced by name, the generic CUDA path and the CPU backend; then
grouped_mm's entries alike: each grouped config, the generic grouped kernel, the CPU) on shapes it accepts, checks each against the reference with docs/CONTRACT.md's bound and prints a report to paste into
a bug report (versions, device, build, PASS/FAIL per entry). The first thing to run on new hardware.
Exit status 1 if any entry fails.

`python -m nvfp4_gemm generate PATH --prompt "..." [--max-new-tokens N]` loads an NVFP4 checkpoint
directory (ModelOpt or compressed-tensors, with its tokenizer) through `nvfp4_gemm.from_pretrained`,
generates greedily and prints the text and the decoding speed in tokens/s.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

import torch

from . import info, mm
from .testing import Case, dispatch_entries, error_ratio, make_inputs, median_seconds, run_dispatch_entries
from .testing_grouped import run_grouped_entries

GPU_MODE_SHAPES = [(128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048)]
EXTRA_SHAPES = [(1, 7168, 16384), (16, 4096, 7168), (512, 4096, 7168), (2304, 4608, 7168)]
CPU_SHAPES = GPU_MODE_SHAPES + EXTRA_SHAPES[:2]


def bytes_moved(m: int, n: int, k: int, out_dtype: torch.dtype) -> int:
    scales = (m + n) * (k // 16)
    return (m + n) * k // 2 + scales + m * n * torch.finfo(out_dtype).bits // 8


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "generate":
        return generate(argv[1:])
    p = argparse.ArgumentParser(prog="python -m nvfp4_gemm", description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--shapes", default=None, help="M,N,K;M,N,K;... (default: built-in list)")
    p.add_argument("--out-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--json", default=None, help="also write the table as JSON to this path")
    p.add_argument("--selftest", action="store_true",
                   help="check every dispatch entry of this machine against the reference and print a report")
    args = p.parse_args(argv)
    if args.selftest:
        return selftest()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dtype = getattr(torch, args.out_dtype)
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    else:
        shapes = GPU_MODE_SHAPES + EXTRA_SHAPES if device.type == "cuda" else CPU_SHAPES

    inf = info()
    dev_name = inf["device"]["name"] + (f" (SM {inf['device']['sm']})" if "sm" in inf["device"] else "")
    print(f"nvfp4_gemm on {dev_name}; backends here: {', '.join(inf['device_backends'])}; "
          f"forced: {inf['forced_backend']}")
    header = f"{'M':>6} {'N':>6} {'K':>6}  {'time us':>10} {'TFLOP/s':>8} {'GB/s':>8}  {'err/bound':>9}  ok"
    print(header)
    print("-" * len(header))
    rows, failed = [], 0
    for i, (m, n, k) in enumerate(shapes):
        inputs = make_inputs(Case(m, n, k, out_dtype, alpha=0.5), device, seed=i)
        out = mm(**inputs)
        worst, msg = error_ratio(out, inputs)
        ok = worst <= 1.0
        failed += not ok
        t = median_seconds(lambda: mm(**inputs), device)
        tflops = 2 * m * n * k / t * 1e-12
        gbs = bytes_moved(m, n, k, out_dtype) / t * 1e-9
        print(f"{m:>6} {n:>6} {k:>6}  {t * 1e6:>10.1f} {tflops:>8.2f} {gbs:>8.1f}  {worst:>9.3f}  "
              f"{'yes' if ok else 'NO: ' + msg}", flush=True)
        rows.append(dict(m=m, n=n, k=k, time_us=t * 1e6, tflops=tflops, gbs=gbs, err_over_bound=worst, ok=ok))
        del inputs, out
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev_name, "out_dtype": args.out_dtype, "info": inf, "rows": rows}, f, indent=1)
    print(f"{len(shapes) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _driver_version() -> str:
    """The NVIDIA driver release (nvidia-smi), else the CUDA version the driver supports (libcuda)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import ctypes

        v = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"unknown release (supports CUDA {v.value // 1000}.{v.value % 1000 // 10})"
    except OSError:
        pass
    return "none found"


def selftest() -> int:
    import importlib.metadata

    from . import __file__ as pkg_file

    try:
        version = importlib.metadata.version("nvfp4_gemm")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed (imported from the source tree)"
    inf = info()
    print("nvfp4_gemm selftest (paste this whole report into a bug report)")
    print(f"  package    nvfp4_gemm {version} at {os.path.dirname(os.path.abspath(pkg_file))}")
    print(f"  python     {platform.python_version()} on {platform.platform()}")
    print(f"  torch      {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    print(f"  driver     {_driver_version()}")
    print(f"  build      {json.dumps(inf['build'], sort_keys=True)}")
    print(f"  modules    loaded {', '.join(inf['modules'])}; failed to load: "
          f"{json.dumps(inf['modules_failed_to_load']) if inf['modules_failed_to_load'] else 'none'}")
    print(f"  configs    {json.dumps({k: v['configs'] for k, v in inf['backends'].items()})}")
    # The first-use self-check (SM100 configs against torch._scaled_mm) would send a broken config's
    # problems to the generic path, so that the config looked right here: check the kernels themselves.
    # Read once per process: set before the first mm call.
    os.environ.setdefault("NVFP4_GEMM_SELFCHECK", "0")
    print(f"  selfcheck  NVFP4_GEMM_SELFCHECK={os.environ['NVFP4_GEMM_SELFCHECK']} (0: each config runs as is)")
    forced = {k: os.environ[k] for k in ("NVFP4_GEMM_BACKEND", "NVFP4_GEMM_CONFIG") if k in os.environ}
    if forced:
        print(f"  note       {forced} set in the environment; the selftest forces each entry itself")

    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] + [torch.device("cpu")]
    skipped = []
    if not torch.cuda.is_available():
        why = ("torch has no CUDA" if torch.version.cuda is None else
               "no CUDA device visible (torch.cuda.is_available() is False: no GPU, or a driver too old for "
               f"CUDA {torch.version.cuda})")
        cuda_backends = [f"{b} ({len(v['configs'])} config{'s' * (len(v['configs']) != 1)})"
                         for b, v in inf["backends"].items() if b != "cpu"]
        skipped.append(f"{', '.join(cuda_backends) or 'CUDA backends (not in this build)'}: {why}")
    rows = []
    for dev in devices:
        if dev.type == "cuda":
            props = torch.cuda.get_device_properties(dev)
            print(f"  device     {dev}: {props.name}, SM {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
                  f"{props.total_memory / 2**30:.0f} GiB")
        entries, not_here = dispatch_entries(dev)
        skipped += [f"{dev}: {s}" for s in not_here]
        rows += run_dispatch_entries(dev, entries)
        # grouped_mm's entries (the arch modules' grouped configs, the generic and CPU grouped paths).
        rows += run_grouped_entries(dev)

    print()
    w = max([len(r.config) for r in rows] + [6])
    header = f"{'device':<7} {'backend':<8} {'config':<{w}} {'result':<6} {'err/bound':>9}  shapes run"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.device:<7} {r.backend:<8} {r.config:<{w}} {'PASS' if r.ok else 'FAIL':<6} {r.worst:>9.3f}  "
              f"{', '.join(r.ran) or '-'}")
        for f in r.failures:
            print(f"    FAIL {f}")
        for why in r.refused:
            print(f"    (not run: {why})")
    for s in skipped:
        print(f"skipped: {s}")
    failed = sum(not r.ok for r in rows)
    print(f"{len(rows) - failed} of {len(rows)} entries passed, {failed} failed")
    return 1 if failed else 0


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def generate(argv: list[str]) -> int:
    """`python -m nvfp4_gemm generate PATH --prompt ...`: exit status 0, or 2 for a directory it cannot use
    (no checkpoint, no tokenizer, an unsupported or broken checkpoint), with the reason on stderr."""
    import time

    p = argparse.ArgumentParser(prog="python -m nvfp4_gemm generate",
                                description="Load an NVFP4 checkpoint directory and generate text (greedy).")
    p.add_argument("path", help="checkpoint directory (config.json, safetensors, and its tokenizer's files)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--weight-only", action="store_true", help="run every NVFP4 layer weight-only (W4A16)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")

    from .checkpoint import CheckpointError, from_pretrained

    def fail(msg: str) -> int:
        print(f"python -m nvfp4_gemm generate: {msg}", file=sys.stderr)
        return 2

    if not os.path.isfile(os.path.join(args.path, "config.json")):
        return fail(f"{args.path}: not a checkpoint directory (no config.json)")
    if not any(os.path.isfile(os.path.join(args.path, f)) for f in TOKENIZER_FILES):
        return fail(f"{args.path}: no tokenizer in the directory (looked for {', '.join(TOKENIZER_FILES)}); "
                    f"save one beside the weights, e.g. save_pretrained(model, path, format, tokenizer=tok)")
    from transformers import AutoTokenizer

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.path)
        model = from_pretrained(args.path, device=device, weight_only=True if args.weight_only else None)
    except (CheckpointError, OSError, ValueError) as e:
        return fail(str(e))
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                             do_sample=False, pad_token_id=pad)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    new = out[0, ids.shape[1]:]
    print(tokenizer.decode(out[0], skip_special_tokens=True))
    print(f"{new.numel()} new tokens in {seconds:.2f} s: {new.numel() / seconds:.1f} tokens/s "
          f"(prompt {ids.shape[1]} tokens, greedy, {device})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
