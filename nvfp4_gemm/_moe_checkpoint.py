"""Mixture-of-experts checkpoints: per-expert tensors on disk, NVFP4Experts in memory.

Every public NVFP4 MoE checkpoint (ModelOpt's export, llm-compressor's, what vLLM and TensorRT-LLM read) and
transformers' own save of a float MoE model name each expert's projections as separate Linear layers:
    <block>.experts.<e>.gate_proj / up_proj / down_proj . <the format's tensor names>
(Mixtral: <layer>.block_sparse_moe.experts.<e>.w1 (gate) / w3 (up) / w2 (down), and the router
<layer>.block_sparse_moe.gate), while transformers 5 builds one experts module holding 3-D tensors
(<layer>.mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]).

So the checkpoint code meets the experts as what the files say they are: before planning a load, each
experts module of the meta model is swapped for a staging ModuleList of per-expert MLPs whose projections
are nn.Linear under the checkpoint's names (`stage_for_load`); the ordinary loader then plans, checks and
reads them as it does any Linear (formats, names, dtypes, shapes, quantize=True's shared gate/up scale), and
`finish_load` stacks each staged module into one NVFP4Experts (or back into the float experts module when
the checkpoint left the experts float), one module at a time. Saving does the reverse for the duration of
the write (`per_expert_view`): each NVFP4Experts is shown as per-expert NVFP4Linear layers whose packed
weights are views of the 3-D buffers (their block scales re-laid out per part), and the model is restored
afterwards.
"""
from __future__ import annotations

import contextlib
import re

import torch
from torch import nn

from ._checkpoint_io import UnsupportedFormatError
from .formats import from_blocked, to_blocked
from .moe import NVFP4Experts, looks_like_experts, router_of, unsupported_reason
from .nn import NVFP4Linear

# (attribute of the decoder layer holding the MoE block on disk, gate, up, down): transformers' own names
# first, then Mixtral's original ones.
_NAMINGS = (("mlp", "gate_proj", "up_proj", "down_proj"), ("block_sparse_moe", "w1", "w3", "w2"))


class _ExpertMLP(nn.Module):
    """One expert's three projections as separate Linear layers, under the checkpoint's names."""

    def __init__(self, names: tuple[str, str, str], hidden: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.names = names
        g, u, d = names
        setattr(self, g, nn.Linear(hidden, inter, bias=False, dtype=dtype))
        setattr(self, u, nn.Linear(hidden, inter, bias=False, dtype=dtype))
        setattr(self, d, nn.Linear(inter, hidden, bias=False, dtype=dtype))

    def parts(self) -> tuple[nn.Module, nn.Module, nn.Module]:
        return tuple(getattr(self, n) for n in self.names)


class _StagedExperts(nn.ModuleList):
    """The per-expert stand-in of one experts module while a checkpoint is read or written."""

    def __init__(self, original: nn.Module, names: tuple[str, str, str], experts: list[_ExpertMLP]) -> None:
        super().__init__(experts)
        object.__setattr__(self, "original", original)  # not a child: not in state_dict


class _Staging:
    """Where each staged experts module sits, and the MoE block attributes renamed for the checkpoint's naming."""

    def __init__(self) -> None:
        self.experts: list[tuple[str, _StagedExperts]] = []   # (qualified name while staged, module)
        self.renamed: list[tuple[nn.Module, str, str]] = []   # (decoder layer, on-disk attr, model attr)

    def __bool__(self) -> bool:
        return bool(self.experts)


def _experts_sites(model: nn.Module):
    """(layer name, layer module, block attr, experts module) for every transformers experts module inside
    a MoE block that is an attribute of a decoder layer."""
    for name, mod in model.named_modules():
        if not looks_like_experts(mod):
            continue
        block_name, _, attr = name.rpartition(".")
        if attr != "experts" or not block_name:
            continue
        layer_name, _, block_attr = block_name.rpartition(".")
        layer = model.get_submodule(layer_name) if layer_name else model
        yield layer_name, layer, block_attr, mod


def _naming_in(entries, layer_name: str, block_attr: str) -> tuple[str, str, str, str] | None:
    """The naming under which the checkpoint holds this block's experts (None: not per expert)."""
    prefix = f"{layer_name}." if layer_name else ""
    for naming in _NAMINGS:
        attr = naming[0] if naming[0] != "mlp" else block_attr
        head = f"{prefix}{attr}.experts.0.{naming[1]}."
        if any(k.startswith(head) for k in entries):
            return (attr, *naming[1:])
    return None


def stage_for_load(model: nn.Module, entries) -> _Staging:
    """Swaps each experts module of the (meta) model whose checkpoint holds per-expert tensors for a staging
    module of per-expert Linear layers under the checkpoint's names (module docstring)."""
    staging = _Staging()
    for layer_name, layer, block_attr, mod in list(_experts_sites(model)):
        naming = _naming_in(entries, layer_name, block_attr)
        if naming is None:
            continue  # 3-D tensors on disk (or none): the model's own parameters are what the files hold
        why = unsupported_reason(mod)
        if why:
            raise UnsupportedFormatError(f"'{layer_name}.{block_attr}.experts': {why}")
        disk_attr, names = naming[0], naming[1:]
        block = getattr(layer, block_attr)
        if disk_attr != block_attr:
            delattr(layer, block_attr)
            setattr(layer, disk_attr, block)
            staging.renamed.append((layer, disk_attr, block_attr))
        e, n2, h = mod.gate_up_proj.shape
        with torch.device("meta"):
            staged = _StagedExperts(mod, names, [_ExpertMLP(names, h, n2 // 2, mod.gate_up_proj.dtype)
                                                 for _ in range(e)])
        block.experts = staged
        staging.experts.append((f"{layer_name}.{disk_attr}.experts" if layer_name else f"{disk_attr}.experts", staged))
    return staging


def _mode(layer: nn.Module) -> str:
    if not isinstance(layer, NVFP4Linear):
        return "float"
    if layer.weight_only:
        return "weight_only"
    if layer.input_scale is not None:
        return "static"
    return "dynamic_block" if getattr(layer, "block_scales_only", False) else "dynamic"


def experts_from_linears(staged: _StagedExperts, device: torch.device) -> nn.Module:
    """One NVFP4Experts from a staged module's per-expert NVFP4Linear layers (or the float experts module
    again from float ones), on `device`."""
    original = staged.original
    parts = [m.parts() for m in staged]
    modes = {_mode(p) for trio in parts for p in trio}
    if modes == {"float"}:
        flt = original.to_empty(device=device)
        with torch.no_grad():
            for e, (g, u, d) in enumerate(parts):
                flt.gate_up_proj[e].copy_(torch.cat([g.weight, u.weight]))
                flt.down_proj[e].copy_(d.weight)
        return flt
    if len(modes) != 1:
        raise UnsupportedFormatError(f"the experts mix modes {sorted(modes)}; NVFP4 experts run every expert, "
                                     f"gate, up and down alike in one mode")
    mode = modes.pop()
    if mode == "dynamic_block":
        raise UnsupportedFormatError("per-block dynamic input scales (compressed-tensors input_activations "
                                     "dynamic=true) are not supported for experts; load with weight_only=True, "
                                     "or use a checkpoint with static ('local') input scales")
    e = len(parts)
    g0 = parts[0][0]
    h, i = g0.in_features, g0.out_features
    out = NVFP4Experts(e, h, i, act_fn=getattr(original, "act_fn", None), weight_only=mode == "weight_only",
                       static_input_scale=mode == "static", device=device)
    with torch.no_grad():
        for x, (g, u, d) in enumerate(parts):
            out.gate_up_proj[x].copy_(torch.cat([g.weight, u.weight]))
            out.gate_up_proj_weight_scale[x].copy_(to_blocked(torch.cat(
                [from_blocked(g.weight_scale, i, h), from_blocked(u.weight_scale, i, h)])))
            out.gate_up_proj_weight_scale_2[x].copy_(torch.cat([g.weight_scale_2.reshape(1),
                                                                 u.weight_scale_2.reshape(1)]))
            out.down_proj[x].copy_(d.weight)
            out.down_proj_weight_scale[x].copy_(d.weight_scale.reshape(-1))
            out.down_proj_weight_scale_2[x].copy_(d.weight_scale_2.reshape(()))
            if mode == "static":
                out.gate_up_proj_input_scale[x].copy_(torch.cat([g.input_scale.reshape(1), u.input_scale.reshape(1)]))
                out.down_proj_input_scale[x].copy_(d.input_scale.reshape(()))
    out.refresh()
    return out


def finish_load(model: nn.Module, staging: _Staging, device: torch.device) -> list[str]:
    """Stacks every staged module into its experts module (one at a time: the per-expert copies of one
    module are freed before the next is stacked) and restores the model's own attribute names. Returns the
    names of the NVFP4Experts modules made."""
    made = []
    for name, staged in staging.experts:
        block = model.get_submodule(name.rpartition(".")[0])
        try:
            block.experts = experts_from_linears(staged, device)
        except UnsupportedFormatError as e:
            raise UnsupportedFormatError(f"'{name}': {e}") from None
        if isinstance(block.experts, NVFP4Experts):
            made.append(name)
    for layer, disk_attr, model_attr in staging.renamed:
        block = getattr(layer, disk_attr)
        delattr(layer, disk_attr)
        setattr(layer, model_attr, block)
    staging.experts.clear()
    staging.renamed.clear()
    return [re.sub(r"\.block_sparse_moe\.", ".mlp.", n) for n in made]


class _PartView(NVFP4Linear):
    """An NVFP4Linear over one expert part of an NVFP4Experts, for writing only: the packed weight is a view
    of the 3-D buffer, the block scales this part's own blocked copy, the per-tensor scales views."""

    def __init__(self, experts: NVFP4Experts, e: int, part: str) -> None:
        nn.Module.__init__(self)
        h, i = experts.hidden_dim, experts.intermediate_dim
        self.weight_only = experts.weight_only
        self.block_scales_only = False
        if part == "down":
            self.in_features, self.out_features = i, h
            w, sf = experts.down_proj[e], experts.down_proj_weight_scale[e]
            ws2 = experts.down_proj_weight_scale_2[e:e + 1]
            inp = None if experts.down_proj_input_scale is None else experts.down_proj_input_scale[e:e + 1]
        else:
            p = 0 if part == "gate" else 1
            self.in_features, self.out_features = h, i
            w = experts.gate_up_proj[e, p * i:(p + 1) * i]
            sf = to_blocked(from_blocked(experts.gate_up_proj_weight_scale[e], 2 * i, h)[p * i:(p + 1) * i])
            ws2 = experts.gate_up_proj_weight_scale_2[e, p:p + 1]
            inp = None if experts.gate_up_proj_input_scale is None else experts.gate_up_proj_input_scale[e, p:p + 1]
        self.register_buffer("weight", w)
        self.register_buffer("weight_scale", sf)
        self.register_buffer("weight_scale_2", ws2)
        self.register_buffer("input_scale", inp)
        self.register_buffer("bias", None)


def _float_part(experts: nn.Module, e: int, part: str) -> nn.Linear:
    """An nn.Linear whose weight is a view of one part of a float experts module (for writing only)."""
    i = experts.gate_up_proj.shape[1] // 2
    w = experts.down_proj[e] if part == "down" else experts.gate_up_proj[e, (0 if part == "gate" else i):][:i]
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight = nn.Parameter(w.detach(), requires_grad=False)
    return lin


def has_experts(model: nn.Module) -> bool:
    """Whether save_pretrained must show experts per expert (per_expert_view)."""
    return any(isinstance(m, NVFP4Experts) or (looks_like_experts(m) and unsupported_reason(m) is None)
               for m in model.modules())


def _naming_for_save(layer: nn.Module, block_attr: str) -> tuple[str, str, str, str]:
    from .moe import family_of

    if family_of(layer) == "mixtral":  # the names Mixtral checkpoints (and their readers) use
        return _NAMINGS[1]
    return (block_attr, *_NAMINGS[0][1:])


@contextlib.contextmanager
def per_expert_view(model: nn.Module):
    """For the duration of a save: every NVFP4Experts shown as per-expert NVFP4Linear layers, and every float
    experts module (left out of quantization) as per-expert nn.Linear layers, under the names checkpoints use
    (module docstring; the weights are views, nothing is copied but the per-part block scales); the model is
    restored on exit, whatever happens."""
    swaps = []   # (block, experts module)
    renamed = []  # (layer, disk attr, model attr)
    try:
        for name, mod in list(model.named_modules()):
            if not (isinstance(mod, NVFP4Experts) or (looks_like_experts(mod) and unsupported_reason(mod) is None)):
                continue
            block_name, _, attr = name.rpartition(".")
            if attr != "experts" or not block_name:
                raise ValueError(f"save_pretrained: NVFP4Experts '{name}' is not the 'experts' of a MoE block")
            layer_name, _, block_attr = block_name.rpartition(".")
            layer = model.get_submodule(layer_name) if layer_name else model
            block = getattr(layer, block_attr)
            disk_attr, *names = _naming_for_save(layer, block_attr)
            with torch.device("meta"):
                staged = _StagedExperts(mod, tuple(names), [])
            for e in range(mod.gate_up_proj.shape[0]):
                trio = nn.Module()
                for n, part in zip(names, ("gate", "up", "down")):
                    setattr(trio, n, _PartView(mod, e, part) if isinstance(mod, NVFP4Experts) else
                            _float_part(mod, e, part))
                staged.append(trio)
            block.experts = staged
            swaps.append((block, mod))
            if disk_attr != block_attr:
                delattr(layer, block_attr)
                setattr(layer, disk_attr, block)
                renamed.append((layer, disk_attr, block_attr))
        yield [n for n, m in model.named_modules() if isinstance(m, _StagedExperts)]
    finally:
        for layer, disk_attr, model_attr in renamed:
            block = getattr(layer, disk_attr)
            delattr(layer, disk_attr)
            setattr(layer, model_attr, block)
        for block, mod in swaps:
            block.experts = mod


def router_names(model: nn.Module) -> list[str]:
    """The MoE routers (the 'gate' beside each experts module): float modules that NVFP4 exports list as
    excluded (ModelOpt does; readers that build the router as a Linear must not look for NVFP4 tensors)."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, (NVFP4Experts, _StagedExperts)) or looks_like_experts(mod):
            gate, router = router_of(model, name)
            if router is not None and not isinstance(router, NVFP4Linear):
                out.append(gate)
    return out
