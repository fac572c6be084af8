"""Fused projections: the q/k/v and gate/up layers of a transformers decoder block run as ONE NVFP4 GEMM each.

    nvfp4_gemm.fuse_projections(model)      # quantize_model and from_pretrained do this by default (fuse=True)
    nvfp4_gemm.unfuse_projections(model)    # back to one NVFP4Linear (and one GEMM) per projection

Why: transformers keeps q, k, v, gate and up as separate Linear layers, so a decode step pays 7 GEMM
launches per block, most of them small and latency-bound (k and v of an 8B Llama are 1024 x 4096). Engines
concatenate each group's weights along N and run one GEMM.

Storage. A fused group's packed weights [sum N, K/2], blocked e4m3 scales and biases are concatenated once;
each part (`model.layers[i].self_attn.q_proj`, ...) stays the same module object in its place (its hooks and
every reference to it too), its class changed in place to `FusedNVFP4Linear` (an NVFP4Linear subclass that
adds methods only), and its `weight`, `weight_scale` and `bias` buffers become views of the fused tensors:
state_dict keys and values, save_pretrained's output and every part's own forward are those of the unfused
layers, and the model holds no second copy. The blocked scales concatenate exactly when every part's N is a
multiple of 128 (a part is then whole 128-row blocks of the fused layout); other groups (SmolLM2's 192-row
k/v) stay unfused. The per-tensor scales are not concatenated, and they may differ between parts:
  * parts that share weight_scale_2 (and, static W4A4, input_scale), as ModelOpt's and llm-compressor's
    exports and quantize_model with fuse=True make them, run one nvfp4_gemm.linear call: one alpha;
  * parts whose weight_scale_2 differ (quantize_model with fuse=False, a checkpoint that did not share
    them) run one GEMM with alpha = 1 into float32, then each part's columns are multiplied by that part's
    own alpha, formed exactly as its own linear call forms it (weight-only: weight_scale_2; W4A4:
    fl(input decode scale * weight_scale_2), the decode scale being input_scale, or the call's dynamic one
    from nvfp4_gemm._input_scales), the bias added in fp32 and the sum rounded once to x's dtype. The
    kernels' epilogues compute round(fl(alpha * acc)) (the CPU's; sm90's fl(fl(2^7 * alpha) * acc') with
    acc = 2^7 * acc' exactly, the power of two its decode leaves; cuBLAS's alpha * acc with beta = 0 on
    the generic path), so this is the same arithmetic, one launch later: never a block scale rescaled into
    e4m3. Its GEMM takes x already quantized (W4A4: _input_scales, quantize, then mm, as linear does where
    no kernel quantizes x itself), and under torch.compile the whole of it is one op
    (nvfp4_gemm::_linear_parts), so that inductor cannot contract the multiply and the bias add into an
    FMA. Cost against one shared alpha: the fp32 result written and read once more and 2-4 small launches
    (the alpha columns, the multiply, the bias add; W4A4: the quantize the sm90 kernel would otherwise do
    itself), measured by benchmarks/bench_generate.py --own-scales. A call that needs a gradient (x, the
    bias or a weight_scale_2 requiring grad) runs the group unfused;
  * parts whose static input_scale differ stay unfused (exact): each would quantize x with its own scale,
    so the parts share no quantized x for one GEMM to read.
A group that stays unfused, and why, is logged at debug level.

Execution. transformers calls the projections one by one inside its own attention and MLP forwards
(`self.q_proj(hidden_states)`, `self.k_proj(hidden_states)`, ...), so nothing outside the parts changes: the
group's first part (q_proj, gate_proj) runs the fused GEMM on its input x, returns its own slice and leaves
the other slices in the group's slot, keyed on x itself (identity and, in eager mode, x's version counter, so
an in-place change of x in between is a miss). A later part called with that same x takes its slice (once) and
the slot empties when every slice has been taken; a part called with anything else, or with nothing left in
the slot, runs its own GEMM on its own views: a miss costs time, never correctness. Under torch.compile the
same Python runs at trace time (dynamo cannot read version counters, so the key is x's identity in the traced
program) and the compiled graph holds one fused GEMM; inference-mode tensors have no version counter either.
Identity alone is enough for the families fused by default: their attention and MLP forwards never modify the
projections' input in place. The whole group takes the unfused path for a call while any part has a forward
(pre-)hook, or a global module forward hook is registered, so hooks on a part see exactly what an unfused
layer would give them. Hooks on the parent (the attention / MLP module) need nothing: the parts still receive
whatever the parent's forward hands them. A group becomes unfused (permanently, until fuse_projections is
called again) when a part's buffer is replaced (`set_input_amax`, assignment) or, in eager mode, when a part's
per-tensor scale is changed in place; load_state_dict re-checks the group.

Numerics. The fused GEMM computes every output element from the same operands as the part's own GEMM
(dynamic W4A4: the amax of x is the same for every part), and applies the part's own alpha, so results
are bit for bit the unfused ones on the CPU; on CUDA a different N can select a different kernel
configuration (fp32 accumulation order); with per-part alphas the static W4A4 GEMM reads x quantized by
the quantize kernel rather than inside the sm90 kernel (the same bits), and at M >= 2048 (decode +
cuBLAS) the fp32 output can make cuBLAS pick another kernel than the part's own fp16 / bf16 one. What
changes numerics is the SHARED per-tensor weight scale that quantize_model gives a fusable group (from
the group's largest |w|, as ModelOpt's export does): k and v are then quantized with q's group scale
rather than their own (fuse=False keeps each layer's own scale; fuse_projections then fuses them with
per-part alphas).

Limits: one thread per model at a time (a concurrent forward just misses the slot); an exception between the
first part and the last leaves the slot holding x and the untaken slices until the group's next call.
"""
from __future__ import annotations

import logging
import re

import torch
from torch import nn
from torch.nn.modules import module as _module

from ._groups import group_members
from .nn import NVFP4Linear
from .autograd import call_linear, call_mm
from .ops import _check_devices

log = logging.getLogger(__name__)

# Decoder families whose attention and MLP call the parts of a group on the same tensor, in the order of
# _groups.FUSABLE_GROUPS
# (read in transformers 5.x: Llama, Mistral, Qwen2 and Qwen3 attention and MLP forwards).
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
_FAMILY_MODULE = re.compile(r"transformers\.models\.(%s)\.modeling_" % "|".join(FAMILIES))
# A part's N must be whole 128-row blocks of the blocked scale layout for the scales to concatenate.
_ROW_BLOCK = 128
_VIEWS = ("weight", "weight_scale", "bias")
_SCALARS = ("weight_scale_2", "input_scale")
# Bias dtypes the add reads as they are; others are rounded to float32 first (csrc/bindings/linear.cpp's
# finish_linear, which the unfused parts run).
_BIAS_AS_IS = (torch.float32, torch.float16, torch.bfloat16)
_INPUT_SCALES_OP = torch.ops.nvfp4_gemm._input_scales.default
_QUANTIZE_OP = torch.ops.nvfp4_gemm.quantize.default


def linear_parts(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 weight_scale_2: list[torch.Tensor], sizes: list[int], input_scale: torch.Tensor | None,
                 bias: torch.Tensor | None, weight_only: bool) -> torch.Tensor:
    """nvfp4_gemm.linear of the concatenated parts (weight [sum sizes, K/2], ...) where part i has its own
    weight_scale_2[i]: bit for bit the parts' own linear calls, concatenated along the last dim (module
    docstring). No host sync; no autograd (the caller runs the parts unfused when a gradient is needed)."""
    k = weight.shape[1] * 2
    x2 = x.reshape(-1, k)
    # (linear's rows_for_kernels: the GPU kernels read 16-byte aligned rows of unit stride)
    if not x2.is_contiguous() or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)
    n = weight.shape[0]
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n))
    # Each column's alpha, in the column's part order (expand: no per-part copy before the one cat).
    alpha = torch.cat([t.reshape(1).expand(size) for t, size in zip(weight_scale_2, sizes)])
    if weight_only:
        acc = call_mm(x2, weight, None, weight_scale, None, torch.float32)
    else:
        # [encode, decode, alpha of part 0]: encode and decode do not depend on weight_scale_2.
        scales = _INPUT_SCALES_OP(x2, weight_scale_2[0], input_scale)
        packed, sf = _QUANTIZE_OP(x2, scales[0:1])
        acc = call_mm(packed, weight, sf, weight_scale, None, torch.float32)
        alpha = scales[1:2] * alpha  # fl(decode * weight_scale_2), as recipe.h's InputScales forms alpha
    out = torch.empty(acc.shape, dtype=x.dtype, device=x.device)
    if bias is None:
        torch.mul(acc, alpha, out=out)  # fp32 product, one rounding to x's dtype on the store
    else:
        acc.mul_(alpha)
        torch.add(acc, bias if bias.dtype in _BIAS_AS_IS else bias.float(), out=out)
    return out.view(*x.shape[:-1], n)


@torch.library.custom_op("nvfp4_gemm::_linear_parts", mutates_args=())
def _linear_parts_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     weight_scale_2: list[torch.Tensor], sizes: list[int], input_scale: torch.Tensor | None,
                     bias: torch.Tensor | None, weight_only: bool) -> torch.Tensor:
    # What compiled code calls: one opaque op, so that the epilogue's multiply and add stay two roundings.
    return linear_parts(x, weight, weight_scale, weight_scale_2, sizes, input_scale, bias, weight_only)


@_linear_parts_op.register_fake
def _(x, weight, weight_scale, weight_scale_2, sizes, input_scale, bias, weight_only):
    scales_2 = {f"weight_scale_2[{i}]": t for i, t in enumerate(weight_scale_2)}
    _check_devices("nvfp4_gemm._linear_parts", "x", x, weight=weight, weight_scale=weight_scale,
                   input_scale=input_scale, bias=bias, **scales_2)
    torch._check(sum(sizes) == weight.shape[0],
                 lambda: f"nvfp4_gemm._linear_parts: sizes must sum to N = {weight.shape[0]}, got {sizes}")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def supported_parent(module: nn.Module) -> bool:
    """True for the attention and MLP modules of the families whose forwards fusion was checked against."""
    return _FAMILY_MODULE.match(type(module).__module__ or "") is not None


def _hooked(parts) -> bool:
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return True
    for p in parts:
        if p._forward_hooks or p._forward_pre_hooks:
            return True
    return False


def _shares_storage(view: torch.Tensor, base: torch.Tensor) -> bool:
    # (not view._base: views made under torch.inference_mode have none)
    return view.device == base.device and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


class _Group:
    """The fused tensors of one group and the slot that hands the later parts their slices. Not a Module:
    nothing here appears in state_dict or named_modules; the parts move it along in _apply."""

    def __init__(self, parts: list[NVFP4Linear]) -> None:
        self.parts = parts
        self.sizes = [p.out_features for p in parts]
        self.weight = torch.cat([p.weight for p in parts])
        self.weight_scale = torch.cat([p.weight_scale.reshape(-1) for p in parts])
        self.bias = torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None
        self.valid = False
        self.own_alphas = False  # the parts' weight_scale_2 differ: linear_parts, not one linear call
        self.tracked: list[torch.Tensor] = []  # the parts' per-tensor scales and their versions when validated
        self.versions: list[int] = []
        self.views: list[dict] = []
        self.slot = None

    # -- the parts' views of the fused tensors

    def view(self, i: int, name: str) -> torch.Tensor | None:
        start = sum(self.sizes[:i])
        n = self.sizes[i]
        if name == "weight":
            return self.weight[start:start + n]
        if name == "bias":
            return None if self.bias is None else self.bias[start:start + n]
        per_row = self.weight_scale.numel() // sum(self.sizes)  # round_up(K/16, 4) bytes per row
        return self.weight_scale[start * per_row:(start + n) * per_row]

    def attach(self) -> None:
        """Points every part's weight / weight_scale / bias at its view of the fused tensors."""
        self.views = []
        for i, p in enumerate(self.parts):
            views = {name: self.view(i, name) for name in _VIEWS}
            for name, v in views.items():
                p._buffers[name] = v
            self.views.append(views)

    def tracked_scalars(self) -> list[torch.Tensor]:
        # (inference-mode tensors, made under torch.inference_mode, have no version counter to watch)
        return [t for p in self.parts for t in (p._buffers.get(n) for n in _SCALARS)
                if t is not None and not t.is_inference()]

    def why_invalid(self) -> str | None:
        """None if the fused GEMM computes exactly what the parts compute, else why not (syncs the host)."""
        lead = self.parts[0]
        for i, p in enumerate(self.parts):
            for name in _VIEWS:
                v, base = self.views[i][name], getattr(self, name)
                if p._buffers.get(name) is not v or (v is not None and not _shares_storage(v, base)):
                    return f"{name} of part {i} is not a view of the fused tensors"
            if p.weight_only != lead.weight_only:
                return "the parts mix weight-only and W4A4 modes"
            if p.block_scales_only:
                return "a part is per-block dynamic (block_scales_only)"
            why = _scalars_problem(lead, p, self.weight.device)
            if why:
                return why
        return None

    def alphas_differ(self) -> bool:
        ws2 = [p._buffers["weight_scale_2"].reshape(-1).float() for p in self.parts]
        return not all(torch.equal(ws2[0], t) for t in ws2[1:])

    def validate(self, where: str = "") -> bool:
        why = self.why_invalid()
        self.valid = why is None
        self.own_alphas = self.valid and self.alphas_differ()
        self.tracked = self.tracked_scalars() if self.valid else []
        self.versions = [t._version for t in self.tracked]
        self.slot = None
        if why:
            log.debug("fused projections %s: running unfused: %s", where or self.sizes, why)
        elif self.own_alphas:
            log.debug("fused projections %s: the parts' weight_scale_2 differ: one GEMM, each part's own alpha "
                      "in the epilogue", where or self.sizes)
        return self.valid

    def invalidate(self, why: str) -> None:
        if self.valid:
            log.debug("fused projections %s: running unfused from now on: %s", self.sizes, why)
        self.valid = False
        self.slot = None

    def usable(self) -> bool:
        if not self.valid or _hooked(self.parts):
            return False
        if torch.compiler.is_compiling():
            return True
        # (assigning a new scale tensor to a part invalidates the group in FusedNVFP4Linear.__setattr__)
        for t, v in zip(self.tracked, self.versions):
            if t._version != v:
                self.invalidate("a part's per-tensor scale was changed in place")
                return False
        return True

    # -- device moves and casts

    def apply(self, fn) -> None:
        """fn on the fused tensors: device moves only for the packed weight and scales (their dtypes are the
        format), fn itself for the bias. Idempotent for .to / .cuda / .half ...: the second part's call
        finds the tensors already moved."""
        for name in ("weight", "weight_scale"):
            t = getattr(self, name)
            probe = fn(t.new_empty(0))
            setattr(self, name, fn(t) if probe.dtype == t.dtype else t.to(probe.device))
        if self.bias is not None:
            self.bias = fn(self.bias)


class FusedNVFP4Linear(NVFP4Linear):
    """One part of a fused group: an NVFP4Linear whose weight, weight_scale and bias are views of the group's
    fused tensors (module docstring). Its own forward computes what an NVFP4Linear with the same buffers
    computes, whichever path it takes."""

    _group: _Group | None = None
    _index: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self._group
        if g is None or not g.valid:
            return super().forward(x)
        # An inference-mode tensor has no version counter, and dynamo cannot read one: identity alone then.
        version = None if torch.compiler.is_compiling() or x.is_inference() else x._version
        if self._index == 0:
            # The whole group's checks run here, once per call of the group: a later part only takes what
            # this call left for the same x (hooks on any part send this call down the unfused path).
            if not g.usable():
                g.slot = None
                return super().forward(x)
            lead = self
            if g.own_alphas:
                if torch.is_grad_enabled() and (
                        x.requires_grad or (g.bias is not None and g.bias.requires_grad)
                        or any(p._buffers["weight_scale_2"].requires_grad for p in g.parts)):
                    # linear_parts has no backward: each part runs its own linear (autograd, and its refusal
                    # of a frozen scale that requires grad)
                    g.slot = None
                    return super().forward(x)
                y = self._linear_parts(x, g)
            else:
                # (call_linear: NVFP4Linear.forward's entry, autograd included)
                y = call_linear(x, g.weight, g.weight_scale, lead._buffers["weight_scale_2"],
                                lead._buffers["input_scale"], g.bias, lead.weight_only)
            outs = list(y.split(g.sizes, dim=-1))
            g.slot = (x, version, outs)
            mine, outs[0] = outs[0], None
            return mine
        slot = g.slot
        if slot is not None and slot[0] is x and slot[1] == version:
            outs = slot[2]
            mine, outs[self._index] = outs[self._index], None
            if all(o is None for o in outs):
                g.slot = None
            if mine is not None:
                return mine
        return super().forward(x)

    def _linear_parts(self, x: torch.Tensor, g: _Group) -> torch.Tensor:
        if x.dim() < 2:
            self._check_input(x)  # raises, in the layer's terms (a 1-D x would reshape without complaint)
        args = (x, g.weight, g.weight_scale, [p._buffers["weight_scale_2"] for p in g.parts], g.sizes,
                self._buffers["input_scale"], g.bias, self.weight_only)
        try:
            if torch.compiler.is_compiling():
                return torch.ops.nvfp4_gemm._linear_parts(*args)
            return linear_parts(*args)  # eager: no custom-op dispatch (host time per call)
        except RuntimeError:
            self._check_input(x)  # the layer's own terms (in_features, its device) where they apply
            raise

    def __setattr__(self, name, value):
        g = self.__dict__.get("_group")
        if g is not None and name in _VIEWS + _SCALARS + ("weight_only", "block_scales_only"):
            g.invalidate(f"{name} of a part was assigned")
        super().__setattr__(name, value)

    def _apply(self, fn, recurse=True):
        g = self._group
        if g is None or not g.views:
            return super()._apply(fn, recurse)
        mine = g.views[self._index]
        attached = [n for n in _VIEWS if mine[n] is not None and self._buffers.get(n) is mine[n]]
        for name in attached:  # NVFP4Linear._apply would move each view on its own: a copy per part
            self._buffers[name] = None
        try:
            super()._apply(fn, recurse)  # the per-tensor scales
        finally:
            for name in attached:
                self._buffers[name] = mine[name]
        g.apply(fn)  # the first part to get here moves the fused tensors; the others find them moved
        for name in attached:
            mine[name] = self._buffers[name] = g.view(self._index, name)
        g.validate()  # valid again once every part points into the moved tensors
        return self


def _scalars_problem(lead: NVFP4Linear, p: NVFP4Linear, device: torch.device) -> str | None:
    """None if part p's per-tensor scales can join lead's in one fused GEMM (weight_scale_2 may differ: each
    part then keeps its own alpha), else why not."""
    for name in _SCALARS:
        a, b = lead._buffers.get(name), p._buffers.get(name)
        if (a is None) != (b is None):
            return f"only some parts have {name}"
        if a is None:
            continue
        if a.device != device or b.device != device:
            return f"a part's {name} is not on the weights' device {device}"
        if name == "input_scale" and not torch.equal(a.reshape(-1).float(), b.reshape(-1).float()):
            return (f"the parts' input_scale differ ({a.reshape(-1).tolist()} vs {b.reshape(-1).tolist()}): each "
                    f"part quantizes x with its own scale, so no one quantized x serves a fused GEMM")
    return None


def _after_load(module: FusedNVFP4Linear, incompatible_keys) -> None:
    # load_state_dict copies into the views (the fused tensors follow) and into each part's scalars: the
    # parts may no longer agree.
    if module._group is not None:
        module._group.validate()


def _why_not(parts: list[nn.Module]) -> str | None:
    """None if these modules can form one fused group (before comparing their per-tensor scales)."""
    lead = parts[0]
    for p in parts:
        if type(p) not in (NVFP4Linear, FusedNVFP4Linear):
            return f"{type(p).__name__} is not an NVFP4Linear"
        if p.out_features % _ROW_BLOCK:
            return f"out_features {p.out_features} is not a multiple of {_ROW_BLOCK}"
        if p.block_scales_only:
            return "per-block dynamic (block_scales_only) layers are not fused"
        if p.in_features != lead.in_features:
            return "the parts have different in_features"
        if (p.bias is None) != (lead.bias is None) or (p.bias is not None and p.bias.dtype != lead.bias.dtype):
            return "the parts' biases differ in presence or dtype"
        for name in ("weight", "weight_scale", "bias", *_SCALARS):
            if name in p._parameters:
                return f"{name} is a Parameter"
        if p.weight.device != lead.weight.device or p.weight.dtype != lead.weight.dtype:
            return "the parts' weights differ in device or dtype"
    return None


def fuse_group(parent: nn.Module, names: tuple[str, ...], where: str = "") -> bool:
    """Fuses parent.<names> (NVFP4Linear layers) into one group if they qualify; True if it did. Each part
    stays the same module object (its hooks, its place, references to it), now a FusedNVFP4Linear whose
    weight, weight_scale and bias are views of the concatenated tensors."""
    parts = [getattr(parent, n) for n in names]
    why = _why_not(parts)
    if why is None:
        g0 = getattr(parts[0], "_group", None)
        if g0 is not None and g0.valid and [getattr(p, "_group", None) for p in parts] == [g0] * len(parts):
            return True  # already fused and in order
        lead = parts[0]
        for p in parts[1:]:
            why = why or ("the parts mix weight-only and W4A4 modes" if p.weight_only != lead.weight_only
                          else _scalars_problem(lead, p, lead.weight.device))
    if why is not None:
        log.debug("fuse_projections: %s%s stay unfused: %s", f"{where}." if where else "", "/".join(names), why)
        return False
    for p in parts:
        if isinstance(p, FusedNVFP4Linear):
            _unfuse_part(p)
    group = _Group(parts)
    for i, p in enumerate(parts):
        # The class changes in place (a subclass adding methods only): the module keeps its identity, hooks
        # and place, so nothing that refers to model.layers[i].self_attn.k_proj has to know.
        p.__class__ = FusedNVFP4Linear
        object.__setattr__(p, "_group", group)
        object.__setattr__(p, "_index", i)
        p.register_load_state_dict_post_hook(_after_load)
    group.attach()  # the parts' own tensors are dropped here: the fused copies replace them
    return group.validate(where)


def _unfuse_part(p: FusedNVFP4Linear) -> None:
    """Back to a plain NVFP4Linear, in place, with its own contiguous copies of its tensors."""
    g = p.__dict__.pop("_group", None)
    if g is not None:
        g.invalidate("a part was unfused")
    for name in _VIEWS:
        t = p._buffers.get(name)
        if t is not None:
            p._buffers[name] = t.clone()
    hooks = p._load_state_dict_post_hooks  # (not a stored handle: a deep copy's would point at the original)
    for key in [k for k, h in hooks.items() if h is _after_load]:
        del hooks[key]
    p.__dict__.pop("_index", None)
    p.__class__ = NVFP4Linear


def fuse_projections(model: nn.Module, *, any_family: bool = False) -> int:
    """Fuses, in place, every q/k/v and gate/up group of NVFP4Linear layers that qualifies (module
    docstring): the attention and MLP modules of the Llama, Mistral, Qwen2 and Qwen3 families of
    transformers (with any_family=True, any module with the children of a group of _groups.FUSABLE_GROUPS,
    Mixtral-style w1/w3 experts included: fusion is exact wherever the parts are called with the same tensor,
    and costs a wasted GEMM where they are not). Groups already fused are
    re-checked, and re-fused if they had become unfused. Returns the number of fused groups. Groups left
    unfused, and why, are logged at debug level (logger nvfp4_gemm.fused)."""
    count = 0
    for name, mod in list(model.named_modules()):
        if not (any_family or supported_parent(mod)):
            continue
        for names in group_members(mod):
            parts = [getattr(mod, n) for n in names]
            g = getattr(parts[0], "_group", None)
            if g is not None and g.parts == parts and g.validate(name):
                count += 1
                continue
            for p in parts:  # an invalid group, or parts of other groups: checked afresh
                if isinstance(p, FusedNVFP4Linear):
                    _unfuse_part(p)
            count += fuse_group(mod, names, name)
    return count


def unfuse_projections(model: nn.Module) -> int:
    """Turns every FusedNVFP4Linear back into a plain NVFP4Linear (in place: same module objects and hooks)
    with its own contiguous copies of its tensors: one GEMM per projection again, numerics unchanged.
    Returns the number of layers changed."""
    parts = [m for m in model.modules() if isinstance(m, FusedNVFP4Linear)]
    for p in parts:
        _unfuse_part(p)
    return len(parts)


def fusable_groups(model: nn.Module, names: set[str], shape_ok) -> list[list[str]]:
    """quantize_model's plan: the groups of `names` (qualified names of nn.Linear layers about to be
    quantized) under a supported parent whose shapes fuse (shape_ok(linear) and N % 128 == 0, the same K,
    biases all present or all absent), as lists of qualified names, first part first."""
    out = []
    for pname, mod in model.named_modules():
        if not supported_parent(mod):
            continue
        for group in group_members(mod):
            full = [f"{pname}.{n}" if pname else n for n in group]
            lins = [getattr(mod, n) for n in group]
            if not all(f in names for f in full) or not all(type(m) is nn.Linear and shape_ok(m) for m in lins):
                continue
            if any(m.out_features % _ROW_BLOCK for m in lins) or len({m.in_features for m in lins}) != 1:
                log.debug("quantize_model: %s keep their own weight scales (not fusable: shapes %s)", full,
                          [tuple(m.weight.shape) for m in lins])
                continue
            if len({m.bias is None for m in lins}) != 1:
                continue
            out.append(full)
    return out
