"""NVFP4 quantization: nvfp4_gemm.quantize (the op, CPU and CUDA), its fake, and a pure-PyTorch reference.

The recipe (NVIDIA Model Optimizer's and torchao's two-level NVFP4), per 16-element block of a row, in fp32:

    amax  = max |x_i|                        NaN if any x_i is NaN
    s     = fl(fl(amax / 6) * gs)            gs: the per-tensor ENCODE scale (1 when absent)
    s8    = e4m3_rn_sat(s)                   round to nearest even; >= 448 or inf -> 448; NaN -> NaN (0x7F)
    inv   = fl(gs / float(s8)) if s8 > 0 else 0
    q_i   = fl(|x_i| * inv)                  reciprocal-multiply (torchao's nvfp4_quantize does the same)
    code  = sign(x_i) | e2m1_rne(q_i)        ties to even, saturating at 6 (inf and NaN too)

and a value decodes as e2m1(code) * float(s8) / gs. Conventions:
  * global_scale is the ENCODE scale, gs = 448 * 6 / amax(x) for the usual per-tensor amax
  (`global_encode_scale`). Its reciprocal, the DECODE scale amax(x) / 2688, is what goes into mm's alpha:
  alpha = decode_scale_a * decode_scale_b. (ModelOpt checkpoints store decode scales: weight_scale_2 and
  input_scale.)
  * All-zero blocks (and blocks whose scale rounds to 0) get scale 0 and codes +-0 (the sign of x is kept:
  -0.0 and tiny negatives give code 8). torchao instead clamps the block scale up to 2^-6; see
  docs/QUANTIZE.md for that difference.
  * NaN in a block makes its scale NaN (0x7F), the NaN elements' codes +-6 and the rest of the block +-0:
  mm then gives NaN exactly in the outputs that use that block (docs/CONTRACT.md). +-inf saturates: scale 448, the inf element +-6, so it decodes
  to +-2688 / gs and the rest of its block to (almost always) +-0. No input crashes.
  * global_scale may be a Python float or a one-element float32 tensor on x's device (read there: no host
  sync, CUDA-graph safe). It must be positive and finite: a Python float or a CPU tensor that is not is
  refused with an error naming it; a CUDA tensor is not read by the host, so there every block gets the NaN
  scale (0x7F) instead and everything computed from the result is NaN, never silently zero or sign-flipped.
"""
from __future__ import annotations

import math

import torch

from .formats import SF_VEC, to_blocked
from .ops import _check_devices

E2M1_MAX = 6.0
E4M3_MAX = 448.0
# The e2m1 rounding midpoints (exact in fp32) and which way an exact tie goes: '>' keeps a tie on the lower,
# even code (0, 1.0, 2.0, 4.0), '>=' moves it to the upper, even code (1.0, 2.0, 4.0).
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def quantize(x: torch.Tensor, global_scale: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] (float32 / float16 / bfloat16, K a multiple of 16) -> (packed, sf_blocked).

    packed: [R, K/2] torch.uint8, element 2i in the low nibble of byte i (docs/CONTRACT.md).
    sf_blocked: flat torch.float8_e4m3fn of round_up(R,128) * round_up(K/16,4) scales in the 128x4
    blocked layout, padding zero: ready for `mm` as sfa / sfb.
    global_scale: the per-tensor ENCODE scale (None: 1); see the module docstring for the recipe and the
    corner cases. Runs on x's device (CUDA kernel for SM >= 8.0, or the CPU); both agree bit for bit.
    """
    if global_scale is not None and not isinstance(global_scale, torch.Tensor):
        gs = float(global_scale)
        if not (0.0 < gs < math.inf):
            raise ValueError(f"nvfp4_gemm.quantize: global_scale must be positive and finite (the ENCODE scale, "
                             f"2688 / amax for the usual per-tensor amax), got {gs}")
        global_scale = torch.full((1,), gs, dtype=torch.float32, device=x.device)
    return torch.ops.nvfp4_gemm.quantize.default(x, global_scale)


@torch.library.register_fake("nvfp4_gemm::quantize")
def _quantize_fake(x, global_scale=None):
    _check_devices("nvfp4_gemm.quantize", "x", x, global_scale=global_scale)
    torch._check(x.dim() == 2, lambda: f"nvfp4_gemm.quantize: x must be 2-D [rows, K], got {x.dim()}-D")
    torch._check(
        x.dtype in (torch.float32, torch.float16, torch.bfloat16),
        lambda: f"nvfp4_gemm.quantize: x must be float32, float16 or bfloat16, got {x.dtype}",
    )
    rows, k = x.shape
    torch._check(k % SF_VEC == 0, lambda: f"nvfp4_gemm.quantize: K must be a positive multiple of 16, got {k}")
    if global_scale is not None:
        torch._check(global_scale.numel() == 1, lambda: "nvfp4_gemm.quantize: global_scale must hold 1 element")
    sf_bytes = ((rows + 127) // 128 * 128) * ((k // SF_VEC + 3) // 4 * 4)
    return x.new_empty((rows, k // 2), dtype=torch.uint8), x.new_empty((sf_bytes,), dtype=torch.float8_e4m3fn)


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """448 * 6 / amax as a one-element float32 tensor (on amax's device, no sync): the encode scale that maps
    the tensor's largest magnitude to the largest e2m1 value times the largest e4m3 scale. amax = 0 (an
    all-zero tensor) gives 1, and a result that would overflow fp32 is clamped to its largest finite value."""
    amax = amax.detach().to(torch.float32).reshape(1)
    gs = (E2M1_MAX * E4M3_MAX) / amax
    gs = torch.where(amax > 0, gs, torch.ones_like(gs))
    return torch.clamp(gs, max=torch.finfo(torch.float32).max)


def finite_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the finite elements (0 if none): a NaN or inf in x must not poison the per-tensor scale
    (NaN then stays in its own block, inf saturates)."""
    if x.numel() == 0:  # amax of nothing is an error in PyTorch; an empty batch has no scale to set
        return torch.zeros((), dtype=torch.float32, device=x.device)
    a = x.detach().abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax().to(torch.float32)


def _e4m3_rn_sat_bits(s: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3 bytes through PyTorch's own conversion (round to nearest even) after saturating."""
    s8 = torch.clamp(s, min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(s), torch.full_like(s8, 0x7F), s8)


def reference_quantize(x: torch.Tensor, global_scale: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe written in plain PyTorch (float32 tensor ops, PyTorch's e4m3 conversion): the definition
    the native implementations are tested against, bit for bit. Slow; any device."""
    if x.dim() != 2 or x.shape[1] % SF_VEC != 0:
        raise ValueError(f"reference_quantize: x must be [rows, K] with K a multiple of 16, got {tuple(x.shape)}")
    rows, k = x.shape
    gs = torch.ones((), dtype=torch.float32, device=x.device) if global_scale is None else (
        torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
    )
    raw = x.view(torch.int32 if x.dtype == torch.float32 else torch.int16)
    neg = (raw < 0).to(torch.uint8).reshape(rows, -1, SF_VEC)
    xa = x.to(torch.float32).abs().reshape(rows, -1, SF_VEC)
    amax = xa.amax(dim=-1)  # propagates NaN
    s8 = _e4m3_rn_sat_bits(amax / 6.0 * gs)
    usable = (gs > 0) & (gs <= torch.finfo(torch.float32).max)  # else every block's scale is NaN (recipe.h)
    s8 = torch.where(usable, s8, torch.full_like(s8, 0x7F))
    sf = s8.view(torch.float8_e4m3fn).to(torch.float32)
    inv = torch.where(sf > 0, gs / sf, torch.zeros_like(sf))
    q = xa * inv.unsqueeze(-1)
    mag = torch.zeros_like(q, dtype=torch.uint8)
    for mid, tie_up in _MIDPOINTS:
        mag += (q >= mid if tie_up else q > mid).to(torch.uint8)
    mag = torch.where(torch.isnan(q), torch.full_like(mag, 7), mag)
    codes = (neg << 3) | mag
    codes = codes.reshape(rows, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, to_blocked(s8.view(torch.float8_e4m3fn))
