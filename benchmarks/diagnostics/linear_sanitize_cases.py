"""The input-scales kernel and NVFP4Linear in every mode, on small shapes (empty, one row, partial blocks, a
strided view), for compute-sanitizer (memcheck, racecheck): python benchmarks/diagnostics/linear_sanitize_cases.py"""
import torch
from torch import nn

import nvfp4_gemm

torch.manual_seed(0)
ws2 = torch.full((1,), 0.3, device="cuda")
for dt in (torch.float16, torch.bfloat16, torch.float32):
    for rows, k in ((0, 64), (1, 32), (7, 48), (300, 512), (2049, 256)):
        x = torch.randn(rows, k, device="cuda").to(dt)
        torch.ops.nvfp4_gemm._input_scales(x, ws2)
        torch.ops.nvfp4_gemm._input_scales(x, ws2, torch.full((1,), 0.01, device="cuda"))
    base = torch.randn(40, 256, device="cuda").to(dt)
    torch.ops.nvfp4_gemm._input_scales(base[:, 64:192], ws2)
lin = nn.Linear(256, 128).cuda()
for mode in ("dynamic", "static", "weight_only"):
    layer = nvfp4_gemm.NVFP4Linear.from_linear(lin, weight_only=mode == "weight_only",
                                               input_amax=8.0 if mode == "static" else None)
    for m in (1, 40):
        layer(torch.randn(m, 256, device="cuda", dtype=torch.float16))
torch.cuda.synchronize()
print("sanitize cases ran: input scales, NVFP4Linear dynamic / static / weight_only")
