"""The blocked scale layout, nibble order and decode helpers against docs/CONTRACT.md's definitions."""
from __future__ import annotations

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.formats import E2M1_VALUES, blocked_offset


@pytest.mark.parametrize("rows,k", [(1, 32), (7, 96), (128, 64), (129, 320), (300, 544), (256, 2048)])
def test_to_blocked_matches_offset_formula(rows, k):
    s = k // 16
    g = torch.Generator().manual_seed(rows * 100_000 + k)
    lin = torch.randint(0, 256, (rows, s), dtype=torch.uint8, generator=g)
    blk = nvfp4_gemm.to_blocked(lin)
    rp, cp = nvfp4_gemm.blocked_shape(rows, k)
    assert blk.shape == (rp * cp,)
    expect = torch.zeros(rp * cp, dtype=torch.uint8)
    for r in range(rows):
        for c in range(s):
            expect[blocked_offset(r, c, s)] = lin[r, c]
    assert torch.equal(blk, expect)  # includes zero padding everywhere else
    assert torch.equal(nvfp4_gemm.from_blocked(blk, rows, k), lin)


def test_offset_formula_is_a_bijection_onto_the_padded_buffer():
    rows, k = 300, 544
    rp, cp = nvfp4_gemm.blocked_shape(rows, k)
    offs = {blocked_offset(r, c, cp) for r in range(rp) for c in range(cp)}
    assert offs == set(range(rp * cp))


def test_permuted_view_reads_the_same_scales():
    rows, k = 200, 320
    g = torch.Generator().manual_seed(2)
    lin = torch.randint(0, 256, (rows, k // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    blk = nvfp4_gemm.to_blocked(lin)
    six = nvfp4_gemm.permuted_view(blk, rows, k)
    assert six.shape == (32, 4, 2, 4, 5, 1)
    assert six.data_ptr() == blk.data_ptr()
    # six[r32, r4, rb, s4, sb, 0] is logical scale (rb*128 + r4*32 + r32, sb*4 + s4)
    padded = torch.zeros(256, 20, dtype=torch.uint8)
    padded[:rows] = lin.view(torch.uint8)
    for r in (0, 31, 32, 127, 128, 199):
        for c in (0, 3, 4, 19):
            assert six.view(torch.uint8)[r % 32, (r % 128) // 32, r // 128, c % 4, c // 4, 0] == padded[r, c]
    assert torch.equal(nvfp4_gemm.from_blocked(six, rows, k).view(torch.uint8), lin.view(torch.uint8))


def test_to_blocked_rejects_non_2d():
    with pytest.raises(ValueError, match="2-D"):
        nvfp4_gemm.to_blocked(torch.zeros(8, dtype=torch.uint8))


def test_nibble_order_and_e2m1_values():
    """Element 2i in the low nibble: byte 0x21 holds codes (1, 2) = (0.5, 1.0)."""
    packed = torch.tensor([[0x21, 0xF8] + [0] * 14], dtype=torch.uint8)
    sf = nvfp4_gemm.to_blocked(torch.full((1, 2), 0x38, dtype=torch.uint8))  # scale 1.0
    out = nvfp4_gemm.dequantize(packed, sf, 32, torch.float32)
    assert out[0, :4].tolist() == [0.5, 1.0, -0.0, -6.0]
    assert str(out[0, 2].item()) == "-0.0"
    assert nvfp4_gemm.unpack_e2m1(packed)[0, :4].tolist() == [1, 2, 8, 15]
    assert torch.equal(nvfp4_gemm.pack_e2m1(nvfp4_gemm.unpack_e2m1(packed)), packed)


def test_dequantize_against_bitwise_decode():
    """dequantize equals an independent bit-level decode of e2m1 and e4m3 (incl. subnormals, NaN)."""
    g = torch.Generator().manual_seed(1)
    rows, k = 130, 96
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    sf_bits = torch.randint(0, 256, (rows, k // 16), dtype=torch.uint8, generator=g)
    got = nvfp4_gemm.dequantize(packed, nvfp4_gemm.to_blocked(sf_bits), k, torch.float64)

    def e4m3(bits: int) -> float:
        sign, exp, man = bits >> 7, (bits >> 3) & 15, bits & 7
        if exp == 15 and man == 7:
            return float("nan")
        v = man * 2.0**-9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        return -v if sign else v

    for r in range(0, rows, 7):
        for j in range(k):
            byte = int(packed[r, j // 2])
            code = (byte >> 4) if j % 2 else (byte & 15)
            want = E2M1_VALUES[code] * e4m3(int(sf_bits[r, j // 16]))
            g_ = got[r, j].item()
            assert (g_ != g_ and want != want) or g_ == want, (r, j, g_, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dequantize_is_exact_in_narrow_dtypes(dtype):
    """Every e2m1 value times every finite e4m3 scale is representable in fp16, bf16 and fp32."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(2)  # one row, 32 codes
    for sbits in [b for b in range(256) if (b & 0x7F) != 0x7F]:
        packed = nvfp4_gemm.pack_e2m1(codes.view(1, 32))
        sf = nvfp4_gemm.to_blocked(torch.full((1, 2), sbits, dtype=torch.uint8))
        exact = nvfp4_gemm.dequantize(packed, sf, 32, torch.float64)
        assert torch.equal(nvfp4_gemm.dequantize(packed, sf, 32, dtype).to(torch.float64), exact), sbits
