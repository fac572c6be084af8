"""One generator of inputs and one checker (SPEC.md "Checking numbers"), shared by the tests, the main
job (`python -m nvfp4_gemm`) and the benchmarks."""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch

from .formats import SF_VEC, blocked_shape, dequantize, permuted_view, to_blocked

UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
SMALLEST_SUBNORMAL = {torch.float16: 2.0**-24, torch.bfloat16: 2.0**-133, torch.float32: 2.0**-149}


@dataclasses.dataclass(frozen=True)
class Case:
    m: int
    n: int
    k: int
    out_dtype: torch.dtype = torch.float16
    alpha: float | None = None
    sf_view: str = "flat"        # flat | 2d | 6d
    scales: str = "typical"      # typical | tiny (zero + subnormal) | large (up to 448, overflow) | nan
    data_dtype: str = "uint8"    # uint8 | fp4x2

    @property
    def id(self) -> str:
        dt = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}[self.out_dtype]
        al = "" if self.alpha is None else f"-a{self.alpha:g}"
        return f"{self.m}x{self.n}x{self.k}-{dt}{al}-{self.sf_view}-{self.scales}-{self.data_dtype}"


def _random_scales(rows: int, cols: int, kind: str, g: torch.Generator) -> torch.Tensor:
    """e4m3 bytes. 'typical' spans 2^-6 .. 2^3 (10 binades, every mantissa) so outputs stay in fp16's range."""
    if kind == "typical":
        exp = torch.randint(1, 11, (rows, cols), generator=g)          # biased exponent 1..10
    elif kind == "tiny":
        exp = torch.randint(0, 3, (rows, cols), generator=g)           # zero, subnormals, 2^-6, 2^-5
    elif kind in ("large", "nan"):
        exp = torch.randint(8, 16, (rows, cols), generator=g)          # 2^0 .. 2^8 (448 = 0x7E)
    else:
        raise ValueError(kind)
    man = torch.randint(0, 8, (rows, cols), generator=g)
    bits = (exp << 3) | man
    bits = torch.where(bits == 0x7F, torch.full_like(bits, 0x7E), bits)  # NaN only where asked for
    if kind == "tiny":
        bits[torch.rand((rows, cols), generator=g) < 0.15] = 0         # exact zero scales
    if kind == "nan":
        nan_mask = torch.rand((rows, cols), generator=g) < 0.02
        bits[nan_mask] = 0x7F
    return bits.to(torch.uint8).view(torch.float8_e4m3fn)


def make_inputs(case: Case, device: str | torch.device = "cpu", seed: int = 0) -> dict:
    """Random operands per SPEC.md: uniform bytes (all 16 e2m1 codes), scales per `case.scales`."""
    g = torch.Generator().manual_seed(seed)
    m, n, k = case.m, case.n, case.k
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, generator=g)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    sfa_lin = _random_scales(m, k // SF_VEC, case.scales, g)
    sfb_lin = _random_scales(n, k // SF_VEC, "typical" if case.scales == "nan" else case.scales, g)
    sfa, sfb = to_blocked(sfa_lin), to_blocked(sfb_lin)
    if case.data_dtype == "fp4x2":
        a, b = a.view(torch.float4_e2m1fn_x2), b.view(torch.float4_e2m1fn_x2)
    a, b, sfa, sfb = (t.to(device) for t in (a, b, sfa, sfb))
    if case.sf_view == "2d":
        sfa = sfa.view(blocked_shape(m, k))
        sfb = sfb.view(blocked_shape(n, k))
    elif case.sf_view == "6d":
        sfa, sfb = permuted_view(sfa, m, k), permuted_view(sfb, n, k)
    alpha = None if case.alpha is None else torch.tensor([case.alpha], dtype=torch.float32, device=device)
    return dict(a=a, b=b, sfa=sfa, sfb=sfb, alpha=alpha, out_dtype=case.out_dtype)


def error_ratio(out: torch.Tensor, inputs: dict) -> tuple[float, str]:
    """Worst |out - ref| / bound over the elements (<= 1 passes SPEC.md), and a description of the worst
    violation ('' if none). The bound: |out - ref| <= 2u|ref| + 2^-16 sum|a b| |alpha| + d; inf where ref
    overflows out_dtype; NaN exactly where ref is NaN (a NaN or inf mismatch gives ratio inf).
    Computed in float64 on the inputs' device."""
    a, b, sfa, sfb, alpha, dt = (inputs[k] for k in ("a", "b", "sfa", "sfb", "alpha", "out_dtype"))
    m, n = a.shape[0], b.shape[0]
    assert out.shape == (m, n), f"shape {tuple(out.shape)} != {(m, n)}"
    assert out.dtype == dt, f"dtype {out.dtype} != {dt}"
    assert out.device == a.device, f"device {out.device} != {a.device}"
    k = a.shape[1] * 2
    ad = dequantize(a, sfa, k, torch.float64)
    bd = dequantize(b, sfb, k, torch.float64)
    al = 1.0 if alpha is None else float(alpha.reshape(()))
    ref = (ad @ bd.T) * al
    mag = (ad.abs() @ bd.abs().T) * abs(al)
    got = out.detach().to(torch.float64)

    ref_nan, got_nan = torch.isnan(ref), torch.isnan(got)
    bad_nan = ref_nan != got_nan
    if bad_nan.any():
        return math.inf, (f"NaN mismatch at {bad_nan.nonzero()[:5].tolist()}: ref has {int(ref_nan.sum())} NaN, "
                          f"out has {int(got_nan.sum())}")
    ref_rounded = ref.to(dt).to(torch.float64)
    overflow = torch.isinf(ref_rounded) & ~ref_nan
    bad_inf = overflow & (got != ref_rounded)
    if bad_inf.any():
        return math.inf, f"expected inf at {bad_inf.nonzero()[:5].tolist()}"
    finite = ~ref_nan & ~overflow
    bound = 2 * UNIT_ROUNDOFF[dt] * ref.abs() + 2.0**-16 * mag + SMALLEST_SUBNORMAL[dt]
    ratio = torch.where(finite, (got - ref).abs() / bound, torch.zeros_like(ref))
    ratio = torch.nan_to_num(ratio, nan=math.inf)  # inf out where ref is finite
    if ratio.numel() == 0:
        return 0.0, ""
    worst = float(ratio.max())
    if worst <= 1.0:
        return worst, ""
    idx = int(ratio.argmax())
    i, j = divmod(idx, n)
    return worst, (f"{int((ratio > 1).sum())} of {m * n} elements out of bound; worst at ({i}, {j}): "
                   f"out={got[i, j].item()!r} ref={ref[i, j].item()!r} bound={bound[i, j].item():.3g}")


def check_against_reference(out: torch.Tensor, inputs: dict) -> None:
    """Raises AssertionError naming the worst element if `out` violates SPEC.md's bound."""
    worst, msg = error_ratio(out, inputs)
    assert worst <= 1.0, msg


def poison_cuda_allocator(nbytes: int, device: torch.device) -> None:
    """Fill a freed block of the caching allocator with NaN bytes, so an output that reuses it and is
    not fully written shows NaN (0xFF bytes are NaN in fp16, bf16 and fp32)."""
    if torch.device(device).type != "cuda":
        return
    t = torch.full((max(nbytes, 512),), 0xFF, dtype=torch.uint8, device=device)
    del t


def median_seconds(fn, device: torch.device | str = "cuda") -> float:
    """Median seconds of fn(). CUDA: triton's do_bench (L2 flushed between runs) if present, else CUDA
    events around each call; CPU: wall clock of a few calls. The one timer of the main job and benchmarks."""
    if torch.device(device).type == "cuda":
        try:
            from triton.testing import do_bench

            return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
        except ImportError:
            fn()
            times = []
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) * 1e-3)
            return statistics.median(times)
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
