"""The grouped (mixture-of-experts) NVFP4 GEMM and the helpers that feed it (docs/CONTRACT.md "Grouped GEMM").

    out = nvfp4_gemm.grouped_mm(a, b, sfa, sfb, offs, alpha=alpha)       # == torch.ops.nvfp4_gemm.grouped_mm
    packed, sfa, alpha = nvfp4_gemm.quantize_grouped(x, offs, input_scale, weight_scale_2=ws2)
    out = nvfp4_gemm.grouped_linear(x, weight, weight_scale, ws2, offs, input_scale)  # the two above in one call
    sfa = nvfp4_gemm.to_blocked_grouped(sf_linear, offs)

Rows of group g are a[offs[g-1]:offs[g]] (offs[-1] taken as 0), torch.nn.functional.grouped_mm's convention.
Everything here runs on the device without a host sync (offs, alpha and the token counts are never read by
the host on CUDA), so a CUDA graph stays valid when the routing changes between replays.
"""
from __future__ import annotations

import torch

from .formats import SF_VEC, dequantize, round_up

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PACKED_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)
_SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8)
_OP = "nvfp4_gemm.grouped_mm"

# The arch modules' grouped tables (sm90, sm100), found once the modules are imported (nvfp4_gemm/_loader.py
# imports them before this module).
_GROUPED_BACKENDS = list(torch.ops.nvfp4_gemm._register_grouped_backends())


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    sfa: torch.Tensor | None,
    sfb: torch.Tensor,
    offs: torch.Tensor,
    *,
    alpha: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[t] = alpha[g] * A_dq[t] @ B_dq[g]^T for every row t of group g: one NVFP4 GEMM per expert, one call.

    Args:
        a: the tokens, sorted by group, in one of two forms:
            * NVFP4 (W4A4): [T, K/2] packed e2m1 (torch.uint8 or torch.float4_e2m1fn_x2), with sfa its scales in
              the grouped blocked layout (`quantize_grouped` / `to_blocked_grouped` make it).
            * weight-only (W4A16): [T, K] float16 / bfloat16 / float32 activations, used as they are, sfa=None.
        b: [G, N, K/2] packed e2m1, one weight per group (expert), "TN": out = A @ B[g]^T. Groups may be strided
            (a slice of a larger stacked weight) but each row must be K-major.
        sfa: A's e4m3 scales, every group starting at a 128-row atom: group g's m_g rows blocked on their own
            (to_blocked of its m_g x K/16 scales, round_up(m_g,128) rows), the groups concatenated in order.
            Flat 1-D or 2-D [rows, round_up(K/16,4)], a whole number of 128-row atoms, at least round_up(T,128)
            rows; `grouped_sfa_rows(T, G)` rows are enough for every routing. A routing whose groups need more
            rows than sfa holds is an error on the CPU; on CUDA (where offs is not read by the host) the rows
            whose scales fall outside sfa come out NaN, and nothing is read past the buffer.
        sfb: [G, round_up(N,128), round_up(K/16,4)] or [G, round_up(N,128)*round_up(K/16,4)] e4m3, each group's
            blocked scales, contiguous.
        offs: int32 [G] on a's device, cumulative row ends: non-decreasing, offs[G-1] == T. Empty groups are
            fine. Read on the device only (CUDA): routing that breaks these rules gives wrong rows, never an
            out-of-bounds access; the CPU backend checks it and raises.
        alpha: None (1) or float32 [G] on a's device: each group's product of global decode scales.
        out_dtype: float16 (default for NVFP4 a), bfloat16 or float32; default a's dtype for weight-only a, or
            out's dtype when out is given.
        out: optional [T, N] tensor of the result dtype on a's device (unit stride along N, 16-byte rows on
            CUDA) to write into; returned.

    Numerics per row: those of `mm` (exact products, fp32 accumulation, alpha in fp32, one rounding).
    """
    if out is None:
        return torch.ops.nvfp4_gemm.grouped_mm.default(a, b, sfa, sfb, offs, alpha, out_dtype)
    torch.ops.nvfp4_gemm.grouped_mm_out.default(a, b, sfa, sfb, offs, alpha, out_dtype, out=out)
    return out


def grouped_sfa_rows(t: int, g: int) -> int:
    """Padded rows of the grouped blocked layout that no routing of t rows into g groups exceeds: each of the
    at most min(g, t) non-empty groups pads its rows up to a multiple of 128."""
    groups = min(t, g)
    return (t + groups * 127) // 128 * 128


def _routing(offs: torch.Tensor, t: int):
    """(starts, ends, row_group) as int64 on offs' device, offsets clamped to [0, t] and a decrease read as an
    empty group, the rules the CUDA kernels follow; no host sync."""
    ends = offs.to(torch.int64).clamp(0, t)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    ends = torch.maximum(ends, starts)
    rows = torch.arange(t, device=offs.device, dtype=torch.int64)
    row_group = torch.searchsorted(ends, rows, right=True).clamp(max=offs.numel() - 1)
    return starts, ends, row_group


def to_blocked_grouped(sf: torch.Tensor, offs: torch.Tensor, *, rows: int | None = None) -> torch.Tensor:
    """Linear [T, K/16] e4m3 scales of grouped tokens -> the grouped blocked layout `grouped_mm` takes as sfa.

    Group g's rows (offs as in grouped_mm) are blocked on their own starting at a 128-row atom. The result is a
    flat tensor of `rows` * round_up(K/16,4) values of sf's dtype (default rows: grouped_sfa_rows(T, G), enough
    for every routing), zero wherever no scale lands. Runs on sf's device without a host sync (offs is not read
    by the host); scales of a routing that would need more than `rows` rows are dropped, never written past the
    buffer.
    """
    if sf.dim() != 2:
        raise ValueError(f"to_blocked_grouped: sf must be 2-D [T, K/16] linear scales, got shape {tuple(sf.shape)}")
    if offs.dim() != 1 or offs.numel() < 1 or offs.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"to_blocked_grouped: offs must be 1-D int32 [G] cumulative row ends, got {offs.dtype} of "
                         f"shape {tuple(offs.shape)}")
    if offs.device != sf.device:
        raise ValueError(f"to_blocked_grouped: offs must be on sf's device ({sf.device}), got {offs.device}")
    t, s = sf.shape
    g = offs.numel()
    cap = grouped_sfa_rows(t, g) if rows is None else int(rows)
    if cap % 128 != 0 or cap < round_up(t, 128):
        raise ValueError(f"to_blocked_grouped: rows must be a multiple of 128 and at least round_up(T,128) = "
                         f"{round_up(t, 128)}, got {cap}")
    sp = round_up(s, 4)
    starts, ends, row_group = _routing(offs, t)
    padded = (ends - starts + 127) // 128 * 128
    pad_start = torch.cumsum(padded, 0) - padded
    dest = pad_start[row_group] + torch.arange(t, device=sf.device) - starts[row_group]
    dest = torch.where((dest >= 0) & (dest < cap), dest, torch.full_like(dest, cap))  # row `cap`: dropped
    src = sf.view(torch.uint8) if sf.dtype != torch.uint8 else sf
    src = torch.nn.functional.pad(src, (0, sp - s))
    lin = torch.zeros((cap + 1, sp), dtype=torch.uint8, device=sf.device)
    lin.index_copy_(0, dest, src)
    blocked = lin[:cap].view(cap // 128, 4, 32, sp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
    return blocked.view(sf.dtype) if sf.dtype != torch.uint8 else blocked


def quantize_grouped(
    x: torch.Tensor,
    offs: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    *,
    weight_scale_2: torch.Tensor | None = None,
    sfa_rows: int | None = None,
    one_input_scale: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize grouped tokens to NVFP4 with one per-tensor scale per group: x [T, K] float -> (packed [T, K/2]
    uint8, sfa in the grouped blocked layout (flat float8_e4m3fn, sfa_rows * round_up(K/16,4) values, default
    rows grouped_sfa_rows(T, G)), scale float32 [G]).

    input_scale: float32 [G] (or one value for every group) on x's device, each group's static DECODE input
    scale (ModelOpt's per-expert input_scale; the encode scale is its reciprocal); None: dynamic, each group's
    scale from the finite amax of its own rows (global_encode_scale); with one_input_scale=True (dynamic only) one
    scale for every group from the finite amax of all of x (a dynamic `linear` of x as one tensor: an MoE layer's
    per-tensor input scale over its experts). The bits are those of
    `nvfp4_gemm.quantize(x[rows of g], encode_g)` for every group (the same recipe, csrc/quant/recipe.h), placed
    as `to_blocked_grouped` places them.

    weight_scale_2: float32 [G] (or one value) on x's device, the experts' per-tensor weight scales. Given, the
    third output is each group's grouped_mm alpha, fl(decode_g * weight_scale_2[g]) (what `linear` forms for a
    dense layer), so grouped_mm takes it as it is; None: each group's DECODE scale (alpha is then
    decode * weight_scale_2, the same float32 product).

    One native call, no host sync. On CUDA one launch that writes the packed rows and every byte of sfa, each group
    worked by CTAs of its own, as many as its rows need, so a skewed routing's popular group is spread like any other
    (with dynamic scales, unless all the rows are a few CTAs' work, the groups' amax comes from a launch ahead); a
    programmatic dependent launch, so the grouped GEMM behind it starts while it runs. Offsets follow grouped_mm's
    CUDA rules (clamped, a decrease is an empty group); rows whose scales would lie past sfa_rows are not quantized
    (their GEMM rows then come out NaN on CUDA).
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_grouped: x must be 2-D [T, K], got shape {tuple(x.shape)}")
    g = offs.numel() if isinstance(offs, torch.Tensor) else 0
    if not isinstance(offs, torch.Tensor) or offs.dim() != 1 or g < 1 or offs.dtype != torch.int32:
        raise ValueError(f"quantize_grouped: offs must be 1-D int32 [G] cumulative row ends, got "
                         f"{getattr(offs, 'dtype', type(offs).__name__)} of shape {tuple(getattr(offs, 'shape', ()))}")
    if one_input_scale and input_scale is not None:
        raise ValueError("quantize_grouped: one_input_scale=True forms one dynamic scale from all of x; input_scale "
                         f"must then be None, got {type(input_scale).__name__}")
    t = x.shape[0]
    rows = grouped_sfa_rows(t, g) if sfa_rows is None else int(sfa_rows)
    return torch.ops.nvfp4_gemm._quantize_grouped.default(
        x, offs, _per_group("input_scale", input_scale, g), _per_group("weight_scale_2", weight_scale_2, g), rows,
        bool(one_input_scale))


def _per_group(name: str, v: torch.Tensor | None, g: int, op: str = "quantize_grouped") -> torch.Tensor | None:
    """A per-group float32 argument as a contiguous [G] tensor (one value broadcast), or None."""
    if v is None:
        return None
    if not isinstance(v, torch.Tensor):
        raise ValueError(f"{op}: {name} must be a float32 tensor [G] on x's device or None, got {type(v).__name__}")
    if v.dtype != torch.float32 or v.numel() not in (1, g) or g < 1:
        raise ValueError(f"{op}: {name} must be float32 with G = {g} values (or one for every group), "
                         f"got {v.dtype} of shape {tuple(v.shape)}")
    return v.detach().reshape(-1).expand(g).contiguous()


def grouped_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    offs: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    *,
    weight_only: bool = False,
    out_dtype: torch.dtype | None = None,
    one_input_scale: bool = False,
) -> torch.Tensor:
    """The grouped form of `nvfp4_gemm.linear`: float activations x [T, K] (tokens sorted by group) times each
    group's NVFP4 weight [G, N, K/2] with its blocked scales and per-tensor scale weight_scale_2 [G] (or one value).

      * weight_only=True: x as it is (W4A16), alpha = weight_scale_2: `grouped_mm(x, weight, None, weight_scale, ...)`.
      * W4A4 (the default): the bits of `quantize_grouped(x, offs, input_scale, weight_scale_2=weight_scale_2)`
        followed by `grouped_mm` with that alpha; input_scale [G] (or one value) gives static per-group scales
        (ModelOpt's per-expert input scales), None dynamic ones from each group's own rows, or with
        one_input_scale=True one dynamic scale for all groups from all of x. On CUDA the GEMM is launched behind the
        quantization so that it streams its weights while A is quantized.
    out_dtype: default x's dtype. No host sync; offs follows grouped_mm's rules.
    """
    g = offs.numel() if isinstance(offs, torch.Tensor) else 0
    out_dtype = x.dtype if out_dtype is None else out_dtype
    ws2 = _per_group("weight_scale_2", weight_scale_2, g, "grouped_linear")
    if ws2 is None:
        raise ValueError("grouped_linear: weight_scale_2 must be a float32 tensor [G] (or one value), got None")
    if weight_only:
        if input_scale is not None or one_input_scale:
            raise ValueError("grouped_linear: weight_only=True takes no input_scale nor one_input_scale (the activations "
                             "are not quantized)")
        return grouped_mm(x, weight, None, weight_scale, offs, alpha=ws2, out_dtype=out_dtype)
    if one_input_scale and input_scale is not None:
        raise ValueError("grouped_linear: one_input_scale=True forms one dynamic scale from all of x; input_scale must "
                         f"then be None, got {type(input_scale).__name__}")
    return torch.ops.nvfp4_gemm._grouped_linear.default(
        x, weight, weight_scale, offs, _per_group("input_scale", input_scale, g, "grouped_linear"), ws2, out_dtype,
        bool(one_input_scale))


# --- The reference ----------------------------------------------------------------------------------------


def _group_ends_host(offs: torch.Tensor, t: int) -> list[int]:
    ends = [int(v) for v in offs.cpu().tolist()]
    prev = 0
    for i, e in enumerate(ends):
        if e < prev:
            raise ValueError(f"offs must be non-decreasing from 0, got offs[{i}] = {e} after {prev}")
        prev = e
    if prev != t:
        raise ValueError(f"offs[G-1] must equal T = {t}, got {prev}")
    return ends


def grouped_operands_f64(a, b, sfa, sfb, offs):
    """(A_dq [T, K], list of B_dq[g] [N, K]) in float64 on the CPU, decoding each group's rows of A from its
    place in the grouped blocked layout (host reads of offs: a reference, not for the hot path)."""
    t = a.shape[0]
    g, n, half_k = b.shape
    k = half_k * 2
    ends = _group_ends_host(offs, t)
    bd = [dequantize(b[i].cpu(), sfb.reshape(g, -1)[i].cpu(), k, torch.float64) for i in range(g)]
    if sfa is None:
        return a.detach().cpu().to(torch.float64), bd, ends
    sp = round_up(k // SF_VEC, 4)
    flat = sfa.cpu().reshape(-1)
    ad = torch.empty((t, k), dtype=torch.float64)
    start = pad = 0
    for e in ends:
        m = e - start
        if m:
            rows = round_up(m, 128)
            ad[start:e] = dequantize(a[start:e].cpu(), flat[pad * sp:(pad + rows) * sp], k, torch.float64)
            pad += rows
        start = e
    return ad, bd, ends


def reference_grouped_mm(a, b, sfa, sfb, offs, alpha=None, out_dtype=None) -> torch.Tensor:
    """grouped_mm in float64 on the CPU, group by group (decode, exact sum, alpha[g]), rounded to out_dtype via
    float32 (as reference_mm does); returned on a's device. The source of truth of the grouped tests."""
    if out_dtype is None:
        out_dtype = a.dtype if sfa is None else torch.float16
    ad, bd, ends = grouped_operands_f64(a, b, sfa, sfb, offs)
    out = torch.zeros((a.shape[0], b.shape[1]), dtype=torch.float64)
    start = 0
    for i, e in enumerate(ends):
        if e > start:
            out[start:e] = ad[start:e] @ bd[i].T
            if alpha is not None:
                out[start:e] *= float(alpha.reshape(-1)[i])
        start = e
    return out.to(out_dtype).to(a.device)


# --- Fake (meta) kernels ----------------------------------------------------------------------------------


def _check_devices(ref: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        torch._check(t is None or t.device == ref.device,
                     lambda: f"{_OP}: {name} must be on a's device ({ref.device}), got {t.device}")


def _grouped_meta(a, b, sfa, sfb, offs, alpha, out_dtype, out=None):
    _check_devices(a, b=b, sfa=sfa, sfb=sfb, offs=offs, alpha=alpha, out=out)
    weight_only = a.dtype in _ACT_DTYPES
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else (a.dtype if weight_only else torch.float16)
    torch._check(out_dtype in _OUT_DTYPES,
                 lambda: f"{_OP}: out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    torch._check(b.dim() == 3 and b.dtype in _PACKED_DTYPES,
                 lambda: f"{_OP}: b must be packed e2m1 [G, N, K/2], got {b.dtype} of shape {tuple(b.shape)}")
    torch._check(a.dim() == 2, lambda: f"{_OP}: a must be 2-D, got shape {tuple(a.shape)}")
    if weight_only:
        torch._check(sfa is None, lambda: f"{_OP}: sfa must be None when a holds float activations")
        k = a.shape[1]
    else:
        torch._check(a.dtype in _PACKED_DTYPES, lambda: f"{_OP}: a must be packed e2m1 or float, got {a.dtype}")
        torch._check(sfa is not None, lambda: f"{_OP}: sfa is required for packed e2m1 a")
        k = a.shape[1] * 2
    g, n = b.shape[0], b.shape[1]
    torch._check(b.shape[2] * 2 == k, lambda: f"{_OP}: a and b must have the same K, got {k} and {b.shape[2] * 2}")
    torch._check(k > 0 and k % 32 == 0, lambda: f"{_OP}: K must be a positive multiple of 32, got {k}")
    torch._check(n % 8 == 0, lambda: f"{_OP}: N must be a multiple of 8, got {n}")
    torch._check(g >= 1, lambda: f"{_OP}: b must hold at least one group")
    torch._check(offs.dtype == torch.int32 and offs.dim() == 1 and offs.shape[0] == g,
                 lambda: f"{_OP}: offs must be int32 [G] = [{g}], got {offs.dtype} of shape {tuple(offs.shape)}")
    sp = round_up(k // SF_VEC, 4)
    torch._check(sfb.dtype in _SCALE_DTYPES and sfb.numel() == g * round_up(n, 128) * sp,
                 lambda: f"{_OP}: sfb must hold G*round_up(N,128)*round_up(K/16,4) = {g * round_up(n, 128) * sp} "
                         f"e4m3 values, got {sfb.numel()} of {sfb.dtype}")
    if sfa is not None:
        torch._check(sfa.dtype in _SCALE_DTYPES and sfa.numel() % (128 * sp) == 0
                     and sfa.numel() >= round_up(a.shape[0], 128) * sp,
                     lambda: f"{_OP}: sfa must hold a whole number of 128-row blocks of {128 * sp} e4m3 values and at "
                             f"least round_up(T,128)*round_up(K/16,4) = {round_up(a.shape[0], 128) * sp}, got "
                             f"{sfa.numel()} of {sfa.dtype}")
    if alpha is not None:
        torch._check(alpha.dtype == torch.float32 and alpha.dim() == 1 and alpha.shape[0] == g,
                     lambda: f"{_OP}: alpha must be float32 [G] = [{g}], got {alpha.dtype} of shape {tuple(alpha.shape)}")
    return a.shape[0], n, out_dtype


@torch.library.register_fake("nvfp4_gemm::grouped_mm")
def _grouped_mm_fake(a, b, sfa, sfb, offs, alpha=None, out_dtype=None):
    t, n, dtype = _grouped_meta(a, b, sfa, sfb, offs, alpha, out_dtype)
    return a.new_empty((t, n), dtype=dtype)


@torch.library.register_fake("nvfp4_gemm::grouped_mm_out")
def _grouped_mm_out_fake(a, b, sfa, sfb, offs, alpha=None, out_dtype=None, *, out):
    t, n, dtype = _grouped_meta(a, b, sfa, sfb, offs, alpha, out_dtype, out)
    torch._check(out.dtype == dtype, lambda: f"{_OP}: out must have dtype {dtype}, got {out.dtype}")
    torch._check(tuple(out.shape) == (t, n), lambda: f"{_OP}: out must have shape {(t, n)}, got {tuple(out.shape)}")


@torch.library.register_fake("nvfp4_gemm::_quantize_grouped")
def _quantize_grouped_fake(x, offs, input_scale, weight_scale_2, sfa_rows, one_scale=False):
    op = "nvfp4_gemm.quantize_grouped"
    _check_devices(x, offs=offs, input_scale=input_scale, weight_scale_2=weight_scale_2)
    torch._check(x.dim() == 2, lambda: f"{op}: x must be 2-D, got {x.dim()}-D")
    torch._check(x.dtype in _ACT_DTYPES, lambda: f"{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    t, k = x.shape
    torch._check(k % SF_VEC == 0, lambda: f"{op}: K must be a multiple of 16, got {k}")
    torch._check(offs.dtype == torch.int32 and offs.dim() == 1, lambda: f"{op}: offs must be int32 [G]")
    torch._check(sfa_rows % 128 == 0, lambda: f"{op}: sfa_rows must be a multiple of 128, got {sfa_rows}")
    sp = round_up(k // SF_VEC, 4)
    return (x.new_empty((t, k // 2), dtype=torch.uint8), x.new_empty((sfa_rows * sp,), dtype=torch.float8_e4m3fn),
            x.new_empty((offs.shape[0],), dtype=torch.float32))


@torch.library.register_fake("nvfp4_gemm::_grouped_linear")
def _grouped_linear_fake(x, b, sfb, offs, input_scale, weight_scale_2, out_dtype=None, one_scale=False):
    op = "nvfp4_gemm.grouped_linear"
    _check_devices(x, b=b, sfb=sfb, offs=offs, input_scale=input_scale, weight_scale_2=weight_scale_2)
    torch._check(x.dim() == 2, lambda: f"{op}: x must be 2-D [T, K], got {x.dim()}-D")
    torch._check(x.dtype in _ACT_DTYPES, lambda: f"{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    torch._check(b.dim() == 3, lambda: f"{op}: weight must be [G, N, K/2], got {b.dim()}-D")
    torch._check(b.shape[2] * 2 == x.shape[1], lambda: f"{op}: weight's K {b.shape[2] * 2} != x's {x.shape[1]}")
    dtype = x.dtype if out_dtype is None else out_dtype
    torch._check(dtype in _OUT_DTYPES, lambda: f"{op}: out_dtype must be float16, bfloat16 or float32, got {dtype}")
    return x.new_empty((x.shape[0], b.shape[1]), dtype=dtype)


def grouped_backends() -> list[str]:
    """The arch backends whose modules brought grouped kernels (sm90, sm100), preferred first; the generic CUDA
    path and the CPU backend always run the grouped GEMM."""
    return list(torch.ops.nvfp4_gemm._grouped_backends())


def grouped_configs() -> dict[str, list[str]]:
    """Each grouped arch backend's kernel configs by name (what NVFP4_GEMM_CONFIG accepts for grouped_mm)."""
    return {name: list(torch.ops.nvfp4_gemm._grouped_configs(name)) for name in grouped_backends()}


__all__ = ["grouped_mm", "grouped_linear", "grouped_sfa_rows", "to_blocked_grouped", "quantize_grouped",
           "reference_grouped_mm", "grouped_backends", "grouped_configs"]
