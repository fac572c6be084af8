"""Times nvfp4_gemm.mm on the sm90 backend under each value of one environment knob, same inputs, one run.

    python benchmarks/sm90_env_sweep.py NAME=v1,v2,... [M,N,K ...]
e.g. NVFP4_GEMM_SM90_SPLITS=1,2,4 128,7168,2048. Prints one row per shape: do_bench medians in us
(L2 flushed) per value, and checks that every value gives the same bits as the first. For A/B experiments
behind a knob (docs/SM90_NOTES.md); the benchmark of record is bench_sm90.py.
"""
import os
import sys

import torch

import nvfp4_gemm
from bench_sm90 import bench, inputs_for

DEFAULT_SHAPES = [(128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048)]


def main():
    name, values = sys.argv[1].split("=", 1)
    values = values.split(",")
    shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[2:]] or DEFAULT_SHAPES
    os.environ["NVFP4_GEMM_BACKEND"] = "sm90"
    print(f"| M, N, K | " + " | ".join(f"{name}={v} (us)" for v in values) + " | same bits |")
    print("|---" * (len(values) + 2) + "|")
    for m, n, k in shapes:
        inp = inputs_for(m, n, k)
        times, outs = [], []
        for v in values:
            os.environ[name] = v
            outs.append(nvfp4_gemm.mm(**inp))
            times.append(bench(lambda: nvfp4_gemm.mm(**inp)) * 1e6)
        same = all(torch.equal(outs[0], o) for o in outs[1:])
        print(f"| {m}, {n}, {k} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {same} |", flush=True)
        os.environ.pop(name, None)


if __name__ == "__main__":
    main()
