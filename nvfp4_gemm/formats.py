"""The NVFP4 formats of docs/CONTRACT.md in plain PyTorch: e2m1 codes, e4m3 scales, the 128x4 blocked layout.

Everything here runs on any device and is the definition the kernels are tested against.
"""
from __future__ import annotations

import torch

SF_VEC = 16  # e2m1 elements per e4m3 scale
ATOM_ROWS, ATOM_COLS = 128, 4  # one blocked-layout atom: 128 rows x 4 scales = 512 contiguous bytes

# code -> value; sign = bit 3, code 8 is -0.0.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def blocked_shape(rows: int, k: int) -> tuple[int, int]:
    """[round_up(rows, 128), round_up(k / 16, 4)]: the padded scale matrix the blocked layout stores."""
    return round_up(rows, ATOM_ROWS), round_up(k // SF_VEC, ATOM_COLS)


def blocked_offset(r: int, s: int, sf_cols: int) -> int:
    """Byte offset of logical scale (r, s) in the blocked layout (docs/CONTRACT.md's formula)."""
    return ((r // 128) * ceil_div(sf_cols, 4) + s // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + s % 4


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def to_blocked(sf: torch.Tensor) -> torch.Tensor:
    """Linear [R, K/16] e4m3 scales -> the flat 128x4 blocked layout (zero padding), same dtype.

    Returns a 1-D tensor of round_up(R, 128) * round_up(K/16, 4) elements: PyTorch's `to_blocked`,
    cuBLAS's block-scaling layout and CUTLASS's Sm1xxBlkScaledConfig layout.
    """
    if sf.dim() != 2:
        raise ValueError(f"to_blocked: sf must be a 2-D [rows, K/16] scale matrix, got shape {tuple(sf.shape)}")
    rows, cols = sf.shape
    rp, cp = round_up(rows, ATOM_ROWS), round_up(cols, ATOM_COLS)
    padded = torch.zeros((rp, cp), dtype=torch.uint8, device=sf.device)
    padded[:rows, :cols] = _as_bytes(sf)
    # (row block, r4, r32, col block, s4) -> (row block, col block, r32, r4, s4)
    blocked = padded.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
    return blocked.view(sf.dtype) if sf.dtype != torch.uint8 else blocked


def blocked_bytes(sf_blocked: torch.Tensor) -> torch.Tensor:
    """Any accepted view (flat, 2-D padded, 6-D permuted) -> the flat uint8 buffer it addresses."""
    b = _as_bytes(sf_blocked)
    if b.dim() == 6:
        return b.as_strided((b.numel(),), (1,), b.storage_offset())
    return b.reshape(-1)


def from_blocked(sf_blocked: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """The inverse of to_blocked: blocked scales (any accepted view) -> linear [rows, K/16]."""
    rp, cp = blocked_shape(rows, k)
    flat = blocked_bytes(sf_blocked)
    if flat.numel() != rp * cp:
        raise ValueError(
            f"from_blocked: expected round_up({rows},128)*round_up({k}/16,4) = {rp * cp} scales, got {flat.numel()}"
        )
    linear = flat.view(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rp, cp)[:rows, : k // SF_VEC]
    return linear.view(sf_blocked.dtype) if sf_blocked.dtype != torch.uint8 else linear


def permuted_view(sf_blocked: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """The 6-D (32, 4, ceil(R/128), 4, ceil(S/4), 1) view of a blocked buffer (GPU MODE's sf*_permuted)."""
    rp, cp = blocked_shape(rows, k)
    rb, sb = rp // 128, cp // 4
    flat = sf_blocked.reshape(-1)
    return flat.as_strided((32, 4, rb, 4, sb, 1), (16, 4, sb * 512, 1, 512, rp * cp), flat.storage_offset())


def e4m3_to_float(sf: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes or float8_e4m3fn -> float32 (exact; 0x7F / 0xFF are NaN)."""
    return _as_bytes(sf).view(torch.float8_e4m3fn).to(torch.float32)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[rows, K/2] packed bytes -> [rows, K] codes 0..15 (element 2i from the low nibble of byte i)."""
    b = _as_bytes(packed)
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[rows, K] codes 0..15 -> [rows, K/2] uint8."""
    c = codes.to(torch.uint8).reshape(codes.shape[0], -1, 2)
    return c[..., 0] | (c[..., 1] << 4)


def dequantize(packed: torch.Tensor, sf_blocked: torch.Tensor, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, K/2] packed e2m1 + blocked e4m3 scales -> [rows, K] values e2m1 * scale in `dtype`.

    Exact in float16, bfloat16, float32 and float64 (the product of an e2m1 value and an e4m3 scale
    needs 5 significant bits and stays within [2^-10, 2688]).
    """
    if packed.dim() != 2 or packed.shape[1] * 2 != k:
        raise ValueError(f"dequantize: packed must be [rows, K/2] = [rows, {k // 2}], got {tuple(packed.shape)}")
    rows = packed.shape[0]
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    values = lut[unpack_e2m1(packed).long()]
    scales = e4m3_to_float(from_blocked(sf_blocked, rows, k)).repeat_interleave(SF_VEC, dim=1)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return (values.to(wide) * scales.to(wide)).to(dtype)
