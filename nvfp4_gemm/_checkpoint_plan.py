"""Checkpoint loading, step 1: the plan. Which Linear layers of the (meta) model become NVFP4Linear and in
which mode (as the checkpoint's config says, or every Linear the kernels take when quantizing on load), and
every tensor the checkpoint must then hold, with its dtype and shape; all of it checked against the shards'
headers before any data is read (_checkpoint_load reads, _checkpoint_save writes).

Extension points: a module kind other than nn.Linear is matched in plan_layers (and fmt.layer_mode), its
tensors are named in `expectations` by role through the format's naming table
(_checkpoint_formats.ROLE_NAMES), and built by new_layer from its LayerPlan.
"""
from __future__ import annotations

import fnmatch
import os
import re
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ._checkpoint_formats import QUANT_SUFFIXES, QuantFormat
from ._checkpoint_io import CheckpointError, TensorEntry, UnsupportedFormatError
from ._groups import group_key
from .nn import NVFP4Linear, shape_supported

def layer_mode(layer: NVFP4Linear) -> str:
    """The mode a built layer runs: weight_only, static, dynamic_block or dynamic (_checkpoint_formats.MODES)."""
    if layer.weight_only:
        return "weight_only"
    if layer.input_scale is not None:
        return "static"
    return "dynamic_block" if layer.block_scales_only else "dynamic"


@dataclass
class LayerPlan:
    name: str
    k: int
    n: int
    bias: bool
    ckpt_mode: str | None   # what the checkpoint holds (None: a float weight to quantize)
    mode: str               # what the built layer runs


def new_layer(plan: LayerPlan, device: torch.device, dtype: torch.dtype) -> NVFP4Linear:
    kwargs = dict(bias=plan.bias, device=device, dtype=dtype)
    if plan.mode == "static":
        kwargs["static_input_scale"] = True
    elif plan.mode == "weight_only":
        kwargs["weight_only"] = True
    elif plan.mode == "dynamic_block":
        kwargs["block_scales_only"] = True
    return NVFP4Linear(plan.k, plan.n, **kwargs)


class Expect:
    """One tensor the checkpoint must hold: its owner (a quantized layer or None) and what it must look like."""
    __slots__ = ("layer", "role", "dtypes", "shape", "what", "optional")

    def __init__(self, layer, role, dtypes, shape, what, optional=False):
        self.layer, self.role, self.dtypes, self.shape, self.what = layer, role, dtypes, shape, what
        self.optional = optional  # checked when present, not required (an input scale a weight-only run drops)

    def check(self, e: TensorEntry) -> None:
        if self.dtypes is not None and e.dtype not in self.dtypes:
            raise CheckpointError(f"{e.where()}: dtype must be {' or '.join(str(d) for d in self.dtypes)} "
                                  f"({self.what}), got {e.dtype}")
        ok = (e.shape in ((), (1,))) if self.shape == "scalar" else e.shape == self.shape
        if not ok:
            want = "[] or [1]" if self.shape == "scalar" else list(self.shape)
            raise CheckpointError(f"{e.where()}: shape must be {want} ({self.what}), got {list(e.shape)}")


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def plan_layers(model: nn.Module, fmt: QuantFormat | None, weight_only: bool | None,
          exclude: tuple[str, ...] | list[str], tied: set[str]) -> dict[str, LayerPlan]:
    """The Linear layers that become NVFP4Linear: as the checkpoint's config says, or (fmt None: quantize on
    load) every nn.Linear the kernels take that is not excluded or tied."""
    layers: dict[str, LayerPlan] = {}
    for name, mod in model.named_modules():
        if fmt is not None:
            ckpt_mode = fmt.layer_mode(name, mod)
            if ckpt_mode is None:
                continue
            why = shape_supported(mod.in_features, mod.out_features)
            if why:
                raise UnsupportedFormatError(f"{fmt.source}: layer '{name}' is quantized, but {why}: the kernels "
                                             f"cannot run it")
            if f"{name}.weight" in tied:
                raise UnsupportedFormatError(f"{fmt.source}: layer '{name}' is quantized, but its weight is tied to "
                                             f"the input embedding (tie_word_embeddings); it cannot be NVFP4")
            if weight_only:
                mode = "weight_only"
            elif weight_only is False and ckpt_mode == "weight_only":
                mode = "dynamic"
            else:
                mode = ckpt_mode
        else:
            if (type(mod) is not nn.Linear or f"{name}.weight" in tied
                    or any(fnmatch.fnmatchcase(name, p) for p in exclude)):
                continue
            why = shape_supported(mod.in_features, mod.out_features)
            if why:
                warnings.warn(f"from_pretrained(quantize=True): '{name}' stays unquantized: {why}")
                continue
            ckpt_mode, mode = None, ("weight_only" if weight_only else "dynamic")
        layers[name] = LayerPlan(name, mod.in_features, mod.out_features, mod.bias is not None, ckpt_mode, mode)
    return layers


def expectations(model: nn.Module, layers: dict[str, LayerPlan], fmt: QuantFormat | None,
                  tied: set[str]) -> dict[str, Expect]:
    exp: dict[str, Expect] = {}
    names = fmt.names() if fmt is not None else None
    for plan in layers.values():
        p, n, k = plan.name, plan.n, plan.k
        if plan.ckpt_mode is None:
            exp[f"{p}.weight"] = Expect(p, "weight", FLOATS, (n, k), "the float weight to quantize")
        else:
            exp[f"{p}.{names['weight']}"] = Expect(p, "weight", (torch.uint8,), (n, k // 2), "packed e2m1 [N, K/2]")
            exp[f"{p}.{names['weight_scale']}"] = Expect(p, "weight_scale", (torch.float8_e4m3fn,), (n, k // 16),
                                                          "e4m3 block scales [N, K/16]")
            exp[f"{p}.{names['weight_scale_2']}"] = Expect(p, "weight_scale_2", (torch.float32,), "scalar",
                                                            "the per-tensor weight scale")
            if plan.ckpt_mode == "static":
                exp[f"{p}.{names['input_scale']}"] = Expect(p, "input_scale", (torch.float32,), "scalar",
                                                             "the static input scale",
                                                             optional=plan.mode == "weight_only")
        if plan.bias:
            exp[f"{p}.bias"] = Expect(p, "bias", FLOATS, (n,), "the bias")
    for key, t in model.state_dict(keep_vars=True).items():
        owner = key.rpartition(".")[0]
        if owner in layers or key in tied:
            continue
        exp[key] = Expect(None, None, FLOATS if t.is_floating_point() else (t.dtype,), tuple(t.shape),
                           f"{t.dtype} in the model")
    return exp


def check_names(exp: dict[str, Expect], entries: dict[str, TensorEntry], layers: dict[str, LayerPlan],
                 fmt: QuantFormat | None, directory: str, ignore_unexpected: list[str], tied: set[str]) -> None:
    where = fmt.source if fmt is not None else os.path.join(directory, "config.json")
    for name, e in exp.items():
        if name in entries:
            ent = entries[name]
            if e.role == "weight" and e.dtypes == (torch.uint8,) and ent.dtype in FLOATS:
                raise CheckpointError(f"{ent.where()}: a float weight, but {where} quantizes '{e.layer}' "
                                      f"({layers[e.layer].ckpt_mode}): the config contradicts the tensors")
            if e.layer is None and ent.dtype == torch.uint8 and e.dtypes != (torch.uint8,):
                raise CheckpointError(f"{ent.where()}: packed uint8 {list(ent.shape)}, but {where} does not quantize "
                                      f"'{name.rpartition('.')[0]}' (excluded / ignored / not targeted): the config "
                                      f"contradicts the tensors")
            e.check(ent)
            continue
        owner = e.layer
        if owner is not None and layers[owner].ckpt_mode is not None and f"{owner}.weight" in entries \
                and entries[f"{owner}.weight"].dtype in FLOATS:
            raise CheckpointError(f"{entries[owner + '.weight'].where()}: a float weight, but {where} quantizes "
                                  f"'{owner}' ({layers[owner].ckpt_mode}): the config contradicts the tensors")
        if owner is not None and e.role == "input_scale":
            raise CheckpointError(f"{directory}: tensor '{name}' is missing: {where} gives '{owner}' static input "
                                  f"scales")
        raise CheckpointError(f"{directory}: tensor '{name}' ({e.what}) is missing from the checkpoint")
    for name, ent in entries.items():
        if name in exp or name in tied:
            continue
        if fmt is not None and fmt.is_kv_scale(name):
            continue
        if any(re.search(p, name) for p in ignore_unexpected):
            continue
        owner, _, leaf = name.rpartition(".")
        if owner in layers and leaf in QUANT_SUFFIXES:
            raise CheckpointError(f"{ent.where()}: unexpected tensor: {where} says '{owner}' is "
                                  f"{layers[owner].ckpt_mode} (config contradicts the tensors)")
        if owner not in layers and leaf in QUANT_SUFFIXES:
            raise CheckpointError(f"{ent.where()}: a quantization scale, but {where} does not quantize '{owner}': "
                                  f"the config contradicts the tensors")
        raise CheckpointError(f"{ent.where()}: unexpected tensor (the model has no such parameter or buffer)")


def check_layer_count(config, entries: dict[str, TensorEntry], config_path: str) -> None:
    """A config claiming far more layers than the checkpoint holds is refused before the model is built
    (building thousands of layers, even on the meta device, costs seconds and memory before the missing
    tensors would be noticed): some tensor must belong to the last layer, i.e. have a numbered module
    component (model.layers.<i>., h.<i>., experts.<i>., ...) of at least num_hidden_layers - 1."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int) or isinstance(layers, bool):
        return
    top = max((int(m) for name in entries for m in re.findall(r"(?:^|\.)(\d+)(?=\.)", name)), default=-1)
    if layers < 0 or layers - 1 > top:
        raise CheckpointError(f"{config_path}: num_hidden_layers = {layers}, but no tensor of the checkpoint belongs "
                              f"to a module numbered {layers - 1} (the highest is {top})")


def shared_scale_groups(layers: dict[str, "LayerPlan"]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The layers that share one per-tensor scale when quantized on load (a group of _groups.FUSABLE_GROUPS,
    else the layer alone): (key -> the members' names, name -> its key)."""
    groups: dict[str, list[str]] = {}
    for name in layers:
        groups.setdefault(group_key(name) or name, []).append(name)
    return groups, {name: key for key, names in groups.items() for name in names}
