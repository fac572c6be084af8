"""Checkpoint loading, step 2: nvfp4_gemm.from_pretrained. The transformers model is built on the meta device;
every tensor the plan (_checkpoint_plan) expects is read, shard by shard, straight into its place; each
quantized Linear is replaced by an NVFP4Linear as soon as its tensors are in (or, quantizing on load, as soon
as its whole group's float weights are); the linear e4m3 scales of a checkpoint are laid out in the 128x4
blocked layout once, here. Any error raises, naming the file and the tensor: no half-loaded model is ever
returned.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections import defaultdict
from typing import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from . import _moe_checkpoint
from ._checkpoint_formats import HF_QUANT_CONFIG, QuantFormat, _read_json, detect
from ._checkpoint_io import CheckpointError, TensorEntry, read_all_headers, read_into, read_tensor
from ._checkpoint_plan import (
    LayerPlan,
    check_layer_count,
    check_names,
    expectations,
    new_layer,
    plan_layers,
    shared_scale_groups,
)
from ._groups import group_key, shared_amax, shared_encode_scale
from ._quantize_model import calibrate_inputs
from ._scale_checks import block_scales_problem, decode_scale_problem
from .formats import to_blocked
from .fused import fuse_projections
from .moe import calibrate_static as _moe_calibrate
from .moe import fuse_routers as _moe_fuse_routers
from .nn import NVFP4Linear


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


def _quantize_group(plans: list[LayerPlan], parts: dict[str, dict[str, torch.Tensor]], device: torch.device,
                    dtype: torch.dtype) -> list[NVFP4Linear]:
    """Quantizes layers that share one per-tensor scale (a fused q/k/v or gate/up group, or a single layer)
    with NVFP4Linear.from_linear's recipe and the group's shared encode scale (_groups), as ModelOpt's and
    llm-compressor's exports do, so that engines that fuse the group into one GEMM can use it."""
    ws = [parts[p.name]["weight"].to(device) for p in plans]
    gs = shared_encode_scale(ws)
    out = []
    for plan, w in zip(plans, ws):
        layer = new_layer(plan, device, dtype)
        layer._quantize_from(w, global_scale=gs)
        if plan.bias:
            layer.bias.copy_(parts[plan.name]["bias"])
        out.append(layer)
    return out


def _load_role(layer: NVFP4Linear, plan: LayerPlan, role: str, f, ent: TensorEntry, fmt: QuantFormat) -> None:
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
    ModelOpt W4A16_NVFP4 or no input quantization configured -> weight-only W4A16, except the layers
    save_pretrained listed as dynamic W4A4 under config.json's "nvfp4_gemm" key); True makes every layer
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
    dtype = torch_dtype or getattr(config, "dtype", None)
    if not dtype and not isinstance(getattr(type(config), "torch_dtype", None), property):
        # transformers before 4.56 names it torch_dtype; later ones read it into dtype, and reading their
        # torch_dtype property prints a deprecation warning at the user
        dtype = getattr(config, "torch_dtype", None)
    dtype = dtype or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CheckpointError(f"{config_path}: dtype must name a torch floating-point dtype, got {dtype!r}")
    check_layer_count(config, entries, config_path)
    model = _build_on_meta(AutoModelForCausalLM, config, dtype, trust_remote_code, config_path)
    # per-expert tensors on disk: the experts are read as per-expert Linear layers, then stacked (_moe_checkpoint)
    moe_staging = _moe_checkpoint.stage_for_load(model, entries)

    tied = set(getattr(model, "all_tied_weights_keys", None) or {}) if getattr(
        config, "tie_word_embeddings", False) else set()
    layers = plan_layers(model, fmt, weight_only, exclude, tied)
    tp = None
    if tp_plan is not None or device_mesh is not None:
        if quantize:
            raise ValueError("from_pretrained: quantize=True cannot load tensor-parallel shards (the per-tensor "
                             "scales need whole weights); quantize and save first, then load sharded")
        from .parallel import LoadSharding

        tp = LoadSharding(model, layers, tp_plan, device_mesh)
    exp = expectations(model, layers, fmt, tied)
    exp = {k: e for k, e in exp.items() if not (e.optional and k not in entries)}
    ignore_unexpected = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    ignore_unexpected.append(r"rotary_emb\.inv_freq$")
    check_names(exp, entries, layers, fmt, directory, ignore_unexpected, tied)
    if fmt is not None and fmt.kv_cache and any(fmt.is_kv_scale(n) for n in entries):
        warnings.warn(f"{fmt.source}: the KV-cache scales are not used; attention runs in {dtype}")

    groups, group_of = shared_scale_groups(layers)  # quantize=True: layers that share one per-tensor scale

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
                                building[plan.name] = new_layer(tp.local_plan(plan) if sharded else plan, device,
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
    moe_names = _moe_checkpoint.finish_load(model, moe_staging, device)
    _moe_fuse_routers(model, moe_names)  # as quantize_experts leaves them: the same router outputs either way
    _materialize_non_persistent(model, device)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"{directory}: the checkpoint left {left[:5]} uninitialized (not in any shard)")
    model.eval()
    if tp is not None:
        tp.finish(model)
    if calibrate is not None:
        _calibrate(model, {n: p for n, p in layers.items() if not any(n.startswith(m + ".") for m in moe_names)},
                   calibrate)
        _moe_calibrate(model, moe_names, calibrate)
    if fuse:
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


def _calibrate(model: nn.Module, layers: dict[str, LayerPlan], calibrate: Callable[[nn.Module], object]) -> None:
    amax, _ = calibrate_inputs(model, [(n, model.get_submodule(n)) for n in layers], calibrate,
                               record_amax=True, hessians=None)
    by_key: dict[str, list[torch.Tensor]] = defaultdict(list)
    for name, a in amax.items():
        by_key[group_key(name) or name].append(a)
    shared = {key: shared_amax(values) for key, values in by_key.items()}
    missed = [n for n in layers if n not in amax]
    if missed:
        warnings.warn(f"from_pretrained: calibrate never ran {len(missed)} layer(s) ({missed[:3]}...); "
                      f"they keep dynamic input scales")
    for name in amax:
        model.get_submodule(name).set_input_amax(shared[group_key(name) or name])
