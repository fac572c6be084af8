"""NVFP4 checkpoints in and out: nvfp4_gemm.from_pretrained / nvfp4_gemm.save_pretrained.

    model = nvfp4_gemm.from_pretrained("path/to/nvfp4-checkpoint", device="cuda")      # ModelOpt or compressed-tensors
    model = nvfp4_gemm.from_pretrained("path/to/bf16-checkpoint", quantize=True)      # quantize while streaming
    nvfp4_gemm.save_pretrained(model, "out", format="compressed-tensors", tokenizer=tok)

Both public NVFP4 formats are read and written (docs/CHECKPOINTS.md; _checkpoint_formats.py spells out
the conventions). Loading never builds the float model: the transformers model is created on the meta
device, every quantized Linear is replaced by an NVFP4Linear built from its tensors as soon as they have
been read, every other tensor is read into its place, shard by shard, and nothing else is held; the
linear e4m3 scales of a checkpoint are laid out in the 128x4 blocked layout once, here. Every tensor's
name, dtype, shape and byte range is checked against the config and the model before any data is read,
and any error raises (naming the file and the tensor): no half-loaded model is ever returned.
"""
from __future__ import annotations

import ctypes
import errno
import fnmatch
import inspect
import json
import os
import re
import secrets
import shutil
import stat
import sys
import threading
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ._checkpoint_formats import CT_FORMAT, HF_QUANT_CONFIG, QuantFormat, _read_json, detect, fused_group_key
from ._checkpoint_io import (
    INDEX_FILE,
    CheckpointError,
    ShardWriter,
    TensorEntry,
    UnsupportedFormatError,
    parse_size,
    read_all_headers,
    read_into,
    read_tensor,
)
from ._scale_checks import block_scales_problem, decode_scale_problem
from .formats import from_blocked, to_blocked
from .nn import NVFP4Linear, shape_supported
from .nn import _calibrate as _run_calibration
from .quantize import finite_amax, global_encode_scale, quantize as _quantize

__all__ = ["from_pretrained", "save_pretrained", "CheckpointError", "UnsupportedFormatError", "FORMATS"]

FORMATS = ("modelopt", "compressed-tensors")


def _layer_supports_weight_only() -> bool:
    return "weight_only" in inspect.signature(NVFP4Linear.__init__).parameters


def _layer_mode(layer: NVFP4Linear) -> str:
    if getattr(layer, "weight_only", False):
        return "weight_only"
    if layer.input_scale is not None:
        return "static"
    return "dynamic_block" if getattr(layer, "block_scales_only", False) else "dynamic"


@dataclass
class _Layer:
    name: str
    k: int
    n: int
    bias: bool
    ckpt_mode: str | None   # what the checkpoint holds (None: a float weight to quantize)
    mode: str               # what the built layer runs


def _new_layer(plan: _Layer, device: torch.device, dtype: torch.dtype) -> NVFP4Linear:
    kwargs = dict(bias=plan.bias, device=device, dtype=dtype)
    if plan.mode == "static":
        kwargs["static_input_scale"] = True
    elif plan.mode == "weight_only":
        kwargs["weight_only"] = True
    elif plan.mode == "dynamic_block":
        kwargs["block_scales_only"] = True
    return NVFP4Linear(plan.k, plan.n, **kwargs)


def _decode_scale(t: torch.Tensor, entry: TensorEntry, fmt_name: str) -> torch.Tensor:
    """A per-tensor scale as the layer keeps it (a DECODE scale; compressed-tensors stores its reciprocal),
    checked after the conversion: a tiny encode scale has a reciprocal that overflows."""
    v = t.reshape(1).to(torch.float32)
    if fmt_name == "compressed-tensors":  # global scales are ENCODE scales there; the layer keeps 1 / g
        why = decode_scale_problem(v)
        if why:
            raise CheckpointError(f"{entry.where()}: a global (encode) scale {why}, so its reciprocal, the "
                                  f"decode scale, is not a usable float32")
        v = 1.0 / v
    why = decode_scale_problem(v)
    if why:
        raise CheckpointError(f"{entry.where()}: a per-tensor decode scale {why}")
    return v


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor) -> None:
    mod_name, _, attr = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    if attr in mod._parameters:
        mod._parameters[attr] = nn.Parameter(value, requires_grad=mod._parameters[attr].requires_grad)
    else:
        mod._buffers[attr] = value


def _replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


class _Expect:
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


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _plan(model: nn.Module, fmt: QuantFormat | None, weight_only: bool | None,
          exclude: tuple[str, ...] | list[str], tied: set[str]) -> dict[str, _Layer]:
    """The Linear layers that become NVFP4Linear: as the checkpoint's config says, or (fmt None: quantize on
    load) every nn.Linear the kernels take that is not excluded or tied."""
    layers: dict[str, _Layer] = {}
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
        layers[name] = _Layer(name, mod.in_features, mod.out_features, mod.bias is not None, ckpt_mode, mode)
    return layers


def _expectations(model: nn.Module, layers: dict[str, _Layer], fmt: QuantFormat | None,
                  tied: set[str]) -> dict[str, _Expect]:
    exp: dict[str, _Expect] = {}
    names = fmt.names() if fmt is not None else None
    for plan in layers.values():
        p, n, k = plan.name, plan.n, plan.k
        if plan.ckpt_mode is None:
            exp[f"{p}.weight"] = _Expect(p, "weight", _FLOATS, (n, k), "the float weight to quantize")
        else:
            exp[f"{p}.{names['weight']}"] = _Expect(p, "weight", (torch.uint8,), (n, k // 2), "packed e2m1 [N, K/2]")
            exp[f"{p}.{names['weight_scale']}"] = _Expect(p, "weight_scale", (torch.float8_e4m3fn,), (n, k // 16),
                                                          "e4m3 block scales [N, K/16]")
            exp[f"{p}.{names['weight_scale_2']}"] = _Expect(p, "weight_scale_2", (torch.float32,), "scalar",
                                                            "the per-tensor weight scale")
            if plan.ckpt_mode == "static":
                exp[f"{p}.{names['input_scale']}"] = _Expect(p, "input_scale", (torch.float32,), "scalar",
                                                             "the static input scale",
                                                             optional=plan.mode == "weight_only")
        if plan.bias:
            exp[f"{p}.bias"] = _Expect(p, "bias", _FLOATS, (n,), "the bias")
    for key, t in model.state_dict(keep_vars=True).items():
        owner = key.rpartition(".")[0]
        if owner in layers or key in tied:
            continue
        exp[key] = _Expect(None, None, _FLOATS if t.is_floating_point() else (t.dtype,), tuple(t.shape),
                           f"{t.dtype} in the model")
    return exp


def _check_names(exp: dict[str, _Expect], entries: dict[str, TensorEntry], layers: dict[str, _Layer],
                 fmt: QuantFormat | None, directory: str, ignore_unexpected: list[str], tied: set[str]) -> None:
    where = fmt.source if fmt is not None else os.path.join(directory, "config.json")
    for name, e in exp.items():
        if name in entries:
            ent = entries[name]
            if e.role == "weight" and e.dtypes == (torch.uint8,) and ent.dtype in _FLOATS:
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
                and entries[f"{owner}.weight"].dtype in _FLOATS:
            raise CheckpointError(f"{entries[owner + '.weight'].where()}: a float weight, but {where} quantizes "
                                  f"'{owner}' ({layers[owner].ckpt_mode}): the config contradicts the tensors")
        if owner is not None and e.role == "input_scale":
            raise CheckpointError(f"{directory}: tensor '{name}' is missing: {where} gives '{owner}' static input "
                                  f"scales")
        raise CheckpointError(f"{directory}: tensor '{name}' ({e.what}) is missing from the checkpoint")
    quant_suffixes = {"weight_scale", "weight_scale_2", "input_scale", "weight_packed", "weight_global_scale",
                      "input_global_scale"}
    for name, ent in entries.items():
        if name in exp or name in tied:
            continue
        if fmt is not None and fmt.is_kv_scale(name):
            continue
        if any(re.search(p, name) for p in ignore_unexpected):
            continue
        owner, _, leaf = name.rpartition(".")
        if owner in layers and leaf in quant_suffixes:
            raise CheckpointError(f"{ent.where()}: unexpected tensor: {where} says '{owner}' is "
                                  f"{layers[owner].ckpt_mode} (config contradicts the tensors)")
        if owner not in layers and leaf in quant_suffixes:
            raise CheckpointError(f"{ent.where()}: a quantization scale, but {where} does not quantize '{owner}': "
                                  f"the config contradicts the tensors")
        raise CheckpointError(f"{ent.where()}: unexpected tensor (the model has no such parameter or buffer)")


def _quantize_group(plans: list[_Layer], parts: dict[str, dict[str, torch.Tensor]], device: torch.device,
                    dtype: torch.dtype) -> list[NVFP4Linear]:
    """Quantizes layers that share one per-tensor scale (a fused q/k/v or gate/up group, or a single layer):
    the encode scale of the largest finite |w| over the group, as ModelOpt's and llm-compressor's exports do,
    so that engines that fuse the group into one GEMM can use it. For a single layer this is exactly
    NVFP4Linear.from_linear's recipe."""
    ws = [parts[p.name]["weight"].to(device) for p in plans]
    amax = torch.stack([finite_amax(w) for w in ws]).amax()
    gs = global_encode_scale(amax)
    out = []
    for plan, w in zip(plans, ws):
        layer = _new_layer(plan, device, dtype)
        packed, sf = _quantize(w if w.dtype in (torch.float16, torch.bfloat16, torch.float32) else w.float(), gs)
        layer.weight.copy_(packed)
        layer.weight_scale.copy_(sf)
        layer.weight_scale_2.copy_(1.0 / gs)
        if plan.bias:
            layer.bias.copy_(parts[plan.name]["bias"])
        out.append(layer)
    return out


def _load_role(layer: NVFP4Linear, plan: _Layer, role: str, f, ent: TensorEntry, fmt: QuantFormat) -> None:
    """Reads one checkpoint tensor of a quantized layer into the layer's buffer."""
    if role == "weight":
        read_into(f, ent, layer.weight)
    elif role == "weight_scale":
        sf = read_tensor(f, ent)
        why = block_scales_problem(sf)
        if why:
            raise CheckpointError(f"{ent.where()}: {why}")
        layer.weight_scale.copy_(to_blocked(sf))
    elif role == "bias":
        read_into(f, ent, layer.bias)
    else:
        v = _decode_scale(read_tensor(f, ent), ent, fmt.name)
        if role == "weight_scale_2":
            layer.weight_scale_2.copy_(v)
        elif plan.mode == "static":
            layer.input_scale.copy_(v)


def from_pretrained(
    path: str | os.PathLike,
    *,
    device: torch.device | str | None = None,
    torch_dtype: torch.dtype | None = None,
    weight_only: bool | None = None,
    quantize: bool = False,
    calibrate: Callable[[nn.Module], object] | None = None,
    exclude: tuple[str, ...] | list[str] = ("lm_head",),
    progress: bool = True,
    trust_remote_code: bool = False,
    fuse: bool = True,
    tp_plan: str | dict | None = None,
    device_mesh=None,
) -> nn.Module:
    """Loads a checkpoint directory into a transformers model (AutoModelForCausalLM.from_config) whose
    quantized Linear layers are NVFP4Linear, on `device` (default CPU), in eval mode.

    path: a local directory with config.json and model.safetensors or sharded safetensors + index.
    NVFP4 checkpoints (ModelOpt's or compressed-tensors' "nvfp4-pack-quantized"; the format is detected
    from hf_quant_config.json / config.json's quantization_config): the layers the config quantizes become
    NVFP4Linear, the excluded / ignored ones stay float.
    torch_dtype: dtype of the float tensors (embeddings, norms, excluded layers, biases); default the
    config's dtype, else float32.
    weight_only: None runs each layer as the checkpoint says (static input scales -> static W4A4;
    compressed-tensors dynamic=true -> per-block dynamic W4A4 without a global scale, its numerics;
    ModelOpt W4A16_NVFP4 or no input quantization configured -> weight-only W4A16); True makes every layer
    weight-only (input scales are checked if present, then dropped, and need not be there); False makes
    configured weight-only layers dynamic W4A4 (per-tensor scale).
    quantize=True reads an unquantized checkpoint and quantizes each Linear as it streams in (the
    NVFP4Linear.from_linear recipe; the members of a fused q/k/v or gate/up group share the per-tensor
    scale of their largest |w|, as ModelOpt and llm-compressor do). Linear layers matching an `exclude`
    fnmatch pattern (default lm_head), tied to an embedding, or of a shape the kernels refuse stay float.
    Layers are dynamic W4A4, or weight-only with weight_only=True. calibrate(model), if given, then runs
    once on the quantized model (dynamic scales, no_grad) and every layer gets a static input scale from
    the largest finite |input| it saw (max over a fused group).
    fuse: run the q/k/v and gate/up groups of Llama-, Mistral-, Qwen2- and Qwen3-family blocks as one GEMM
    each (nvfp4_gemm.fuse_projections; exact, the model still looks unfused from outside): one alpha where
    the parts share their per-tensor scales, each part's own alpha where their weight_scale_2 differ;
    parts with different static input scales stay unfused. False keeps one GEMM per layer.
    tp_plan / device_mesh: load tensor-parallel shards (nvfp4_gemm.parallel, docs/PARALLEL.md): every rank of
    the 1-D device_mesh (None: the default process group) calls this and reads only its slice of each sharded
    layer's tensors. tp_plan "auto" (the default once either is given) is transformers' plan of the model
    (config.base_model_tp_plan, lm_head from the model's _tp_plan), or a dict {module pattern: style}.
    Raises CheckpointError / UnsupportedFormatError naming the file and the tensor for a bad checkpoint.
    """
    from tqdm.auto import tqdm

    AutoConfig, AutoModelForCausalLM = _transformers_auto_classes()
    directory = os.fspath(path)
    if not os.path.isdir(directory):
        raise CheckpointError(f"{directory}: not a checkpoint directory")
    config_dict = _read_json(os.path.join(directory, "config.json"))
    fmt = detect(directory, config_dict)
    if fmt is None and not quantize:
        raise CheckpointError(f"{directory}: no NVFP4 quantization config (config.json quantization_config or "
                              f"{HF_QUANT_CONFIG}); pass quantize=True to quantize a float checkpoint while loading")
    if fmt is not None and quantize:
        raise ValueError(f"from_pretrained: quantize=True, but {directory} is already a {fmt.name} NVFP4 checkpoint")
    if calibrate is not None and (not quantize or weight_only):
        raise ValueError("from_pretrained: calibrate needs quantize=True and weight_only not True "
                         "(it sets static input scales)")
    device = torch.device(device if device is not None else "cpu")

    entries = read_all_headers(directory)  # every header first: a truncated shard fails before any data is read
    config_path = os.path.join(directory, "config.json")
    try:
        with _TRANSFORMERS_LOCK:  # resolves the config class lazily, as from_config does the model's
            config = AutoConfig.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - transformers' own validation of the file: any refusal is a bad config
        raise CheckpointError(f"{config_path}: transformers cannot read it ({type(e).__name__}: {e})") from e
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # ours to apply; transformers must not bring its own quantizer
    dtype = torch_dtype or getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CheckpointError(f"{config_path}: dtype must name a torch floating-point dtype, got {dtype!r}")
    _check_layer_count(config, entries, config_path)
    model = _build_on_meta(AutoModelForCausalLM, config, dtype, trust_remote_code, config_path)

    tied = set(getattr(model, "all_tied_weights_keys", None) or {}) if getattr(
        config, "tie_word_embeddings", False) else set()
    layers = _plan(model, fmt, weight_only, exclude, tied)
    wo = [n for n, p in layers.items() if p.mode == "weight_only"]
    if wo and not _layer_supports_weight_only():
        raise NotImplementedError(f"{len(wo)} layer(s) (e.g. '{wo[0]}') are weight-only (W4A16), but this "
                                  f"nvfp4_gemm's NVFP4Linear has no weight_only mode; pass weight_only=False to run "
                                  f"them as dynamic W4A4")
    tp = None
    if tp_plan is not None or device_mesh is not None:
        if quantize:
            raise ValueError("from_pretrained: quantize=True cannot load tensor-parallel shards (the per-tensor "
                             "scales need whole weights); quantize and save first, then load sharded")
        from .parallel import LoadSharding

        tp = LoadSharding(model, layers, tp_plan, device_mesh)
    exp = _expectations(model, layers, fmt, tied)
    exp = {k: e for k, e in exp.items() if not (e.optional and k not in entries)}
    ignore_unexpected = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    ignore_unexpected.append(r"rotary_emb\.inv_freq$")
    _check_names(exp, entries, layers, fmt, directory, ignore_unexpected, tied)
    if fmt is not None and fmt.kv_cache and any(fmt.is_kv_scale(n) for n in entries):
        warnings.warn(f"{fmt.source}: the KV-cache scales are not used; attention runs in {dtype}")

    groups: dict[str, list[str]] = defaultdict(list)  # quantize=True: layers that share one per-tensor scale
    for name in layers:
        groups[fused_group_key(name) or name].append(name)
    group_of = {name: key for key, names in groups.items() for name in names}

    need = defaultdict(int)
    for e in exp.values():
        if e.layer is not None:
            need[e.layer] += 1
    got: dict[str, int] = defaultdict(int)
    building: dict[str, NVFP4Linear] = {}          # pre-quantized layers whose tensors are still arriving
    parts: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)  # quantize=True: float tensors of a group
    by_file: dict[str, list[TensorEntry]] = defaultdict(list)
    for name in exp:
        by_file[entries[name].file].append(entries[name])
    model_dtypes = {k: t.dtype for k, t in model.state_dict(keep_vars=True).items()}

    shard_bar = tqdm(total=len(by_file), desc="Reading shards", unit="shard", disable=not progress)
    layer_bar = tqdm(total=len(layers), desc="Quantizing layers" if quantize else "NVFP4 layers", unit="layer",
                     disable=not progress)
    try:
        with torch.no_grad():
            for file in sorted(by_file):
                with open(file, "rb") as f:
                    for ent in sorted(by_file[file], key=lambda e: e.start):
                        e = exp[ent.name]
                        if e.layer is None:  # a float tensor: read straight into its final place
                            t = torch.empty(ent.shape, dtype=model_dtypes[ent.name], device=device)
                            read_into(f, ent, t)
                            _set_tensor(model, ent.name, t)
                            continue
                        got[e.layer] += 1
                        if fmt is not None:
                            plan = layers[e.layer]
                            sharded = tp is not None and plan.name in tp
                            if plan.name not in building:
                                building[plan.name] = _new_layer(tp.local_plan(plan) if sharded else plan, device,
                                                                 dtype)
                            if sharded:
                                tp.load_role(building[plan.name], plan, e.role, f, ent, fmt)
                            else:
                                _load_role(building[plan.name], plan, e.role, f, ent, fmt)
                            if got[plan.name] == need[plan.name]:
                                _replace_module(model, plan.name, building.pop(plan.name))
                                layer_bar.update(1)
                            continue
                        t = read_tensor(f, ent)
                        parts[e.layer][e.role] = t if e.role != "bias" else t.to(dtype)
                        members = [layers[m] for m in groups[group_of[e.layer]]]
                        if all(got[m.name] == need[m.name] for m in members):
                            for plan, layer in zip(members, _quantize_group(members, parts, device, dtype)):
                                _replace_module(model, plan.name, layer)
                                parts.pop(plan.name)
                            layer_bar.update(len(members))
                shard_bar.update(1)
    finally:
        shard_bar.close()
        layer_bar.close()

    if tied:
        model.tie_weights()
    _materialize_non_persistent(model, device)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"{directory}: the checkpoint left {left[:5]} uninitialized (not in any shard)")
    model.eval()
    if tp is not None:
        tp.finish(model)
    if calibrate is not None:
        _calibrate(model, layers, calibrate)
    if fuse:
        from .fused import fuse_projections

        fuse_projections(model)
    return model


# transformers resolves its classes lazily, on first attribute access; two threads doing that first access at
# once can see a half-initialized module (ImportError). One lock makes the first import and the lookups of the
# model code (from_config imports the architecture's module) happen one thread at a time.
_TRANSFORMERS_LOCK = threading.RLock()


def _transformers_auto_classes():
    with _TRANSFORMERS_LOCK:
        from transformers import AutoConfig, AutoModelForCausalLM

        return AutoConfig, AutoModelForCausalLM


def _check_layer_count(config, entries: dict[str, TensorEntry], config_path: str) -> None:
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


class _FactoryDtype(TorchFunctionMode):
    """torch.set_default_dtype(dtype) for this thread only: a factory call that leaves its dtype to the default
    (torch.empty(n), nn.Linear's torch.empty(..., dtype=None), torch.tensor(1.0)) makes `dtype` instead of
    the process-wide default; explicit dtypes and integer results are left alone. Function modes are
    thread-local, torch's default dtype is not."""

    _FACTORIES = frozenset((torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn,
                            torch.empty_strided, torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.arange,
                            torch.linspace, torch.logspace, torch.eye))

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in self._FACTORIES or kwargs.get("dtype") is not None or not isinstance(out, torch.Tensor) \
                or out.dtype != torch.get_default_dtype():
            return out
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], (float, list, tuple)):
            return out  # made from a tensor or an array: that dtype, not the default
        return out.to(self.dtype)


def _build_on_meta(auto_class, config, dtype: torch.dtype, trust_remote_code: bool, config_path: str) -> nn.Module:
    """The model on the meta device, built as from_config(dtype=dtype) builds it, without from_config's
    torch.set_default_dtype, which changes the default for every thread of the process while it runs."""
    try:
        with _TRANSFORMERS_LOCK, torch.device("meta"), _FactoryDtype(dtype):
            model = auto_class.from_config(config, dtype=None, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - a config that transformers cannot build a model from
        raise CheckpointError(f"{config_path}: transformers cannot build the model ({type(e).__name__}: {e})") from e
    config.dtype = dtype
    return model


def _materialize_non_persistent(model: nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (rotary inv_freq, ...) are not in checkpoints: they were created on the meta
    device with the model, so they are recomputed the way transformers' own loader does it (each module's
    _init_weights), and every loaded tensor is flagged so that nothing else is re-initialized."""
    owners = set()
    for mod_name, mod in model.named_modules():
        for b in list(getattr(mod, "_non_persistent_buffers_set", ())):
            buf = mod._buffers.get(b)
            if buf is not None and buf.is_meta:
                mod._buffers[b] = torch.empty_like(buf, device=device)
                owners.add(mod_name)
    if not owners:
        return
    for mod_name, mod in model.named_modules():
        if mod_name not in owners:
            mod._is_hf_initialized = True
    if hasattr(model, "initialize_weights"):
        model.initialize_weights()


def _calibrate(model: nn.Module, layers: dict[str, _Layer], calibrate: Callable[[nn.Module], object]) -> None:
    amax, _ = _run_calibration(model, [(n, model.get_submodule(n)) for n in layers], calibrate,
                               record_amax=True, hessians=None)
    shared: dict[str, torch.Tensor] = {}
    for name, a in amax.items():
        key = fused_group_key(name) or name
        shared[key] = torch.maximum(shared[key], a) if key in shared else a
    missed = [n for n in layers if n not in amax]
    if missed:
        warnings.warn(f"from_pretrained: calibrate never ran {len(missed)} layer(s) ({missed[:3]}...); "
                      f"they keep dynamic input scales")
    for name in amax:
        model.get_submodule(name).set_input_amax(shared[fused_group_key(name) or name])


# ---------------------------------------------------------------------------------------------- saving

def _encode_of(decode: torch.Tensor) -> torch.Tensor:
    """A float32 g with fl(1 / g) == decode, so that a loader computing the decode scale as 1 / g (ours;
    vLLM's alpha = 1 / (g_in * g_w)) gets the model's value back bit for bit. A decode scale that came from
    a reciprocal (our quantizer, a compressed-tensors checkpoint) always has one; for others (ModelOpt's
    amax / 2688) there may be none, and fl(1 / decode) is within one ulp."""
    d = decode.detach().to("cpu", torch.float32).reshape(1)
    first = up = down = 1.0 / d
    for _ in range(3):
        for g in (up, down):
            if torch.equal(1.0 / g, d):
                return g
        up = torch.nextafter(up, torch.full_like(up, float("inf")))
        down = torch.nextafter(down, torch.zeros_like(down))
    return first


def _quant_config_groups(modes: dict[str, str], fmt: str) -> dict:
    """config_groups with one group per input mode; a single group targets the class "Linear"."""
    by_mode: dict[str, list[str]] = defaultdict(list)
    for name, mode in modes.items():
        by_mode[mode].append(name)
    groups = {}
    for i, (mode, names) in enumerate(sorted(by_mode.items())):
        if fmt == "modelopt":  # as ModelOpt's export writes them: weight-only groups have no input_activations
            w = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
            g = {"targets": ["Linear"] if len(by_mode) == 1 else sorted(names), "weights": w}
            if mode == "static":
                g["input_activations"] = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
        else:  # static: "local" (static global scale, per-call block scales); dynamic_block: true (no global scale)
            w = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "symmetric": True, "dynamic": False,
                 "group_size": 16, "scale_dtype": "torch.float8_e4m3fn"}
            a = None if mode == "weight_only" else {
                "num_bits": 4, "type": "float", "strategy": "tensor_group", "symmetric": True,
                "dynamic": True if mode == "dynamic_block" else "local", "group_size": 16,
                "scale_dtype": "torch.float8_e4m3fn"}
            g = {"targets": ["Linear"] if len(by_mode) == 1 else sorted(names), "weights": w, "input_activations": a,
                 "format": CT_FORMAT, "output_activations": None}
        groups[f"group_{i}"] = g
    return groups


def save_pretrained(
    model: nn.Module,
    path: str | os.PathLike,
    format: str = "modelopt",
    *,
    tokenizer=None,
    max_shard_size: int | str = "5GB",
    progress: bool = True,
) -> None:
    """Writes `model` (a transformers model whose quantized layers are NVFP4Linear) as a checkpoint directory
    in one of the public NVFP4 formats: config.json with its quantization_config (and, for "modelopt",
    hf_quant_config.json), model.safetensors or shards of at most max_shard_size + model.safetensors.index.json,
    generation_config.json, and the tokenizer's files when given. from_pretrained loads it back bit for bit.

    format="modelopt": ModelOpt's names and decode scales (weight_scale_2, input_scale as float32 scalars),
    linear e4m3 weight_scale; quant_algo NVFP4 (static W4A4), W4A16_NVFP4 (weight-only) or MIXED_PRECISION,
    exclude_modules with the embeddings, as ModelOpt's export writes them. Dynamic layers are refused: ModelOpt
    NVFP4 inputs have static scales (its readers, vLLM "modelopt_fp4" and TensorRT-LLM, need input_scale).
    format="compressed-tensors": "nvfp4-pack-quantized" (weight_packed, weight_global_scale = 1 /
    weight_scale_2, input_global_scale = 1 / input_scale, chosen so that their reciprocals give our scales
    back exactly where a float32 can: a warning names those that cannot); static ("local"), weight-only and
    per-block dynamic (block_scales_only: "dynamic": true) layers; per-tensor dynamic ones are refused (the
    format has no such setting). Refusals raise ValueError before anything is written.
    Layers that inference engines fuse (q/k/v, gate/up) should share their per-tensor scales (from_pretrained
    with quantize=True does that); a warning names any group that does not.
    The save is atomic: arguments and values are checked first, the checkpoint is written into a new
    directory beside `path` and swapped in whole; on any error `path` is left as it was. Files of an
    existing `path` that are not checkpoint files (a README, ...) are kept.
    """
    if format not in FORMATS:
        raise ValueError(f"save_pretrained: format must be one of {FORMATS}, got {format!r}")
    if any(getattr(m, "_tp_shard", None) is not None for m in model.modules()):
        from .parallel import save_pretrained as save_sharded  # every rank calls; rank 0 writes the whole model

        return save_sharded(model, path, format, tokenizer=tokenizer, max_shard_size=max_shard_size,
                            progress=progress)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    if not layers:
        raise ValueError("save_pretrained: the model has no NVFP4Linear layer; nothing to save in an NVFP4 format")
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("save_pretrained: model has no .config (a transformers model is expected)")
    max_bytes = parse_size(max_shard_size)
    if tokenizer is not None and not callable(getattr(tokenizer, "save_pretrained", None)):
        raise ValueError(f"save_pretrained: tokenizer must have a save_pretrained method, got "
                         f"{type(tokenizer).__name__}")
    _check_saved_values(layers, format)
    modes = {n: _layer_mode(m) for n, m in layers.items()}
    _refuse_unencodable(modes, format)
    _warn_unshared_scales(layers)

    # Everything is written into a fresh directory beside the target and swapped in whole: a save that fails
    # anywhere (a bad argument, a full disk) leaves the target as it was, and two saves into one path end
    # with one of them, complete.
    target = os.path.realpath(os.fspath(path))
    if os.path.exists(target) and not os.path.isdir(target):
        raise ValueError(f"save_pretrained: {target} exists and is not a directory")
    cwd = os.path.realpath(os.getcwd())
    if os.path.commonpath([cwd, target]) == target:
        raise ValueError(f"save_pretrained: {target} is the working directory or holds it; the checkpoint directory "
                         f"is replaced as a whole, so save into a subdirectory")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = _new_sibling(target, "save")
    try:
        _write_checkpoint(model, staging, format, layers, modes, config, tokenizer, max_bytes, progress)
        _carry_over(target, staging)
        _fsync_tree(staging)
        _swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write_checkpoint(model: nn.Module, directory: str, format: str, layers: dict[str, NVFP4Linear],
                      modes: dict[str, str], config, tokenizer, max_bytes: int, progress: bool) -> None:
    from tqdm.auto import tqdm

    excluded = sorted(n for n, m in model.named_modules() if isinstance(m, nn.Linear))
    if format == "modelopt":  # ModelOpt's export lists every float module with a weight, embeddings included
        excluded = sorted(set(excluded) | {n for n, m in model.named_modules() if isinstance(m, nn.Embedding)})

    names = {"modelopt": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
             "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")}[format]
    tied = set(getattr(model, "all_tied_weights_keys", None) or {}) if getattr(
        config, "tie_word_embeddings", False) else set()
    bar = tqdm(desc="Writing shards", unit="shard", disable=not progress)
    writer = ShardWriter(directory, max_bytes, bar)
    done = set()
    inexact: list[str] = []  # decode scales that no float32 1 / g holds (compressed-tensors stores g)
    try:
        for key, t in model.state_dict().items():
            owner = key.rpartition(".")[0]
            if owner not in layers:
                if key not in tied:
                    writer.add(key, t)
                continue
            if owner in done:
                continue
            done.add(owner)
            m = layers[owner]
            sf = from_blocked(m.weight_scale, m.out_features, m.in_features).contiguous()
            ws2, inp = m.weight_scale_2.reshape(1).float(), m.input_scale
            if format == "modelopt":
                ws2 = ws2.reshape(())
                inp = None if inp is None else inp.reshape(()).float()
            else:
                for what, decode in (("weight_scale_2", ws2), ("input_scale", inp)):
                    if decode is not None and not torch.equal(1.0 / _encode_of(decode), decode.reshape(1).float().cpu()):
                        inexact.append(f"{owner}.{what}")
                ws2 = _encode_of(ws2)
                inp = None if inp is None else _encode_of(inp)
            writer.add(f"{owner}.{names[0]}", m.weight)
            writer.add(f"{owner}.{names[1]}", sf)
            writer.add(f"{owner}.{names[2]}", ws2)
            if inp is not None and modes[owner] == "static":
                writer.add(f"{owner}.{names[3]}", inp)
            if m.bias is not None:
                writer.add(f"{owner}.bias", m.bias)
        writer.close()
    finally:
        bar.close()
    if inexact:
        warnings.warn(f"save_pretrained(format='compressed-tensors'): {len(inexact)} per-tensor scale(s) (e.g. "
                      f"'{inexact[0]}') are not the reciprocal of any float32, and compressed-tensors stores the "
                      f"reciprocal: they load back one float32 ulp off (ModelOpt's amax / 2688 scales can be such; "
                      f"format='modelopt' keeps them exactly)")

    producer = {"name": "nvfp4_gemm", "version": _package_version()}
    cfg = config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.setdefault("architectures", [type(model).__name__])
    groups = _quant_config_groups(modes, format)
    if format == "modelopt":
        algos = {n: MODELOPT_ALGO_OF_MODE[m] for n, m in modes.items()}
        quant = {"quant_algo": None, "kv_cache_quant_algo": None}
        cfg_q = {"quant_method": "modelopt", "producer": producer, "config_groups": groups}
        if len(set(algos.values())) == 1:
            algo = next(iter(algos.values()))
            quant.update(quant_algo=algo, group_size=16, exclude_modules=excluded)
            cfg_q.update(quant_algo=algo, ignore=excluded)
        else:  # ModelOpt's per-layer form: the quantized layers listed, each with its algorithm
            per_layer = {n: {"quant_algo": a, "group_size": 16} for n, a in sorted(algos.items())}
            quant.update(quant_algo="MIXED_PRECISION", quantized_layers=per_layer)
            cfg_q.update(quant_algo="MIXED_PRECISION", ignore=[], quantized_layers=per_layer)
        with open(os.path.join(directory, HF_QUANT_CONFIG), "w") as f:
            json.dump({"producer": producer, "quantization": quant}, f, indent=4)
        cfg["quantization_config"] = cfg_q
    else:
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": CT_FORMAT,
                                      "quantization_status": "compressed", "config_groups": groups,
                                      "ignore": excluded, "kv_cache_scheme": None, "sparsity_config": {},
                                      "transform_config": {}, "global_compression_ratio": None}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def _check_saved_values(layers: dict[str, NVFP4Linear], format: str) -> None:
    """from_pretrained's value checks on what would be written (after the format's conversion), before
    anything is: a saved checkpoint always loads."""
    for name, m in layers.items():
        scales = [("weight_scale_2", m.weight_scale_2)]
        if m.input_scale is not None and _layer_mode(m) == "static":
            scales.append(("input_scale", m.input_scale))
        for attr, t in scales:
            why = decode_scale_problem(t)
            if why is None and format == "compressed-tensors":
                why = decode_scale_problem(1.0 / _encode_of(t))
            if why:
                raise ValueError(f"save_pretrained: '{name}.{attr}' (a decode scale) {why}; nothing was written")
        why = block_scales_problem(from_blocked(m.weight_scale, m.out_features, m.in_features))
        if why:
            raise ValueError(f"save_pretrained: '{name}.weight_scale' {why}; nothing was written")


def _new_sibling(target: str, what: str) -> str:
    """A new, empty directory beside target, named for this call alone (pid, thread, random), with the
    permissions a plain mkdir gives (the umask's), so that the swapped-in checkpoint has them too."""
    parent, base = os.path.split(target)
    while True:
        path = os.path.join(parent, f".{base[:80]}.nvfp4-{what}-{os.getpid()}-{threading.get_ident()}-"
                                    f"{secrets.token_hex(4)}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


_OWN_FILES = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors|" + re.escape(INDEX_FILE) + "|" +
                        re.escape(HF_QUANT_CONFIG))


def _carry_over(target: str, staging: str) -> None:
    """The target's files that are not part of a checkpoint this function writes (a README, a tokenizer not
    passed this time, ...) are kept: hard-linked into the new directory (copied where links fail). Old
    shards, index and format configs are not: they would be read as part of the new checkpoint."""
    if not os.path.isdir(target):
        return
    os.chmod(staging, stat.S_IMODE(os.stat(target).st_mode))
    for entry in os.listdir(target):
        src, dst = os.path.join(target, entry), os.path.join(staging, entry)
        if _OWN_FILES.fullmatch(entry) or os.path.lexists(dst):
            continue
        if os.path.isdir(src) and not os.path.islink(src):
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)


def _link_or_copy(src: str, dst: str) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fsync_tree(directory: str) -> None:
    """Data and names on disk before the swap makes them the checkpoint (a crash after it must not leave
    empty files under the final names)."""
    for root, dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rename_exchange(a: str, b: str) -> bool:
    """Atomically swaps two paths (Linux renameat2 RENAME_EXCHANGE); False where the system or the file
    system has no such call."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def _swap_in(staging: str, target: str) -> None:
    """Makes staging the target. A new target (or an empty directory) is one rename; an existing checkpoint is
    exchanged with staging in one step, then removed, so the path always names one complete checkpoint."""
    try:
        os.rename(staging, target)
        _fsync_dir(os.path.dirname(target))
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if _rename_exchange(staging, target):
        _fsync_dir(os.path.dirname(target))
        shutil.rmtree(staging, ignore_errors=True)  # the old checkpoint, now at the staging name
        return
    # Without an atomic exchange: move the old one aside, the new one in, and the old one back on failure.
    # Between the two renames the path is absent; a concurrent save may then fail (with an error).
    old = _new_sibling(target, "old")
    os.rename(target, os.path.join(old, "checkpoint"))
    try:
        os.rename(staging, target)
    except OSError:
        os.rename(os.path.join(old, "checkpoint"), target)
        os.rmdir(old)
        raise
    _fsync_dir(os.path.dirname(target))
    shutil.rmtree(old, ignore_errors=True)


# the ModelOpt quant_algo that says each of our modes (dynamic ones have none: ModelOpt's inputs are static)
MODELOPT_ALGO_OF_MODE = {"static": "NVFP4", "weight_only": "W4A16_NVFP4"}


def _refuse_unencodable(modes: dict[str, str], format: str) -> None:
    """Raises, before anything is written, for layers whose activation numerics the format cannot say."""
    if format == "modelopt":
        bad = [n for n, m in modes.items() if m not in MODELOPT_ALGO_OF_MODE]
        if bad:
            raise ValueError(
                f"save_pretrained(format='modelopt'): {len(bad)} layer(s) (e.g. '{bad[0]}', {modes[bad[0]]}) have "
                f"dynamic input scales, but ModelOpt NVFP4 requires static input scales (input_scale; its readers, "
                f"vLLM 'modelopt_fp4' and TensorRT-LLM, need them) and W4A16_NVFP4 quantizes no input. Calibrate "
                f"them (quantize_model(..., calibrate=) / from_pretrained(..., calibrate=)), make them weight-only, "
                f"or save per-block dynamic layers as format='compressed-tensors'")
    else:
        bad = [n for n, m in modes.items() if m == "dynamic"]
        if bad:
            raise ValueError(
                f"save_pretrained(format='compressed-tensors'): {len(bad)} layer(s) (e.g. '{bad[0]}') use a per-call "
                f"per-tensor input scale (dynamic W4A4), which compressed-tensors cannot say: its "
                f"input_activations.dynamic=true means per-block scales with no global scale (different numerics), "
                f"and 'local' needs a static input_global_scale. Calibrate them (static), make them weight-only, or "
                f"set layer.block_scales_only = True for compressed-tensors' per-block dynamic numerics")


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvfp4_gemm")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source checkout on PYTHONPATH)
        return "unknown"


def _warn_unshared_scales(layers: dict[str, NVFP4Linear]) -> None:
    groups: dict[str, list[str]] = defaultdict(list)
    for name in layers:
        key = fused_group_key(name)
        if key is not None:
            groups[key].append(name)
    bad = []
    for names in groups.values():
        if len(names) < 2:
            continue
        for attr in ("weight_scale_2", "input_scale"):
            vals = [getattr(layers[n], attr) for n in names]
            if any(v is None for v in vals):
                continue
            if not all(torch.equal(vals[0].cpu(), v.cpu()) for v in vals[1:]):
                bad.append(f"{'/'.join(n.rpartition('.')[2] for n in names)} of "
                           f"'{names[0].rpartition('.')[0]}' ({attr})")
    if bad:
        warnings.warn(f"save_pretrained: {len(bad)} fused group(s) have different per-tensor scales, e.g. {bad[0]}: "
                      f"engines that fuse them into one GEMM (vLLM, TensorRT-LLM) use one scale for the group; "
                      f"quantize with from_pretrained(quantize=True) to share them")
