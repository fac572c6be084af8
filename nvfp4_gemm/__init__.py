"""nvfp4_gemm: NVFP4 (e2m1 data, e4m3 per-16 scales in the 128x4 blocked layout) matrix multiplication.

    C = nvfp4_gemm.mm(a, b, sfa, sfb, alpha=None, out_dtype=torch.float16)

computes alpha * (A * sfa) @ (B * sfb)^T; with float activations a and sfa=None, alpha * A @ (B * sfb)^T
(weight-only). See README.md and docs/CONTRACT.md for formats and rules.
"""
from __future__ import annotations

from ._loader import load_native as _load_native

_native = _load_native()

from .formats import (  # noqa: E402
    blocked_offset,
    blocked_shape,
    dequantize,
    from_blocked,
    pack_e2m1,
    permuted_view,
    to_blocked,
    unpack_e2m1,
)
from .info import configs, dispatch_rules, info  # noqa: E402
from .ops import linear, mm  # noqa: E402
from .reference import reference_mm  # noqa: E402
from .quantize import global_encode_scale, quantize, reference_quantize  # noqa: E402
from .nn import NVFP4Linear  # noqa: E402
from ._quantize_model import quantize_model  # noqa: E402
from .fused import fuse_projections, unfuse_projections  # noqa: E402
from .checkpoint import CheckpointError, UnsupportedFormatError, from_pretrained, save_pretrained  # noqa: E402
from .grouped import (  # noqa: E402
    grouped_linear,
    grouped_mm,
    grouped_sfa_rows,
    quantize_grouped,
    reference_grouped_mm,
    to_blocked_grouped,
)

from .moe import NVFP4Experts  # noqa: E402

__all__ = [
    "mm",
    "linear",
    "reference_mm",
    "dequantize",
    "to_blocked",
    "from_blocked",
    "permuted_view",
    "blocked_shape",
    "blocked_offset",
    "pack_e2m1",
    "unpack_e2m1",
    "info",
    "configs",
    "dispatch_rules",
    "quantize",
    "reference_quantize",
    "global_encode_scale",
    "NVFP4Linear",
    "quantize_model",
    "fuse_projections",
    "unfuse_projections",
    "from_pretrained",
    "save_pretrained",
    "CheckpointError",
    "UnsupportedFormatError",
    "grouped_mm",
    "grouped_linear",
    "grouped_sfa_rows",
    "to_blocked_grouped",
    "quantize_grouped",
    "reference_grouped_mm",
    "NVFP4Experts",
]
