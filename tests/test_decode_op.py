"""nvfp4_gemm::_decode, the exact decode of an NVFP4 weight the backward multiplies by (autograd.decode_weight):
bit for bit formats.dequantize and the plain PyTorch decoder on random data per docs/CONTRACT.md and every scale byte,
each output dtype, odd N, K a multiple of 16 but not 32, the views the layers hand it (fused-group row slices,
row strides, a stride along K, an unaligned base, every scale view); its errors; its fake under opcheck,
meta tensors and torch.compile; and on a GPU, no host sync and CUDA-graph capture."""
from __future__ import annotations

import re

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm import autograd as nvfp4_autograd
from nvfp4_gemm.formats import blocked_shape, dequantize, from_blocked, permuted_view, to_blocked
from nvfp4_gemm.testing import Case, make_inputs, poison_cuda_allocator
from conftest import requires_cuda

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DTYPE_IDS = ("f16", "bf16", "f32")
DEVICES = ("cpu", pytest.param("cuda", marks=requires_cuda))
decode = torch.ops.nvfp4_gemm._decode


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what) -> None:
    """Equal values, NaN where and only where want has NaN, and equal signs of every non-NaN (-0.0 too)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    got, want = got.cpu(), want.cpu()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), (what, "NaN positions differ")
    assert torch.equal(got[~nan], want[~nan]), (what, "values differ")
    assert torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan])), (what, "signs of zeros differ")


def operand(n: int, k: int, scales: str, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, k/2] random packed e2m1 (all 16 codes) and its blocked scales of kind `scales` (the 'nan' kind puts
    NaN scales in the first operand of make_inputs, which is why this decodes that one)."""
    inputs = make_inputs(Case(m=n, n=8, k=k, scales=scales), device, seed=seed)
    return inputs["a"], inputs["sfa"]


# N odd, N = 1, N past one 128-row block; K = 16 and 48 (K/16 not a multiple of 4, K not of 32), 64, 160.
SHAPES = ((1, 16), (37, 48), (129, 64), (200, 160), (8, 32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_matches_dequantize_bit_for_bit(device, dtype):
    for scales in ("typical", "tiny", "large", "nan"):
        nans = 0
        for i, (n, k) in enumerate(SHAPES):
            packed, sf = operand(n, k, scales, seed=100 * i + len(scales), device=device)
            poison_cuda_allocator(n * k * dtype.itemsize, device)
            got = decode(packed, sf, dtype)
            assert got.device.type == device
            want = dequantize(packed.cpu(), sf.cpu(), k, dtype)
            assert_same_bits(got, want, (scales, n, k, "dequantize"))
            nans += int(torch.isnan(want).sum())
        assert (nans > 0) == (scales == "nan"), (scales, nans)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_every_scale_byte_and_code(device):
    """All 256 e4m3 scale bytes (zero, subnormals, 448, both NaNs, negative ones) against all 256 packed bytes."""
    n, k = 256, 32  # 2 scales per row: row r holds scales r and 255 - r
    sf_lin = torch.stack((torch.arange(256), 255 - torch.arange(256)), dim=1).to(torch.uint8)
    packed = ((torch.arange(n * k // 2) * 37 + 11) % 256).to(torch.uint8).reshape(n, k // 2)
    sf = to_blocked(sf_lin.view(torch.float8_e4m3fn))
    for dtype in DTYPES:
        poison_cuda_allocator(n * k * dtype.itemsize, device)
        got = decode(packed.to(device), sf.to(device), dtype)
        assert_same_bits(got, dequantize(packed, sf, k, dtype), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_no_rows(device):
    """N = 0 (an empty weight) gives an empty [0, K] result, and launches nothing (a zero-block launch fails)."""
    out = decode(torch.empty(0, 32, dtype=torch.uint8, device=device), torch.empty(0, dtype=torch.uint8, device=device),
                 torch.bfloat16)
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16 and out.device.type == device


def random_bytes(rows: int, cols: int, seed: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=g).to(device)


def views(device: str):
    """(name, packed view, its scales, the same weight contiguous, its scales): what mm and the layers accept,
    and strides the CUDA kernel cannot read in place (copied first)."""
    out = []
    # A fused group's part: rows 128..255 of a 384-row weight, its scales a slice of the concatenated 1-D bytes.
    whole, whole_sf = operand(384, 64, "typical", 7, device)
    per_row = whole_sf.numel() // 384  # round_up(K/16, 4) bytes per row, as fused.py slices them
    part_sf = whole_sf.reshape(-1)[128 * per_row:256 * per_row]
    own_sf = to_blocked(from_blocked(whole_sf, 384, 64)[128:256])
    out.append(("fused row slice", whole[128:256], part_sf, whole[128:256].clone(), own_sf))
    _, sf = operand(37, 64, "tiny", 9, device)
    # Column slices: rows 36 bytes apart (not a multiple of 8: copied on CUDA) and 64 apart (read in place).
    for width in (36, 64):
        wide = random_bytes(37, width, 8 + width, device)
        out.append((f"row stride {width}", wide[:, :32], sf, wide[:, :32].contiguous(), sf))
    # A stride along K (a transposed copy read back transposed).
    p, sf = operand(40, 96, "large", 10, device)
    out.append(("stride along K", p.t().contiguous().t(), sf, p, sf))
    # A base 3 bytes into its storage (copied on CUDA) and 8 bytes in (read in place).
    _, sf = operand(24, 96, "typical", 12, device)
    for offset in (3, 8):
        p = random_bytes(1, offset + 24 * 48, 11, device)[0, offset:].view(24, 48)
        out.append((f"base offset {offset}", p, sf, p.clone(), sf))
    # float4_e2m1fn_x2 data; 2-D, 6-D and uint8 scale views.
    p, sf = operand(136, 96, "typical", 13, device)
    out.append(("float4_e2m1fn_x2", p.view(torch.float4_e2m1fn_x2), sf, p, sf))
    out.append(("2-D scales", p, sf.view(blocked_shape(136, 96)), p, sf))
    out.append(("6-D scales", p, permuted_view(sf, 136, 96), p, sf))
    out.append(("uint8 scales", p, sf.view(torch.uint8), p, sf))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_decode_views_equal_their_contiguous_copies(device):
    for name, p, sf, p_contig, sf_contig in views(device):
        k = p.shape[1] * 2
        for dtype in DTYPES:
            poison_cuda_allocator(p.shape[0] * k * dtype.itemsize, device)
            got = decode(p, sf, dtype)
            assert got.is_contiguous()
            assert_same_bits(got, dequantize(p_contig.cpu().view(torch.uint8), sf_contig.cpu(), k, dtype), (name, dtype))


def test_decode_weight_goes_through_the_op(monkeypatch):
    """The backward decodes with the op on the CPU (and CUDA): a spy on it sees the backward's call."""
    calls = []

    def spy(*args):
        calls.append(args[2])
        return decode.default(*args)

    monkeypatch.setattr(nvfp4_autograd, "_DECODE_OP", spy)
    packed, sf = operand(64, 96, "typical", 21, "cpu")
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(22)).requires_grad_(True)
    alpha = torch.tensor([0.5])
    nvfp4_gemm.linear(x, packed, sf, alpha, weight_only=True).sum().backward()
    assert calls == [torch.float32]
    want = (torch.ones(5, 64, dtype=torch.float64) @ dequantize(packed, sf, 96, torch.float64) * 0.5).float()
    assert torch.equal(x.grad, want)


def expect(pattern: str, *args) -> None:
    with pytest.raises(RuntimeError) as e:
        decode(*args)
    assert re.search(pattern, str(e.value)), f"message {str(e.value)!r} does not match {pattern!r}"


def test_decode_bad_inputs_name_the_argument():
    packed, sf = operand(40, 64, "typical", 31, "cpu")
    op = r"nvfp4_gemm\._decode: "
    expect(op + r"dtype must be torch.float16, torch.bfloat16 or torch.float32 .*got Double", packed, sf, torch.float64)
    expect(op + r"dtype must be .*got Int", packed, sf, torch.int32)
    expect(op + r"packed must be packed e2m1 data of dtype torch.uint8 or torch.float4_e2m1fn_x2, got Short",
           packed.to(torch.int16), sf, torch.float16)
    expect(op + r"packed must be 2-D \[N, K/2\] .*got 3-D tensor of shape \[1, 40, 32\]", packed[None], sf, torch.float16)
    expect(op + r"K = 2 \* packed.shape\[1\] must be a positive multiple of 16 .*got K=24", packed[:, :12], sf,
           torch.float16)
    expect(op + r"K = 2 \* packed.shape\[1\] must be a positive multiple of 16 .*got K=0", packed[:, :0], sf,
           torch.float16)
    expect(op + r"sf must hold e4m3 scales of dtype torch.float8_e4m3fn or torch.uint8, got Float", packed,
           sf.float(), torch.float16)
    expect(op + r"sf must hold round_up\(N,128\)\*round_up\(K/16,4\) = 128\*4 = 512 e4m3 values .*N=40, K=64\), "
           r"got 256", packed, sf[:256], torch.float16)
    expect(op + r"sf must be contiguous in the 128x4 blocked layout", packed,
           sf.view(torch.uint8).repeat_interleave(2)[::2], torch.float16)
    with pytest.raises(RuntimeError, match=op + r"sf must be on packed's device \(cpu\), got meta"):
        decode(packed, sf.to("meta"), torch.float16)


def test_decode_meta_and_opcheck():
    packed, sf = operand(40, 64, "typical", 41, "cpu")
    out = decode(packed.to("meta"), sf.to("meta"), torch.bfloat16)
    assert out.device.type == "meta" and out.shape == (40, 64) and out.dtype == torch.bfloat16
    for dtype in DTYPES:
        # uint8 scales: opcheck's checks multiply tensors, which float8 does not support on the CPU
        torch.library.opcheck(decode.default, (packed, sf.view(torch.uint8), dtype))


def test_decode_compiles():
    """torch.compile of a function calling the op (through decode_weight, as the backward does): the compiled
    graph holds the op and gives the eager numbers."""
    torch._dynamo.reset()
    packed, sf = operand(72, 96, "typical", 51, "cpu")
    scale = torch.tensor(0.25)

    def f(p, s, alpha):
        return nvfp4_autograd.decode_weight(p, s, torch.bfloat16).float() * alpha

    graphs = []

    def inductor_seeing_the_graph(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    compiled = torch.compile(f, fullgraph=True, backend=inductor_seeing_the_graph)
    assert torch.equal(compiled(packed, sf, scale), f(packed, sf, scale))
    assert [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"].count(decode.default) == 1
    want = dequantize(packed, sf, 96, torch.float32) * 0.25
    assert torch.equal(compiled(packed, sf, scale), want)


@requires_cuda
def test_decode_cuda_no_host_sync_and_graph_capture():
    """The CUDA op issues no host synchronization and replays in a CUDA graph to the decode of new bytes."""
    packed, sf = operand(200, 160, "typical", 61, "cuda")
    decode(packed, sf, torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode(packed, sf, torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode(packed, sf, torch.bfloat16)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = decode(packed, sf, torch.bfloat16)
    for seed in (62, 63):
        new_p, new_sf = operand(200, 160, "tiny", seed, "cuda")
        packed.copy_(new_p)
        sf.copy_(new_sf)
        out.fill_(float("nan"))
        graph.replay()
        assert_same_bits(out, dequantize(new_p.cpu(), new_sf.cpu(), 160, torch.bfloat16), seed)


@requires_cuda
def test_decode_cuda_argument_on_another_device():
    packed, sf = operand(40, 64, "typical", 71, "cuda")
    with pytest.raises(RuntimeError, match=r"nvfp4_gemm\._decode: sf must be on packed's device \(cuda:0\), got cpu"):
        decode(packed, sf.cpu(), torch.float16)
