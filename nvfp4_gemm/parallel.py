"""Tensor and expert parallelism for NVFP4 layers, on torch.distributed (docs/PARALLEL.md).

    mesh = torch.distributed.device_mesh.init_device_mesh("cuda", (world,))   # under torchrun
    model = nvfp4_gemm.from_pretrained(path, device=f"cuda:{rank}", tp_plan="auto", device_mesh=mesh)
    model = parallel.tensor_parallel(quantized_model, mesh)   # (from nvfp4_gemm import parallel) a built model
    nvfp4_gemm.save_pretrained(model, "out")                                  # every rank calls; rank 0 writes

The plan is transformers' own: `config.base_model_tp_plan` (+ the model's `_tp_plan` for lm_head), whose
strings ("colwise", "rowwise", "colwise_gather_output"/"colwise_rep") are mapped here to ParallelStyles of
torch.distributed.tensor.parallel and applied with its `parallelize_module` (fnmatch on module names, as
transformers does). NVFP4Linear layers and plain float nn.Linear layers the plan names (an fp16 lm_head) are
sharded; every other module (embeddings, norms, routers) stays replicated.

Sharding (docs/CONTRACT.md's formats, exact: the shards hold the checkpoint's own bytes):
  * colwise (split N): rows r0:r1 of the packed weight [N, K/2] and of the logical [N, K/16] scales, the
    scales laid out again in the 128x4 blocked layout for N/world rows (for whole 128-row blocks that is
    the same bytes as a slice of whole atoms); the bias rows r0:r1. N/world must be a multiple of 8 (the
    kernels' 16-byte output rows). Input replicated, output the rank's N/world columns: no collective.
  * rowwise (split K): columns c0:c1 of x's K, i.e. packed columns c0/2:c1/2 and scale columns c0/16:c1/16,
    re-blocked per shard. K/world must be a multiple of 32 (the kernels' K rule; shards of a multiple of
    64 are whole 4-column scale atoms). The forward runs the rank's partial GEMM into FLOAT32 (alpha
    applied), all-reduces the fp32 partial sums, adds the bias (replicated, added once after the reduce)
    in fp32 and rounds once to x's dtype: the GEMM's own contract with one more fp32 addition per rank,
    inside docs/CONTRACT.md's bound (see `RowwiseNVFP4Linear`). Cost: the all-reduce moves 4 bytes per output
    element instead of 2 (at decode sizes the collective is latency-bound, so this is noise).
  * per-tensor scales (weight_scale_2, input_scale) are replicated. Dynamic W4A4 needs the amax of the
    WHOLE input; a rowwise rank sees K/world of it, so it all-reduces (MAX) its local finite amax first:
    one more one-element collective per rowwise layer, which makes the result the one-process scales
    exactly. Static, weight-only and per-block (block_scales_only) layers need nothing more.
  * fused q/k/v and gate/up groups (nvfp4_gemm.fused) are sharded per part (each part colwise, as
    transformers' plans list them) and fused again on each rank; a group whose local parts are not whole
    128-row blocks runs unfused (exact, one GEMM per part).
  * experts (expert parallel): `shard_experts` slices every [E, ...] tensor of an experts module along E;
    `route_to_local` maps the router's global expert ids to the rank's, with transformers' sentinel for
    the others; `ExpertParallel` does both to a module and all-reduces its output (fp32).

Collectives go through torch.ops._c10d_functional (traceable by torch.compile, capturable in CUDA graphs with
NCCL), or, after `use_symmetric_memory(group, ...)`, through torch's symmetric-memory one-shot all-reduce
(CUDA only). Tested on CPU with gloo (tests/test_parallel.py); benchmarks/bench_tp.py runs the two-GPU
checks and timings with NCCL.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from .formats import from_blocked, to_blocked
from .nn import NVFP4Linear

log = logging.getLogger(__name__)

__all__ = [
    "tensor_parallel", "resolve_plan", "shard_bounds", "shard_weight", "shard_layer", "gather_layer",
    "NVFP4ColwiseParallel", "NVFP4RowwiseParallel", "RowwiseNVFP4Linear", "GatherNVFP4Linear",
    "expert_bounds", "shard_experts", "route_to_local", "ExpertParallel", "is_sharded", "save_pretrained",
    "use_symmetric_memory", "all_reduce_sum", "gathered", "plan_layers", "shard_float_linear", "RowwiseLinear",
    "GatherLinear", "LoadSharding", "read_rows", "read_cols",
]

# transformers' plan strings -> what an NVFP4Linear does with them. The *_rep / *_gather_output forms gather
# the colwise output (an LM head); "rowwise_rep" / "rowwise_split_input" take a replicated input and slice it.
STYLE_NAMES = {
    "colwise": "colwise",
    "colwise_gather_output": "colwise_gather_output",
    "colwise_rep": "colwise_gather_output",
    "rowwise": "rowwise",
    "rowwise_rep": "rowwise_split_input",
    "rowwise_split_input": "rowwise_split_input",
}
# The kernels' rules (docs/CONTRACT.md): N a multiple of 8 (16-byte fp16 output rows), K a multiple of 32.
_N_MULTIPLE = 8
_K_MULTIPLE = 32
_SF_VEC = 16


@dataclasses.dataclass(frozen=True)
class Shard:
    """What a sharded layer remembers: its style, its place, the whole layer's shape."""
    style: str          # colwise | rowwise | colwise_gather_output | rowwise_split_input
    rank: int
    world: int
    in_features: int    # of the whole layer
    out_features: int

    @property
    def splits_k(self) -> bool:
        return self.style.startswith("rowwise")


# ------------------------------------------------------------------------------------------ tensors


def shard_bounds(size: int, rank: int, world: int, multiple: int, what: str) -> tuple[int, int]:
    """[start, stop) of rank's equal share of `size`; the share must be a multiple of `multiple`."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"{what}: rank must be in [0, world) = [0, {world}), got {rank}")
    if size % world:
        raise ValueError(f"{what} = {size} does not split over {world} ranks (not divisible)")
    local = size // world
    if local % multiple:
        raise ValueError(f"{what} = {size} over {world} ranks gives {local} per rank, which must be a multiple of "
                         f"{multiple} (the kernels' rule); use fewer ranks for this layer")
    return rank * local, (rank + 1) * local


def shard_weight(weight: torch.Tensor, weight_scale: torch.Tensor, splits_k: bool, rank: int, world: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, blocked scales) of rank's shard of an NVFP4 weight: weight [N, K/2] packed, weight_scale its
    blocked scales (any view mm accepts). splits_k False: rows N/world (colwise); True: K/world (rowwise).
    Each shard's scales are laid out in the 128x4 blocked layout of its own shape (flat, zero padded)."""
    n, k = weight.shape[0], weight.shape[1] * 2
    linear = from_blocked(weight_scale, n, k)
    if splits_k:
        c0, c1 = shard_bounds(k, rank, world, _K_MULTIPLE, "in_features (K)")
        return weight[:, c0 // 2:c1 // 2].contiguous(), to_blocked(linear[:, c0 // _SF_VEC:c1 // _SF_VEC].contiguous())
    r0, r1 = shard_bounds(n, rank, world, _N_MULTIPLE, "out_features (N)")
    return weight[r0:r1].contiguous(), to_blocked(linear[r0:r1].contiguous())


def _mode_kwargs(layer: NVFP4Linear) -> dict:
    return dict(static_input_scale=layer.input_scale is not None, weight_only=layer.weight_only,
                block_scales_only=getattr(layer, "block_scales_only", False))


def shard_layer(layer: NVFP4Linear, style: str, rank: int, world: int, group=None) -> NVFP4Linear:
    """Shards `layer` IN PLACE (same module object, hooks and place) into rank's part for `style` (a key of
    STYLE_NAMES) and returns it: its buffers become the rank's shard, in/out_features the local ones, and
    its class RowwiseNVFP4Linear / GatherNVFP4Linear where the forward needs a collective (plain
    NVFP4Linear for colwise: no collective, and fusable). `group`: the process group of the collectives
    (None: the default group)."""
    if style not in STYLE_NAMES:
        raise ValueError(f"shard_layer: style must be one of {sorted(STYLE_NAMES)}, got {style!r}")
    style = STYLE_NAMES[style]
    if not isinstance(layer, NVFP4Linear):
        raise TypeError(f"shard_layer: expected an NVFP4Linear, got {type(layer).__name__}")
    if getattr(layer, "_tp_shard", None) is not None:
        raise ValueError(f"shard_layer: the layer is already sharded ({layer._tp_shard})")
    if type(layer).__name__ == "FusedNVFP4Linear":
        from .fused import _unfuse_part

        _unfuse_part(layer)  # its own copies; the group is re-fused on the shards afterwards
    for name in ("weight", "weight_scale", "bias"):
        if name in layer._parameters:
            raise ValueError(f"shard_layer: {name} is a Parameter (a trainable layer); shard inference layers only")
    splits_k = style.startswith("rowwise")
    n, k = layer.out_features, layer.in_features
    w, sf = shard_weight(layer.weight, layer.weight_scale, splits_k, rank, world)
    b = layer._buffers
    b["weight"], b["weight_scale"] = w, sf
    if b.get("bias") is not None and not splits_k:
        r0, r1 = shard_bounds(n, rank, world, _N_MULTIPLE, "out_features (N)")
        b["bias"] = b["bias"][r0:r1].contiguous()
    layer.in_features, layer.out_features = (k // world, n) if splits_k else (k, n // world)
    object.__setattr__(layer, "_tp_shard", Shard(style, rank, world, k, n))
    object.__setattr__(layer, "_tp_group", group)
    if style == "colwise_gather_output":
        layer.__class__ = GatherNVFP4Linear
    elif style == "rowwise_split_input":
        layer.__class__ = _SplitInputRowwise
    elif splits_k:
        layer.__class__ = RowwiseNVFP4Linear
    return layer


class RowwiseLinear(nn.Linear):
    """The K-shard of a float nn.Linear: y = all_reduce(x_r @ W_r^T) + b in x's dtype (the usual float
    tensor-parallel recipe: each partial rounded to x's dtype, summed in x's dtype)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce_sum(torch.nn.functional.linear(x, self.weight), self._tp_group)
        return y if self.bias is None else y + self.bias


class GatherLinear(nn.Linear):
    """The N-shard of a float nn.Linear with its output all-gathered along the last dim (an LM head)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _all_gather_last(super().forward(x), self._tp_shard.rank, self._tp_shard.world, self._tp_group)


def shard_float_linear(layer: nn.Linear, style: str, rank: int, world: int, group=None) -> nn.Linear:
    """shard_layer for a float nn.Linear (in place; the weight stays a Parameter of the local shape)."""
    style = STYLE_NAMES[style]
    if getattr(layer, "_tp_shard", None) is not None:
        raise ValueError(f"shard_float_linear: the layer is already sharded ({layer._tp_shard})")
    n, k = layer.out_features, layer.in_features
    splits_k = style.startswith("rowwise")
    lo, hi = shard_bounds(k if splits_k else n, rank, world, 1, "in_features (K)" if splits_k else "out_features (N)")
    with torch.no_grad():
        w = layer.weight[:, lo:hi] if splits_k else layer.weight[lo:hi]
        layer.weight = nn.Parameter(w.contiguous(), requires_grad=layer.weight.requires_grad)
        if layer.bias is not None and not splits_k:
            layer.bias = nn.Parameter(layer.bias[lo:hi].contiguous(), requires_grad=layer.bias.requires_grad)
    layer.in_features, layer.out_features = (hi - lo, n) if splits_k else (k, hi - lo)
    object.__setattr__(layer, "_tp_shard", Shard(style, rank, world, k, n))
    object.__setattr__(layer, "_tp_group", group)
    if style == "colwise_gather_output":
        layer.__class__ = GatherLinear
    elif style == "rowwise":
        layer.__class__ = RowwiseLinear
    elif style == "rowwise_split_input":
        layer.__class__ = _SplitInputRowwiseLinear
    return layer


def _gather_float_linear(layer: nn.Linear, device) -> nn.Linear:
    shard: Shard = layer._tp_shard
    dim = 1 if shard.splits_k else 0
    parts = [torch.empty_like(layer.weight.data) for _ in range(shard.world)]
    dist.all_gather(parts, layer.weight.data.contiguous(), group=layer._tp_group)
    full = nn.Linear(shard.in_features, shard.out_features, bias=layer.bias is not None, device=device,
                     dtype=layer.weight.dtype)
    with torch.no_grad():
        full.weight.copy_(torch.cat(parts, dim=dim))
        if layer.bias is not None:
            if shard.splits_k:
                full.bias.copy_(layer.bias)
            else:
                bparts = [torch.empty_like(layer.bias.data) for _ in range(shard.world)]
                dist.all_gather(bparts, layer.bias.data.contiguous(), group=layer._tp_group)
                full.bias.copy_(torch.cat(bparts))
    return full


def gather_layer(layer: NVFP4Linear, device: torch.device | str = "cpu") -> NVFP4Linear:
    """The whole layer (a new plain NVFP4Linear on `device`) from every rank's shard. Collective: every rank
    of the layer's group calls it (each gets the whole layer)."""
    if not isinstance(layer, NVFP4Linear):
        return _gather_float_linear(layer, device)
    shard: Shard = layer._tp_shard
    group = layer._tp_group
    n_loc, k_loc = layer.out_features, layer.in_features
    lin = from_blocked(layer.weight_scale, n_loc, k_loc).view(torch.uint8)
    dim = 1 if shard.splits_k else 0

    def gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(shard.world)]
        dist.all_gather(parts, t, group=group)
        return torch.cat(parts, dim=dim if t.dim() > 1 else 0).to(device)

    full = NVFP4Linear(shard.in_features, shard.out_features, bias=layer.bias is not None, device=device,
                       dtype=layer.bias.dtype if layer.bias is not None else torch.float32, **_mode_kwargs(layer))
    with torch.no_grad():
        full.weight.copy_(gather(layer.weight))
        full.weight_scale.copy_(to_blocked(gather(lin).view(torch.float8_e4m3fn)))
        full.weight_scale_2.copy_(layer.weight_scale_2)
        if layer.input_scale is not None:
            full.input_scale.copy_(layer.input_scale)
        if layer.bias is not None:
            full.bias.copy_(layer.bias if shard.splits_k else gather(layer.bias))
    return full


# ------------------------------------------------------------------------------------------ collectives

# (group name, dtype) -> a symmetric-memory buffer, set by use_symmetric_memory
_SYMM: dict[tuple[str, torch.dtype], torch.Tensor] = {}


def _group_name(group) -> str:
    g = group if group is not None else dist.group.WORLD
    return g.group_name


def use_symmetric_memory(group=None, max_elements: int = 1 << 20, device: torch.device | str | None = None,
                         dtypes: Iterable[torch.dtype] = (torch.float32,), enable: bool = True) -> None:
    """All-reduces (all_reduce_sum: the rowwise layers, ExpertParallel) of up to `max_elements` values of one
    of `dtypes` on `group` then run torch's symmetric-memory one-shot all-reduce
    (torch.ops.symm_mem.one_shot_all_reduce_copy: each rank copies its input into its symmetric buffer and
    sums the peers' buffers read over P2P / NVLink; no NCCL, no multicast) instead of NCCL. Larger inputs
    still go through NCCL. CUDA only; collective (every rank calls it). enable=False goes back to NCCL."""
    name = _group_name(group)
    for key in [key for key in _SYMM if key[0] == name]:
        del _SYMM[key]
    if not enable:
        return
    from torch.distributed import _symmetric_memory as symm_mem

    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    for dtype in dtypes:
        buf = symm_mem.empty(max_elements, dtype=dtype, device=device)
        symm_mem.rendezvous(buf, name)
        try:  # the one-shot kernel does not take every dtype; every rank fails alike, so this stays collective
            torch.ops.symm_mem.one_shot_all_reduce_copy(_head(buf, (16,)), torch.zeros(16, dtype=dtype, device=device),
                                                        "sum", name)
            torch.cuda.synchronize(device)
        except (RuntimeError, NotImplementedError) as e:
            log.warning("symmetric-memory one-shot all-reduce refuses %s (%s): %s", dtype, e,
                        "such tensors go through NCCL" if dtype == torch.float32
                        else "such tensors go through the float32 buffer, if one is registered")
            continue
        _SYMM[(name, dtype)] = buf


def _head(buf: torch.Tensor, shape) -> torch.Tensor:
    """The first numel(shape) elements of a symmetric buffer viewed as `shape`: the one-shot kernel takes a
    buffer of the local input's shape (a view at offset 0 of the registered allocation)."""
    n = 1
    for d in shape:
        n *= d
    return buf[:n].view(shape)


def all_reduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """The sum over the group's ranks of t (a new tensor). Functional collectives: traceable by
    torch.compile, capturable in a CUDA graph (NCCL); the symmetric-memory one-shot where registered."""
    name = _group_name(group)
    if _SYMM and t.is_cuda:
        buf = _SYMM.get((name, t.dtype))
        if buf is not None and t.numel() <= buf.numel():
            return torch.ops.symm_mem.one_shot_all_reduce_copy(_head(buf, t.shape), t.contiguous(), "sum", name)
        buf = _SYMM.get((name, torch.float32))
        if buf is not None and t.dtype in (torch.float16, torch.bfloat16) and t.numel() <= buf.numel():
            return torch.ops.symm_mem.one_shot_all_reduce_copy(_head(buf, t.shape), t.float(), "sum",
                                                               name).to(t.dtype)
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(t.contiguous(), "sum", name))


def _all_reduce_max(t: torch.Tensor, group=None) -> torch.Tensor:
    name = _group_name(group)
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(t.contiguous(), "max", name))


def _all_gather_last(t: torch.Tensor, rank: int, world: int, group=None) -> torch.Tensor:
    """Concatenation along the last dim of every rank's t (same shape everywhere). With a symmetric-memory
    buffer registered for t's dtype (use_symmetric_memory), an all-reduce of zero-padded blocks instead (each
    element is one rank's value plus zeros: exact), so that no NCCL collective is left in the step."""
    name = _group_name(group)
    buf = None
    if _SYMM:
        buf = _SYMM.get((name, t.dtype))
        buf = buf if buf is not None else _SYMM.get((name, torch.float32))
    if buf is not None and t.is_cuda and t.numel() * world <= buf.numel():
        full = t.new_zeros(*t.shape[:-1], world, t.shape[-1])
        full[..., rank, :] = t
        return all_reduce_sum(full.reshape(*t.shape[:-1], world * t.shape[-1]), group)
    g = torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.all_gather_into_tensor(t.contiguous(), world, name))  # [world * d0, ...]
    return torch.cat(g.chunk(world, dim=0), dim=-1)


# ------------------------------------------------------------------------------------------ modules

_INPUT_SCALES_OP = torch.ops.nvfp4_gemm._input_scales.default
_QUANTIZE_OP = torch.ops.nvfp4_gemm.quantize.default
_MM_OP = torch.ops.nvfp4_gemm.mm.default


class RowwiseNVFP4Linear(NVFP4Linear):
    """The K-shard of an NVFP4Linear (shard_layer(..., "rowwise")): x [..., K/world] (this rank's columns of
    the whole input), y [..., N] the whole output on every rank.

        acc_r = alpha * x_r @ W_r^T              (the rank's GEMM, fp32 accumulation, alpha in fp32, NOT rounded)
        y     = round(sum_r acc_r + bias)        (fp32 all-reduce, bias in fp32, one rounding to x's dtype)

    alpha and the input's quantization are the whole layer's: weight-only alpha = weight_scale_2; static
    W4A4 the layer's input_scale; dynamic W4A4 the scales of the amax over ALL ranks' columns (one MAX
    all-reduce of a scalar first); per-block W4A4 has no per-tensor input scale. So each rank's products
    are exactly the one-process GEMM's products of its K range, and the result differs from the one
    process's only in how fp32 sums are grouped (plus one fp32 rounding of alpha * acc_r per rank): per
    element |error| <= (K/world + world) * 2^-24 * |alpha| * sum_k |a_k b_k| on top of the final rounding,
    which is far inside docs/CONTRACT.md's 2^-16 * sum_k |a_k b_k| * |alpha| term. Summing in the output dtype
    instead (a half-precision all-reduce of rounded partials) would round world + 1 times, which can leave
    the bound where partials cancel. No autograd (inference)."""

    _tp_shard: Shard
    _tp_group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self._buffers
        k = self.in_features
        if x.shape[-1] != k or x.dim() < 2:
            self._check_input(x)
        x2 = x.reshape(-1, k)
        # The GPU kernels read 16-byte aligned rows (compiled code allocates aligned tensors; dynamo cannot
        # trace data_ptr arithmetic, so the check runs in eager mode only).
        if not x2.is_contiguous() or (not torch.compiler.is_compiling() and x2.data_ptr() % 16):
            x2 = x2.clone(memory_format=torch.contiguous_format)
        w, sf, ws2 = b["weight"], b["weight_scale"], b["weight_scale_2"]
        if self.weight_only:
            acc = _MM_OP(x2, w, None, sf, ws2, torch.float32)
        elif getattr(self, "block_scales_only", False):
            packed, sfx = _QUANTIZE_OP(x2, None)
            acc = _MM_OP(packed, w, sfx, sf, ws2, torch.float32)
        else:
            if b["input_scale"] is not None:
                scales = _INPUT_SCALES_OP(x2, ws2, b["input_scale"])
            else:
                # The whole input's finite amax (every rank's columns): the one-process dynamic scales,
                # formed by the same op from a one-element tensor holding that amax (exact in fp32).
                amax = _all_reduce_max(_finite_amax(x2).reshape(1, 1), self._tp_group)
                scales = _INPUT_SCALES_OP(amax.expand(1, _SF_VEC).contiguous(), ws2, None)
            packed, sfx = _QUANTIZE_OP(x2, scales[0:1])
            acc = _MM_OP(packed, w, sfx, sf, scales[2:3], torch.float32)
        acc = all_reduce_sum(acc, self._tp_group)
        bias = b["bias"]
        if bias is not None:
            acc = acc + (bias if bias.dtype == torch.float32 else bias.float())
        return acc.to(x.dtype).reshape(*x.shape[:-1], acc.shape[-1])


def _finite_amax(x: torch.Tensor) -> torch.Tensor:
    a = x.abs().float()
    if a.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax()


class GatherNVFP4Linear(NVFP4Linear):
    """The N-shard of an NVFP4Linear whose output is gathered (transformers' "colwise_gather_output" /
    "colwise_rep", an LM head): the rank's columns, then an all-gather along the last dim. Each output
    element is computed exactly as in one process (same operands, same K order)."""

    _tp_shard: Shard
    _tp_group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _all_gather_last(super().forward(x), self._tp_shard.rank, self._tp_shard.world, self._tp_group)


def _mesh_group_rank(mesh) -> tuple[object, int, int]:
    if mesh is None:
        if not dist.is_initialized():
            raise RuntimeError("nvfp4_gemm.parallel: torch.distributed is not initialized (run under torchrun and "
                               "call torch.distributed.init_process_group, or pass a device_mesh)")
        return None, dist.get_rank(), dist.get_world_size()
    if mesh.ndim != 1:
        raise ValueError(f"nvfp4_gemm.parallel: device_mesh must be 1-D (the tensor-parallel dimension), got "
                         f"{mesh.ndim}-D {tuple(mesh.shape)}; pass mesh['tp']")
    return mesh.get_group(), mesh.get_local_rank(), mesh.size()


class _NVFP4Style(ParallelStyle):
    style = "colwise"

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        group, rank, world = _mesh_group_rank(device_mesh)
        if isinstance(module, NVFP4Linear):
            return shard_layer(module, self.style, rank, world, group)
        if type(module) is nn.Linear:
            return shard_float_linear(module, self.style, rank, world, group)
        return module  # anything else stays replicated


class NVFP4ColwiseParallel(_NVFP4Style):
    """ParallelStyle for NVFP4Linear: split N (transformers' "colwise"); `gather_output=True` all-gathers the
    output ("colwise_gather_output"). Non-NVFP4 modules are left alone (replicated)."""

    def __init__(self, gather_output: bool = False) -> None:
        super().__init__()
        self.style = "colwise_gather_output" if gather_output else "colwise"


class NVFP4RowwiseParallel(_NVFP4Style):
    """ParallelStyle for NVFP4Linear: split K, fp32 all-reduce of the partial sums (transformers'
    "rowwise"). `split_input=True` takes the whole input and uses the rank's columns ("rowwise_split_input")."""

    def __init__(self, split_input: bool = False) -> None:
        super().__init__()
        self.style = "rowwise_split_input" if split_input else "rowwise"


class _SplitInputRowwise(RowwiseNVFP4Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self._tp_shard
        k = self.in_features
        return super().forward(x[..., s.rank * k:(s.rank + 1) * k])


class _SplitInputRowwiseLinear(RowwiseLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self._tp_shard
        k = self.in_features
        return super().forward(x[..., s.rank * k:(s.rank + 1) * k])


def _style_object(name: str) -> ParallelStyle:
    s = STYLE_NAMES[name]
    if s == "colwise":
        return NVFP4ColwiseParallel()
    if s == "colwise_gather_output":
        return NVFP4ColwiseParallel(gather_output=True)
    return NVFP4RowwiseParallel(split_input=s == "rowwise_split_input")


def resolve_plan(model: nn.Module, tp_plan: str | Mapping[str, str] | None = "auto") -> dict[str, str]:
    """{module-name pattern: style string}. "auto": the model's transformers plan (config.base_model_tp_plan
    under the base model's prefix, plus the model's own _tp_plan, e.g. lm_head), as transformers'
    tp_plan="auto" reads it; a dict is used as given. Only the styles in STYLE_NAMES apply to NVFP4
    layers; entries of other styles (norms, experts, routers) are ignored here (those modules stay
    replicated; experts: ExpertParallel)."""
    if tp_plan is None:
        return {}
    if isinstance(tp_plan, str):
        if tp_plan != "auto":
            raise ValueError(f"tp_plan must be 'auto' or a dict {{module pattern: style}}, got {tp_plan!r}")
        config = getattr(model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        base = dict(getattr(text, "base_model_tp_plan", None) or {})
        if not base:
            raise ValueError(f"tp_plan='auto': {type(model).__name__}'s config has no base_model_tp_plan; pass "
                             f"tp_plan={{'layers.*.self_attn.q_proj': 'colwise', ...}}")
        prefix = getattr(model, "base_model_prefix", "") or ""
        if prefix and hasattr(model, prefix):
            base = {f"{prefix}.{k}": v for k, v in base.items()}
        plan = {**base, **dict(getattr(model, "_tp_plan", None) or {})}
    else:
        plan = dict(tp_plan)
    return {k: v for k, v in plan.items() if v in STYLE_NAMES}


def _check_heads(model: nn.Module, plan: Mapping[str, str], world: int) -> None:
    """Attention heads must split whole over the ranks (q/k/v colwise cut N on head boundaries)."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is None or not any(k.endswith(("q_proj", "k_proj", "v_proj")) for k in plan):
        return
    for attr in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, attr, None)
        if isinstance(heads, int) and heads % world:
            raise ValueError(f"tensor parallel over {world} ranks: config.{attr} = {heads} is not divisible by "
                             f"{world} (q/k/v are split on head boundaries)")


def _matches(name: str, pattern: str) -> bool:
    import fnmatch

    a, b = name.split("."), pattern.split(".")
    return len(a) == len(b) and all(fnmatch.fnmatchcase(x, y) for x, y in zip(a, b))


def plan_layers(model: nn.Module, plan: Mapping[str, str], names: Iterable[str] | None = None) -> dict[str, str]:
    """{layer name: style} for the NVFP4 and plain nn.Linear layers (or `names`) that a plan pattern matches, as
    parallelize_module matches them (fnmatch, component by component)."""
    if names is None:
        names = [n for n, m in model.named_modules() if isinstance(m, NVFP4Linear) or type(m) is nn.Linear]
    out = {}
    for name in names:
        for pattern, style in plan.items():
            if _matches(name, pattern):
                out[name] = style
                break
    return out


def tensor_parallel(model: nn.Module, device_mesh=None, tp_plan: str | Mapping[str, str] = "auto", *,
                    fuse: bool = True) -> nn.Module:
    """Shards, in place, every NVFP4Linear (and plain float nn.Linear, such as an fp16 lm_head: colwise /
    rowwise with the usual float recipe) of `model` that the plan names (module docstring) over the 1-D
    `device_mesh` (None: the default process group), with parallelize_module and this module's
    ParallelStyles. Every rank calls it on the same (whole) model and keeps its shard. Returns model.
    fuse: re-fuse the q/k/v and gate/up groups on each rank (nvfp4_gemm.fuse_projections). Checks every
    layer's split before changing any."""
    _, rank, world = _mesh_group_rank(device_mesh)
    if device_mesh is None:  # parallelize_module wants a mesh: the default group's, on the backend's device type
        from torch.distributed.device_mesh import DeviceMesh

        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
        device_mesh = DeviceMesh.from_group(dist.group.WORLD, device_type)
    plan = resolve_plan(model, tp_plan)
    layers = plan_layers(model, plan)
    if not layers:
        raise ValueError(f"tensor_parallel: the plan {dict(plan)} names no NVFP4Linear layer of the model")
    _check_heads(model, plan, world)
    for name, style in layers.items():
        mod = model.get_submodule(name)
        nvfp4 = isinstance(mod, NVFP4Linear)
        try:
            if STYLE_NAMES[style].startswith("rowwise"):
                shard_bounds(mod.in_features, rank, world, _K_MULTIPLE if nvfp4 else 1, "in_features (K)")
            else:
                shard_bounds(mod.out_features, rank, world, _N_MULTIPLE if nvfp4 else 1, "out_features (N)")
        except ValueError as e:
            raise ValueError(f"tensor_parallel: layer '{name}' ({style}): {e}") from None
    with torch.no_grad():
        parallelize_module(model, device_mesh, {name: _style_object(style) for name, style in layers.items()})
    if fuse:
        from .fused import fuse_projections

        fuse_projections(model)
    return model


def is_sharded(model: nn.Module) -> bool:
    return any(getattr(m, "_tp_shard", None) is not None for m in model.modules())


@contextlib.contextmanager
def gathered(model: nn.Module, device: torch.device | str = "cpu"):
    """Within the block, rank 0's model holds every sharded NVFP4 layer whole (gathered onto `device`); the
    other ranks' models are unchanged. Collective: every rank enters it. Rank 0's host holds the NVFP4
    layers whole while inside."""
    names = [n for n, m in model.named_modules() if getattr(m, "_tp_shard", None) is not None]
    rank = dist.get_rank()
    swapped = {}
    try:
        for name in names:
            mod = model.get_submodule(name)
            full = gather_layer(mod, device)
            if rank == 0:
                parent_name, _, attr = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                swapped[name] = (parent, attr, mod)
                setattr(parent, attr, full)
        yield model
    finally:
        for parent, attr, mod in swapped.values():
            setattr(parent, attr, mod)


def save_pretrained(model: nn.Module, directory, *args, **kwargs) -> None:
    """nvfp4_gemm.save_pretrained of a sharded model: one ordinary checkpoint, written by rank 0 from the
    gathered layers (gathered()); every rank calls it and every rank raises if rank 0's write failed."""
    from .checkpoint import save_pretrained as _save

    error = None
    with gathered(model):
        if dist.get_rank() == 0:
            try:
                _save(model, directory, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - re-raised on every rank below
                error = e
    msg = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(msg, src=0)
    if error is not None:
        raise error
    if msg[0] is not None:
        raise RuntimeError(f"save_pretrained failed on rank 0: {msg[0]}")


# ------------------------------------------------------------------------------------------ experts


def expert_bounds(num_experts: int, rank: int, world: int) -> tuple[int, int]:
    """[first, stop) of the experts rank holds: num_experts / world consecutive experts (transformers'
    expert-parallel split: global expert e lives on rank e // (num_experts / world))."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"expert parallel: rank must be in [0, {world}), got {rank}")
    if num_experts % world:
        raise ValueError(f"expert parallel: {num_experts} experts do not split over {world} ranks (not divisible)")
    local = num_experts // world
    return rank * local, (rank + 1) * local


def shard_experts(tensors: Mapping[str, torch.Tensor], rank: int, world: int,
                  num_experts: int | None = None) -> dict[str, torch.Tensor]:
    """rank's experts of every [E, ...] tensor (dim 0 = E): packed weights [E, N, K/2], blocked scales
    [E, ...] (each expert's scales are blocked on their own, so the slice needs no re-blocking), per-expert
    global scales [E], biases [E, N]. Tensors without that leading E (shared scalars) are returned as they
    are. Contiguous copies of the slices."""
    sizes = {name: t.shape[0] for name, t in tensors.items() if t.dim() >= 1}
    if num_experts is None:
        if not sizes:
            raise ValueError("shard_experts: no tensor with a leading expert dimension")
        num_experts = max(sizes.values())
    e0, e1 = expert_bounds(num_experts, rank, world)
    out = {}
    for name, t in tensors.items():
        out[name] = t[e0:e1].contiguous() if t.dim() >= 1 and t.shape[0] == num_experts else t
    return out


def route_to_local(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, rank: int, world: int,
                   num_experts: int, sentinel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's global expert ids and weights [T, top_k] as rank sees them: ids of its own experts
    become local (e - first), the others the sentinel num_experts / world (an experts module skips it),
    their weights 0: transformers' EpRouterParallel convention. sentinel=False sends the others to local
    expert 0 with weight 0 instead, for a module that cannot skip ids (wasted rows; a non-finite output of
    such a row would turn its zero weight into NaN). No host sync."""
    e0, e1 = expert_bounds(num_experts, rank, world)
    local = num_experts // world
    mine = (top_k_index >= e0) & (top_k_index < e1)
    idx = torch.where(mine, top_k_index - e0, torch.full_like(top_k_index, local if sentinel else 0))
    return idx, torch.where(mine, top_k_weights, torch.zeros_like(top_k_weights))


class ExpertParallel(ParallelStyle):
    """ParallelStyle for an experts module with transformers' interface: attribute `num_experts`, tensors
    (parameters or buffers) whose dim 0 is the expert, forward(hidden [T, H], top_k_index [T, k],
    top_k_weights [T, k]) that skips index == num_experts. Keeps the rank's experts (shard_experts), sets
    num_experts to the local count, remaps the routing (route_to_local) before the forward and sums the
    ranks' outputs after it (fp32 all-reduce, one rounding to the output dtype): each token's output is
    the sum of its top-k experts' contributions, each computed on the rank that holds the expert.
    The others' slots get transformers' sentinel id (num_experts local) where the module skips it: its own
    experts modules (transformers.*), or a module whose `expert_parallel_sentinel` attribute is True;
    otherwise (route_to_local's sentinel=False) local expert 0 with weight 0.
    A module whose `expert_parallel_float32_output` attribute is True (nvfp4_gemm.moe.NVFP4Experts) returns its
    float32 per-token sums instead, so that the sum over the ranks is rounded once (to the hidden states' dtype).
    The module gets `ep_all_reduce_max(t)` (the elementwise max of t over the ranks, a functional collective):
    a module whose dynamic W4A4 input scale comes from the amax of ALL experts' rows (the down projection's
    input) must pass its local amax through it for the one-process scales. A dynamic W4A4 module that does
    not declare `expert_parallel_sentinel` gets a warning: the extra rows of the fallback and the local-only
    amax change its input scales (a valid NVFP4 run, not the one-process numbers)."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        group, rank, world = _mesh_group_rank(device_mesh)
        num = getattr(module, "num_experts", None)
        if not isinstance(num, int):
            raise ValueError(f"ExpertParallel: {type(module).__name__} has no integer num_experts")
        tensors = {**{f"p:{n}": p for n, p in module._parameters.items() if p is not None},
                   **{f"b:{n}": t for n, t in module._buffers.items() if t is not None}}
        local = shard_experts(tensors, rank, world, num)
        with torch.no_grad():
            for key, t in local.items():
                kind, name = key.split(":", 1)
                if kind == "p":
                    module._parameters[name] = nn.Parameter(t, requires_grad=False)
                else:
                    module._buffers[name] = t
        module.num_experts = num // world
        module._is_expert_parallel = True  # transformers (5.23) experts backends skip the sentinel ids only then
        object.__setattr__(module, "_ep_shard", (rank, world, num))
        if callable(getattr(module, "refresh", None)):
            module.refresh()  # a module that caches facts about its per-expert scales (nvfp4_gemm.moe)

        sentinel = bool(getattr(module, "expert_parallel_sentinel", False)) or \
            (type(module).__module__ or "").startswith("transformers.")
        object.__setattr__(module, "ep_all_reduce_max", lambda t: _all_reduce_max(t, group))
        if getattr(module, "weight_only", True) is False and getattr(module, "static_input_scale", True) is False \
                and not sentinel:
            warnings.warn(f"ExpertParallel: {type(module).__name__} is dynamic W4A4 and does not skip the sentinel "
                          f"expert id (expert_parallel_sentinel): its per-call input scales will come from this "
                          f"rank's rows, so the outputs differ from one process's", UserWarning, stacklevel=2)

        def pre(mod, args, kwargs):
            hidden, idx, weights, *rest = args
            idx, weights = route_to_local(idx, weights, rank, world, num, sentinel)
            return (hidden, idx, weights, *rest), kwargs

        # A module declaring expert_parallel_float32_output returns float32 sums here: one rounding, after
        # the all-reduce, to the input's dtype; any other module's output was rounded once already.
        if getattr(module, "expert_parallel_float32_output", False):
            object.__setattr__(module, "_ep_float32_output", True)

        def post(mod, args, kwargs, out):
            return all_reduce_sum(out.float(), group).to(args[0].dtype)

        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(post, with_kwargs=True)
        return module


# ------------------------------------------------------------------------------------------ loading


def read_rows(f, entry, r0: int, r1: int) -> torch.Tensor:
    """Rows r0:r1 of a checkpoint tensor (a safetensors entry: row-major at entry.start), read with one
    positioned read of exactly those bytes."""
    row = entry.nbytes // entry.shape[0] if entry.shape[0] else 0
    out = torch.empty((r1 - r0, *entry.shape[1:]), dtype=entry.dtype)
    _pread(f, out.view(torch.uint8).reshape(-1), entry.start + r0 * row, entry)
    return out


def read_cols(f, entry, c0: int, c1: int) -> torch.Tensor:
    """Columns c0:c1 of a 2-D checkpoint tensor: one positioned read per row of exactly its c1 - c0 values."""
    rows, cols = entry.shape
    item = entry.nbytes // (rows * cols) if rows * cols else 1
    out = torch.empty((rows, c1 - c0), dtype=entry.dtype)
    flat = out.view(torch.uint8).reshape(rows, (c1 - c0) * item)
    for r in range(rows):
        _pread(f, flat[r], entry.start + (r * cols + c0) * item, entry)
    return out


# bytes read by read_rows / read_cols in this process (tests read it)
BYTES_READ = [0]


def _pread(f, dst: torch.Tensor, offset: int, entry) -> None:
    n = dst.numel()
    if n == 0:
        return
    got = os.preadv(f.fileno(), [dst.numpy()], offset)
    BYTES_READ[0] += got
    if got != n:
        from ._checkpoint_io import CheckpointError

        raise CheckpointError(f"{entry.where()}: read {got} of {n} bytes at offset {offset} (file changed or truncated)")


class LoadSharding:
    """What from_pretrained(..., tp_plan=, device_mesh=) needs: which quantized layers are sharded how, their
    local shapes, and a reader of each rank's slice of their checkpoint tensors (the rest of a tensor is
    never read). Built after the model skeleton (meta) and the checkpoint's layer plan; every split is
    checked here, before any data is read."""

    def __init__(self, model: nn.Module, layers: Mapping[str, object], tp_plan, device_mesh) -> None:
        self.group, self.rank, self.world = _mesh_group_rank(device_mesh)
        self.plan = "auto" if tp_plan is None else tp_plan
        plan = resolve_plan(model, self.plan)
        self.styles = {n: STYLE_NAMES[s] for n, s in plan_layers(model, plan, list(layers)).items()}
        if not self.styles:
            raise ValueError(f"from_pretrained: the tensor-parallel plan {dict(plan)} names none of the checkpoint's "
                             f"quantized layers")
        _check_heads(model, plan, self.world)
        self.bounds = {}
        for name, style in self.styles.items():
            p = layers[name]
            try:
                if style.startswith("rowwise"):
                    self.bounds[name] = shard_bounds(p.k, self.rank, self.world, _K_MULTIPLE, "in_features (K)")
                else:
                    self.bounds[name] = shard_bounds(p.n, self.rank, self.world, _N_MULTIPLE, "out_features (N)")
            except ValueError as e:
                raise ValueError(f"from_pretrained: layer '{name}' ({style}): {e}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.styles

    def local_plan(self, plan):
        """The checkpoint loader's per-layer plan with this rank's shape."""
        if self.styles[plan.name].startswith("rowwise"):
            return dataclasses.replace(plan, k=plan.k // self.world)
        return dataclasses.replace(plan, n=plan.n // self.world)

    def load_role(self, layer: NVFP4Linear, plan, role: str, f, ent, fmt) -> None:
        """Reads this rank's slice of one checkpoint tensor of a sharded layer into the (local) layer."""
        from ._checkpoint_io import CheckpointError
        from ._scale_checks import block_scales_problem
        from ._checkpoint_load import _load_role

        lo, hi = self.bounds[plan.name]
        rowwise = self.styles[plan.name].startswith("rowwise")
        if role == "weight":
            t = read_cols(f, ent, lo // 2, hi // 2) if rowwise else read_rows(f, ent, lo, hi)
            layer.weight.copy_(t.view(torch.uint8))
        elif role == "weight_scale":
            sf = read_cols(f, ent, lo // _SF_VEC, hi // _SF_VEC) if rowwise else read_rows(f, ent, lo, hi)
            why = block_scales_problem(sf)
            if why:
                raise CheckpointError(f"{ent.where()}: {why}")
            layer.weight_scale.copy_(to_blocked(sf))
        elif role == "bias" and not rowwise:
            layer.bias.copy_(read_rows(f, ent, lo, hi))
        else:  # per-tensor scales and a rowwise layer's bias: whole (replicated)
            _load_role(layer, plan, role, f, ent, fmt)

    def finish(self, model: nn.Module) -> None:
        """Marks the loaded local layers as shards (their forward's collectives); float nn.Linear layers the
        plan names (an unquantized lm_head) were read whole and are sharded here."""
        plan = resolve_plan(model, self.plan)
        for name, style in plan_layers(model, plan, [n for n, m in model.named_modules()
                                                     if type(m) is nn.Linear]).items():
            shard_float_linear(model.get_submodule(name), style, self.rank, self.world, self.group)
        for name, style in self.styles.items():
            mod = model.get_submodule(name)
            shape = (mod.in_features * self.world, mod.out_features) if style.startswith("rowwise") else \
                (mod.in_features, mod.out_features * self.world)
            object.__setattr__(mod, "_tp_shard", Shard(style, self.rank, self.world, *shape))
            object.__setattr__(mod, "_tp_group", self.group)
            if style == "colwise_gather_output":
                mod.__class__ = GatherNVFP4Linear
            elif style == "rowwise_split_input":
                mod.__class__ = _SplitInputRowwise
            elif style == "rowwise":
                mod.__class__ = RowwiseNVFP4Linear
