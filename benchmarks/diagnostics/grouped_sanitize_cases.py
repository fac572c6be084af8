"""Grouped GEMM cases for compute-sanitizer (memcheck, racecheck): empty groups, one group holding every token,
groups of one token, T not a multiple of anything, G = 1, both forms (W4A4, fp16 / bf16 weight-only), the
grouped quantization, grouped_linear (the GEMM behind the quantization), sfa sized for round_up(T,128) only while
the routing needs more (NaN rows, nothing read past the buffer) and garbage routing (decreasing, negative, past T). Each case is checked against the float64
reference. Backend: NVFP4_GEMM_BACKEND as set (default auto; run once with generic and once with sm90). A forced
backend skips the cases it has no kernel for (sm90: K not a multiple of 256), saying so:

    NVFP4_GEMM_BACKEND=generic compute-sanitizer --tool memcheck python benchmarks/diagnostics/grouped_sanitize_cases.py
    NVFP4_GEMM_BACKEND=sm90 compute-sanitizer --tool racecheck python benchmarks/diagnostics/grouped_sanitize_cases.py
"""
import os
import sys

import torch

import nvfp4_gemm
from nvfp4_gemm.testing_grouped import GroupedCase, grouped_reference, make_grouped_inputs, op_args

CASES = [
    GroupedCase(1, 64, 128, 8, "ones", torch.float16, alpha=True),
    GroupedCase(37, 136, 96, 4, "uniform", torch.bfloat16, alpha=True),
    GroupedCase(130, 72, 256, 5, "one", torch.float32, alpha=True),
    GroupedCase(6, 64, 128, 9, "ones"),
    GroupedCase(301, 64, 256, 1, sfa_size="least"),
    GroupedCase(70, 40, 64, 6, "edges", sfa_size="exact"),
    GroupedCase(300, 256, 512, 16, "skewed", torch.bfloat16, alpha=True),
    GroupedCase(33, 24, 96, 4, "skewed", a_dtype=torch.float16, alpha=True),
    GroupedCase(200, 128, 256, 8, "skewed", a_dtype=torch.bfloat16, out_dtype=torch.bfloat16),
    GroupedCase(3, 512, 2048, 128, "ones", a_dtype=torch.bfloat16, alpha=True),
    GroupedCase(16, 512, 2048, 128, "uniform", alpha=True),
]


FORCED = os.environ.get("NVFP4_GEMM_BACKEND", "auto") != "auto"


def grouped_mm(*args, **kwargs):
    """nvfp4_gemm.grouped_mm, or None where a forced backend has no kernel for the case."""
    try:
        return nvfp4_gemm.grouped_mm(*args, **kwargs)
    except RuntimeError as e:
        if FORCED and "has no grouped kernel" in str(e):
            print(f"skipped: {e}")
            return None
        raise


def main() -> int:
    failures = 0
    for case in CASES:
        inputs = make_grouped_inputs(case, "cuda", seed=1)
        args, kwargs = op_args(inputs)
        out = grouped_mm(*args, **kwargs)
        if out is None:
            continue
        worst, msg = grouped_reference(inputs).ratio(out)
        print(f"{case.id}: worst error / bound {worst:.3g} {msg}")
        failures += worst > 1.0

    # sfa holding round_up(T,128) rows while the routing needs 384: rows past the buffer come out NaN. K = 256 (16
    # scales a row), so that every backend runs this and the garbage routing below.
    inputs = make_grouped_inputs(GroupedCase(100, 64, 256, 3, counts=(60, 30, 10)), "cuda", seed=2)
    args, kwargs = op_args(inputs)
    small = args[2].reshape(-1)[: 128 * 16].clone()
    out = nvfp4_gemm.grouped_mm(args[0], args[1], small, args[3], args[4], **kwargs)
    ok = not torch.isnan(out[:60]).any() and torch.isnan(out[60:]).all()
    print(f"sfa too small for the routing: rows past the buffer NaN, the rest finite: {bool(ok)}")
    failures += not ok

    # Garbage routing: wrong rows, no fault.
    for bad in ([60, 10, -5, 100], [1000, 2000, 100], [-7, -7, -7]):
        offs = torch.tensor(bad, dtype=torch.int32, device="cuda")
        g = len(bad)
        inputs = make_grouped_inputs(GroupedCase(100, 64, 256, g), "cuda", seed=3)
        args, kwargs = op_args(inputs)
        nvfp4_gemm.grouped_mm(args[0], args[1], args[2], args[3], offs, **kwargs)
    torch.cuda.synchronize()
    print("garbage routing: no fault")

    # The grouped quantization and the blocked placement, static and dynamic, with and without weight_scale_2: one
    # CTA a group (dynamic amax inside the quantizing launch), then groups of ~1000 rows (several CTAs, amax ahead).
    for t, k, ends in ((77, 256, [0, 40, 40, 41, 77]), (2000, 1024, [900, 900, 2000])):
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor(ends, dtype=torch.int32, device="cuda")
        g = len(ends)
        for scale in (None, torch.full((g,), 0.01, device="cuda")):
            for ws2 in (None, torch.full((g,), 0.5, device="cuda")):
                packed, sfa, alpha = nvfp4_gemm.quantize_grouped(x, offs, scale, weight_scale_2=ws2)
                if scale is None:  # one dynamic scale from all of x: every CTA's slot, or its own pass over x
                    nvfp4_gemm.quantize_grouped(x, offs, weight_scale_2=ws2, one_input_scale=True)
    # Garbage routing into the grouped quantization (decreasing, negative, past T; overlapping groups that would need
    # more CTAs than the launch holds): wrong rows, no fault, no write past the outputs.
    x = torch.randn(100, 256, device="cuda", dtype=torch.bfloat16)
    for bad in ([60, 10, -5, 100], [1000, 2000, 100], [-7, -7, -7], [100, 0, 100, 0, 100, 0, 100]):
        offs = torch.tensor(bad, dtype=torch.int32, device="cuda")
        for scale in (None, torch.full((len(bad),), 0.01, device="cuda")):
            nvfp4_gemm.quantize_grouped(x, offs, scale)
        nvfp4_gemm.quantize_grouped(x, offs, one_input_scale=True)
    torch.cuda.synchronize()
    print("quantize_grouped: done")

    # grouped_linear (the GEMM launched behind the quantization, streaming B before its grid dependency resolves),
    # static and dynamic, against quantize_grouped + grouped_mm bit for bit; groups of 0-9 rows, T not a multiple of 8,
    # K of one stage and of many; then garbage offs.
    for dtype in (torch.bfloat16, torch.float16):
        for k in (256, 1024):
            counts = [3, 0, 9, 1, 0, 4]
            inputs = make_grouped_inputs(GroupedCase(sum(counts), 136, k, len(counts), counts=tuple(counts),
                                                     a_dtype=dtype), "cuda", seed=4)
            x, b, sfb, offs = inputs["a"], inputs["b"], inputs["sfb"], inputs["offs"]
            w = torch.full((len(counts),), 0.01, device="cuda")
            for s, one in ((torch.full((len(counts),), 0.002, device="cuda"), False), (None, False), (None, True)):
                got = nvfp4_gemm.grouped_linear(x, b, sfb, w, offs, s, one_input_scale=one)
                packed, sfa, alpha = nvfp4_gemm.quantize_grouped(x, offs, s, weight_scale_2=w, one_input_scale=one)
                want = nvfp4_gemm.grouped_mm(packed, b, sfa, sfb, offs, alpha=alpha, out_dtype=dtype)
                if not torch.equal(got, want):
                    failures += 1
                    print(f"grouped_linear {dtype} K={k} static={s is not None} one={one}: differs from "
                          "quantize_grouped + grouped_mm")
                for bad in ([9, 4, 20, 17, 3, 17], [-5, 3, 99, 2, 0, 17]):
                    nvfp4_gemm.grouped_linear(x, b, sfb, w, torch.tensor(bad, dtype=torch.int32, device="cuda"), s,
                                              one_input_scale=one)
    torch.cuda.synchronize()
    print("grouped_linear: done")
    print("FAILURES:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
