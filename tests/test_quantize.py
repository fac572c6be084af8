"""nvfp4_gemm.quantize: the native CPU and CUDA implementations, each against the PyTorch reference
(reference_quantize, bit for bit),
the corner cases the recipe defines, argument errors, the custom-op contract, and torchao's NVFP4 quantizer."""
from __future__ import annotations

import importlib
import math
import os
import shutil
import subprocess
import tempfile

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.formats import SF_VEC, blocked_shape, dequantize, from_blocked, to_blocked, unpack_e2m1
from nvfp4_gemm.testing import poison_cuda_allocator
from conftest import requires_cuda

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# R not a multiple of 128, K/16 not a multiple of 4, K not a multiple of 64, R = 1, K = 16.
SHAPES = ((1, 16), (7, 48), (130, 96), (129, 2064), (256, 512))


def random_activations(rows: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Activation-like data over many binades: normal values, per-row and per-block magnitudes spread by
    e^N(0, 2) and e^N(0, 1), some exact small multiples that land on e2m1 midpoints, a few outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x = x * torch.exp(2 * torch.randn(rows, 1, generator=g))
    x = (x.view(rows, -1, SF_VEC) * torch.exp(torch.randn(rows, k // SF_VEC, 1, generator=g))).view(rows, k)
    exact = torch.randint(-24, 25, (rows, k), generator=g).float() * 0.25  # ties after scaling by 1/sf
    x = torch.where(torch.rand(rows, k, generator=g) < 0.1, exact, x)
    out = torch.rand(rows, k, generator=g) < 0.002
    x[out] *= 50.0
    return x.to(dtype)


def assert_same_bits(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    gp, gs = (t.cpu() for t in got)
    wp, ws = (t.cpu() for t in want)
    assert gp.dtype == torch.uint8 and gs.dtype == torch.float8_e4m3fn, f"{what}: dtypes {gp.dtype}, {gs.dtype}"
    assert gp.shape == wp.shape and gs.shape == ws.shape, f"{what}: shapes {gp.shape}/{gs.shape} vs {wp.shape}/{ws.shape}"
    bad_p = (gp != wp).nonzero()
    assert bad_p.numel() == 0, f"{what}: {bad_p.shape[0]} packed bytes differ, first at {bad_p[:4].tolist()}"
    gsb, wsb = gs.view(torch.uint8), ws.view(torch.uint8)
    bad_s = (gsb != wsb).nonzero()
    assert bad_s.numel() == 0, (f"{what}: {bad_s.shape[0]} scale bytes differ, first at flat "
                                f"{bad_s[:4].flatten().tolist()}: {gsb[bad_s[:4].flatten()].tolist()} vs "
                                f"{wsb[bad_s[:4].flatten()].tolist()}")


def _scales(dev="cpu"):
    # None (1), a Python float, the per-tensor amax convention as a tensor, a power of two.
    return ("none", "float", "amax", "pow2")


def _gs(kind: str, x: torch.Tensor):
    if kind == "none":
        return None
    if kind == "float":
        return 0.37
    if kind == "pow2":
        return torch.tensor([2.0**-3], device=x.device)
    return nvfp4_gemm.global_encode_scale(x.float().abs().amax())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("gs_kind", _scales())
def test_cpu_matches_reference(dtype, shape, gs_kind):
    x = random_activations(*shape, dtype, seed=shape[0] + shape[1])
    gs = _gs(gs_kind, x)
    assert_same_bits(nvfp4_gemm.quantize(x, gs), nvfp4_gemm.reference_quantize(x, gs), f"cpu {dtype} {shape} gs={gs_kind}")


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES + ((1000, 4096),), ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("gs_kind", _scales())
def test_cuda_matches_reference(dtype, shape, gs_kind):
    x = random_activations(*shape, dtype, seed=7 * shape[0] + shape[1])
    gs_cpu = _gs(gs_kind, x)
    x[0, 5] = math.nan
    x[-1, -1] = math.inf
    x[shape[0] // 2, :16] = 0.0
    gs_cuda = gs_cpu.cuda() if isinstance(gs_cpu, torch.Tensor) else gs_cpu
    sf_bytes = math.prod(blocked_shape(*shape))
    poison_cuda_allocator(4 * (sf_bytes + x.numel()), torch.device("cuda"))  # unwritten padding would show
    got = nvfp4_gemm.quantize(x.cuda(), gs_cuda)
    assert got[0].device.type == "cuda" and got[1].device.type == "cuda"
    assert_same_bits(got, nvfp4_gemm.reference_quantize(x, gs_cpu), f"cuda {dtype} {shape} gs={gs_kind}")


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_strided_and_misaligned_inputs(dtype):
    base = random_activations(64, 272, dtype, seed=3)
    dev = base.cuda()
    n = 63 * 256
    views = {"column slice": (dev[:, 16:], base[:, 16:]), "row step": (dev[::2, :256], base[::2, :256]),
             "offset by one row": (dev[1:, :256], base[1:, :256]),
             "misaligned columns": (dev[:, 1:257], base[:, 1:257]),  # not 16-byte aligned rows: copied
             "contiguous, misaligned base": (dev.flatten()[1 : 1 + n].view(63, 256), base.flatten()[1 : 1 + n].view(63, 256))}
    for name, (on_gpu, on_cpu) in views.items():
        assert_same_bits(nvfp4_gemm.quantize(on_gpu), nvfp4_gemm.reference_quantize(on_cpu), f"cuda {name}")


@requires_cuda
def test_cuda_graph_reads_global_scale_on_device():
    x = random_activations(256, 1024, torch.bfloat16, seed=11).cuda()
    gs = torch.tensor([1.0], device="cuda")
    nvfp4_gemm.quantize(x, gs)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        packed, sf = nvfp4_gemm.quantize(x, gs)
    for value in (0.5, 3.0, 1000.0):
        gs.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bits((packed, sf), nvfp4_gemm.reference_quantize(x.cpu(), value), f"graph replay gs={value}")


def test_rounding_ties_to_even_and_saturation():
    # amax 6 and gs 1: s = 1, so q = |x| exactly; each midpoint goes to its even neighbour.
    vals = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, 0.2499, 0.7501, 4.99, 5.01, -0.0]
    want = [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 14, 0, 2, 6, 7, 8]
    x = torch.tensor([vals], dtype=torch.float32)
    for impl in (nvfp4_gemm.quantize, nvfp4_gemm.reference_quantize):
        packed, sf = impl(x)
        assert from_blocked(sf, 1, 16).view(torch.uint8).item() == 0x38, "scale of amax 6 with gs 1 must be 1.0"
        assert unpack_e2m1(packed)[0].tolist() == want
    # A block whose scale saturates at 448: |x| / 448 * gs beyond 6 rounds to code 7.
    big = torch.full((1, 16), 1.0e6)
    packed, sf = nvfp4_gemm.quantize(big, 1.0)
    assert from_blocked(sf, 1, 16).view(torch.uint8).item() == 0x7E
    assert (unpack_e2m1(packed) == 7).all()


def test_e2m1_rounding_near_every_midpoint():
    """Each e2m1 midpoint m (and 0, 6, inf) and its neighbours up to 4 ulps away, through blocks whose
    amax is 6 with gs 1 (scale 1.0, so q = |x| exactly), against the nearest-even definition."""
    centers = torch.tensor([0.0, 0.25, 0.75, 1.0, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    bits = centers.view(torch.int32).unsqueeze(1) + torch.arange(-4, 5, dtype=torch.int32)
    q = bits.clamp(min=0).view(torch.float32).flatten()
    q = q[q <= 6.0]
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    dist = (q.double().unsqueeze(1) - grid.double()).abs()
    best = dist.min(1, keepdim=True).values
    cand = dist == best  # one or two (a tie) nearest values; a tie takes the even code
    lower = cand.int().argmax(1)  # the first nearest code; of a tied pair, the even one wins
    want = torch.where((cand.sum(1) == 2) & (lower % 2 == 1), lower + 1, lower)
    n = q.numel()
    pad = (-n) % 15
    vals = torch.cat([q, torch.zeros(pad)]).view(-1, 15)
    x = torch.cat([torch.full((vals.shape[0], 1), 6.0), vals], 1).view(1, -1)
    for impl in (nvfp4_gemm.quantize, nvfp4_gemm.reference_quantize):
        packed, _ = impl(x)
        got = unpack_e2m1(packed).view(-1, 16)[:, 1:].flatten()[:n]
        assert torch.equal(got, want.to(torch.uint8)), (impl.__name__, q[got != want], got[got != want])


def run_host_program(name: str, *flags: str) -> subprocess.CompletedProcess:
    """Builds tests/quant_host/<name>.cpp (C++17, csrc on the include path, `flags`) and runs it; skipped where
    no C++ compiler is on PATH, or where `flags` ask for AddressSanitizer and the compiler has no runtime."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip(f"no C++ compiler on PATH to build tests/quant_host/{name}.cpp")
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, name)
        build = subprocess.run([cxx, *flags, "-std=c++17", "-I", os.path.join(here, "..", "csrc"),
                                os.path.join(here, "quant_host", f"{name}.cpp"), "-o", exe],
                               capture_output=True, text=True)
        if build.returncode != 0 and "-fsanitize=address" in flags and "asan" in build.stderr.lower():
            pytest.skip(f"this compiler has no AddressSanitizer runtime: {build.stderr[-300:]}")
        assert build.returncode == 0, build.stderr
        return subprocess.run([exe], capture_output=True, text=True)


def test_e2m1_rounding_exhaustive_host():
    """recipe.h's bit-trick e2m1 rounding against the midpoint definition for all 2^31 non-negative fp32
    bit patterns (a ~15 s host program)."""
    run = run_host_program("e2m1_exhaustive", "-O2")
    assert run.returncode == 0 and "mismatches=0" in run.stdout, run.stdout + run.stderr


def test_mse_search_table_in_bounds_asan():
    """mse_search.h (the search both quantize_mse backends run) under AddressSanitizer, with a heap table of
    exactly 128 candidate scales and every kind of encode scale, the refused ones included (negative, -0,
    NaN, inf): no lookup leaves the table (tests/quant_host/mse_search_asan.cpp; a few seconds)."""
    run = run_host_program("mse_search_asan", "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer")
    assert run.returncode == 0 and "blocks=" in run.stdout, run.stdout + run.stderr


def test_corner_cases_zero_nan_inf_subnormal():
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    x[0, :16] = 0.0                 # an all-zero block
    x[0, 16:32] = -0.0              # negative zeros keep their sign: code 8
    x[1, 20] = math.nan             # NaN: its block's scale is NaN, the NaN's code +-6, the rest +-0; nothing else moves
    x[2, 33] = -math.inf            # inf: scale saturates, the inf element becomes -6
    x[2, 48:64] = torch.linspace(-0.03, 0.03, 16)  # small: amax / 6 = 2^-8, a subnormal e4m3 scale with gs 1
    for impl in (nvfp4_gemm.quantize, nvfp4_gemm.reference_quantize):
        packed, sf = impl(x)
        s = from_blocked(sf, 3, 64).view(torch.uint8)
        codes = unpack_e2m1(packed)
        assert s[0, 0] == 0 and (codes[0, :16] == 0).all()
        assert s[0, 1] == 0 and (codes[0, 16:32] == 8).all()
        assert s[1, 1] == 0x7F and codes[1, 20] & 7 == 7 and ((codes[1, 16:32] & 7) == 0).sum() == 15
        assert (s[1, [0, 2, 3]] != 0x7F).all(), "NaN must stay in its own block"
        assert s[2, 2] == 0x7E and codes[2, 33] == 15
        assert 0 < s[2, 3] < 0x08, f"expected a subnormal e4m3 scale, got {int(s[2, 3]):#x}"
    # Through mm, NaN reaches exactly the outputs of row 1.
    packed, sf = nvfp4_gemm.quantize(x, 1.0)
    w = random_activations(8, 64, torch.float32, seed=5)
    wp, wsf = nvfp4_gemm.quantize(w)
    out = nvfp4_gemm.mm(packed, wp, sf, wsf, out_dtype=torch.float32)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2]]).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dequantized_error_within_half_step(dtype):
    """Every element lands within the largest half-gap of e2m1 (1.0) times its block's decoded scale, plus
    the absolute rounding of a subnormal e4m3 scale (2^-10, which can push the block max past 6 or flush a
    block to zero), and the scale is within e4m3's relative rounding of amax / 6 where it is normal."""
    x = random_activations(200, 256, dtype, seed=1)
    gs = nvfp4_gemm.global_encode_scale(x.float().abs().amax())
    packed, sf = nvfp4_gemm.quantize(x, gs)
    scale = from_blocked(sf, 200, 256).to(torch.float32) / gs  # decoded block scales
    dq = dequantize(packed, sf, 256) / gs
    err = (dq - x.float()).abs().view(200, -1, SF_VEC)
    assert (err <= scale.unsqueeze(-1) * 1.0 + 6 * 2.0**-10 / gs).all()
    amax = x.float().abs().view(200, -1, SF_VEC).amax(-1)
    live = amax * gs / 6 > 2.0**-6  # normal e4m3 range: relative rounding <= 2^-4
    assert ((scale - amax / 6).abs() <= (amax / 6) * 2.0**-4 + 1e-30)[live].all()


def test_empty_rows():
    packed, sf = nvfp4_gemm.quantize(torch.empty(0, 64, dtype=torch.bfloat16))
    assert packed.shape == (0, 32) and sf.numel() == 0


@pytest.mark.parametrize(
    "x, gs, match",
    [
        (torch.zeros(2, 3, 32), None, r"x must be 2-D \[rows, K\], got shape \[2, 3, 32\]"),
        (torch.zeros(4, 24), None, r"K = x.shape\[1\] must be a positive multiple of 16.*got 24"),
        (torch.zeros(4, 32, dtype=torch.int32), None, r"x must be float32, float16 or bfloat16, got Int"),
        (torch.zeros(4, 32), torch.ones(2), r"global_scale must hold exactly 1 element, got shape \[2\]"),
        (torch.zeros(4, 32), torch.ones(1, dtype=torch.float64), r"global_scale must be float32, got Double"),
    ],
    ids=["3d", "k24", "int", "gs2", "gs-f64"],
)
def test_errors_name_the_argument(x, gs, match):
    with pytest.raises(RuntimeError, match=match):
        nvfp4_gemm.quantize(x, gs)


@requires_cuda
def test_error_global_scale_device():
    with pytest.raises(RuntimeError, match=r"global_scale must be on x's device cuda:0.*got cpu"):
        nvfp4_gemm.quantize(torch.zeros(4, 32, device="cuda"), torch.ones(1))


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_opcheck(device):
    x = random_activations(130, 96, torch.bfloat16).to(device)
    torch.library.opcheck(torch.ops.nvfp4_gemm.quantize.default, (x, None))
    gs = torch.tensor([0.5], device=device)
    torch.library.opcheck(torch.ops.nvfp4_gemm.quantize.default, (x.float(), gs))


@pytest.mark.parametrize("device", _devices())
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    x = random_activations(130, 96, torch.float16).to(device)

    @torch.compile(fullgraph=True)
    def f(x):
        gs = nvfp4_gemm.global_encode_scale(x.float().abs().amax())
        return nvfp4_gemm.quantize(x * 2.0, gs)

    gs = nvfp4_gemm.global_encode_scale(x.float().abs().amax())
    assert_same_bits(f(x), nvfp4_gemm.reference_quantize(x * 2.0, gs), "compiled")


# torchao's NVFP4 quantizer (torchao.prototype.mx_formats), where it can be installed.
def _torchao_quantize():
    try:
        mod = importlib.import_module("torchao.prototype.mx_formats.nvfp4_tensor")
    except Exception as e:  # noqa: BLE001 - absent, or built for another torch
        pytest.skip(f"torchao is not importable here ({type(e).__name__}: {e}); `pip install --no-deps torchao` to run")
    return mod.nvfp4_quantize


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("per_tensor", ("amax", "pow2", "none"))
def test_matches_torchao(dtype, per_tensor):
    """torchao 0.18 computes, for a DECODE per-tensor scale pts: s = fl(fl(amax/6) / pts), clamped to
    [2^-6, 448] and cast to e4m3; data = x * fl(fl(1/pts) / s8), rounded to e2m1 ties to even. With
    gs = fl(1/pts) our recipe is the same except for
      1. s: fl(amax/6) * gs versus fl(amax/6) / pts, identical when pts is a power of two and almost always
         otherwise (both are within an ulp of the exact value; only an e4m3 rounding midpoint between them
         could separate them: checked block by block below);
      2. the lower clamp: torchao raises a block scale below 2^-6 (E4M3_EPS, the smallest normal e4m3) to
         2^-6, we keep the subnormal or zero scale the format allows. Only such blocks may differ.
    Without a per-tensor scale (pts None, gs 1), the same two points apply."""
    nvfp4_quantize = _torchao_quantize()
    rows, k = 256, 1024
    x = random_activations(rows, k, dtype, seed=21)
    amax = x.float().abs().amax()
    pts = {"amax": amax / 2688.0, "pow2": torch.tensor(2.0**-5), "none": None}[per_tensor]
    ao_scale, ao_data = nvfp4_quantize(x.contiguous(), 16, pts)
    gs = None if pts is None else (1.0 / pts.float()).reshape(1)
    packed, sf = nvfp4_gemm.quantize(x, gs)
    ours_s = from_blocked(sf, rows, k).view(torch.uint8)
    ao_s = ao_scale.view(torch.uint8).reshape(rows, k // 16)
    ao_codes = unpack_e2m1(ao_data.view(torch.uint8).reshape(rows, k // 2)).view(rows, -1, 16)
    codes = unpack_e2m1(packed).view(rows, -1, 16)

    block_amax = x.float().abs().view(rows, -1, 16).amax(-1) / 6.0
    clamped = ours_s < 0x08  # below 2^-6 (subnormal or zero): torchao raised it to 2^-6
    assert (ao_s[clamped] == 0x08).all()
    if pts is None:
        s_ours, s_ao = block_amax, block_amax
    else:
        s_ours, s_ao = block_amax * gs, block_amax / pts.float()
    rounding = ~clamped & (s_ours != s_ao) & (ours_s != ao_s)
    explained = clamped | rounding
    assert ((ours_s.int() - ao_s.int()).abs()[rounding] == 1).all(), "a rounding difference must be one e4m3 step"
    bad = (ours_s != ao_s) & ~explained
    assert not bad.any(), f"{int(bad.sum())} unexplained scale differences, first at {bad.nonzero()[:4].tolist()}"
    bad_data = (codes != ao_codes).any(-1) & ~explained
    assert not bad_data.any(), f"{int(bad_data.sum())} blocks with unexplained code differences, first at {bad_data.nonzero()[:4].tolist()}"
    if per_tensor == "pow2":
        assert not rounding.any()
    equal = (ours_s == ao_s) & (codes == ao_codes).all(-1)
    print(f"torchao agreement: {int(equal.sum())} of {equal.numel()} blocks bitwise equal; "
          f"{int(clamped.sum())} under torchao's 2^-6 scale clamp, {int(rounding.sum())} differ by scale rounding")


def _modelopt_qtensor():
    try:
        mod = importlib.import_module("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    except Exception as e:  # noqa: BLE001 - absent, or missing one of its many dependencies
        pytest.skip(f"nvidia-modelopt is not importable here ({type(e).__name__}: {e})")
    return mod.NVFP4QTensor


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_modelopt(dtype):
    """NVIDIA Model Optimizer 0.47's NVFP4QTensor.quantize (its weight path): decode scale
    d = amax / (6 * 448); block scale fl(amax_b / fl(6 * d)) with zero scales set to 1.0, clamped to
    [2^-9, 448], cast to e4m3; values x / fl(s8 * d), rounded to e2m1 with ties to even. With gs = fl(1/d)
    the differences from our recipe are:
      1. blocks whose scale rounds to 0 here (all-zero blocks, amax * gs / 6 < 2^-10): ModelOpt stores 1.0
         or 2^-9 instead; the block decodes to zeros here;
      2. the block scale's rounding order (divide by fl(6 d) versus multiply fl(amax/6) by gs): one e4m3
         step, where an e4m3 midpoint separates the two fp32 values;
      3. the value's rounding order (x / fl(s8 d) versus |x| * fl(gs / s8)): one e2m1 step, only where the
         exact x * gs / s8 is within a few fp32 ulps of an e2m1 midpoint (a tie, or nearly);
      4. -0.0 gets code 0 there (sign from x < 0), 8 here (sign bit). Not in this data.
    Everything else is bitwise equal; the test checks each difference against its explanation."""
    qtensor = _modelopt_qtensor()
    rows, k = 256, 1024
    x = random_activations(rows, k, dtype, seed=21)
    q, mo_sf, mo_d = qtensor.quantize(x.clone(), 16)
    gs = (1.0 / mo_d.float()).reshape(1)
    packed, sf = nvfp4_gemm.quantize(x, gs)
    ours_s = from_blocked(sf, rows, k).view(torch.uint8).int()
    mo_s = mo_sf.view(torch.uint8).reshape(rows, k // 16).int()
    codes = unpack_e2m1(packed).view(rows, -1, 16).int()
    mo_codes = unpack_e2m1(q._quantized_data.view(torch.uint8)).view(rows, -1, 16).int()

    underflow = ours_s == 0
    assert (mo_s[underflow] > 0).all() and ((codes[underflow] & 7) == 0).all()
    xf = x.float().view(rows, -1, 16)
    amax = xf.abs().amax(-1)
    scale_rounding = ~underflow & (ours_s != mo_s)
    assert ((ours_s - mo_s).abs()[scale_rounding] == 1).all(), "a scale difference must be one e4m3 step"
    assert ((amax / 6 * gs) != (amax / (6 * mo_d.float())))[scale_rounding].all()

    same_scale = (ours_s == mo_s).unsqueeze(-1).expand_as(codes)
    code_diff = same_scale & (codes != mo_codes)
    assert ((codes - mo_codes).abs()[code_diff] == 1).all(), "a code difference must be one e2m1 step"
    s8 = from_blocked(sf, rows, k).to(torch.float64).unsqueeze(-1)
    ratio = (xf.double().abs() * gs.double() / s8)[code_diff]
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    near = ((ratio.unsqueeze(-1) - mids).abs() <= mids * 2.0**-21).any(-1)
    assert near.all(), f"code differences away from e2m1 midpoints: ratios {ratio[~near][:5].tolist()}"
    equal = (ours_s == mo_s) & (codes == mo_codes).all(-1)
    print(f"ModelOpt agreement ({dtype}): {int(equal.sum())} of {equal.numel()} blocks bitwise equal; "
          f"{int(underflow.sum())} zero-scale blocks, {int(scale_rounding.sum())} scale roundings, "
          f"{int(code_diff.sum())} codes at e2m1 midpoints of {codes.numel()}")
