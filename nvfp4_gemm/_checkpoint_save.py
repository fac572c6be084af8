"""Checkpoint saving: nvfp4_gemm.save_pretrained. The NVFP4Linear layers of a model are written in one of the
two public NVFP4 formats (_checkpoint_formats), under the format's names (ROLE_NAMES) with its scale
conventions, checked first so that a saved checkpoint always loads, and swapped in whole (_atomic_dir).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import sys
import warnings
from collections import defaultdict

import torch
from torch import nn

from . import _moe_checkpoint
from ._atomic_dir import fsync_tree, link_or_copy, new_sibling, swap_in
from ._checkpoint_formats import CT_FORMAT, DYNAMIC_KEY, HF_QUANT_CONFIG, OWN_CONFIG_KEY, ROLE_NAMES
from ._checkpoint_io import INDEX_FILE, ShardWriter, parse_size
from ._groups import group_key
from ._scale_checks import block_scales_problem, decode_scale_problem
from .formats import from_blocked
from .nn import NVFP4Linear

FORMATS = ("modelopt", "compressed-tensors")

log = logging.getLogger(__name__)


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
    format: str | None = None,
    *,
    tokenizer=None,
    max_shard_size: int | str = "5GB",
    progress: bool = True,
) -> None:
    """Writes `model` (a transformers model whose quantized layers are NVFP4Linear) as a checkpoint directory
    in one of the public NVFP4 formats: config.json with its quantization_config (and, for "modelopt",
    hf_quant_config.json), model.safetensors or shards of at most max_shard_size + model.safetensors.index.json,
    generation_config.json, and the tokenizer's files when given. from_pretrained loads it back bit for bit.

    format=None (the default) picks the format that holds the model, and says which (a line on stderr with
    progress=True, and the logger nvfp4_gemm._checkpoint_save): "modelopt" when every layer is static W4A4
    or weight-only (ModelOpt's NVFP4 / W4A16_NVFP4); otherwise "compressed-tensors", the one format that
    says per-block dynamic layers. Per-tensor dynamic W4A4 layers (quantize_model's default) have no
    setting in either format; their tensors are those of a weight-only layer, so they are stored as
    weight-only (NVFP4A16: what vLLM and transformers + compressed-tensors run as W4A16) and listed under
    config.json's "nvfp4_gemm" key, so that from_pretrained runs them as dynamic W4A4 again, bit for bit
    (weight_only=True there runs them weight-only). compressed-tensors rather than ModelOpt for these:
    transformers reads a compressed-tensors weight-only checkpoint natively, while compressed-tensors'
    ModelOpt converter turns a W4A16_NVFP4 one into a W4A4 config without input scales (NaN logits;
    docs/CHECKPOINTS.md).

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
    if format is not None and format not in FORMATS:
        raise ValueError(f"save_pretrained: format must be one of {FORMATS} or None (chosen from the model), "
                         f"got {format!r}")
    if any(getattr(m, "_tp_shard", None) is not None for m in model.modules()):
        from .parallel import save_pretrained as save_sharded  # every rank calls; rank 0 writes the whole model

        return save_sharded(model, path, format, tokenizer=tokenizer, max_shard_size=max_shard_size,
                            progress=progress)
    if _moe_checkpoint.has_experts(model):
        # experts are written per expert, as every MoE checkpoint names them; the model is restored after
        with _moe_checkpoint.per_expert_view(model):
            return save_pretrained(model, path, format, tokenizer=tokenizer, max_shard_size=max_shard_size,
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
    modes = {n: m.mode for n, m in layers.items()}
    dynamic: list[str] = []  # per-tensor dynamic layers stored as weight-only (format=None only)
    if format is None:
        format, dynamic = _default_format(modes, progress)
        modes.update({n: "weight_only" for n in dynamic})
    _check_saved_values(layers, format)
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
    staging = new_sibling(target, "save")
    try:
        _write_checkpoint(model, staging, format, layers, modes, dynamic, config, tokenizer, max_bytes, progress)
        _carry_over(target, staging)
        fsync_tree(staging)
        swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write_checkpoint(model: nn.Module, directory: str, format: str, layers: dict[str, NVFP4Linear],
                      modes: dict[str, str], dynamic: list[str], config, tokenizer, max_bytes: int,
                      progress: bool) -> None:
    from tqdm.auto import tqdm

    excluded = sorted(n for n, m in model.named_modules() if isinstance(m, nn.Linear))
    if format == "modelopt":  # ModelOpt's export lists every float module with a weight, embeddings included
        excluded = sorted(set(excluded) | {n for n, m in model.named_modules() if isinstance(m, nn.Embedding)})
    excluded = sorted(set(excluded) | set(_moe_checkpoint.router_names(model)))  # MoE routers stay float

    names = ROLE_NAMES[format]
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
            writer.add(f"{owner}.{names['weight']}", m.weight)
            writer.add(f"{owner}.{names['weight_scale']}", sf)
            writer.add(f"{owner}.{names['weight_scale_2']}", ws2)
            if inp is not None and modes[owner] == "static":
                writer.add(f"{owner}.{names['input_scale']}", inp)
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
    cfg.pop(OWN_CONFIG_KEY, None)  # (a model loaded from our checkpoint carries the key it was loaded with)
    if dynamic:
        cfg[OWN_CONFIG_KEY] = {DYNAMIC_KEY: sorted(dynamic)}
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
        if m.input_scale is not None and m.mode == "static":
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
            shutil.copytree(src, dst, symlinks=True, copy_function=link_or_copy)
        else:
            link_or_copy(src, dst)


# the ModelOpt quant_algo that says each of our modes (dynamic ones have none: ModelOpt's inputs are static)
MODELOPT_ALGO_OF_MODE = {"static": "NVFP4", "weight_only": "W4A16_NVFP4"}


def _default_format(modes: dict[str, str], progress: bool) -> tuple[str, list[str]]:
    """save_pretrained(format=None): the format that holds these layers, and the per-tensor dynamic layers to
    store as weight-only (see save_pretrained). Says which, and why."""
    kinds = set(modes.values())
    dynamic = sorted(n for n, m in modes.items() if m == "dynamic")
    if kinds <= set(MODELOPT_ALGO_OF_MODE):
        fmt, why = "modelopt", "every layer is static W4A4 or weight-only"
    elif "dynamic_block" in kinds:
        fmt, why = "compressed-tensors", "per-block dynamic layers: only compressed-tensors says them"
    else:
        fmt, why = "compressed-tensors", "weight-only tensors that transformers and vLLM read as they are"
    if dynamic:
        why += (f"; {len(dynamic)} dynamic W4A4 layer(s) (e.g. '{dynamic[0]}'), which no NVFP4 format can say "
                f"(per-call per-tensor input scales), are stored as weight-only and marked so that from_pretrained "
                f"runs them as dynamic W4A4 again (other readers run them weight-only)")
    msg = f"save_pretrained: format='{fmt}' ({why})"
    log.info(msg)
    if progress:
        print(msg, file=sys.stderr)
    return fmt, dynamic


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
                f"or save per-block dynamic layers as format='compressed-tensors' (the default, format=None, "
                f"stores dynamic layers as weight-only and marks them)")
    else:
        bad = [n for n, m in modes.items() if m == "dynamic"]
        if bad:
            raise ValueError(
                f"save_pretrained(format='compressed-tensors'): {len(bad)} layer(s) (e.g. '{bad[0]}') use a per-call "
                f"per-tensor input scale (dynamic W4A4), which compressed-tensors cannot say: its "
                f"input_activations.dynamic=true means per-block scales with no global scale (different numerics), "
                f"and 'local' needs a static input_global_scale. Calibrate them (static), make them weight-only, or "
                f"set layer.block_scales_only = True for compressed-tensors' per-block dynamic numerics (the "
                f"default, format=None, stores dynamic layers as weight-only and marks them)")


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("nvfp4_gemm")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source checkout on PYTHONPATH)
        return "unknown"


def _warn_unshared_scales(layers: dict[str, NVFP4Linear]) -> None:
    groups: dict[str, list[str]] = defaultdict(list)
    for name in layers:
        key = group_key(name)
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
