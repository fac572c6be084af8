"""The two public NVFP4 checkpoint formats: which Linear layers are quantized, how, and under which names.

NVIDIA Model Optimizer ("modelopt"), as its unified Hugging Face export writes it:
  * config: hf_quant_config.json {"producer": ..., "quantization": {"quant_algo": "NVFP4" (W4A4, static input
    scales) or "W4A16_NVFP4" (weight-only: no input quantizer, no input_scale), "group_size": 16,
    "exclude_modules": [fnmatch patterns], "kv_cache_quant_algo": ...}} and, from later versions on, the same
    in config.json "quantization_config" {"quant_method": "modelopt", "quant_algo", "ignore", "config_groups"}.
    "MIXED_PRECISION" lists each quantized layer under "quantized_layers" with its own quant_algo.
    exclude_modules names the modules left float, the input embedding included (model.embed_tokens).
  * every nn.Linear not excluded is quantized; tensors <m>.weight uint8 [N, K/2] (element 2i in the low
    nibble), <m>.weight_scale float8_e4m3fn [N, K/16] row-major, <m>.weight_scale_2 float32 scalar (the weight
    DECODE scale amax / 2688), <m>.input_scale float32 scalar (input DECODE scale; static W4A4).
  * fused projections (q/k/v, gate/up: _groups.FUSABLE_GROUPS) share weight_scale_2 and input_scale (max of
    the amaxes).
compressed-tensors "nvfp4-pack-quantized" (llm-compressor; read natively by vLLM):
  * config: config.json "quantization_config" {"quant_method": "compressed-tensors", "format",
    "config_groups": {g: {"targets", "weights", "input_activations", "format"}}, "ignore",
    "quantization_status": "compressed"}; targets / ignore entries are exact module names, "re:<regex>"
    (re.match) or module class names ("Linear").
  * tensors <m>.weight_packed uint8 [N, K/2] (same nibble order), <m>.weight_scale float8_e4m3fn [N, K/16],
    <m>.weight_global_scale float32 [1] = the ENCODE scale = 1 / weight_scale_2, and, when the input
    activations are "dynamic": "local" (global scale static, block scales per call),
    <m>.input_global_scale float32 [1] = 1 / input_scale. input_activations null is weight-only (NVFP4A16);
    "dynamic": true is per-block e4m3 scales computed per call with NO global scale (compressed-tensors
    registers no input_global_scale then): our mode "dynamic_block", quantize(x, None).
  * llm-compressor also makes q/k/v and gate/up share the global scales.
"""
from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field

from torch import nn

from ._checkpoint_io import CheckpointError, UnsupportedFormatError, checked_file

# static: input_scale from calibration; dynamic: per-call per-tensor scale from the amax (ours);
# dynamic_block: per-call per-block e4m3 scales, no per-tensor scale (compressed-tensors' dynamic: true)
MODES = ("static", "dynamic", "dynamic_block", "weight_only")
# ModelOpt quant_algo -> the mode of its layers
MODELOPT_ALGOS = {"NVFP4": "static", "W4A16_NVFP4": "weight_only"}
HF_QUANT_CONFIG = "hf_quant_config.json"
CT_FORMAT = "nvfp4-pack-quantized"

# The per-format tensor naming table: our role -> the checkpoint's suffix (NVFP4Linear's own buffer names are
# ModelOpt's). The loader's expectations, its unexpected-tensor checks and the writer all read it.
ROLE_NAMES = {
    "modelopt": {"weight": "weight", "weight_scale": "weight_scale", "weight_scale_2": "weight_scale_2",
                 "input_scale": "input_scale", "bias": "bias"},
    "compressed-tensors": {"weight": "weight_packed", "weight_scale": "weight_scale",
                           "weight_scale_2": "weight_global_scale", "input_scale": "input_global_scale",
                           "bias": "bias"},
}
# Every suffix that marks a quantization tensor in either format (a scale where the config quantizes nothing).
QUANT_SUFFIXES = frozenset(suffix for names in ROLE_NAMES.values() for role, suffix in names.items()
                           if role not in ("weight", "bias")) | {"weight_packed"}


# A checkpoint's "re:" targets run on every module name; Python's re backtracks without bound, so a pattern
# such as (a+)+$ would hang the loader. They run on the `regex` package (transformers' own dependency; the
# same syntax as re for these patterns) with a time limit, far above what a real target takes (microseconds).
_REGEX_TIMEOUT_S = 0.5


def _regex_match(pattern: str, name: str, source: str) -> bool:
    import regex

    try:
        return regex.match(pattern, name, timeout=_REGEX_TIMEOUT_S) is not None
    except TimeoutError as e:
        raise CheckpointError(f"{source}: the target regex {pattern!r} takes more than {_REGEX_TIMEOUT_S} s on "
                              f"'{name}' (catastrophic backtracking); refused") from e
    except regex.error as e:
        raise CheckpointError(f"{source}: target 're:{pattern}' is not a valid regex ({e})") from e


def _ct_match(name: str, module: nn.Module, target: str, source: str = "config") -> bool:
    if target.startswith("re:"):
        return _regex_match(target[3:], name, source)
    return target == name or any(c.__name__ == target for c in type(module).__mro__ if issubclass(c, nn.Module))


def _ct_specificity(name: str, target: str) -> int:
    # compressed-tensors resolves a module matched by several groups by: exact name, then regex, then class
    return 0 if target == name else 1 if target.startswith("re:") else 2


def _mode_of_activations(args, where: str, fmt: str) -> str:
    """A config_groups entry's input_activations -> static / dynamic / dynamic_block / weight_only."""
    if args is None:
        return "weight_only"
    if not isinstance(args, dict):
        raise CheckpointError(f"{where}: input_activations must be an object or null, got {args!r}")
    if args.get("num_bits", 4) != 4 or args.get("type", "float") != "float":
        raise UnsupportedFormatError(f"{where}: input activations with num_bits={args.get('num_bits')} "
                                     f"type={args.get('type')} are not NVFP4 (W4A4 or weight-only only)")
    dyn = args.get("dynamic", False)
    if dyn is True:
        # compressed-tensors: no global scale, per-block scales only. ModelOpt's own exports never say
        # this (its NVFP4 inputs have static scales); nvfp4_gemm's earlier writer did, for per-call scales.
        return "dynamic_block" if fmt == "compressed-tensors" else "dynamic"
    if dyn in (False, "local"):  # "local": static global scale, per-block scales computed per call
        return "static"
    raise UnsupportedFormatError(f"{where}: input_activations dynamic={dyn!r} is not supported")


@dataclass
class QuantFormat:
    """What a checkpoint's config says: the format, which Linear layers are quantized and in which mode."""
    name: str                                   # "modelopt" | "compressed-tensors"
    source: str                                 # the config file it came from (for messages)
    exclude: list[str] = field(default_factory=list)       # modelopt: fnmatch patterns
    groups: list[tuple[list[str], str]] = field(default_factory=list)  # (targets, mode), compressed-tensors style
    ignore: list[str] = field(default_factory=list)        # compressed-tensors ignore entries
    quantized_layers: dict[str, str] | None = None  # modelopt MIXED_PRECISION: layer -> its mode
    algo_mode: str = "static"                   # modelopt: the mode quant_algo gives every quantized layer
    kv_cache: bool = False                      # k_scale / v_scale tensors may be present (ignored)

    def names(self) -> dict[str, str]:
        return ROLE_NAMES[self.name]

    def layer_mode(self, name: str, module: nn.Module) -> str | None:
        """None if the module is not quantized in this checkpoint, else its mode as the config says."""
        if self.name == "modelopt":
            if self.quantized_layers is not None:
                if name not in self.quantized_layers:
                    return None
                return self.quantized_layers[name]
            quantized = isinstance(module, nn.Linear) and not any(
                fnmatch.fnmatchcase(name, p) for p in self.exclude)
            if not quantized:
                return None
            if not self.groups or self.algo_mode == "weight_only":
                # hf_quant_config.json alone (NVFP4: static input scales; W4A16_NVFP4: weight-only)
                return self.algo_mode
        elif any(_ct_match(name, module, ig, self.source) for ig in self.ignore):
            return None
        matches = [(t, mode) for targets, mode in self.groups for t in targets
                   if _ct_match(name, module, t, self.source)]
        if not matches:
            return None if self.name == "compressed-tensors" else self.algo_mode
        target, mode = min(matches, key=lambda tm: _ct_specificity(name, tm[0]))
        if not isinstance(module, nn.Linear):
            # a regex also matches parents of the layers it is meant for (re:.*mlp.* matches the MLP block),
            # which hold no weight of their own; a name or a class names the module itself
            if target.startswith("re:"):
                return None
            raise UnsupportedFormatError(f"{self.source}: target '{target}' quantizes '{name}', a "
                                         f"{type(module).__name__}; only Linear layers are supported")
        return mode

    def is_kv_scale(self, tensor_name: str) -> bool:
        return self.kv_cache and tensor_name.rpartition(".")[2] in ("k_scale", "v_scale")


def _read_json(path: str) -> dict:
    """A checkpoint's JSON file (a regular file inside the checkpoint: checked_file), which must hold an object."""
    checked_file(os.path.dirname(path) or ".", os.path.basename(path), path)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: cannot read ({type(e).__name__}: {e})") from e
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, got {type(doc).__name__}")
    return doc


def _check_types(qcfg: dict, source: str, modelopt: bool) -> None:
    """The JSON types of every quantization-config field the parsing below reads, so that a malformed config
    is a CheckpointError naming the field instead of an AttributeError / TypeError somewhere inside."""
    def want(ok: bool, field: str, what: str, value) -> None:
        if not ok:
            raise CheckpointError(f"{source}: {field} must be {what}, got {type(value).__name__} {value!r:.80}")

    def str_list(v, field: str) -> None:
        want(v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)), field,
             "a list of strings", v)

    def obj(v, field: str, null_ok: bool = True) -> None:
        want(isinstance(v, dict) or (null_ok and v is None), field, "an object", v)

    for key in ("quant_algo", "quantization_status", "format"):
        want(not isinstance(qcfg.get(key), (dict, list)), key, "a string", qcfg.get(key))
    for key in ("exclude_modules", "ignore"):
        str_list(qcfg.get(key), key)
    obj(qcfg.get("quantized_layers"), "quantized_layers")
    for layer, lc in (qcfg.get("quantized_layers") or {}).items():
        obj(lc, f"quantized_layers.{layer}", null_ok=False)
    obj(qcfg.get("config_groups"), "config_groups")
    for gname, g in (qcfg.get("config_groups") or {}).items():
        obj(g, f"config_groups.{gname}", null_ok=False)
        str_list(g.get("targets"), f"config_groups.{gname}.targets")
        obj(g.get("weights"), f"config_groups.{gname}.weights")
    if modelopt:
        want(isinstance(qcfg.get("group_size", 16), int), "group_size", "an integer", qcfg.get("group_size"))


def _modelopt(qcfg: dict, source: str, groups_cfg: dict | None) -> QuantFormat:
    algo = qcfg.get("quant_algo")
    fmt = QuantFormat("modelopt", source)
    if algo == "MIXED_PRECISION":
        layers = qcfg.get("quantized_layers") or {}
        for layer, lc in layers.items():
            if lc.get("quant_algo") not in MODELOPT_ALGOS:
                raise UnsupportedFormatError(f"{source}: layer '{layer}' uses quant_algo {lc.get('quant_algo')!r}; "
                                             f"only NVFP4 and W4A16_NVFP4 layers are supported")
            if lc.get("group_size", 16) != 16:
                raise UnsupportedFormatError(f"{source}: layer '{layer}' has group_size {lc.get('group_size')}, NVFP4 is 16")
        fmt.quantized_layers = {layer: MODELOPT_ALGOS[lc["quant_algo"]] for layer, lc in layers.items()}
    elif algo not in MODELOPT_ALGOS:
        raise UnsupportedFormatError(f"{source}: quant_algo {algo!r} is not supported (only NVFP4 and W4A16_NVFP4; "
                                     f"FP8, INT4/AWQ, NVFP4_AWQ, W4A8, MXFP4 and others are not)")
    elif qcfg.get("group_size", 16) != 16:
        raise UnsupportedFormatError(f"{source}: group_size {qcfg.get('group_size')} is not NVFP4's 16")
    else:
        fmt.algo_mode = MODELOPT_ALGOS[algo]
    fmt.exclude = list(qcfg.get("exclude_modules") or qcfg.get("ignore") or [])
    fmt.kv_cache = bool(qcfg.get("kv_cache_quant_algo") or qcfg.get("kv_cache_scheme"))
    for gname, g in (groups_cfg or {}).items():
        fmt.groups.append((list(g.get("targets") or ["Linear"]),
                           _mode_of_activations(g.get("input_activations"), f"{source}: config_groups.{gname}",
                                                "modelopt")))
    return fmt


def _compressed_tensors(qcfg: dict, source: str) -> QuantFormat:
    fmt = QuantFormat("compressed-tensors", source)
    status = qcfg.get("quantization_status", "compressed")
    if status != "compressed":
        raise UnsupportedFormatError(f"{source}: quantization_status {status!r}: only compressed checkpoints "
                                     f"(packed NVFP4 weights) are read")
    for key in ("sparsity_config", "transform_config"):
        if qcfg.get(key):
            raise UnsupportedFormatError(f"{source}: {key} is set; sparse or transformed (rotated) checkpoints "
                                         f"are not supported")
    top_format = qcfg.get("format")
    groups = qcfg.get("config_groups") or {}
    if not groups:
        raise CheckpointError(f"{source}: compressed-tensors quantization_config has no config_groups")
    for gname, g in groups.items():
        where = f"{source}: config_groups.{gname}"
        gfmt = g.get("format") or top_format
        if gfmt != CT_FORMAT:
            raise UnsupportedFormatError(f"{where}: format {gfmt!r} is not supported (only '{CT_FORMAT}'; "
                                         f"FP8 'float-quantized', INT 'pack-quantized' / 'int-quantized', "
                                         f"'mxfp4-pack-quantized' and others are not)")
        w = g.get("weights") or {}
        got = (w.get("num_bits"), w.get("type"), w.get("group_size"), w.get("strategy"), w.get("symmetric", True))
        if got != (4, "float", 16, "tensor_group", True):
            raise UnsupportedFormatError(f"{where}: weights (num_bits, type, group_size, strategy, symmetric) = {got}; "
                                         f"NVFP4 is (4, 'float', 16, 'tensor_group', True)")
        if g.get("output_activations"):
            raise UnsupportedFormatError(f"{where}: output activation quantization is not supported")
        fmt.groups.append((list(g.get("targets") or []),
                           _mode_of_activations(g.get("input_activations"), where, "compressed-tensors")))
    fmt.ignore = list(qcfg.get("ignore") or [])
    fmt.kv_cache = bool(qcfg.get("kv_cache_scheme"))
    return fmt


def detect(directory: str, config_dict: dict) -> QuantFormat | None:
    """The checkpoint's quantization format from config.json's quantization_config or hf_quant_config.json;
    None for an unquantized checkpoint."""
    config_path = os.path.join(directory, "config.json")
    hf_path = os.path.join(directory, HF_QUANT_CONFIG)
    qcfg = config_dict.get("quantization_config")
    if qcfg is not None and not isinstance(qcfg, dict):
        raise CheckpointError(f"{config_path}: quantization_config must be an object, got {type(qcfg).__name__}")
    method = (qcfg or {}).get("quant_method")
    if method == "compressed-tensors":
        _check_types(qcfg, config_path, modelopt=False)
        return _compressed_tensors(qcfg, config_path)
    if method == "modelopt" or (qcfg is None and os.path.lexists(hf_path)):
        if qcfg is not None:
            _check_types(qcfg, config_path, modelopt=True)
        if os.path.lexists(hf_path):  # the original; config.json's copy is derived from it
            hf = _read_json(hf_path)
            if not isinstance(hf.get("quantization"), dict):
                raise CheckpointError(f"{hf_path}: no 'quantization' object")
            _check_types(hf["quantization"], hf_path, modelopt=True)
            return _modelopt(hf["quantization"], hf_path, (qcfg or {}).get("config_groups"))
        return _modelopt(qcfg, config_path, qcfg.get("config_groups"))
    if qcfg is not None:
        raise UnsupportedFormatError(f"{config_path}: quantization_config quant_method {method!r} is not supported "
                                     f"(NVFP4 checkpoints: 'modelopt' or 'compressed-tensors')")
    return None
