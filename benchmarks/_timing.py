"""Shared by bench_mm.py and bench_model.py: the timer (CUDA-graph replay and eager on a GPU, a wall clock
in --smoke mode on the CPU), the copy and fp16-matmul ceilings, the read-floor kernel, the humming-kernels
adapter and the run's metadata.

Why graph replay and not triton's do_bench: do_bench flushes L2 between calls and adds a fixed ~5 us to
each (measured on an H100), which hides what a model sees: a model calls its GEMMs back to back with
weights that are not in L2, from a CUDA graph. Here the caller hands over R calls on distinct operands
whose weights together exceed L2 several times; they are captured back to back in one CUDA graph, and the
per-call time is one replay's time / R, the median over the replays.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterable

import torch

# The GPU sleeps this many cycles (~2-3 ms) before the timed replays, so the host can queue all of them
# while it waits: the event intervals then hold GPU time only, no host launch gaps.
_SLEEP_CYCLES = 5_000_000
# The read-floor kernel: each program reads one tile of this many int32 (16 KiB, four 16-byte loads per
# thread with 8 warps), so even an 8 MB operand set spreads over ~4 programs per SM.
_READ_BLOCK = 4096
_READ_WARPS = 8


class Unavailable(Exception):
    """A variant that cannot run here (missing package, contract not landed, CPU-only run); the message
    says why and goes into the table and the JSON."""


class Timer:
    """Per-call times of a list of zero-argument calls, each on its own operands.

    On CUDA: `graph_us` captures every call once, back to back, in one CUDA graph and returns the median
    replay time / len(calls); `eager_us` runs the same calls eagerly, back to back, and returns the median
    per-call time between CUDA events; `host_us` is the host time to issue them (GPU idle at the start).
    On the CPU (--smoke): all three are wall-clock medians, without graphs.
    """

    def __init__(self, device: torch.device, replays: int) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.replays = replays

    @property
    def method(self) -> str:
        if self.cuda:
            return (f"CUDA graph of R back-to-back calls, median of {self.replays} replays / R (CUDA events); "
                    f"eager: same calls without a graph")
        return f"CPU wall clock, median of {self.replays} runs, no CUDA graph (--smoke)"

    def _wall_us(self, calls: list[Callable]) -> float:
        for f in calls:
            f()
        times = []
        for _ in range(self.replays):
            t0 = time.perf_counter()
            for f in calls:
                f()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6 / len(calls)

    def _warm_up(self, calls: list[Callable]) -> None:
        # On a side stream, as torch.cuda.graphs requires before a capture: lazy work (cuBLAS handles and
        # workspaces, JIT compiles, first-use allocations) must not happen while capturing.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for f in calls:
                f()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def _intervals_ms(self, launch: Callable, sleep_first: bool) -> list[float]:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(self.replays + 1)]
        torch.cuda.synchronize()
        if sleep_first:
            torch.cuda._sleep(_SLEEP_CYCLES)
        for i in range(self.replays):
            events[i].record()
            launch()
        events[-1].record()
        events[-1].synchronize()
        return [events[i].elapsed_time(events[i + 1]) for i in range(self.replays)]

    def capture(self, calls: list[Callable]) -> tuple[torch.cuda.CUDAGraph, list]:
        """The calls warmed up, then captured back to back in one CUDA graph, replayed once (the first replay
        uploads it); returns the graph and the calls' outputs, which must live as long as the graph."""
        self._warm_up(calls)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [f() for f in calls]
        graph.replay()
        return graph, outs

    def graph_us(self, calls: list[Callable]) -> float:
        if not self.cuda:
            return self._wall_us(calls)
        graph, outs = self.capture(calls)
        times = self._intervals_ms(graph.replay, sleep_first=True)
        del graph, outs
        return statistics.median(times) * 1e3 / len(calls)

    def eager_us(self, calls: list[Callable]) -> float:
        if not self.cuda:
            return self._wall_us(calls)
        self._warm_up(calls)

        def run_all():
            for f in calls:
                f()

        # No sleep first: eager time is whichever is slower, the host issuing the calls or the GPU running them.
        return statistics.median(self._intervals_ms(run_all, sleep_first=False)) * 1e3 / len(calls)

    def host_us(self, calls: list[Callable]) -> float:
        """Host time to issue the calls, per call; the GPU is idle at the start of each run so that a full
        launch queue cannot block the host and count GPU time as host time."""
        if not self.cuda:
            return self._wall_us(calls)
        self._warm_up(calls)
        times = []
        for _ in range(self.replays):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for f in calls:
                f()
            times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return statistics.median(times) * 1e6 / len(calls)


def parse_choices(text: str, allowed, flag: str, *, empty_ok: bool) -> list[str]:
    """A comma list of names from `allowed`, or SystemExit naming the flag and the accepted names."""
    names = [v for v in text.split(",") if v]
    if any(v not in allowed for v in names) or (not names and not empty_ok):
        raise SystemExit(f"{flag}: expected a comma list of {', '.join(allowed)}, got {text!r}")
    return names


def free_memory(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- ceilings

def copy_ceiling(timer: Timer, nbytes: int) -> dict:
    """Device-to-device copy of `nbytes`; TB/s counts bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=timer.device).uniform_(-1, 1)
    dst = torch.empty_like(src)
    us = timer.graph_us([lambda: dst.copy_(src)])
    del src, dst
    return {"copy_bytes": nbytes, "copy_us": us, "copy_tbps": 2 * nbytes / us / 1e6}


def matmul_ceiling(timer: Timer, n: int) -> dict:
    """fp16 n x n x n torch.mm (cuBLAS on CUDA) on random data, TFLOP/s."""
    g = torch.Generator(device=timer.device).manual_seed(n)
    a = torch.randn(n, n, dtype=torch.float16, device=timer.device, generator=g)
    b = torch.randn(n, n, dtype=torch.float16, device=timer.device, generator=g)
    us = timer.graph_us([lambda: torch.mm(a, b)])
    del a, b
    return {"mm_n": n, "mm_us": us, "mm_tflops": 2 * n**3 / us / 1e6}


# ------------------------------------------------------------------------------------------ read floor

_read_kernel = None
try:
    import triton
    import triton.language as tl

    @triton.jit
    def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        # Reads its tile once; the one int32 it stores per program (its tile's xor) keeps the loads alive.
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0)
        tl.store(out_ptr + tl.program_id(0), tl.xor_sum(x, axis=0))
except ImportError:
    pass


class Reader:
    """A kernel that only reads a buffer: its time over the bytes an op must read is the read floor.
    Triton on CUDA when importable (one tiny store per 16 KiB tile), else torch.sum over the buffer."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.kind = "triton" if (_read_kernel is not None and self.device.type == "cuda") else "torch.sum"

    def buffer(self, nbytes: int, seed: int) -> torch.Tensor:
        """Random int32 words covering nbytes, rounded up to 64 bytes: a word count divisible by 16 lets
        Triton prove the mask vector-aligned and issue 16-byte loads."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        words = (nbytes + 63) // 64 * 16
        return torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, device=self.device, generator=g)

    def call(self, buf: torch.Tensor) -> Callable[[], torch.Tensor]:
        if self.kind == "torch.sum":
            return lambda: buf.sum()
        grid = (triton.cdiv(buf.numel(), _READ_BLOCK),)
        out = torch.empty(grid[0], dtype=torch.int32, device=buf.device)

        def run():
            _read_kernel[grid](buf, out, buf.numel(), BLOCK=_READ_BLOCK, num_warps=_READ_WARPS)
            return out

        return run


# --------------------------------------------------------------------------------------- the variants

@contextlib.contextmanager
def env(name: str, value: str | None):
    """Sets (or with None removes) one environment variable for the block. nvfp4_gemm reads
    NVFP4_GEMM_BACKEND at each call, so a forced backend must be set around the warm-up, the capture and
    the eager runs alike."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def weight_only_mm_reason(device: torch.device) -> str | None:
    """None if mm takes the weight-only form mm(a_fp16, b, None, sfb, alpha=) here (contract 1), else why not.
    Probed on a tiny problem, since the form arrives on main separately."""
    import nvfp4_gemm

    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 64, generator=g).to(torch.float16)
    b = torch.randint(0, 256, (8, 32), dtype=torch.uint8, generator=g)
    sfb = nvfp4_gemm.to_blocked(torch.full((8, 4), 1.0).to(torch.float8_e4m3fn))
    try:
        out = nvfp4_gemm.mm(a.to(device), b.to(device), None, sfb.to(device), alpha=None)
    except Exception as e:  # the op's schema refuses sfa=None until the weight-only form lands
        return f"mm has no weight-only form here ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    if out.shape != (2, 8) or out.dtype != torch.float16:
        return f"weight-only mm returned {out.dtype} {tuple(out.shape)}, expected float16 (2, 8)"
    return None


def humming_reason(device: torch.device) -> str | None:
    """None if humming-kernels can run here, else why not."""
    if torch.device(device).type != "cuda":
        return "humming-kernels needs CUDA"
    try:
        import humming.layer  # noqa: F401
    except Exception as e:  # ImportError, or a CUDA library it could not find at import
        return f"humming-kernels not importable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    return None


def humming_w4a16(weight: torch.Tensor, weight_scale_blocked: torch.Tensor, weight_scale_2: torch.Tensor,
                  dtype: torch.dtype = torch.float16) -> Callable[[torch.Tensor], torch.Tensor]:
    """A humming-kernels (PyPI humming-kernels 0.1.19) W4A16 layer on one NVFP4 weight; returns x -> y with
    y = x @ (W * weight_scale)^T * weight_scale_2, x [M, K] in `dtype`.

    The adapter, as read from humming's source (humming/layer.py, humming/schema/modelopt.py): a
    HummingLayer whose weight schema is ModelOpt's NVFP4 (`weight` uint8 [N, K/2], element 2i in the low
    nibble as here; `weight_scale` e4m3 [N, K/16] in the LINEAR layout, hence from_blocked;
    `weight_scale_2` the fp32 per-tensor decode scale, multiplied in) and whose input schema is left at
    its default, unquantized activations of `dtype`. transform() repacks the weight into humming's layout
    once; kernels compile with nvcc/nvrtc at the first call for each (N, K). Uncertain: load_from_tensors
    uses load_state_dict(strict=False), which would skip a misnamed tensor silently, so the copy is checked
    here, and bench_mm.py checks the layer's output against the float reference.
    """
    from humming.layer import HummingLayer

    from nvfp4_gemm import from_blocked

    n, k = weight.shape[0], weight.shape[1] * 2
    layer = HummingLayer(shape_n=n, shape_k=k, weight_config={"quant_method": "modelopt", "quant_algo": "nvfp4"},
                         torch_dtype=dtype).cuda()
    tensors = {
        "weight": weight.view(torch.uint8).contiguous(),
        "weight_scale": from_blocked(weight_scale_blocked, n, k).contiguous().view(torch.float8_e4m3fn),
        "weight_scale_2": weight_scale_2.reshape(1).to(torch.float32),
    }
    layer.load_from_tensors(tensors)
    for name, t in tensors.items():
        got = getattr(layer, name, None)
        if got is None or not torch.equal(got.view(torch.uint8), t.view(torch.uint8)):
            raise RuntimeError(f"humming adapter: HummingLayer did not take '{name}' (its parameters: "
                               f"{[p for p, _ in layer.named_parameters()]})")
    layer.transform()
    return lambda x: layer(x)


# ------------------------------------------------------------------------------------------- metadata

def source_commit() -> str:
    """The tree's commit for the record: NVFP4_GEMM_COMMIT where set (a copy of the tree whose .git is absent or
    stale, as on the device machine, where HEAD stays at the commit the copy was first made from), else git's
    HEAD, with "+dirty" where tracked files differ from it, so that a figure is never filed under a commit it did
    not run; "unknown" without git."""
    if os.environ.get("NVFP4_GEMM_COMMIT"):
        return os.environ["NVFP4_GEMM_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("+dirty" if dirty else "")


def run_meta(device: torch.device, timer: Timer) -> dict:
    """Device, torch version, commit (source_commit), date, command line."""
    commit = source_commit()
    device = torch.device(device)
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "timing": timer.method,
        "NVFP4_GEMM_BACKEND": os.environ.get("NVFP4_GEMM_BACKEND", ""),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        meta.update(sm=f"{props.major}.{props.minor}", sms=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                    cuda=torch.version.cuda)
    return meta


def l2_bytes(device: torch.device, override: int | None) -> int:
    if override:
        return override
    if torch.device(device).type != "cuda":
        raise ValueError("--l2-bytes is required on the CPU (no L2 size to read)")
    return torch.cuda.get_device_properties(device).L2_cache_size


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def md_table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
