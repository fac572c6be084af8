"""Per-kernel GPU time of nvfp4_gemm.mm (sm90) on the target shapes, through torch.profiler: where the
time goes (A prepass, main kernel, split-K reduce).

    python benchmarks/diagnostics/sm90_profile.py [auto | cfg=<config> | <splits> ...]
    python benchmarks/diagnostics/sm90_profile.py --once M N K [mm | wo | humming]   (three calls, for ncu)

--once runs three calls of one form: mm (NVFP4 A, the default), wo (the weight-only form, fp16 A) or humming
(humming-kernels' W4A16 layer on the same weights, fp16 A), so that ncu can put the kernels side by side.
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import nvfp4_gemm

os.environ["NVFP4_GEMM_BACKEND"] = "sm90"
SHAPES = [(128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048), (1, 7168, 16384), (16, 4096, 7168),
          (512, 4096, 7168), (2304, 4608, 7168)]
once_form = None
if sys.argv[1:2] == ["--once"]:
    SHAPES = [tuple(int(x) for x in sys.argv[2:5])]
    once_form = sys.argv[5] if len(sys.argv) > 5 else "mm"
    if once_form not in ("mm", "wo", "humming"):
        sys.exit(f"--once: form must be mm, wo or humming, got {once_form!r}")
    variants = ["once"]
else:
    variants = sys.argv[1:] or ["auto"]
for m, n, k in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    sfa = nvfp4_gemm.to_blocked(torch.full((m, k // 16), 0x30, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn))
    sfb = nvfp4_gemm.to_blocked(torch.full((n, k // 16), 0x30, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for v in variants:
        if v == "once":
            if once_form == "mm":
                call = lambda: nvfp4_gemm.mm(a, b, sfa, sfb)  # noqa: E731
            else:
                x = torch.randn(m, k, device="cuda", generator=g).to(torch.float16)
                if once_form == "wo":
                    call = lambda: nvfp4_gemm.mm(x, b, None, sfb)  # noqa: E731
                else:
                    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                    from _timing import humming_w4a16
                    layer = humming_w4a16(b, sfb, torch.ones(1, device="cuda"))
                    layer(x)  # humming compiles its kernel at the first call
                    call = lambda: layer(x)  # noqa: E731
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            continue
        os.environ.pop("NVFP4_GEMM_CONFIG", None)
        if v.startswith("cfg="):  # a forced config: only on the small-M shapes it is meant for
            if m > 16:
                continue
            os.environ["NVFP4_GEMM_CONFIG"] = v[4:]
        # A split count forced for this variant only (0: automatic); the environment is read once.
        torch.ops.nvfp4_gemm._force("", "", 0 if v == "auto" or v.startswith("cfg=") else int(v))
        for _ in range(3):
            nvfp4_gemm.mm(a, b, sfa, sfb)
        torch.cuda.synchronize()
        reps = 20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                flush.zero_()
                nvfp4_gemm.mm(a, b, sfa, sfb)
            torch.cuda.synchronize()
        parts = []
        total = 0.0
        for e in prof.key_averages():
            if e.device_type.name != "CUDA" or "elementwise" in e.key or "fill" in e.key.lower() or "memset" in e.key.lower():
                continue
            us = e.device_time_total / reps
            total += us
            name = e.key.split("(")[0].replace("void nvfp4_gemm::sm90::", "")[:40]
            parts.append(f"{name}={us:.1f}")
        print(f"({m},{n},{k}) splits={v}: total {total:.1f} us | " + " ".join(parts), flush=True)
