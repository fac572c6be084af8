"""Small shapes that cover every sm90 dispatch entry, split-K, partial tiles in M, N and K, and M = 1, for
NVFP4 and for fp16 / bf16 activations (the weight-only form), for compute-sanitizer (memcheck, racecheck): python benchmarks/diagnostics/sm90_sanitize_cases.py [--only-w256]"""
import argparse
import os
import sys

import torch

import nvfp4_gemm

os.environ["NVFP4_GEMM_BACKEND"] = "sm90"


def check(m, n, k, tag, out_dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(m)
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    sfa = nvfp4_gemm.to_blocked(torch.full((m, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn))
    sfb = nvfp4_gemm.to_blocked(torch.full((n, k // 16), 0x30, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn))
    out = nvfp4_gemm.mm(a, b, sfa, sfb, out_dtype=out_dtype)
    ref = nvfp4_gemm.dequantize(a, sfa, k, torch.float64) @ nvfp4_gemm.dequantize(b, sfb, k, torch.float64).T
    rtol = 1e-5 if out_dtype == torch.float32 else 1e-2
    assert torch.allclose(out.double(), ref, rtol=rtol, atol=1e-3), (m, n, k, tag)


def check_weight_only(m, n, k, tag, a_dtype):
    g = torch.Generator(device="cuda").manual_seed(m)
    a = torch.randn(m, k, device="cuda", generator=g).to(a_dtype)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    sfb = nvfp4_gemm.to_blocked(torch.full((n, k // 16), 0x30, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn))
    out = nvfp4_gemm.mm(a, b, None, sfb, out_dtype=torch.float32)
    ref = a.double() @ nvfp4_gemm.dequantize(b, sfb, k, torch.float64).T
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-3), (m, n, k, tag, a_dtype)


def check_fused_linear(m, n, k, tag, x_dtype):
    """nvfp4_gemm.linear, static W4A4: the kernels quantize x themselves (Problem::a_scale)."""
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=g).to(x_dtype)
    w = torch.randn(n, k, device="cuda", generator=g)
    ws2 = (w.abs().amax() / 2688.0).reshape(1)
    wq, wsf = nvfp4_gemm.quantize(w, 1.0 / ws2)
    scale = torch.full((1,), 0.002, device="cuda")
    y = nvfp4_gemm.linear(x, wq, wsf, ws2, scale)
    packed, sf = nvfp4_gemm.quantize(x, torch.reciprocal(scale))
    assert torch.equal(y, nvfp4_gemm.mm(packed, wq, sf, wsf, scale * ws2, x_dtype)), (m, n, k, tag, x_dtype)


def check_dynamic_linear(m, n, k, tag, x_dtype):
    """nvfp4_gemm.linear, dynamic W4A4 (at M <= 16, K % 256 == 0 the K-sliced call forms the input scales, above
    M = 32 the wgmma configs' A prepass)."""
    g = torch.Generator(device="cuda").manual_seed(m + 7)
    x = torch.randn(m, k, device="cuda", generator=g).to(x_dtype)
    w = torch.randn(n, k, device="cuda", generator=g)
    ws2 = (w.abs().amax() / 2688.0).reshape(1)
    wq, wsf = nvfp4_gemm.quantize(w, 1.0 / ws2)
    y = nvfp4_gemm.linear(x, wq, wsf, ws2)
    scales = torch.ops.nvfp4_gemm._input_scales(x, ws2, None)
    packed, sf = nvfp4_gemm.quantize(x, scales[0:1])
    assert torch.equal(y, nvfp4_gemm.mm(packed, wq, sf, wsf, scales[2:3], x_dtype)), (m, n, k, tag, x_dtype)


def w256_cases():
    """The 256-row configs (four consumer warpgroups, which the least-cost rules pick): whole tiles and a forced
    balanced split on tails in M, N (N % 256 in (0, 128] and in (128, 256)) and K, then the plan's own splits, on 132
    SMs one wave over more tiles than SMs (165 tiles, 2 and 4 K tiles each) and the cluster split (128 tokens: 4 tiles
    in clusters of 8; 64 tokens: two clusters of 2 a tile, their rows summed through the workspace). Returns the
    configs."""
    configs = [c for c in nvfp4_gemm.configs()["sm90"] if "_w256x" in c]
    for cfg in configs:
        os.environ["NVFP4_GEMM_CONFIG"] = cfg
        for splits in (1, 3):
            torch.ops.nvfp4_gemm._force("", "", splits)
            for m, n, k in [(1, 136, 96), (100, 264, 2080), (130, 392, 544)]:
                check(m, n, k, cfg)
                check_weight_only(m, n, k, cfg, torch.bfloat16)
        torch.ops.nvfp4_gemm._force("", "", 0)
        for m, n, k in [(64, 42240, 512), (100, 1024, 4096), (128, 4096, 7168)]:
            check(m, n, k, cfg, torch.float16)
            check_weight_only(m, n, k, cfg, torch.float16)
    os.environ.pop("NVFP4_GEMM_CONFIG", None)
    return configs


ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--only-w256", action="store_true", help="only the 256-row configs' cases (w256_cases)")
if ap.parse_args().only_w256:
    ran = w256_cases()
    torch.cuda.synchronize()
    print("sanitize cases ran:", 18 * len(ran), "configs:", ran)
    sys.exit(0)

# (12, 264, 1536): weight-only at M 9..16 with K % 256 == 0 takes the K-sliced kernel unsplit (1 split forced).
shapes = [(1, 136, 96), (9, 264, 544), (12, 264, 1536), (20, 136, 288), (33, 128, 1056), (100, 200, 2080),
          (130, 392, 160), (300, 136, 544)]
for m, n, k in shapes:
    for splits in (1, 3):
        torch.ops.nvfp4_gemm._force("", "", splits)
        check(m, n, k, splits)
        check(m, n, k, splits, torch.float16)  # the epilogue stages fp16 and fp32 tiles differently
        for dt in (torch.float16, torch.bfloat16):
            check_weight_only(m, n, k, splits, dt)
        check_fused_linear(m, n, k, splits, (torch.float16, torch.bfloat16, torch.float32)[m % 3])
# Forced, with a split: the small-M configs (M = 40 runs as several launches) and the wgmma configs of 8,
# 16 and 32 tokens, which automatic dispatch does not reach (M <= 32 goes to the small-M kernel).
torch.ops.nvfp4_gemm._force("", "", 3)
forced = [c for c in nvfp4_gemm.configs()["sm90"]
          if "_wk_" not in c and ("_smallm_" in c or any(f"xt{t}xk" in c for t in (8, 16, 32)))]
for cfg in forced:
    os.environ["NVFP4_GEMM_CONFIG"] = cfg
    for m, n, k in [(1, 136, 96), (9, 264, 544), (40, 200, 2080)]:
        check(m, n, k, cfg)
        check_weight_only(m, n, k, cfg, torch.bfloat16)
# The K-sliced configs: NVFP4, weight-only and quantized-on-the-fly A, K % 256 == 0 (M = 40 runs as several
# launches, each quantizing its rows into the same workspace; M = 136 reads A's second 128-row block of scales).
wk = [c for c in nvfp4_gemm.configs()["sm90"] if "_wk_" in c]
for cfg in wk:
    os.environ["NVFP4_GEMM_CONFIG"] = cfg
    for m, n, k in [(1, 136, 256), (9, 264, 768), (40, 200, 2048)]:
        check(m, n, k, cfg)
        for dt in (torch.float16, torch.bfloat16):
            check_weight_only(m, n, k, cfg, dt)
        for dt in (torch.float16, torch.bfloat16, torch.float32):
            check_fused_linear(m, n, k, cfg, dt)
    check(136, 264, 256, cfg)
os.environ.pop("NVFP4_GEMM_CONFIG", None)
torch.ops.nvfp4_gemm._force("", "", 0)
w256 = w256_cases()  # leaves no config forced and the plan's own splits, as the cases below want
for m, n, k in [(1, 136, 256), (9, 264, 768), (16, 200, 2048), (64, 200, 1056), (600, 136, 544)]:
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        check_dynamic_linear(m, n, k, "auto", dt)
# Automatic splits where the wgmma kernel splits each tile's K over clusters (backend.cu choose_split), on an H100:
# 8 tiles of 32 K tiles in clusters of 8; 4 tiles of 17 K tiles (the last ragged) in clusters of 6; 8 tiles of 64
# tokens in clusters of 8; 32 tiles in two clusters of 2 each (their rows summed through the workspace).
for m, n, k in [(100, 1024, 4096), (130, 392, 2080), (64, 1024, 4096), (64, 4096, 2048)]:
    check(m, n, k, "cluster")
    check(m, n, k, "cluster", torch.float16)
    for dt in (torch.float16, torch.bfloat16):
        check_weight_only(m, n, k, "cluster", dt)
    check_fused_linear(m, n, k, "cluster", torch.bfloat16)
    check_dynamic_linear(m, n, k, "cluster", torch.float16)
# Automatic splits with more tiles than SMs: one wave of CTAs whose contiguous ranges hold whole tiles between a
# partial first and last one (330 tiles of 64 tokens x 2 K tiles: 5 K tiles a CTA; 136 tiles of 256 tokens, M and
# K ragged).
for m, n, k in [(64, 42240, 512), (200, 17408, 1056)]:
    check(m, n, k, "one wave")
    check_weight_only(m, n, k, "one wave", torch.bfloat16)
torch.cuda.synchronize()
print("sanitize cases ran:", len(shapes) * 10 + 6 * len(forced) + 18 * len(w256) + 19 * len(wk) + 15 + 4 * 6 + 2 * 2,
      "configs:", nvfp4_gemm.configs()["sm90"])
