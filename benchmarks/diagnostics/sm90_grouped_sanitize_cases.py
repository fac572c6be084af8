"""Grouped-GEMM cases for compute-sanitizer (memcheck, racecheck) on the sm90 grouped kernels, through the
private op torch.ops.nvfp4_gemm._sm90_grouped_test: empty groups, one group holding every row, groups of one
row, T not a multiple of anything, a group spanning two sfa blocks, N 384 (a 256-row weight tile's tail, whose second
128-row scale block lies past the group's scales), forced split counts (the split counters and partials), garbage
routing (clamped on the device), fp16 / bf16 / NVFP4 A, the grouped configs given (0, 1: K-sliced; 2..9: wgmma);
--ring adds, --ring-only runs alone, a launch of many one-stage items per CTA (each CTA's item ring s_items wraps).
Run: compute-sanitizer --tool memcheck python benchmarks/diagnostics/sm90_grouped_sanitize_cases.py [--configs 0,1]
[--a f16,bf16,e2m1] [--ring | --ring-only] (a subset, to fit a sanitizer run into a time budget; all of them by
default)"""
import argparse

import torch

import nvfp4_gemm  # noqa: F401  (loads _C_sm90)
from nvfp4_gemm.formats import round_up, to_blocked
from nvfp4_gemm.testing import Reference


def case(counts, n, k, a_kind, config, splits=0, offs_override=None):
    G, T = len(counts), sum(counts)
    g = torch.Generator(device="cuda").manual_seed(T + n)
    b = torch.randint(0, 256, (G, n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    sfb_lin = torch.full((n, k // 16), 0x30, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    sfb = torch.stack([to_blocked(sfb_lin)] * G)
    sfa, sfa_rows, sfa_parts = None, 0, []
    if a_kind == "e2m1":
        a = torch.randint(0, 256, (T, k // 2), dtype=torch.uint8, device="cuda", generator=g)
        one = torch.full((1, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        sfa_parts = [to_blocked(one.expand(m, -1).contiguous()) if m else None for m in counts]
        sfa_rows = max(128, sum(round_up(m, 128) for m in counts))
        sfa = torch.cat([p.view(torch.uint8) for p in sfa_parts if p is not None] +
                        [torch.zeros(128 * round_up(k // 16, 4), dtype=torch.uint8, device="cuda")])
    else:
        a = torch.randn(T, k, device="cuda", generator=g).to(a_kind)
    starts = [sum(counts[:i]) for i in range(G)]
    offs = torch.tensor(offs_override or [s + m for s, m in zip(starts, counts)], dtype=torch.int32, device="cuda")
    out = torch.full((T, n), float("nan"), dtype=torch.float32, device="cuda")
    torch.ops.nvfp4_gemm._sm90_grouped_force_splits(splits)
    torch.ops.nvfp4_gemm._sm90_grouped_test(a, b, sfa, sfb, offs, None, out, config, sfa_rows)
    torch.cuda.synchronize()
    if offs_override is not None:
        return
    for i, (s, m) in enumerate(zip(starts, counts)):
        if m:
            Reference(dict(a=a[s:s + m], b=b[i], sfa=sfa_parts[i] if a_kind == "e2m1" else None, sfb=sfb[i],
                           alpha=None, out_dtype=torch.float32)).check(out[s:s + m], f"{counts} group {i} {a_kind} "
                                                                       f"config {config} splits {splits}")

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="0,1")
    ap.add_argument("--a", default="f16,bf16,e2m1")
    ap.add_argument("--ring", action="store_true")
    ap.add_argument("--ring-only", action="store_true")
    args = ap.parse_args()
    # 207 rows over 18 groups, N 8192 (64 row blocks), K 256: 34 / 23 / 18 chunks of 8 / 16 / 32 rows, so
    # 2176 / 1472 / 1152 one-stage items over 264 / 264 / 132 CTAs: more items per CTA than its ring's 5 / 4 / 5.
    ring_counts = [5, 0, 9, 1, 40, 3, 0, 2, 17, 8, 8, 30, 12, 25, 7, 33, 1, 6]
    kinds = {"f16": torch.float16, "bf16": torch.bfloat16, "e2m1": "e2m1"}
    ran = 0
    for a_kind in (kinds[k] for k in args.a.split(",")):
        for config in (int(c) for c in args.configs.split(",")):
            if args.ring or args.ring_only:
                case(ring_counts, 8192, 256, a_kind, config)
                ran += 1
            if args.ring_only:
                continue
            for counts in ([0, 0, 37, 0], [1, 1, 1, 1, 1], [3, 0, 0, 5, 0, 1, 2], [0, 130, 1, 0], [0, 0, 0, 1]):
                case(counts, 136, 512, a_kind, config)
                ran += 1
            case([0, 105, 1, 0], 384, 512, a_kind, config)
            ran += 1
            for splits in (2, 3):
                case([2, 0, 5], 264, 256 * 5, a_kind, config, splits=splits)
                ran += 1
            case([3, 5, 2, 6], 136, 512, a_kind, config, offs_override=[9, 4, 20, 16])
            case([3, 5, 2, 6], 136, 512, a_kind, config, offs_override=[-5, 3, 99, 2])
            ran += 2
    torch.ops.nvfp4_gemm._sm90_grouped_force_splits(0)
    print(f"sm90 grouped sanitize cases ran: {ran}")
