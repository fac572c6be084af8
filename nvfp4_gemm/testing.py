"""One generator of inputs and one checker (docs/CONTRACT.md "Checking numbers"), shared by the tests, the main
job (`python -m nvfp4_gemm`) and the benchmarks."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
import warnings
import zlib

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
    a_dtype: torch.dtype | None = None  # None: NVFP4 A; float16 / bfloat16: the weight-only form (sfa None)

    @property
    def id(self) -> str:
        names = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
        al = "" if self.alpha is None else f"-a{self.alpha:g}"
        wo = "" if self.a_dtype is None else f"-wo{names[self.a_dtype]}"
        return f"{self.m}x{self.n}x{self.k}-{names[self.out_dtype]}{al}-{self.sf_view}-{self.scales}-{self.data_dtype}{wo}"


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
    """Random operands per docs/CONTRACT.md: uniform bytes (all 16 e2m1 codes), scales per `case.scales`."""
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
    sfa_blocked = sfa
    if case.sf_view == "2d":
        sfa = sfa.view(blocked_shape(m, k))
        sfb = sfb.view(blocked_shape(n, k))
    elif case.sf_view == "6d":
        sfa, sfb = permuted_view(sfa, m, k), permuted_view(sfb, n, k)
    alpha = None if case.alpha is None else torch.tensor([case.alpha], dtype=torch.float32, device=device)
    if case.a_dtype is not None:  # the weight-only form: A's NVFP4 values as 16-bit activations (exact)
        from .formats import dequantize

        a, sfa = dequantize(a.view(torch.uint8), sfa_blocked, k, case.a_dtype), None
    return dict(a=a, b=b, sfa=sfa, sfb=sfb, alpha=alpha, out_dtype=case.out_dtype)


class Reference:
    """docs/CONTRACT.md's reference for one set of inputs, computed once (float64 decode and sum on `device`, default
    the inputs' device) so that many outputs (configs, devices, repeated calls) are checked against it.
    sfa None is the weight-only form: a holds float activations [M, K], taken exactly."""

    def __init__(self, inputs: dict, device: str | torch.device | None = None):
        a, b, sfa, sfb, alpha, dt = (inputs[k] for k in ("a", "b", "sfa", "sfb", "alpha", "out_dtype"))
        dev = torch.device(device) if device is not None else a.device
        if dt is None:  # mm's default: a's dtype in the weight-only form, float16 for NVFP4 x NVFP4
            dt = a.dtype if sfa is None else torch.float16
        if sfa is None:  # weight-only: float activations [M, K], exact in float64
            k = a.shape[1]
            ad = a.to(dev, torch.float64)
        else:
            k = a.shape[1] * 2
            ad = dequantize(a.to(dev), sfa.to(dev), k, torch.float64)
        bd = dequantize(b.to(dev), sfb.to(dev), k, torch.float64)
        al = 1.0 if alpha is None else float(alpha.reshape(()))
        self.m, self.n, self.out_dtype, self.device = a.shape[0], b.shape[0], dt, dev
        self.ref = (ad @ bd.T) * al
        mag = (ad.abs() @ bd.abs().T) * abs(al)
        self.bound = 2 * UNIT_ROUNDOFF[dt] * self.ref.abs() + 2.0**-16 * mag + SMALLEST_SUBNORMAL[dt]

    def ratio(self, out: torch.Tensor) -> tuple[float, str]:
        """Worst |out - ref| / bound over the elements (<= 1 passes) and a description of the worst violation
        ('' if none). NaN exactly where ref is NaN. Overflow: where even |ref| - bound rounds to inf in
        out_dtype, the inf of ref's sign is required; where |ref| + bound would round to inf but |ref| - bound
        does not, that inf or a finite value within the bound is right (fp32 accumulation decides). A NaN or
        inf mismatch gives ratio inf."""
        m, n, dt, ref, bound = self.m, self.n, self.out_dtype, self.ref, self.bound
        assert out.shape == (m, n), f"shape {tuple(out.shape)} != {(m, n)}"
        assert out.dtype == dt, f"dtype {out.dtype} != {dt}"
        got = out.detach().to(self.device, torch.float64)

        ref_nan, got_nan = torch.isnan(ref), torch.isnan(got)
        bad_nan = ref_nan != got_nan
        if bad_nan.any():
            return math.inf, (f"NaN mismatch at {bad_nan.nonzero()[:5].tolist()}: ref has {int(ref_nan.sum())} NaN, "
                              f"out has {int(got_nan.sum())}")
        signed_inf = torch.where(ref < 0, -math.inf, math.inf).to(torch.float64)
        must_inf = ~ref_nan & torch.isinf((ref.abs() - bound).clamp(min=0).to(dt))
        may_inf = ~ref_nan & torch.isinf((ref.abs() + bound).to(dt))
        bad_inf = must_inf & (got != signed_inf)
        if bad_inf.any():
            i, j = bad_inf.nonzero()[0].tolist()
            return math.inf, (f"{int(bad_inf.sum())} elements should overflow to inf; first at ({i}, {j}): "
                              f"out={got[i, j].item()!r} ref={ref[i, j].item()!r}")
        exempt = ref_nan | must_inf | (may_inf & (got == signed_inf))
        ratio = torch.where(exempt, torch.zeros_like(ref), (got - ref).abs() / bound)
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

    def check(self, out: torch.Tensor, context: str = "") -> float:
        """Raises AssertionError (prefixed by `context`, e.g. the case and seed) if `out` violates the bound;
        returns the worst ratio."""
        worst, msg = self.ratio(out)
        assert worst <= 1.0, f"{context}: {msg}" if context else msg
        return worst


def error_ratio(out: torch.Tensor, inputs: dict) -> tuple[float, str]:
    """Worst |out - ref| / bound over the elements (<= 1 passes docs/CONTRACT.md) and a description of the worst
    violation ('' if none); see Reference.ratio. Computed in float64 on the inputs' device."""
    assert out.device == inputs["a"].device, f"device {out.device} != {inputs['a'].device}"
    return Reference(inputs).ratio(out)


def check_against_reference(out: torch.Tensor, inputs: dict, context: str = "") -> None:
    """Raises AssertionError naming the worst element (after `context`: say which case and seed, so that
    the failure can be replayed) if `out` violates docs/CONTRACT.md's bound."""
    assert out.device == inputs["a"].device, f"device {out.device} != {inputs['a'].device}"
    Reference(inputs).check(out, context)


def case_seed(case: Case) -> int:
    """The seed of a case's random data: a digest of its id, the same in every process and on every
    machine (Python's hash() of a str changes per process), so a failure replays with
    make_inputs(case, device, seed=case_seed(case))."""
    return zlib.crc32(case.id.encode())


# --- Inputs and models of the layer, model and checkpoint tests -----------------------------------------------

# NVFP4Linear's modes as the tests name them (nvfp4_gemm.nn; compressed-tensors' per-block dynamic mode has
# tests of its own).
MODES = ("weight_only", "static", "dynamic")


def seed_of(*parts) -> int:
    """A seed fixed by a test case's parameters, the same in every process (Python's hash() of a str is not):
    a failure replays from its parameters."""
    return zlib.crc32(repr(parts).encode())


def spread_activations(m: int, k: int, seed: int, zero_fraction: float = 0.0) -> torch.Tensor:
    """Float32 [m, k] activations for the weight-only form: normal values times powers of two over eight
    binades (2^-4 .. 2^3), both signs, and about `zero_fraction` of them exactly zero."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-4, 4, (m, k), generator=g).float())
    if zero_fraction:
        a[torch.rand(m, k, generator=g) < zero_fraction] = 0.0
    return a


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (how far logits or outputs are from a reference, as one number)."""
    return float((a.double() - b.double()).norm() / b.double().norm())


# transformers' decoder families the tests build (the families nvfp4_gemm.fused fuses).
_CAUSAL_LM_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                      "mistral": "MistralForCausalLM"}
_CONFIG_CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
                   "mistral": "MistralConfig"}
# Every projection has K % 32 == 0 and N % 8 == 0: hidden 64, 4 heads of 16, 2 KV heads (k/v N = 32), MLP 128.
TINY_CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)


def _spread_rows(model) -> None:
    """Norm weights 1 + 0.1 N(0, 1); each row of a matrix N(0, 1) times its own power of two in 2^-8 .. 2^-4
    (so that block scales differ); other vectors N(0, 0.02)."""
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        else:
            p.copy_(torch.randn_like(p) * torch.exp2(torch.randint(-8, -3, p.shape[:1])).unsqueeze(-1)
                    if p.dim() == 2 else torch.randn_like(p) * 0.02)


def _unit_gain(model) -> None:
    """Every matrix N(0, 1 / fan_in): transformers' std 0.02 leaves activations tiny, so W4A4 would round
    nearly nothing."""
    for p in model.parameters():
        if p.dim() == 2:
            p.normal_(0, p.shape[1] ** -0.5)


TINY_INITS = {"transformers": None, "spread_rows": _spread_rows, "unit_gain": _unit_gain}


def tiny_causal_lm(family: str = "llama", seed: int = 0, *, init: str = "transformers",
                   attn_implementation: str | None = None, **config):
    """A random transformers causal LM of `family` (llama, qwen2, qwen3, mistral) in float32 and eval mode:
    TINY_CONFIG with `config`'s entries over it, built after torch.manual_seed(seed), its weights then set by
    `init` (TINY_INITS: transformers' own, "spread_rows" or "unit_gain")."""
    import transformers

    cfg = getattr(transformers, _CONFIG_CLASSES[family])(**{**TINY_CONFIG, **config})
    if attn_implementation is not None:
        cfg._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = getattr(transformers, _CAUSAL_LM_CLASSES[family])(cfg).float().eval()
    if TINY_INITS[init] is not None:
        with torch.no_grad():
            TINY_INITS[init](model)
    return model


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """One-byte dtypes (fp4x2, e4m3) as uint8: copy_ and zero_ are not implemented for all of them."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _zeros_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(t)
    _bytes(out).zero_()
    return out


# torch.cuda._sleep spins this many GPU clock cycles: ~25-35 ms at 1.4-2 GHz, thousands of times longer
# than the host needs to enqueue the copies and the op that follow it.
SLOW_PRODUCER_CYCLES = 50_000_000


def run_after_slow_producer(fn, inputs: dict, keys=("a", "b", "sfa", "sfb", "alpha")):
    """Calls fn(**copies) on a fresh side stream whose copies of `inputs` (CUDA tensors) are still being
    produced there: the copies are zero-filled and the side stream synchronized first, then the side stream
    spins (torch.cuda._sleep) and only then copies the real values in (device to device, so the host never
    waits), and fn is called right away on that stream. Only the side stream is synchronized before the
    result is returned.

    An op that launches on the current stream reads the real values. One that launches on the legacy
    default stream (or any other) runs while the side stream still spins: torch's side streams are
    non-blocking, so nothing orders it after the copies, and it reads zeros; or it finishes after the side
    stream's synchronize, so its output is unfinished when checked. Either way the result is wrong.
    Returns (out, copies): check `out` against the original inputs."""
    device = inputs["a"].device
    assert device.type == "cuda", "run_after_slow_producer needs CUDA tensors"
    side = torch.cuda.Stream(device=device)
    torch.cuda.current_stream(device).synchronize()  # the originals are ready before the race starts
    with torch.cuda.stream(side):
        copies = {k: (_zeros_like(v) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    side.synchronize()  # zeros in place: a premature read sees zeros, never stale correct data
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLOW_PRODUCER_CYCLES)
        for k in keys:
            if isinstance(inputs.get(k), torch.Tensor):
                _bytes(copies[k]).copy_(_bytes(inputs[k]))
        out = fn(**copies)
    side.synchronize()
    return out, copies


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


# --- Every dispatch entry of a device, forced one at a time (python -m nvfp4_gemm --selftest, the
# multi-GPU test). Each case's shape is off every tile size in M, N and K (K/16 % 4 != 0 in the first
# three); the last is a GPU MODE benchmark shape. A config that refuses a shape is tried on the others.
PROBE_CASES = (
    Case(7, 136, 544),
    Case(100, 264, 1056, torch.bfloat16, alpha=0.5),
    Case(300, 512, 2080, torch.float32, alpha=-0.75),
    Case(128, 4096, 7168, alpha=0.5),
    # The weight-only form; with the case above, something for sm90's K-sliced configs (K % 256 == 0) to run
    # in both forms.
    Case(5, 264, 768, alpha=-1.5, a_dtype=torch.float16),
    Case(16, 4096, 4096, torch.bfloat16, a_dtype=torch.bfloat16),
)
CPU_PROBE_CASES = PROBE_CASES[:3]  # the last takes the CPU backend and reference seconds
GENERIC_CONFIG = "decode+cublas"
CPU_CONFIG = "decode+fp32 matmul"


@dataclasses.dataclass
class EntryResult:
    backend: str
    config: str
    device: str
    worst: float = 0.0                                  # worst error / bound over the cases that ran
    ran: list = dataclasses.field(default_factory=list)       # case ids
    refused: list = dataclasses.field(default_factory=list)   # "case id: why" (forced config cannot take it)
    failures: list = dataclasses.field(default_factory=list)  # "case id (seed s): what went wrong"

    @property
    def ok(self) -> bool:
        return bool(self.ran) and not self.failures


def dispatch_entries(device: str | torch.device) -> tuple[list[tuple[str, str]], list[str]]:
    """(backend, config) for every dispatch entry that can run on `device` (each config of the arch
    backends compiled into this build whose SM matches, then the generic path; on the CPU, the CPU
    backend), and a note for each compiled backend that cannot run there."""
    from .info import configs

    dev = torch.device(device)
    if dev.type == "cpu":
        return [("cpu", CPU_CONFIG)], []
    major, minor = torch.cuda.get_device_capability(dev)
    sm = major * 10 + minor
    runnable = set(torch.ops.nvfp4_gemm._backends_for_sm(sm))
    entries, skipped = [], []
    for backend, names in configs().items():
        if backend in runnable:
            entries += [(backend, name) for name in names]
        else:
            skipped.append(f"{backend} ({len(names)} configs): its kernels cannot run on SM {major}.{minor}")
    if sm >= 80:
        entries.append(("generic", GENERIC_CONFIG))
    else:
        skipped.append(f"generic: needs SM >= 8.0, device is SM {major}.{minor}")
    return entries, skipped


class forced_entry:
    """Context manager: routes mm to one dispatch entry (forced(): its config, or the generic backend),
    restoring the previous forcing afterwards."""

    def __init__(self, backend: str, config: str):
        self.kw = {}
        if backend == "generic":
            self.kw = {"backend": "generic"}
        elif backend != "cpu":
            self.kw = {"config": config}

    def __enter__(self):
        self.ctx = forced(**self.kw)
        self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)


def run_dispatch_entries(device: str | torch.device, entries=None, cases=None) -> list[EntryResult]:
    """Runs each entry (default: dispatch_entries(device)) on each case (default PROBE_CASES, or
    CPU_PROBE_CASES on the CPU) and checks it against the reference with docs/CONTRACT.md's bound. Each case's
    inputs and reference are made once (seed case_seed(case)); each call is followed by a synchronize
    so that an asynchronous launch error is charged to the entry that caused it."""
    from .ops import mm

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if entries is None:
        entries = dispatch_entries(dev)[0]
    if cases is None:
        cases = CPU_PROBE_CASES if dev.type == "cpu" else PROBE_CASES
    prepared = []
    for case in cases:
        inputs = make_inputs(case, dev, seed=case_seed(case))
        prepared.append((case, inputs, Reference(inputs)))
    return run_prepared_entries(dev, entries, prepared, lambda inputs: mm(**inputs), refusal="cannot run M=")


def run_prepared_entries(dev: torch.device, entries, prepared, call, refusal: str) -> list[EntryResult]:
    """Runs `call(inputs)` under each (backend, config) forced (forced_entry) for each (case, inputs, reference)
    of `prepared`, synchronizing after each call so that an asynchronous fault is charged to the entry that caused
    it: an error whose first line contains `refusal` is the forced config's own refusal of that shape (recorded,
    not a failure); any other error, a result outside the reference's bound, or a first-use self-check's FAILED
    warning (that config's problems then went to the generic path: right numbers, broken config) is a failure."""
    results = []
    for backend, config in entries:
        r = EntryResult(backend, config, str(dev))
        for case, inputs, ref in prepared:
            tag = f"{case.id} (seed {case_seed(case)})"
            try:
                with forced_entry(backend, config), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out = call(inputs)
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                for w in caught:
                    if "self-check" in str(w.message) and "FAILED" in str(w.message):
                        r.failures.append(f"{tag}: {w.message}")
            except RuntimeError as e:
                msg = str(e).strip().splitlines()[0]
                if refusal in msg:
                    r.refused.append(f"{case.id}: {msg}")
                else:
                    r.failures.append(f"{tag}: {type(e).__name__}: {msg}")
                continue
            worst, msg = ref.ratio(out)
            r.ran.append(case.id)
            r.worst = max(r.worst, worst)
            if worst > 1.0:
                r.failures.append(f"{tag}: {msg}")
        if not r.ran and not r.failures:
            r.failures.append("refused every probe shape: " + "; ".join(r.refused))
        results.append(r)
    return results


# Forcing dispatch from tests and benchmarks: the binding layer's resolver override (csrc/bindings/resolve.h),
# not the environment, so that one process can switch between entries and split counts.
@contextlib.contextmanager
def forced(backend: str | None = None, config: str | None = None, splits: int | None = None):
    """Within the block, every mm / linear / grouped_mm call in this process runs the forced backend ("auto",
    "generic", "sm90", "sm100"), the forced config (by name, nvfp4_gemm.configs(), or
    nvfp4_gemm.grouped.grouped_configs() for grouped_mm, to which a dense config does not apply) and, on the dense
    split kernels (sm90), the forced K split count (0: the plan's own); what is not given stays as it was (an outer
    forced() block, else NVFP4_GEMM_BACKEND / NVFP4_GEMM_CONFIG). A forced choice that cannot run a problem is an
    error naming why. Process-wide: not for use while other threads call mm with other intentions."""
    op = torch.ops.nvfp4_gemm._force
    prev = op("", "", 0)
    op(prev[0], prev[1], prev[2])
    new = (prev[0] if backend is None else backend, prev[1] if config is None else config,
           prev[2] if splits is None else int(splits))
    op(*new)
    try:
        yield
    finally:
        op(*prev)


@contextlib.contextmanager
def recorded_choices():
    """Within the block, records what each CUDA mm / linear / grouped_mm GEMM call ran: the yielded list receives,
    on exit, one line per call as NVFP4_GEMM_PRINT_CONFIGS prints them ("sm90:<config> m=1 n=4096 k=4096 out=0",
    "generic m=...", "grouped sm90:<config> a=e2m1 T=.. N=.. K=.. G=.. out=0"), in call order."""
    op = torch.ops.nvfp4_gemm._record_choices
    op(True)
    lines: list[str] = []
    try:
        yield lines
    finally:
        lines.extend(op(False))
