"""The public ops and their fake (meta) implementations.

    nvfp4_gemm.mm      == torch.ops.nvfp4_gemm.mm      (torch.ops.nvfp4_gemm.mm_out with out=)
    nvfp4_gemm.linear  == torch.ops.nvfp4_gemm.linear  (one op per NVFP4Linear forward)
"""
from __future__ import annotations

import torch

from . import autograd as _autograd  # the ops' backward (registered on import)

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PACKED_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)


def mm(
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor | None,
    sfb: torch.Tensor,
    alpha: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """C[M, N] = alpha * (A * sfa) @ (B * sfb)^T for NVFP4 operands, or alpha * A @ (B * sfb)^T (weight-only).

    Args:
        a: the activations, in one of two forms:
            * NVFP4 (W4A4): [M, K/2] packed e2m1 (torch.uint8 or torch.float4_e2m1fn_x2), K-major; element 2i
              of a row in the low nibble of byte i. sfa holds its scales.
            * weight-only (W4A16): [M, K] torch.float16, torch.bfloat16 or torch.float32, K-major, with
              sfa=None. The values are used as they are (no quantization).
        b: [N, K/2] packed e2m1 (the weight, "TN" layout: C = A @ B^T).
        sfa, sfb: e4m3 scales (torch.float8_e4m3fn or torch.uint8), one per 16 K elements, in the 128x4
            blocked layout of docs/CONTRACT.md, as a flat 1-D tensor (`to_blocked`), a 2-D [round_up(R,128),
            round_up(K/16,4)] tensor, or the 6-D permuted view (`permuted_view`). Nothing else is accepted.
            sfa is None exactly when a is float (weight-only).
        alpha: None (1) or a one-element float32 tensor on the inputs' device (read on the device, so CUDA
            graphs stay valid): the product of the per-tensor global decode scales.
        out_dtype: torch.float16, torch.bfloat16 or torch.float32. Default: float16 for NVFP4 a, a's dtype
            for weight-only a. With `out`, None means out's dtype.
        out: optional [M, N] tensor of out_dtype on a's device with unit stride along N and rows 16 bytes
            apart; the result is written there (no allocation) and `out` is returned.

    Positional order (a, b, sfa, sfb, alpha, out_dtype) is vLLM's cutlass_scaled_fp4_mm order.

    Rules: K a multiple of 32, N a multiple of 8, any M >= 0 (M = 0 gives an empty result); M, N, K below
    2^31 on CUDA. On CUDA, a and b rows must be 16-byte aligned with unit stride along K. Products of decoded
    values are exact, accumulation is fp32 (or wider on the CPU), alpha is applied in fp32 and the result is
    rounded once to out_dtype, as torch._scaled_mm and CUTLASS's block-scaled SM100 GEMM do. Runs on the
    current CUDA stream; no host synchronization.
    """
    if out is None:
        return _autograd.call_mm(a, b, sfa, sfb, alpha, out_dtype)
    _autograd.refuse_out_with_grad(a, b, sfa, sfb, alpha, out)
    torch.ops.nvfp4_gemm.mm_out.default(a, b, sfa, sfb, alpha, out_dtype, out=out)
    return out


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    weight_only: bool = False,
) -> torch.Tensor:
    """y = x @ W^T + bias for an NVFP4 weight W, as one op (what NVFP4Linear.forward calls).

    Args:
        x: [..., K] float16, bfloat16 or float32 (any strides); y has x's leading dims and dtype.
        weight: [N, K/2] packed e2m1 (uint8 or float4_e2m1fn_x2).
        weight_scale: the weight's e4m3 block scales in the 128x4 blocked layout (any view `mm` accepts).
        weight_scale_2: float32 one-element tensor, the weight's per-tensor DECODE scale (ModelOpt's name).
        input_scale: float32 one-element tensor, the input's DECODE scale (static W4A4), or None.
        bias: [N] (any float dtype) or None; added in fp32 before the one rounding to x's dtype.
        weight_only: x stays in its dtype and multiplies the decoded weight (W4A16); input_scale must be None.

    Modes and their numerics (every step on x's device, no host sync):
      * weight-only: y = round(weight_scale_2 * x @ W_dq^T + bias).
      * static W4A4 (input_scale given): gs = 1 / input_scale; x_q = quantize(x, gs);
        y = round((input_scale * weight_scale_2) * x_q @ W_dq^T + bias).
      * dynamic W4A4: gs = global_encode_scale(finite_amax(x)), 1 / gs is the decode scale; as static after.
    W4A4 results are bit for bit those of quantize() followed by mm() with the same scales.
    """
    return _autograd.call_linear(x, weight, weight_scale, weight_scale_2, input_scale, bias, weight_only)


def _check_devices(op: str, ref_name: str, ref: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """Every tensor argument on the device of the op's first one. The dispatcher sends a call to these fakes
    as soon as ANY argument is on the meta device (a meta alpha with CPU a, say); without this check the
    fake would return an uninitialized tensor on a's device instead of an error."""
    for name, t in tensors.items():
        torch._check(t is None or t.device == ref.device,
                     lambda: f"{op}: {name} must be on {ref_name}'s device ({ref.device}), got {t.device}")


def _mm_result_dtype(a, out_dtype, out=None):
    weight_only = a.dtype in _ACT_DTYPES
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else (a.dtype if weight_only else torch.float16)
    torch._check(
        out_dtype in _OUT_DTYPES,
        lambda: f"nvfp4_gemm.mm: out_dtype must be float16, bfloat16 or float32, got {out_dtype}",
    )
    return out_dtype


def _check_mm_meta(a, b, sfa, sfb):
    weight_only = a.dtype in _ACT_DTYPES
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "nvfp4_gemm.mm: a and b must be 2-D")
    torch._check(b.dtype in _PACKED_DTYPES, lambda: f"nvfp4_gemm.mm: b must be packed e2m1, got {b.dtype}")
    if weight_only:
        torch._check(sfa is None, lambda: "nvfp4_gemm.mm: sfa must be None when a holds float activations")
        k = a.shape[1]
    else:
        torch._check(a.dtype in _PACKED_DTYPES, lambda: f"nvfp4_gemm.mm: a must be packed e2m1 or float, got {a.dtype}")
        torch._check(sfa is not None, lambda: "nvfp4_gemm.mm: sfa is required for packed e2m1 a")
        k = a.shape[1] * 2
    torch._check(k == b.shape[1] * 2, lambda: f"nvfp4_gemm.mm: a and b must have the same K, got {k} and {b.shape[1] * 2}")
    torch._check(k % 32 == 0, lambda: f"nvfp4_gemm.mm: K must be a multiple of 32, got {k}")
    torch._check(b.shape[0] % 8 == 0, lambda: f"nvfp4_gemm.mm: N must be a multiple of 8, got {b.shape[0]}")
    return a.shape[0], b.shape[0]


@torch.library.register_fake("nvfp4_gemm::mm")
def _mm_fake(a, b, sfa, sfb, alpha=None, out_dtype=None):
    _check_devices("nvfp4_gemm.mm", "a", a, b=b, sfa=sfa, sfb=sfb, alpha=alpha)
    m, n = _check_mm_meta(a, b, sfa, sfb)
    return a.new_empty((m, n), dtype=_mm_result_dtype(a, out_dtype))


@torch.library.register_fake("nvfp4_gemm::mm_out")
def _mm_out_fake(a, b, sfa, sfb, alpha=None, out_dtype=None, *, out):
    _check_devices("nvfp4_gemm.mm", "a", a, b=b, sfa=sfa, sfb=sfb, alpha=alpha, out=out)
    m, n = _check_mm_meta(a, b, sfa, sfb)
    dtype = _mm_result_dtype(a, out_dtype, out)
    torch._check(out.dtype == dtype, lambda: f"nvfp4_gemm.mm: out must have dtype {dtype}, got {out.dtype}")
    torch._check(tuple(out.shape) == (m, n), lambda: f"nvfp4_gemm.mm: out must have shape {(m, n)}, got {tuple(out.shape)}")


@torch.library.register_fake("nvfp4_gemm::linear")
def _linear_fake(x, weight, weight_scale, weight_scale_2, input_scale=None, bias=None, weight_only=False):
    torch._check(x.dim() >= 2, lambda: f"nvfp4_gemm.linear: x must be [..., K] with at least 2 dims, got {x.dim()}-D")
    torch._check(x.dtype in _ACT_DTYPES, lambda: f"nvfp4_gemm.linear: x must be float16, bfloat16 or float32, got {x.dtype}")
    torch._check(weight.dim() == 2, lambda: "nvfp4_gemm.linear: weight must be 2-D [N, K/2]")
    # A meta x with real weights dispatches here, not to the device kernels, which would have refused it.
    _check_devices("nvfp4_gemm.linear", "x", x, weight=weight, weight_scale=weight_scale,
                   weight_scale_2=weight_scale_2, input_scale=input_scale, bias=bias)
    torch._check(
        x.shape[-1] == weight.shape[1] * 2,
        lambda: f"nvfp4_gemm.linear: x.shape[-1] must be K = {weight.shape[1] * 2}, got {x.shape[-1]}",
    )
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("nvfp4_gemm::_input_scales")
def _input_scales_fake(x, weight_scale_2, input_scale=None):
    _check_devices("nvfp4_gemm._input_scales", "x", x, weight_scale_2=weight_scale_2, input_scale=input_scale)
    torch._check(x.dim() == 2, lambda: f"nvfp4_gemm._input_scales: x must be 2-D [rows, K], got {x.dim()}-D")
    return x.new_empty((3,), dtype=torch.float32)


@torch.library.register_fake("nvfp4_gemm::_decode")
def _decode_fake(packed, sf, dtype):
    op = "nvfp4_gemm._decode"
    torch._check(dtype in _ACT_DTYPES, lambda: f"{op}: dtype must be float16, bfloat16 or float32, got {dtype}")
    torch._check(packed.dtype in _PACKED_DTYPES,
                 lambda: f"{op}: packed must be packed e2m1 (uint8 or float4_e2m1fn_x2), got {packed.dtype}")
    torch._check(packed.dim() == 2, lambda: f"{op}: packed must be 2-D [N, K/2], got {packed.dim()}-D")
    _check_devices(op, "packed", packed, sf=sf)
    n, k = packed.shape[0], packed.shape[1] * 2
    torch._check(k > 0 and k % 16 == 0, lambda: f"{op}: K = 2 * packed.shape[1] must be a positive multiple of 16, got {k}")
    need = -(-n // 128) * 128 * (-(-(k // 16) // 4) * 4)
    torch._check(sf.numel() == need, lambda: f"{op}: sf must hold {need} blocked e4m3 scales for N={n}, K={k}, got {sf.numel()}")
    return packed.new_empty((n, k), dtype=dtype)
