"""Times the sm90 grouped kernels (torch.ops.nvfp4_gemm._sm90_grouped_test: one launch, workspace from torch)
on MoE layer shapes against the read floor: the bytes of the experts the routing hits (packed weights + their
scales) at the measured device-to-device copy bandwidth. Each GEMM (gate_up: N = 2I, K = H; down: N = H, K = I)
is timed as a CUDA graph of back-to-back calls over enough layers that the experts hit exceed 3x L2.
--configs -1,0,1 times each config (-1: select's pick; 0, 1: the 8- and 16-token K-sliced configs; 2-7 the wgmma
tiles of 64, 128, 80, 256, 160 and 32 tokens over 128 weight rows, 8 and 9 those of 80 and 128 tokens over 256)
on every point.
Run: python benchmarks/diagnostics/sm90_grouped_bench.py [--tokens 1,16,64] [--shapes mixtral,dsv3,qwen3]
[--configs -1]"""
import argparse
import random

import torch

import nvfp4_gemm  # noqa: F401  (loads _C_sm90)
from nvfp4_gemm.formats import round_up

SHAPES = {"qwen3": (128, 8, 2048, 768), "mixtral": (8, 2, 4096, 14336), "dsv3": (256, 8, 7168, 2048)}


def copy_bandwidth():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (start.elapsed_time(end) * 1e-3)  # read + write bytes per second


def routing(E, topk, tokens, seed):
    rng = random.Random(seed)
    counts = [0] * E
    for _ in range(tokens):
        for e in rng.sample(range(E), topk):
            counts[e] += 1
    return counts


def time_gemm(E, n, k, counts, a_kind, bw, l2_bytes, config=-1):
    T = sum(counts)
    kp = round_up(k // 16, 4)
    expert_bytes = n * k // 2 + round_up(n, 128) * kp
    hit = sum(1 for c in counts if c) * expert_bytes
    layers = max(1, min(8, -(-3 * l2_bytes // max(hit, 1))))
    # Scales of 1.0 (e4m3 0x38) and random codes: timing does not depend on the values.
    ws = [(torch.randint(0, 256, (E, n, k // 2), dtype=torch.uint8, device="cuda"),
           torch.full((E, round_up(n, 128) * kp), 0x38, dtype=torch.uint8, device="cuda")) for _ in range(layers)]
    offs = torch.tensor([sum(counts[:i + 1]) for i in range(E)], dtype=torch.int32, device="cuda")
    if a_kind == "e2m1":
        a = torch.randint(0, 256, (T, k // 2), dtype=torch.uint8, device="cuda")
        sfa_rows = round_up(T + E * 127, 128)
        sfa = torch.full((sfa_rows * kp,), 0x38, dtype=torch.uint8, device="cuda")
    else:
        a = torch.randn(T, k, device="cuda").to(a_kind)
        sfa, sfa_rows = None, 0
    out = torch.empty(T, n, dtype=torch.bfloat16, device="cuda")
    call = lambda w: torch.ops.nvfp4_gemm._sm90_grouped_test(a, w[0], sfa, w[1], offs, None, out, config, sfa_rows)
    for w in ws:
        call(w)
    reps = 4
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            for w in ws:
                call(w)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (reps * layers))
    del ws
    return sorted(times)[len(times) // 2], hit / bw * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,16,64,256")
    ap.add_argument("--shapes", default="mixtral,dsv3,qwen3")
    ap.add_argument("--a", default="bf16,e2m1")
    ap.add_argument("--configs", default="-1")
    args = ap.parse_args()
    bw = copy_bandwidth()  # bytes read + written per second by a device copy: what HBM sustains
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"copy bandwidth (read + write) {bw / 1e12:.2f} TB/s, L2 {l2 >> 20} MB")
    kinds = {"bf16": torch.bfloat16, "f16": torch.float16, "e2m1": "e2m1"}
    print("shape    tokens  A     cfg gemm     rows  us      floor_us  ratio")
    for name in args.shapes.split(","):
        E, topk, H, I = SHAPES[name]
        for tokens in (int(t) for t in args.tokens.split(",")):
            counts = routing(E, topk, tokens, seed=tokens)
            for ak in args.a.split(","):
                for cfg in (int(c) for c in args.configs.split(",")):
                    tot, tot_floor = 0.0, 0.0
                    for gemm, n, k in (("gate_up", 2 * I, H), ("down", H, I)):
                        us, floor = time_gemm(E, n, k, counts, kinds[ak], bw, l2, cfg)
                        tot, tot_floor = tot + us, tot_floor + floor
                        print(f"{name:8s} {tokens:6d}  {ak:5s} {cfg:3d} {gemm:8s} {sum(counts):5d} {us:7.1f} "
                              f"{floor:8.1f}  {us / floor:5.2f}")
                    print(f"{name:8s} {tokens:6d}  {ak:5s} {cfg:3d} {'layer':8s} {sum(counts):5d} {tot:7.1f} "
                          f"{tot_floor:8.1f}  {tot / tot_floor:5.2f}", flush=True)

if __name__ == "__main__":
    main()
