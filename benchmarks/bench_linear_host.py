"""Host time and kernel launches per NVFP4Linear forward, against nn.Linear / F.linear: the
budget is F.linear's host time, since a Python layer pays it on every call of every layer.

    python benchmarks/bench_linear_host.py                       # CUDA if present, else the CPU
    python benchmarks/bench_linear_host.py --device cpu --m 1 --k 256 --n 256

Per mode (dynamic, static, weight_only) and bias: the host time to issue one forward through the module
(NVFP4Linear) and through the op directly (torch.ops.nvfp4_gemm.linear), next to nn.Linear and F.linear
on the same x (their weight in x's dtype). On CUDA the GPU is idle when each timed batch starts, so a full
launch queue cannot count GPU time as host time (_timing.Timer.host_us), and the kernel launches of one
forward are counted with the profiler. On the CPU the figure is the wall time per call, compute included:
there the module-minus-op difference is the Python layer's own cost.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import Timer  # noqa: E402

import nvfp4_gemm  # noqa: E402
from nvfp4_gemm import NVFP4Linear  # noqa: E402

MODES = ("dynamic", "static", "weight_only")


def launches(fn, device: torch.device) -> int | None:
    """CUDA kernels one call of fn launches (None for a CPU device: nothing to count)."""
    if device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA and not e.is_user_annotation
               and not e.name.startswith(("Memcpy", "Memset")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--k", type=int, default=None, help="in_features (default 4096 on CUDA, 256 on the CPU)")
    p.add_argument("--n", type=int, default=None, help="out_features (default: K)")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--calls", type=int, default=None, help="calls per timed batch (default 50 on CUDA, 2000 on the CPU)")
    p.add_argument("--replays", type=int, default=21, help="timed batches; the median is reported")
    args = p.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    k = args.k or (4096 if cuda else 256)
    n = args.n or k
    calls = args.calls or (50 if cuda else 2000)
    dtype = getattr(torch, args.dtype)
    timer = Timer(device, args.replays)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(args.m, k, generator=g) * 3).to(dtype).to(device)
    torch.set_grad_enabled(False)

    def host_us(fn) -> float:
        return timer.host_us([fn] * calls)

    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}, x [{args.m}, {k}] "
          f"{args.dtype}, weight [{n}, {k}], {calls} calls per batch, median of {args.replays} batches")
    print(f"{'variant':<34} {'bias':>5} {'host us/forward':>16} {'vs F.linear':>12} {'launches':>9}")
    for bias in (False, True):
        lin = nn.Linear(k, n, bias=bias).to(device=device, dtype=dtype)
        ref = host_us(lambda: F.linear(x, lin.weight, lin.bias))
        rows = [("F.linear", ref, launches(lambda: F.linear(x, lin.weight, lin.bias), device)),
                ("nn.Linear", host_us(lambda: lin(x)), launches(lambda: lin(x), device))]
        for mode in MODES:
            layer = NVFP4Linear.from_linear(lin, weight_only=mode == "weight_only",
                                            input_amax=20.0 if mode == "static" else None)
            op = torch.ops.nvfp4_gemm.linear.default
            args_ = (x, layer.weight, layer.weight_scale, layer.weight_scale_2, layer.input_scale, layer.bias,
                     layer.weight_only)
            rows.append((f"NVFP4Linear {mode}", host_us(lambda: layer(x)), launches(lambda: layer(x), device)))
            rows.append((f"  torch.ops.nvfp4_gemm.linear {mode}", host_us(lambda: op(*args_)), None))
        for name, us, nl in rows:
            print(f"{name:<34} {str(bias):>5} {us:>16.2f} {us / ref:>11.2f}x {'' if nl is None else nl:>9}")


if __name__ == "__main__":
    main()
