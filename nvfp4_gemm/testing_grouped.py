"""The grouped GEMM's test inputs and checker, shared by tests/test_grouped.py, the sanitizer cases and
benchmarks/bench_moe.py: random data per docs/CONTRACT.md (testing.py's generators), routings from the MoE corner cases,
and docs/CONTRACT.md's bound per element against the float64 reference, group by group."""
from __future__ import annotations

import dataclasses

import torch

from .formats import SF_VEC, dequantize, round_up, to_blocked
from .grouped import grouped_operands_f64, grouped_sfa_rows
from .testing import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF, Reference, _random_scales

ROUTINGS = ("uniform", "skewed", "one", "ones", "edges")


@dataclasses.dataclass(frozen=True)
class GroupedCase:
    t: int
    n: int
    k: int
    g: int
    routing: str = "uniform"       # ROUTINGS, or explicit per-group token counts via `counts`
    out_dtype: torch.dtype = torch.float16
    alpha: bool = False            # per-group alpha (signed, many binades)
    scales: str = "typical"        # testing._random_scales kinds: typical | tiny | large | nan
    a_dtype: torch.dtype | None = None  # None: NVFP4 A; float16 / bfloat16 / float32: weight-only
    sfa_size: str = "worst"        # worst: grouped_sfa_rows(T, G) | exact: this routing's sum | least: round_up(T,128)
    sfa_view: str = "flat"         # flat | 2d
    sfb_view: str = "2d"           # 2d [G, Np*Sp] | 3d [G, Np, Sp]
    counts: tuple[int, ...] | None = None

    @property
    def id(self) -> str:
        names = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
        wo = "" if self.a_dtype is None else f"-wo{names[self.a_dtype]}"
        route = self.routing if self.counts is None else "counts" + "_".join(map(str, self.counts))
        al = "-alpha" if self.alpha else ""
        return (f"t{self.t}-n{self.n}-k{self.k}-g{self.g}-{route}-{names[self.out_dtype]}{al}-{self.scales}{wo}"
                f"-sfa{self.sfa_size}-{self.sfa_view}-{self.sfb_view}")


def routing_counts(t: int, g: int, routing: str, gen: torch.Generator) -> list[int]:
    """Tokens per group (sum t) for a named routing, seeded."""
    if routing == "uniform":
        return torch.bincount(torch.randint(0, g, (t,), generator=gen), minlength=g).tolist()
    if routing == "skewed":  # Zipf-like: a few experts take most tokens, many see none
        p = 1.0 / torch.arange(1, g + 1, dtype=torch.float64) ** 1.5
        perm = torch.randperm(g, generator=gen)
        picks = torch.multinomial(p[perm], t, replacement=True, generator=gen) if t else torch.zeros(0, dtype=torch.long)
        return torch.bincount(picks, minlength=g).tolist()
    if routing == "one":  # one group holds every token
        counts = [0] * g
        counts[g // 2] = t
        return counts
    if routing == "ones":  # groups of one token (and the rest, if t > g, in the last group)
        counts = [1 if i < t else 0 for i in range(g)]
        counts[-1] += t - sum(counts)
        return counts
    if routing == "edges":  # the first and last groups empty, the rest uniform
        assert g >= 3
        inner = torch.bincount(torch.randint(0, g - 2, (t,), generator=gen), minlength=g - 2).tolist()
        return [0, *inner, 0]
    raise ValueError(routing)


def stack_blocked(sf_per_group: list[torch.Tensor]) -> torch.Tensor:
    """Each group's linear scales blocked on its own (docs/CONTRACT.md's definition), concatenated."""
    return torch.cat([to_blocked(s).view(torch.uint8) for s in sf_per_group]) if sf_per_group else torch.zeros(0, dtype=torch.uint8)


def grouped_blocked_reference(sf: torch.Tensor, counts: list[int], rows: int) -> torch.Tensor:
    """The grouped blocked layout built straight from docs/CONTRACT.md (to_blocked of each non-empty group's rows, in
    order, zero padded to `rows` padded rows): independent of nvfp4_gemm.to_blocked_grouped. uint8, flat."""
    k16 = sf.shape[1]
    sp = round_up(k16, 4)
    parts, start = [], 0
    for m in counts:
        if m:
            parts.append(sf[start:start + m])
        start += m
    body = stack_blocked(parts)
    out = torch.zeros(rows * sp, dtype=torch.uint8)
    out[:body.numel()] = body
    return out


def make_grouped_inputs(case: GroupedCase, device: str | torch.device = "cpu", seed: int = 0) -> dict:
    """Random grouped operands per docs/CONTRACT.md: uniform bytes (all 16 e2m1 codes), scales per `case.scales` for A
    (typical for B), routing per `case.routing`; sfa built from docs/CONTRACT.md's definition (grouped_blocked_reference)."""
    gen = torch.Generator().manual_seed(seed)
    t, n, k, g = case.t, case.n, case.k, case.g
    counts = list(case.counts) if case.counts is not None else routing_counts(t, g, case.routing, gen)
    assert len(counts) == g and sum(counts) == t, (counts, t, g)
    offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    a = torch.randint(0, 256, (t, k // 2), dtype=torch.uint8, generator=gen)
    b = torch.randint(0, 256, (g, n, k // 2), dtype=torch.uint8, generator=gen)
    sfa_lin = _random_scales(t, k // SF_VEC, case.scales, gen).view(torch.uint8)
    sfb = torch.stack([to_blocked(_random_scales(n, k // SF_VEC, "typical", gen)).view(torch.uint8) for _ in range(g)])
    exact = sum(round_up(m, 128) for m in counts)  # >= round_up(t, 128)
    rows = {"worst": grouped_sfa_rows(t, g), "exact": exact, "least": round_up(t, 128)}[case.sfa_size]
    assert exact <= rows, f"routing {counts} needs {exact} padded rows, more than the case's sfa ({rows})"
    sfa = grouped_blocked_reference(sfa_lin, counts, rows)
    sp = round_up(k // SF_VEC, 4)
    if case.sfa_view == "2d":
        sfa = sfa.view(-1, sp)
    if case.sfb_view == "3d":
        sfb = sfb.view(g, round_up(n, 128), sp)
    alpha = None
    if case.alpha:
        mag = torch.exp2(torch.randint(-3, 3, (g,), generator=gen).to(torch.float32))
        frac = 1.0 + torch.randint(0, 8, (g,), generator=gen).to(torch.float32) / 8.0
        sign = torch.where(torch.rand(g, generator=gen) < 0.3, -1.0, 1.0)
        alpha = (mag * frac * sign).to(torch.float32)
    if case.a_dtype is not None:  # weight-only: A's NVFP4 values as activations (exact in fp16 / bf16 / fp32)
        a = dequantize(a, to_blocked(sfa_lin.view(torch.float8_e4m3fn)), k, case.a_dtype)
        sfa = None
    sfb = sfb.view(torch.float8_e4m3fn)
    sfa = sfa.view(torch.float8_e4m3fn) if sfa is not None else None
    dev = torch.device(device)
    move = lambda x: None if x is None else x.to(dev)  # noqa: E731
    return dict(a=move(a), b=move(b), sfa=move(sfa), sfb=move(sfb), offs=move(offs), alpha=move(alpha),
                out_dtype=case.out_dtype, counts=counts)


def op_args(inputs: dict) -> tuple[tuple, dict]:
    """(args, kwargs) of torch.ops.nvfp4_gemm.grouped_mm for make_grouped_inputs' dict."""
    return ((inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], inputs["offs"]),
            {"alpha": inputs["alpha"], "out_dtype": inputs["out_dtype"]})


def grouped_reference(inputs: dict) -> Reference:
    """docs/CONTRACT.md's reference and bound for grouped inputs, as a testing.Reference (its ratio / check): float64
    decode and sum group by group on the CPU, |alpha[g]| scaling each group's error budget."""
    a, b, sfa, sfb, offs, alpha, dt = (inputs[k] for k in ("a", "b", "sfa", "sfb", "offs", "alpha", "out_dtype"))
    if dt is None:
        dt = a.dtype if sfa is None else torch.float16
    ad, bd, ends = grouped_operands_f64(a, b, sfa, sfb, offs)
    t, n = a.shape[0], b.shape[1]
    ref = torch.zeros((t, n), dtype=torch.float64)
    mag = torch.zeros((t, n), dtype=torch.float64)
    start = 0
    for i, e in enumerate(ends):
        if e > start:
            al = 1.0 if alpha is None else float(alpha.reshape(-1)[i])
            ref[start:e] = (ad[start:e] @ bd[i].T) * al
            mag[start:e] = (ad[start:e].abs() @ bd[i].abs().T) * abs(al)
        start = e
    r = Reference.__new__(Reference)
    r.m, r.n, r.out_dtype, r.device = t, n, dt, torch.device("cpu")
    r.ref = ref
    r.bound = 2 * UNIT_ROUNDOFF[dt] * ref.abs() + 2.0**-16 * mag + SMALLEST_SUBNORMAL[dt]
    return r


# --- Every grouped dispatch entry of a device, forced one at a time (python -m nvfp4_gemm --selftest). Each case has
# empty groups or groups of one row, and sizes off every tile; the last (K % 256 == 0) is decode-like: many groups of
# one token, for the configs of that regime (sm90's K-sliced ones take only K % 256 == 0). A config that refuses a
# case is tried on the others.
GROUPED_PROBE_CASES = (
    GroupedCase(37, 136, 544, 5, "edges"),                                       # K/16 % 4 != 0
    GroupedCase(300, 264, 1056, 8, "skewed", torch.bfloat16, alpha=True),        # groups past one 128-row atom
    GroupedCase(20, 512, 2048, 16, "ones", torch.float32, alpha=True),           # decode: one token per group
)
CPU_GROUPED_PROBE_CASES = GROUPED_PROBE_CASES[:2]
GENERIC_GROUPED_CONFIG = "grouped_simt_64x64"
CPU_GROUPED_CONFIG = "grouped decode+fp32 matmul"


def grouped_dispatch_entries(device: str | torch.device) -> list[tuple[str, str]]:
    """(backend, grouped config) for every grouped dispatch entry that can run on `device`: each grouped config of
    the arch modules in this build whose SM matches, then the generic grouped kernel; on the CPU, the CPU backend."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return [("cpu", CPU_GROUPED_CONFIG)]
    major, minor = torch.cuda.get_device_capability(dev)
    sm = major * 10 + minor
    runnable = set(torch.ops.nvfp4_gemm._backends_for_sm(sm))
    entries = [(b, name) for b in torch.ops.nvfp4_gemm._grouped_backends() if b in runnable
               for name in torch.ops.nvfp4_gemm._grouped_configs(b)]
    if sm >= 80:
        entries.append(("generic", GENERIC_GROUPED_CONFIG))
    return entries


def run_grouped_entries(device: str | torch.device, entries=None, cases=None) -> list:
    """Runs each grouped entry (default: grouped_dispatch_entries(device)) on each case (default
    GROUPED_PROBE_CASES, CPU_GROUPED_PROBE_CASES on the CPU) and checks it group by group against the float64
    reference with docs/CONTRACT.md's bound; testing.EntryResult rows, as run_dispatch_entries gives for mm. Each
    call is followed by a synchronize so that an asynchronous fault is charged to the entry that caused it."""
    from .grouped import grouped_mm
    from .testing import case_seed, run_prepared_entries

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if entries is None:
        entries = grouped_dispatch_entries(dev)
    if cases is None:
        cases = CPU_GROUPED_PROBE_CASES if dev.type == "cpu" else GROUPED_PROBE_CASES
    prepared = []
    for case in cases:
        inputs = make_grouped_inputs(case, dev, seed=case_seed(case))
        prepared.append((case, inputs, grouped_reference(inputs)))

    def call(inputs):
        args, kwargs = op_args(inputs)
        return grouped_mm(*args, **kwargs)

    # a forced grouped config's own refusal reads "... cannot run T=.. N=.. K=.. G=..: why" (bindings/resolve.h)
    return run_prepared_entries(dev, entries, prepared, call, refusal="cannot run T=")
