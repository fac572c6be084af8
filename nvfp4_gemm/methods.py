"""How an NVFP4 weight's block scales and codes are chosen: "rtn", "mse" and "gptq".

    packed, sf_blocked, weight_scale_2 = quantize_weight(w, method, hessian=None, **options)

All three return ordinary NVFP4 tensors (packed e2m1 [N, K/2] uint8, the flat 128x4 blocked e4m3 scales of
[N, K/16], the per-tensor DECODE scale as float32 [1]): every kernel, NVFP4Linear mode and checkpoint
writer takes them unchanged. They differ only in which legal scales and codes they pick.

* "rtn": NVIDIA Model Optimizer's recipe, bitwise what `NVFP4Linear.from_linear` has always done:
  gs = 2688 / finite amax(W), then `nvfp4_gemm.quantize(w, gs)` (block scale = e4m3(amax_b / 6 * gs), each
  value rounded to the nearest e2m1 code).
* "mse": per 16-element block, the e4m3 scale that minimizes the block's squared reconstruction error over a
  small candidate set: rtn's scale (amax_b -> 6) and its `neighbours` e4m3 neighbours on each side, and the
  scale mapping amax_b -> 4 with its neighbours; every element takes the nearest e2m1 code for the scale
  (the same reciprocal-multiply rounding as rtn). With `hessian=` (a layer's [K, K] input second moment H,
  or its diagonal [K]) each element's squared error is weighted by its input column's H_kk, the mean square
  activation it is multiplied by: the diagonal part of the layer's output error, which the unweighted error
  spreads evenly over columns that matter very differently. The per-tensor scale is chosen the same way, by total
  error, among gs * 2^(-j / global_candidates), j = 0 .. global_candidates - 1 (j = 0 is rtn's; the default,
  global_candidates=1, keeps rtn's per-tensor scale: on SmolLM2-135M the search lowered the weight error
  but not the perplexity, at 4x the time). Because
  rtn's (scale, codes) pair is always a candidate and ties keep it, no block is ever worse than rtn under
  the same per-tensor scale (and the same objective), and the chosen per-tensor scale never gives a larger
  total than rtn's. The search runs natively (csrc/quant/mse_search.h, one pass on the CPU or one CUDA
  kernel); `reference_mse` is its plain-PyTorch definition.
* "gptq": GPTQ (Frantar et al., 2022) on the NVFP4 grid: columns are quantized one at a time and each
  column's rounding error is spread over the columns not yet quantized, weighted by the inverse Hessian
  of the layer's calibration inputs (H = 2/n sum x x^T, `HessianAccumulator`), so that the layer's OUTPUT
  on those inputs moves as little as possible. Block scales stay per 16 original columns: a block's scale
  is fixed (rtn or mse choice, option `scale`) when the first of its columns is reached, from the current,
  error-updated values of all 16 of its columns, none of which has been quantized yet.

Determinism of "mse" (CPU and CUDA give the same bits): every quantity that decides a choice is computed
by IEEE-754 operations in a fixed order, each correctly rounded on both devices, never by a reduction whose
order a backend picks. The native search is one C++ definition compiled by g++ and nvcc (explicit
round-to-nearest intrinsics on the device, so nothing is contracted into a fused multiply-add), and it
performs, operation for operation, what `reference_mse` does with PyTorch ops:
  - r = |x| * gs in float64 is exact (a 24-bit by 24-bit product); a code's value v = e2m1 * scale is exact
    (2 + 4 significant bits); their difference is exact too: v is the nearest grid point to r (or 0, or the
    saturated top of the grid), so the two lie within a few binades of each other and r - v needs fewer
    than 53 bits (and because v is an exact product, the kernel's single FMA for r - v equals the
    multiply and subtract done elsewhere);
  - the 16 squared differences (each times its column weight, float64, with hessian=) are summed pairwise
    (e0 + e1, e2 + e3, ..., then pairs of those), the same tree on every device;
  - a block keeps a candidate only if its error is strictly smaller, candidates tried in a fixed order;
  - per-tensor totals are sums of integers: each block error is scaled by a power of two (exact), floored
    and summed as int64 (exact and order-free: the exponent is chosen so the sum cannot overflow).
Block amax is exact whatever the order. The tests hold the native search to `reference_mse` (on the CPU,
where PyTorch's tensor / number division is a true division, as the native code's is) and CPU to CUDA.
GPTQ's matrix products are NOT order-free: its results can differ between devices in rare near-tie roundings.

NaN / inf: "rtn" and "mse" keep quantize()'s handling (a NaN block gets a NaN scale and +-6 at the NaN,
+-inf saturates); "mse" leaves every non-finite block exactly as rtn has it and excludes it from the
per-tensor totals. "gptq" refuses non-finite weights or Hessians (the error propagation would spread them).
"""
from __future__ import annotations

import math

import torch

from .formats import SF_VEC, pack_e2m1, to_blocked
from .ops import _check_devices
from .quantize import _MIDPOINTS, _e4m3_rn_sat_bits, finite_amax, global_encode_scale, quantize

METHODS = ("rtn", "mse", "gptq")

_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E4M3_MAX_BYTE = 0x7E  # 448; 0x7F is NaN
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def quantize_weight(
    w: torch.Tensor,
    method: str = "rtn",
    *,
    hessian: torch.Tensor | None = None,
    **options,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] (float32 / float16 / bfloat16, K a multiple of 16) -> (packed uint8 [N, K/2], flat blocked
    float8_e4m3fn scales, weight_scale_2 float32 [1], the DECODE scale), on w's device.

    method: "rtn" (no options), "mse" (options: neighbours=2, global_candidates=1, clip=True; hessian [K, K] or
    its diagonal [K] optional: weights each column's error by it), "gptq" (hessian [K, K] required; options: percdamp=0.01, block_size=128, act_order=True, scale="mse" or "rtn", neighbours=2,
    global_candidates=1, clip=True). See the module docstring for what each chooses.
    global_scale (an option of every method): a one-element per-tensor ENCODE scale to use instead of the weight's own
    (rtn's 2688 / amax, or mse's search): layers fused into one GEMM must share one.
    """
    if method not in METHODS:
        raise ValueError(f"quantize_weight: method must be one of {METHODS}, got {method!r}")
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"quantize_weight: w must be a 2-D [N, K] tensor, got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    if w.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"quantize_weight: w must be float32, float16 or bfloat16, got {w.dtype}")
    if w.shape[1] == 0 or w.shape[1] % SF_VEC != 0:
        raise ValueError(f"quantize_weight: K (w.shape[1]) must be a positive multiple of 16, got {w.shape[1]}")
    w = w.detach()
    global_scale = _check_global_scale(options.pop("global_scale", None), w, options)
    if method == "gptq":
        if hessian is None:
            raise ValueError("quantize_weight: method 'gptq' needs hessian= [K, K] (HessianAccumulator.hessian())")
        return _gptq(w, hessian, global_scale=global_scale, **options)
    if method == "rtn":
        if hessian is not None:
            raise ValueError("quantize_weight: hessian= is used only by methods 'mse' and 'gptq', got it with 'rtn'")
        if options:
            raise TypeError(f"quantize_weight: method 'rtn' takes no options, got {sorted(options)}")
        gs = global_encode_scale(finite_amax(w)) if global_scale is None else global_scale
        packed, sf = quantize(w, gs)
        return packed, sf, 1.0 / gs
    return _mse(w, weight=None if hessian is None else _column_weights(hessian, w), global_scale=global_scale,
                **options)


def _check_global_scale(gs, w: torch.Tensor, options: dict) -> torch.Tensor | None:
    """The `global_scale` option: a per-tensor ENCODE scale imposed from outside (layers fused into one GEMM
    share one, from the group's largest |w|), as a float32 [1] on w's device; it replaces the per-tensor
    search, so it excludes global_candidates > 1."""
    if gs is None:
        return None
    if not isinstance(gs, torch.Tensor) or gs.numel() != 1:
        raise ValueError(f"quantize_weight: global_scale must be a one-element tensor, got "
                         f"{tuple(gs.shape) if isinstance(gs, torch.Tensor) else type(gs).__name__}")
    if options.get("global_candidates", 1) != 1:
        raise ValueError("quantize_weight: global_scale fixes the per-tensor scale; global_candidates must be 1")
    return gs.detach().to(device=w.device, dtype=torch.float32).reshape(1)


class HessianAccumulator:
    """H = 2/n sum_i x_i x_i^T over every row x_i [K] of the inputs a layer sees during calibration.

    add(x [..., K]) runs on x's device without a host sync (usable inside a forward hook); rows holding a
    NaN or inf are left out (they would poison every entry of H) and not counted. hessian() -> [K, K] float32.
    The running sum is kept in float32 (K^2 values: one layer's Hessian at a time is the intended use).
    diagonal=True keeps only diag(H) = 2/n sum_i x_i^2 (K values; what "mse" weighs its columns by), and
    hessian() then returns [K].
    """

    def __init__(self, in_features: int, device: torch.device | str | None = None, *, diagonal: bool = False) -> None:
        if in_features <= 0:
            raise ValueError(f"HessianAccumulator: in_features must be positive, got {in_features}")
        self.in_features = in_features
        self.diagonal = diagonal
        shape = (in_features,) if diagonal else (in_features, in_features)
        self._sum = torch.zeros(shape, dtype=torch.float32, device=device)
        self._rows = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"HessianAccumulator.add: x.shape[-1] must be in_features = {self.in_features}, "
                             f"got {x.shape[-1]}")
        x = x.detach().reshape(-1, self.in_features).to(device=self._sum.device, dtype=torch.float32)
        finite = torch.isfinite(x).all(dim=1, keepdim=True)
        x = torch.where(finite, x, torch.zeros_like(x))
        if self.diagonal:
            self._sum += (x * x).sum(dim=0)
        else:
            self._sum.addmm_(x.T, x)
        self._rows += finite.sum()

    @property
    def rows(self) -> int:
        return int(self._rows.item())

    def hessian(self) -> torch.Tensor:
        """2/n * sum x x^T, or its diagonal [K] (all zeros before any row was added)."""
        return self._sum * (2.0 / self._rows.clamp(min=1)).to(torch.float32)


# ---------------------------------------------------------------------------------------------- shared pieces

def _round_e2m1(q: torch.Tensor) -> torch.Tensor:
    """|value| / scale (fp32, >= 0 or NaN) -> e2m1 magnitude code 0..7: nearest, ties to even, >= 6 and NaN
    give 7 (quantize()'s rounding, reference_quantize's comparisons)."""
    mag = torch.zeros_like(q, dtype=torch.uint8)
    for mid, tie_up in _MIDPOINTS:
        mag += (q >= mid if tie_up else q > mid).to(torch.uint8)
    return torch.where(torch.isnan(q), torch.full_like(mag, 7), mag)


def _magnitude_codes(xa: torch.Tensor, sc: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """xa [..., 16] = |x| fp32, sc [...] fp32 block scales -> magnitude codes, by quantize()'s recipe
    (inv = gs / scale once per block, then |x| * inv)."""
    inv = torch.where(sc > 0, gs / sc, torch.zeros_like(sc))
    return _round_e2m1(xa * inv.unsqueeze(-1))


def _scale_value(byte: torch.Tensor) -> torch.Tensor:
    return byte.view(torch.float8_e4m3fn).to(torch.float32)


def _block_error(r: torch.Tensor, mag: torch.Tensor, sc: torch.Tensor, lut64: torch.Tensor,
                 h64: torch.Tensor | None = None) -> torch.Tensor:
    """Squared error of each block in units of gs (sum_i h_i (|x_i| gs - e2m1_i * scale)^2, h_i = 1 without
    column weights), float64, computed with a fixed sequence of elementwise operations (module docstring:
    why this is exact and order-free)."""
    d = r - lut64[mag.long()] * sc.to(torch.float64).unsqueeze(-1)
    e = d * d
    if h64 is not None:
        e = e * h64
    while e.shape[-1] > 1:
        e = e[..., 0::2] + e[..., 1::2]
    return e[..., 0]


def _search_block_scales(xb: torch.Tensor, gs: torch.Tensor, neighbours: int, clip: bool = True,
                         weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """xb [R, B, 16] fp32 -> (best scale byte [R, B] uint8, its error [R, B] float64 in units of gs).
    weight: None, or [B * 16] fp32 column weights (each element's squared error is multiplied by its column's).

    Candidates, in the order tried: rtn's byte (amax -> 6), then rtn +- 1..neighbours, then the byte mapping
    amax -> 4 and its +- neighbours; a candidate replaces the best only if strictly better, so ties keep rtn.
    Bytes are clamped to [0, 448] (0 is the all-zero block, also a legal choice)."""
    lut64 = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float64, device=xb.device)
    xa = xb.abs()
    amax = xa.amax(dim=-1)
    r = xa.to(torch.float64) * gs.to(torch.float64)
    b6 = _e4m3_rn_sat_bits(amax / 6.0 * gs)
    b4 = _e4m3_rn_sat_bits(amax / 4.0 * gs)
    h64 = None if weight is None else weight.to(torch.float64).reshape(xb.shape[1], SF_VEC)

    def error_of(byte):
        sc = _scale_value(byte)
        return _block_error(r, _magnitude_codes(xa, sc, gs), sc, lut64, h64)

    best, best_err = b6, error_of(b6)
    offsets = [(b6, d) for k in range(1, neighbours + 1) for d in (-k, k)]
    offsets += [(b4, 0)] + [(b4, d) for k in range(1, neighbours + 1) for d in (-k, k)]
    for base, d in offsets:
        cand = (base.to(torch.int16) + d).clamp(0, _E4M3_MAX_BYTE).to(torch.uint8)
        if not clip:  # a scale below rtn's would saturate the block's largest values: not a candidate
            cand = torch.maximum(cand, b6)
        err = error_of(cand)
        better = err < best_err  # False against NaN: a non-finite block keeps rtn's byte
        best = torch.where(better, cand, best)
        best_err = torch.where(better, err, best_err)
    return best, best_err


def _encode(x: torch.Tensor, scale_bytes: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """x [R, K] fp32, scale bytes [R, K/16] -> packed [R, K/2]: codes by quantize()'s rounding."""
    rows, k = x.shape
    xb = x.view(rows, k // SF_VEC, SF_VEC)
    mag = _magnitude_codes(xb.abs(), _scale_value(scale_bytes), gs)
    codes = (torch.signbit(xb).to(torch.uint8) << 3) | mag
    return pack_e2m1(codes.view(rows, k))


def _native_search(x: torch.Tensor, gs: torch.Tensor, neighbours: int, clip: bool, weight: torch.Tensor | None,
                   with_error: bool):
    """The search and the encoding in one pass of the native op (CPU or CUDA, csrc/quant/mse_search.h):
    (packed [R, K/2], scale bytes [R, K/16], error [R, K/16] float64 or None)."""
    packed, scale_bytes, err = torch.ops.nvfp4_gemm.quantize_mse.default(x, gs, neighbours, clip, weight, with_error)
    return packed, scale_bytes, err if with_error else None


def _reference_search(x: torch.Tensor, gs: torch.Tensor, neighbours: int, clip: bool, weight: torch.Tensor | None,
                      with_error: bool):
    """_native_search's definition in plain PyTorch (same outputs, bit for bit, when run on the CPU)."""
    x = x.to(torch.float32)
    rows, k = x.shape
    scale_bytes, err = _search_block_scales(x.view(rows, k // SF_VEC, SF_VEC), gs, neighbours, clip, weight)
    return _encode(x, scale_bytes, gs), scale_bytes, err if with_error else None


@torch.library.register_fake("nvfp4_gemm::quantize_mse")
def _quantize_mse_fake(x, global_scale, neighbours=2, clip=True, column_weight=None, with_error=False):
    _check_devices("nvfp4_gemm.quantize_mse", "x", x, global_scale=global_scale, column_weight=column_weight)
    rows, k = x.shape
    torch._check(k % SF_VEC == 0, lambda: f"nvfp4_gemm.quantize_mse: K must be a positive multiple of 16, got {k}")
    err_shape = (rows, k // SF_VEC) if with_error else (0, 0)
    return (x.new_empty((rows, k // 2), dtype=torch.uint8), x.new_empty((rows, k // SF_VEC), dtype=torch.uint8),
            x.new_empty(err_shape, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------- mse

def _column_weights(hessian: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """mse's per-column error weights: the diagonal of hessian [K, K] (or hessian itself when it is that
    diagonal, [K]), float32 on w's device; finite and >= 0, else an error."""
    k = w.shape[1]
    if not isinstance(hessian, torch.Tensor) or tuple(hessian.shape) not in ((k, k), (k,)):
        raise ValueError(f"quantize_weight: mse's hessian must be [K, K] = [{k}, {k}] or its diagonal [{k}], got "
                         f"{tuple(hessian.shape) if isinstance(hessian, torch.Tensor) else type(hessian).__name__}")
    h = (torch.diagonal(hessian) if hessian.dim() == 2 else hessian).detach().to(device=w.device, dtype=torch.float32)
    if not bool((torch.isfinite(h) & (h >= 0)).all()):
        raise ValueError("quantize_weight: mse's hessian diagonal must be finite and >= 0")
    return h.contiguous()


def _mse_search(w: torch.Tensor, neighbours: int, global_candidates: int, clip: bool, weight: torch.Tensor | None,
                search=_native_search, global_scale: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (packed [N, K/2], scale bytes [N, K/16] uint8, gs [1] fp32) by the mse search (module
    docstring). `search` does one per-tensor candidate: the native op, or the PyTorch reference."""
    if not isinstance(neighbours, int) or isinstance(neighbours, bool) or not 0 <= neighbours <= 126:
        raise ValueError(f"quantize_weight: neighbours must be an int in [0, 126], got {neighbours!r}")
    if not isinstance(global_candidates, int) or global_candidates < 1:
        raise ValueError(f"quantize_weight: global_candidates must be an int >= 1, got {global_candidates!r}")
    amax = finite_amax(w)
    gs0 = global_encode_scale(amax) if global_scale is None else global_scale
    if global_candidates == 1:  # rtn's per-tensor scale: one pass, no host sync
        packed, scale_bytes, _ = search(w, gs0, neighbours, clip, weight, False)
        return packed, scale_bytes, gs0
    rows, k = w.shape
    amax_host = float(amax)
    nblocks = rows * (k // SF_VEC)
    # Fixed point for the per-tensor totals: a block's error is at most 16 max(h) amax^2 (each code is at
    # least as close as 0 is), so nblocks * 16 max(h) amax^2 * 2 (margin for the rounding of the division by
    # gs^2) < 2^62.
    hmax = 1.0 if weight is None else max(float(weight.max()), 1e-300)
    bound = max(nblocks * 16.0 * amax_host * amax_host * 2.0 * hmax, 1e-300)
    # A Python float multiplier: exact on every device (torch.ldexp goes through pow, whose CUDA version
    # promises no exact powers of two).
    fixed_point = math.ldexp(1.0, 62 - math.frexp(bound)[1])
    best = None
    for j in range(global_candidates):
        gs = gs0 if j == 0 else gs0 * torch.tensor(2.0 ** (-j / global_candidates), dtype=torch.float32,
                                                    device=w.device)
        packed, scale_bytes, err = search(w, gs, neighbours, clip, weight, True)
        fixed = torch.floor(err / (gs.to(torch.float64) * gs.to(torch.float64)) * fixed_point)
        total = int(torch.where(torch.isfinite(fixed), fixed, torch.zeros_like(fixed)).to(torch.int64).sum())
        if best is None or total < best[0]:
            best = (total, packed, scale_bytes, gs)
        if amax_host == 0.0:  # every candidate gives zero error: keep rtn's
            break
    return best[1], best[2], best[3]


def _mse(w: torch.Tensor, neighbours: int = 2, global_candidates: int = 1, clip: bool = True, weight=None,
         search=_native_search, global_scale: torch.Tensor | None = None):
    packed, scale_bytes, gs = _mse_search(w, neighbours, global_candidates, clip, weight, search, global_scale)
    return packed, to_blocked(scale_bytes.view(torch.float8_e4m3fn)), 1.0 / gs


def reference_mse(w: torch.Tensor, *, neighbours: int = 2, global_candidates: int = 1, clip: bool = True,
                  hessian: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantize_weight(w, "mse", ...) written in plain PyTorch: the definition the native search (CPU and
    CUDA) is held to, bit for bit. Slow (about 30 full-tensor float64 passes per candidate scale); run it
    on the CPU: on CUDA, PyTorch divides a tensor by a Python number as a multiplication by its reciprocal,
    so rtn's byte `amax / 6 * gs` can differ by one e4m3 step where the native code divides."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] == 0 or w.shape[1] % SF_VEC != 0:
        raise ValueError("reference_mse: w must be [N, K] with K a positive multiple of 16")
    weight = None if hessian is None else _column_weights(hessian, w)
    return _mse(w.detach(), neighbours, global_candidates, clip, weight, search=_reference_search)


# ---------------------------------------------------------------------------------------------- gptq

def _gptq(
    w: torch.Tensor,
    hessian: torch.Tensor,
    *,
    percdamp: float = 0.01,
    block_size: int = 128,
    act_order: bool = True,
    scale: str = "mse",
    neighbours: int = 2,
    global_candidates: int = 1,
    clip: bool = True,
    global_scale: torch.Tensor | None = None,
):
    n, k = w.shape
    if not isinstance(hessian, torch.Tensor) or tuple(hessian.shape) != (k, k):
        raise ValueError(f"quantize_weight: hessian must be [K, K] = [{k}, {k}], got "
                         f"{tuple(hessian.shape) if isinstance(hessian, torch.Tensor) else type(hessian).__name__}")
    if scale not in ("rtn", "mse"):
        raise ValueError(f"quantize_weight: gptq's scale must be 'rtn' or 'mse', got {scale!r}")
    if not percdamp > 0:
        raise ValueError(f"quantize_weight: percdamp must be > 0, got {percdamp}")
    if block_size <= 0 or block_size % SF_VEC != 0:
        raise ValueError(f"quantize_weight: block_size must be a positive multiple of 16, got {block_size}")
    W = w.to(torch.float32).clone()
    H = hessian.detach().to(device=W.device, dtype=torch.float32).clone()
    if not bool(torch.isfinite(W).all()):
        raise ValueError("quantize_weight: gptq needs finite weights (w holds NaN or inf); use method 'rtn' or 'mse'")
    if not bool(torch.isfinite(H).all()):
        raise ValueError("quantize_weight: hessian holds NaN or inf")

    # The per-tensor scale comes from the original weights: rtn's, or the mse search's choice.
    if global_scale is not None:
        gs = global_scale
    elif scale == "mse" and global_candidates > 1:
        gs = _mse_search(W, neighbours, global_candidates, clip, None)[2]
    else:
        gs = global_encode_scale(finite_amax(W))
    decode = 1.0 / gs
    lut = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float32, device=W.device)

    # Dead inputs (never nonzero in calibration) carry no information: their weights cannot change the
    # output on the calibration data, so they are set to 0 and given unit curvature to keep H invertible.
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    perm = torch.argsort(torch.diagonal(H), descending=True, stable=True) if act_order else torch.arange(k, device=W.device)
    W, H = W[:, perm], H[perm][:, perm]
    H += percdamp * torch.diagonal(H).mean() * torch.eye(k, dtype=H.dtype, device=H.device)
    try:
        L = torch.linalg.cholesky(H)
        Hinv = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
    except torch.linalg.LinAlgError as e:
        raise ValueError(f"quantize_weight: the damped Hessian is not positive definite (percdamp={percdamp}); "
                         f"use a larger percdamp or more calibration data") from e

    # Scale blocks are groups of 16 ORIGINAL columns. In processing order (perm) a group's columns may be
    # scattered; its scale is fixed when its first column comes up, from the current values of its 16 columns.
    perm_host = perm.cpu().tolist()
    position = [0] * k
    for p, c in enumerate(perm_host):
        position[c] = p
    members = [[position[c] for c in range(g * SF_VEC, (g + 1) * SF_VEC)] for g in range(k // SF_VEC)]
    fixed = [False] * (k // SF_VEC)
    scale_bytes = torch.zeros(n, k // SF_VEC, dtype=torch.uint8, device=W.device)
    codes = torch.zeros(n, k, dtype=torch.uint8, device=W.device)

    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            g = perm_host[i1 + i] // SF_VEC
            if not fixed[g]:
                cur = torch.empty(n, SF_VEC, dtype=torch.float32, device=W.device)
                for m, p in enumerate(members[g]):  # 16 columns: current value, in original column order
                    if i1 <= p < i2:
                        cur[:, m] = W1[:, p - i1]
                    else:  # beyond this block: its lazy update from the block's columns done so far is pending
                        cur[:, m] = W[:, p] - Err1[:, :i] @ Hinv[i1:i1 + i, p]
                if scale == "mse":
                    byte = _native_search(cur, gs, neighbours, clip, None, False)[1]
                else:
                    byte = _e4m3_rn_sat_bits(cur.abs().amax(dim=1, keepdim=True) / 6.0 * gs)
                scale_bytes[:, g] = byte[:, 0]
                fixed[g] = True
            sc = _scale_value(scale_bytes[:, g])
            col = W1[:, i]
            inv = torch.where(sc > 0, gs / sc, torch.zeros_like(sc))
            mag = _round_e2m1(col.abs() * inv)
            neg = torch.signbit(col)
            q = lut[mag.long()] * sc * decode
            q = torch.where(neg, -q, q)
            codes[:, i1 + i] = (neg.to(torch.uint8) << 3) | mag
            err = (col - q) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]

    codes = codes[:, torch.argsort(perm)]
    return pack_e2m1(codes), to_blocked(scale_bytes.view(torch.float8_e4m3fn)), decode
