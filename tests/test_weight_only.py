"""The weight-only form of mm (float activations x NVFP4 weight), the out= form and the positional
alpha / out_dtype, on every backend available here, against the float64 reference with docs/CONTRACT.md's bound."""
from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, Reference, make_inputs, spread_activations

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@dataclasses.dataclass(frozen=True)
class WCase:
    m: int
    n: int
    k: int
    a_dtype: torch.dtype = F16
    out_dtype: torch.dtype | None = None  # None: the default (a's dtype)
    alpha: float | None = None
    sf_view: str = "flat"
    scales: str = "typical"

    @property
    def id(self) -> str:
        name = {F16: "f16", BF16: "bf16", F32: "f32", None: "dflt"}
        al = "" if self.alpha is None else f"-a{self.alpha:g}"
        return f"{self.m}x{self.n}x{self.k}-{name[self.a_dtype]}-out{name[self.out_dtype]}{al}-{self.sf_view}-{self.scales}"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.id.encode())


def make_weight_only(case: WCase, device) -> dict:
    """B and its scales from the shared generator; A spread over eight binades, both signs, some zeros."""
    packed = make_inputs(Case(case.m, case.n, case.k, sf_view=case.sf_view, scales=case.scales), device,
                         seed=case.seed)
    a = spread_activations(case.m, case.k, case.seed + 1, zero_fraction=0.05)
    alpha = None if case.alpha is None else torch.tensor([case.alpha], dtype=F32, device=device)
    return dict(a=a.to(case.a_dtype).to(device), b=packed["b"], sfa=None, sfb=packed["sfb"], alpha=alpha,
                out_dtype=case.out_dtype)


def assert_within_spec(out: torch.Tensor, inputs: dict) -> None:
    """docs/CONTRACT.md's bound against the float64 reference of the values multiplied (testing.Reference; sfa None is
    the weight-only form)."""
    Reference(dict(inputs, out_dtype=out.dtype), device="cpu").check(out.cpu())


WEIGHT_ONLY_CASES = [
    WCase(1, 8, 32),
    WCase(7, 64, 96),                       # K/16 = 6: a partial 4-column scale atom
    WCase(130, 136, 256, BF16),             # M past one 128-row atom
    WCase(33, 72, 320, F32),
    WCase(64, 256, 1024, F16, F32, alpha=0.37),
    WCase(5, 64, 2048, BF16, F32, alpha=-1.75),
    WCase(40, 128, 512, F16, BF16),         # cuBLAS pairs neither: fp32 result, one rounding
    WCase(40, 128, 512, BF16, F16, alpha=2.0),
    WCase(9, 64, 128, F32, F16),
    WCase(300, 64, 96, BF16, sf_view="6d"),
    WCase(65, 96, 320, F16, F32, scales="tiny"),
    WCase(40, 64, 2048, F16, scales="large"),  # fp16 overflows to +-inf
]


def arch_takes(name: str, a_dtype: torch.dtype) -> bool:
    """Whether a forced backend runs this weight-only form (else mm refuses it, naming the backend): sm90
    takes fp16 / bf16 activations, sm100 none (W4A4 only); cpu and generic take all."""
    return {"sm90": a_dtype in (F16, BF16), "sm100": False}.get(name, True)


@pytest.mark.parametrize("case", WEIGHT_ONLY_CASES, ids=lambda c: c.id)
def test_weight_only_matches_reference(backend, case):
    name, device = backend
    inputs = make_weight_only(case, device)
    if not arch_takes(name, case.a_dtype):
        with pytest.raises(RuntimeError, match=f"NVFP4_GEMM_BACKEND={name} has no kernel"):
            nvfp4_gemm.mm(**inputs)
        return
    out = nvfp4_gemm.mm(**inputs)
    assert out.shape == (case.m, case.n) and out.device.type == torch.device(device).type
    assert out.dtype == (case.out_dtype or case.a_dtype)
    assert_within_spec(out, inputs)


def test_weight_only_equals_decoded_w4a4(backend):
    """A float A that is exactly an NVFP4 tensor's values gives the W4A4 product of that tensor."""
    _, device = backend
    inputs = make_inputs(Case(37, 64, 256, F32, alpha=0.5), device, seed=3)
    a_dq = nvfp4_gemm.dequantize(inputs["a"], inputs["sfa"], 256, F16)  # exact in fp16 (docs/CONTRACT.md)
    w4a16 = nvfp4_gemm.mm(a_dq, inputs["b"], None, inputs["sfb"], inputs["alpha"], F32)
    w4a4 = nvfp4_gemm.mm(**inputs)
    assert_within_spec(w4a16, dict(a=a_dq, b=inputs["b"], sfa=None, sfb=inputs["sfb"], alpha=inputs["alpha"]))
    assert_within_spec(w4a4, dict(a=a_dq, b=inputs["b"], sfa=None, sfb=inputs["sfb"], alpha=inputs["alpha"]))


def test_positional_alpha_and_out_dtype(backend):
    _, device = backend
    inputs = make_inputs(Case(20, 64, 128, BF16, alpha=0.75), device, seed=4)
    a, b, sfa, sfb, alpha = (inputs[k] for k in ("a", "b", "sfa", "sfb", "alpha"))
    pos = nvfp4_gemm.mm(a, b, sfa, sfb, alpha, BF16)
    kw = nvfp4_gemm.mm(a, b, sfa, sfb, alpha=alpha, out_dtype=BF16)
    assert pos.dtype == BF16 and torch.equal(pos, kw)
    assert torch.equal(torch.ops.nvfp4_gemm.mm(a, b, sfa, sfb, alpha, BF16), kw)


@pytest.mark.parametrize("weight_only", [False, True], ids=["w4a4", "w4a16"])
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
def test_out_writes_into_the_given_tensor(backend, weight_only, dtype):
    _, device = backend
    if weight_only:
        inputs = make_weight_only(WCase(45, 64, 192, BF16, dtype, alpha=1.5), device)
    else:
        inputs = make_inputs(Case(45, 64, 192, dtype, alpha=1.5), device, seed=6)
    expected = nvfp4_gemm.mm(**inputs)
    out = torch.full((45, 64), float("nan"), dtype=dtype, device=device)  # poison: unwritten elements show
    args = {k: v for k, v in inputs.items() if k != "out_dtype"}
    ret = nvfp4_gemm.mm(**args, out=out)
    assert ret is out
    assert torch.equal(out, expected)


def test_out_rows_of_a_wider_buffer(backend):
    """out may be a row-strided view (rows 16 bytes apart); columns past N stay untouched."""
    _, device = backend
    inputs = make_inputs(Case(30, 64, 128, F32), device, seed=7)
    buf = torch.full((30, 72), -7.0, dtype=F32, device=device)
    nvfp4_gemm.mm(**{k: v for k, v in inputs.items() if k != "out_dtype"}, out=buf[:, :64])
    assert torch.equal(buf[:, :64], nvfp4_gemm.mm(**inputs))
    assert bool((buf[:, 64:] == -7.0).all())


def test_out_empty_m(backend):
    _, device = backend
    inputs = make_inputs(Case(1, 64, 128), device, seed=8)
    a = inputs["a"][:0]
    sfa = torch.zeros(0, dtype=torch.float8_e4m3fn, device=device)  # round_up(0, 128) rows
    out = torch.empty(0, 64, dtype=F16, device=device)
    assert nvfp4_gemm.mm(a, inputs["b"], sfa, inputs["sfb"], out=out) is out


def _bad(device):
    inputs = make_inputs(Case(16, 64, 128, F32), device, seed=9)
    return inputs, make_weight_only(WCase(16, 64, 128, F16), device)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda w4, w16: dict(w16, sfa=w4["sfa"]), "sfa must be None when a holds"),
        (lambda w4, w16: dict(w4, sfa=None), "sfa is None, but a holds packed e2m1 data"),
        (lambda w4, w16: dict(w16, a=w16["a"][:, :96]), "with K = a.shape[1] = 96"),
        (lambda w4, w16: dict(w16, a=w16["a"][0]), "weight-only a must be 2-D [M, K]"),
        (lambda w4, w16: dict(w16, a=w16["a"].to(torch.int32)), "must be packed e2m1 data"),
        (lambda w4, w16: dict(w4, out=torch.empty(16, 56)), "out must have shape [M, N] = [16, 64]"),
        (lambda w4, w16: dict(w4, out=torch.empty(16, 64, dtype=F16)), "out must have the result dtype Float"),
        (lambda w4, w16: dict(w4, out_dtype=torch.int32), "out_dtype must be torch.float16"),
    ],
    ids=["sfa-with-float-a", "no-sfa-with-packed-a", "k-mismatch", "1d-a", "int-a", "out-shape", "out-dtype",
         "bad-out-dtype"],
)
def test_errors_name_the_argument(backend, mutate, message):
    _, device = backend
    w4, w16 = _bad(device)
    kwargs = mutate(w4, w16)
    if "out" in kwargs:
        kwargs["out"] = kwargs["out"].to(device)  # out_dtype stays float32: out must match it
    with pytest.raises(RuntimeError, match=_re(message)):
        nvfp4_gemm.mm(**kwargs)


def _re(s: str) -> str:
    import re

    return re.escape(s)


def test_schema():
    schema = str(torch.ops.nvfp4_gemm.mm.default._schema)
    assert schema.startswith("nvfp4_gemm::mm(Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor? alpha=None, "
                             "ScalarType? out_dtype=None)"), schema
    assert "Tensor(a!) out" in str(torch.ops.nvfp4_gemm.mm_out.default._schema)


@pytest.mark.parametrize("form", ["w4a16", "out"])
def test_opcheck(backend, form):
    _, device = backend
    if form == "w4a16":
        inputs = make_weight_only(WCase(7, 64, 96, BF16, F32, alpha=0.5), device)
        op, args, kwargs = torch.ops.nvfp4_gemm.mm.default, (inputs["a"], inputs["b"], None, inputs["sfb"].view(torch.uint8)), dict(alpha=inputs["alpha"], out_dtype=F32)
    else:
        inputs = make_inputs(Case(7, 64, 96, F32), device, seed=10)
        out = torch.empty(7, 64, dtype=F32, device=device)
        op = torch.ops.nvfp4_gemm.mm_out.default
        args = (inputs["a"], inputs["b"], inputs["sfa"].view(torch.uint8), inputs["sfb"].view(torch.uint8))
        kwargs = dict(alpha=None, out_dtype=F32, out=out)
    # float8 has no arithmetic for opcheck's before / after comparison: scales travel as their uint8 bytes.
    torch.library.opcheck(op, args, kwargs)


def test_torch_compile_fullgraph_weight_only_and_out(backend):
    _, device = backend
    torch._dynamo.reset()
    inputs = make_weight_only(WCase(33, 64, 128, F16, F32, alpha=0.25), device)
    out = torch.empty(33, 64, dtype=F32, device=device)

    @torch.compile(fullgraph=True)
    def f(a, b, sfb, alpha, out):
        nvfp4_gemm.mm(a, b, None, sfb, alpha, out=out)
        return nvfp4_gemm.mm(a, b, None, sfb, alpha, F32) * 2.0

    doubled = f(inputs["a"], inputs["b"], inputs["sfb"], inputs["alpha"], out)
    eager = nvfp4_gemm.mm(inputs["a"], inputs["b"], None, inputs["sfb"], inputs["alpha"], F32)
    assert torch.equal(out, eager)
    assert torch.equal(doubled, eager * 2.0)
