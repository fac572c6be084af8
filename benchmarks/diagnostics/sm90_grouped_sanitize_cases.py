"""Grouped-GEMM cases for compute-sanitizer (memcheck, racecheck) on the sm90 grouped kernels, through the
private op torch.ops.nvfp4_gemm._sm90_grouped_test: empty groups, one group holding every row, groups of one
row, T not a multiple of anything, a group spanning two sfa blocks, forced split counts (the split counters
and partials), garbage routing (clamped on the device), fp16 / bf16 / NVFP4 A, every config (8, 16 and 32 tokens).
Run: compute-sanitizer --tool memcheck python benchmarks/diagnostics/sm90_grouped_sanitize_cases.py"""
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
    ran = 0
    for a_kind in (torch.float16, torch.bfloat16, "e2m1"):
        for config in (0, 1, 2):
            for counts in ([0, 0, 37, 0], [1, 1, 1, 1, 1], [3, 0, 0, 5, 0, 1, 2], [0, 130, 1, 0], [0, 0, 0, 1]):
                case(counts, 136, 512, a_kind, config)
                ran += 1
            for splits in (2, 3):
                case([2, 0, 5], 264, 256 * 5, a_kind, config, splits=splits)
                ran += 1
            case([3, 5, 2, 6], 136, 512, a_kind, config, offs_override=[9, 4, 20, 16])
            case([3, 5, 2, 6], 136, 512, a_kind, config, offs_override=[-5, 3, 99, 2])
            ran += 2
    torch.ops.nvfp4_gemm._sm90_grouped_force_splits(0)
    print(f"sm90 grouped sanitize cases ran: {ran}")
