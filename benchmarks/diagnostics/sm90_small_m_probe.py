"""Where a small-M call's time goes: the same shape timed eagerly (do_bench, L2 flushed), as a CUDA-graph
replay (launch overhead gone), and per kernel through torch.profiler; plus the per-call floor of a tiny
problem. Diagnostics for docs/SM90_NOTES.md.

    python benchmarks/diagnostics/sm90_small_m_probe.py [M,N,K ...]   (default: the two small-M targets)
Environment as for mm (NVFP4_GEMM_CONFIG, ...); the sm90
backend is forced.
"""
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import nvfp4_gemm
from bench_sm90 import bench, inputs_for  # its sibling in benchmarks/diagnostics/

os.environ["NVFP4_GEMM_BACKEND"] = "sm90"


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def kernel_times(fn, reps=20):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    per = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "fill" not in e.name.lower():  # not the L2 flush
            per[e.name[:60]].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def main():
    shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[1:]] or [(1, 7168, 16384), (16, 4096, 7168)]
    tiny = inputs_for(1, 128, 256)
    print(f"tiny (1,128,256): eager {bench(lambda: nvfp4_gemm.mm(**tiny)) * 1e6:.1f} us, "
          f"graph {bench(graph_of(lambda: nvfp4_gemm.mm(**tiny)).replay) * 1e6:.1f} us")
    for m, n, k in shapes:
        inp = inputs_for(m, n, k)
        fn = lambda: nvfp4_gemm.mm(**inp)  # noqa: E731
        eager = bench(fn) * 1e6
        g = graph_of(fn)
        replay = bench(g.replay) * 1e6
        nbytes = n * k // 2 + n * k // 16 + m * k // 2 + m * k // 16 + m * n * 2
        ks = kernel_times(fn)
        print(f"({m},{n},{k}) {nbytes / 1e6:.1f} MB: eager {eager:.1f} us, graph replay {replay:.1f} us "
              f"({nbytes / replay / 1e6:.2f} TB/s); kernels (median us): "
              + ", ".join(f"{name} {t:.1f}" for name, t in ks.items()), flush=True)


if __name__ == "__main__":
    main()
