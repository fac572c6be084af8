"""Where the weight-only generic path's time goes at large M (decode + cuBLAS), against its parts and peers.

Per shape (default: the 8B stack's four GEMMs at M = 2048), each timed as the median of CUDA-event timings over
back-to-back calls, one weight set per call in a ring larger than 3x L2 (so weights come from HBM):
  wo_generic    mm weight-only forced to the generic path (decode B to fp16, then one cuBLAS GEMM)
  wo_sm90       mm weight-only forced to the sm90 wgmma config named by --sm90-config (in-kernel decode)
  decode        the decode alone (nvfp4_gemm._decode: 0.5 B read + 2 B written per weight), with its GB/s
  cublas_xrand  torch.mm(x, B_dq^T), x random fp16, B the decoded NVFP4 weights (what wo_generic runs after its decode)
  cublas_xfp4   the same with x holding NVFP4-representable values (what the W4A4 generic path feeds cuBLAS)
  cublas_brand  the same with B random fp16 (fp16 nn.Linear's operands)
The last three tell whether cuBLAS runs at a data-dependent speed (the tensor cores' power draw depends on the
operands' bits, and a power-capped GPU clocks down for dense random bits).

    python3 benchmarks/diagnostics/generic_large_m.py [--shapes 2048,28672,4096 ...] [--iters 20]
"""
from __future__ import annotations

import argparse
import statistics

import torch

import nvfp4_gemm
from nvfp4_gemm.testing import forced

SHAPES_8B = ((2048, 6144, 4096), (2048, 4096, 4096), (2048, 28672, 4096), (2048, 4096, 14336))


def time_calls(fns, iters: int) -> float:
    """Median over `iters` rounds of one round through fns (each a zero-argument call), us per call."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for f in fns:  # warm-up (and cuBLAS's heuristics)
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start.record()
        for f in fns:
            f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / len(fns))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=None, help="M,N,K triples (default: the 8B stack at M = 2048)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sm90-config", default="sm90_nvfp4_w128xt256xk128_s3_b1_ws_rs")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else SHAPES_8B
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    gen = torch.Generator(device=dev).manual_seed(0)
    print(f"generic_large_m on {torch.cuda.get_device_name(dev)}, torch {torch.__version__}; us per call, median of "
          f"{args.iters} rounds over a ring of weight sets > 3x L2")
    print("| M | N | K | wo_generic | wo_sm90 | decode | decode GB/s | cublas_xrand | cublas_xfp4 | cublas_brand |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, n, k in shapes:
        ring = max(2, -(-3 * l2 // (n * k // 2)))
        w = [torch.randn(n, k, device=dev, dtype=torch.float16, generator=gen) * 0.02 for _ in range(ring)]
        q = [nvfp4_gemm.quantize(wi, 448.0 * 6.0 / wi.abs().max().float()) for wi in w]
        del w
        ws2 = torch.ones(1, device=dev)
        x = torch.randn(m, k, device=dev, dtype=torch.float16, generator=gen)
        xp, xs = nvfp4_gemm.quantize(x, 448.0 * 6.0 / x.abs().max().float())
        x_fp4 = torch.ops.nvfp4_gemm._decode.default(xp, xs, torch.float16)

        def wo(qi):
            return nvfp4_gemm.mm(x, qi[0], None, qi[1], alpha=ws2, out_dtype=torch.float16)

        row = []
        with forced(backend="generic"):
            row.append(time_calls([lambda qi=qi: wo(qi) for qi in q], args.iters))
        try:
            with forced(backend="sm90", config=args.sm90_config):
                row.append(time_calls([lambda qi=qi: wo(qi) for qi in q], args.iters))
        except RuntimeError as e:  # a config that cannot take the shape
            print(f"  sm90 {args.sm90_config}: {str(e).splitlines()[0][:160]}")
            row.append(float("nan"))
        dec_us = time_calls([lambda qi=qi: torch.ops.nvfp4_gemm._decode.default(qi[0], qi[1], torch.float16)
                             for qi in q], args.iters)
        row += [dec_us, n * k * 2.5 / dec_us / 1e3]
        # cuBLAS on predecoded weights: a ring of decoded copies (the same bytes per call as wo_generic's GEMM)
        bdq = [torch.ops.nvfp4_gemm._decode.default(qi[0], qi[1], torch.float16) for qi in q[:max(2, ring // 4)]]
        brand = [torch.randn(n, k, device=dev, dtype=torch.float16, generator=gen) * 0.02 for _ in bdq]
        row.append(time_calls([lambda b=b: torch.mm(x, b.t()) for b in bdq], args.iters))
        row.append(time_calls([lambda b=b: torch.mm(x_fp4, b.t()) for b in bdq], args.iters))
        row.append(time_calls([lambda b=b: torch.mm(x, b.t()) for b in brand], args.iters))
        print(f"| {m} | {n} | {k} | " + " | ".join(f"{v:.1f}" for v in row) + " |")
        del q, bdq, brand
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
