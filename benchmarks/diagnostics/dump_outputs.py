"""Hashes of mm / linear outputs over a fixed, seeded grid of shapes and modes, to compare two builds bit for bit.

    python3 <this file> --out after.json            # from the root of a built tree (its nvfp4_gemm is imported)
    python3 <this file> --diff before.json after.json

Run it from the roots of two builds (e.g. a refactor and the commit before it) on the same GPU, then --diff:
every key must hash alike. The grid covers every SM90 dispatch row (M 1..2100 around the row bounds, K with and
without K % 256 == 0, small and large N), NVFP4 A with each output dtype, fp16 / bf16 activations (weight-only),
and linear's weight-only, static and dynamic W4A4 forms with and without bias, each automatic and with
NVFP4_GEMM_BACKEND=sm90 (where M >= 2048 runs the Hopper kernel instead of the generic path). Only APIs that
every version since the weight-only form has are used, and inputs come from this file alone (torch's CUDA
generator, fixed seeds), so that both trees see the same bytes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.getcwd())  # the tree being measured, not this file's

import torch  # noqa: E402

M_VALUES = (1, 3, 8, 9, 13, 16, 17, 24, 32, 33, 64, 65, 100, 128, 129, 300, 1000, 2047, 2048, 2100)
NK_VALUES = ((4096, 4096), (6144, 4096), (1032, 2080), (256, 96), (28672, 4096), (4096, 14336))
MAX_ELEMENTS = 2100 * 6144 * 4096  # skips the largest products at the largest M, to keep a run to minutes


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:24]


def _packed(rows: int, k: int, g: torch.Generator):
    import nvfp4_gemm

    data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    exp = torch.randint(1, 11, (rows, k // 16), device="cuda", generator=g)
    man = torch.randint(0, 8, (rows, k // 16), device="cuda", generator=g)
    sf = nvfp4_gemm.to_blocked(((exp << 3) | man).to(torch.uint8).view(torch.float8_e4m3fn))
    return data, sf


def run() -> dict[str, str]:
    import nvfp4_gemm

    out: dict[str, str] = {}
    for backend in ("auto", "sm90"):
        os.environ["NVFP4_GEMM_BACKEND"] = backend
        for n, k in NK_VALUES:
            g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
            b, sfb = _packed(n, k, g)
            w = torch.randn(n, k, device="cuda", generator=g)
            ws2 = (w.abs().amax() / 2688.0).reshape(1)
            wq, wsf = nvfp4_gemm.quantize(w, 1.0 / ws2)
            bias = torch.randn(n, device="cuda", generator=g)
            for m in M_VALUES:
                if m * n * k > MAX_ELEMENTS:
                    continue
                tag = f"{backend} m={m} n={n} k={k}"
                a, sfa = _packed(m, k, g)
                alpha = torch.tensor([0.37], device="cuda")
                for dt in (torch.float16, torch.bfloat16, torch.float32):
                    out[f"mm w4a4 {tag} out={dt}"] = _digest(nvfp4_gemm.mm(a, b, sfa, sfb, alpha, dt))
                x = torch.randn(m, k, device="cuda", generator=g) * 3
                for dt in (torch.float16, torch.bfloat16):
                    xa = x.to(dt)
                    out[f"mm w4a16 {tag} a={dt}"] = _digest(nvfp4_gemm.mm(xa, b, None, sfb, alpha))
                    input_scale = (xa.float().abs().amax() / 2688.0 * 0.8).reshape(1)
                    for bias_on in (False, True):
                        bb = bias.to(dt) if bias_on else None
                        key = f"{tag} x={dt} bias={bias_on}"
                        out[f"linear weight-only {key}"] = _digest(
                            nvfp4_gemm.linear(xa, wq, wsf, ws2, None, bb, weight_only=True))
                        out[f"linear static {key}"] = _digest(nvfp4_gemm.linear(xa, wq, wsf, ws2, input_scale, bb))
                        out[f"linear dynamic {key}"] = _digest(nvfp4_gemm.linear(xa, wq, wsf, ws2, None, bb))
            torch.cuda.synchronize()
            print(f"{backend} n={n} k={k}: {len(out)} outputs", flush=True)
    os.environ.pop("NVFP4_GEMM_BACKEND", None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the hashes here (JSON)")
    ap.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two files written by --out")
    args = ap.parse_args()
    if args.diff:
        before, after = (json.load(open(p)) for p in args.diff)
        keys = sorted(set(before) | set(after))
        bad = [k for k in keys if before.get(k) != after.get(k)]
        for k in bad[:50]:
            print(f"DIFFERS {k}: {before.get(k)} vs {after.get(k)}")
        print(f"{len(keys) - len(bad)} of {len(keys)} outputs equal bit for bit; {len(bad)} differ")
        return 1 if bad else 0
    if not torch.cuda.is_available():
        print("dump_outputs: needs a CUDA device")
        return 2
    hashes = run()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(hashes, f, indent=0, sort_keys=True)
    print(f"{len(hashes)} outputs hashed on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
