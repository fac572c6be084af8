"""quantize_model: every nn.Linear of a model the kernels take becomes an NVFP4Linear, in place (rtn / mse /
gptq weights; weight-only, static or dynamic inputs), with the q/k/v and gate/up groups of the supported
decoder families sharing one per-tensor scale and fused into one GEMM each (nvfp4_gemm.fused).

It lives apart from nn.py (the layer) because it needs both the layer and the fused groups, which are built
on the layer.
"""
from __future__ import annotations

import logging
import sys
import warnings
from typing import Callable

import torch
from torch import nn

from . import methods
from ._groups import shared_amax, shared_encode_scale
from .fused import fuse_group, fusable_groups
from .nn import NVFP4Linear, check_method, shape_supported
from .quantize import finite_amax

# quantize_model swaps this many layers or more behind a progress bar.
_PROGRESS_MIN_LAYERS = 8
# GPTQ: the Hessians held at once (fp32 [K, K] per layer) stay under this many bytes (one layer at least).
_GPTQ_HESSIAN_BYTES = 2 << 30

log = logging.getLogger("nvfp4_gemm.nn")  # (the logger quantize_model has always used)


def _tied_weights(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> every qualified name it has in `model`, for parameters reachable under more than one
    name (a head tied to the embeddings: lm_head.weight is model.embed_tokens.weight)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {k: v for k, v in names.items() if len(v) > 1}


def _gptq_groups(targets: list[tuple[str, nn.Linear]]) -> list[list[tuple[str, nn.Linear]]]:
    """Consecutive layers of one block (the name up to its first numeric part, as in model.layers.3), split
    where their Hessians would pass _GPTQ_HESSIAN_BYTES."""
    def block(name: str) -> str:
        parts = name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part.isdigit():
                return ".".join(parts[: i + 1])
        return name  # not inside a numbered block: a group of its own

    groups: list[list[tuple[str, nn.Linear]]] = []
    key, size = None, 0
    for name, mod in targets:
        nbytes = 4 * mod.in_features**2
        if groups and block(name) == key and size + nbytes <= _GPTQ_HESSIAN_BYTES:
            groups[-1].append((name, mod))
            size += nbytes
        else:
            groups.append([(name, mod)])
            key, size = block(name), nbytes
    return groups


def calibrate_inputs(model, group, calibrate, record_amax: bool, hessians: dict | None):
    """Runs calibrate(model) once under no_grad with hooks on the group's layers. Returns (each layer's finite
    input amax if record_amax, the names of the layers that ran) and adds the inputs to hessians[name]."""
    amax: dict[str, torch.Tensor] = {}
    seen: set[str] = set()

    def hook(name):
        def record(_mod, args):
            x = args[0]
            seen.add(name)
            if record_amax:
                a = finite_amax(x)
                amax[name] = torch.maximum(amax[name], a) if name in amax else a
            if hessians is not None:
                hessians[name].add(x.detach())
        return record

    handles = [mod.register_forward_pre_hook(hook(name)) for name, mod in group]
    try:
        with torch.no_grad():
            calibrate(model)
    finally:
        for h in handles:
            h.remove()
    return amax, seen


def quantize_model(
    model: nn.Module,
    filter: Callable[[str, nn.Linear], bool] | None = None,
    *,
    calibrate: Callable[[nn.Module], object] | None = None,
    weight_only: bool = False,
    method: str = "rtn",
    progress: bool = True,
    quantize_tied: bool = False,
    fuse: bool = True,
) -> nn.Module:
    """Replaces, in place, every nn.Linear of `model` that the kernels accept (K % 32 == 0, N % 8 == 0) and
    that filter(qualified_name, module) accepts (default: all) by NVFP4Linear.from_linear. Returns model.

    Only exact nn.Linear instances are swapped: subclasses such as MultiheadAttention's out_proj are read
    through .weight by their owners and are left alone.

    weight_only: W4A16 layers (activations stay float; module docstring).
    calibrate: a callable run as calibrate(model) under no_grad, feeding the model representative inputs.
        W4A4: each swapped layer gets a static input scale from the largest finite |input| it saw (without
        calibrate, input scales are dynamic). "mse" also takes each layer's diag(H) from the same pass and
        weighs each weight column's squared error by it (with weight_only too); weight-only "rtn" has no use
        for it (an error to pass it).
    method: "rtn", "mse" or "gptq" (NVFP4Linear.from_linear). "gptq" needs calibrate: the layers are
        quantized group by group (the layers of one numbered block such as model.layers.3, split so that
        their fp32 [K, K] Hessians stay under 2 GiB), each group after a calibrate(model) pass that
        accumulates the Hessians of that group only; they are freed before the next group. Memory: one
        block's Hessians. Cost: calibrate runs once per group (about once per decoder block), and later
        groups see the inputs of the already quantized earlier ones, as sequential GPTQ does.
    progress: a progress bar (tqdm, on stderr) when 8 or more layers are swapped, and a line for each layer
        left alone because its weight is tied; False for silence (those lines then go to the logger only).
        A layer that calibrate(model) never ran gets no static scale (W4A4: its input scale stays dynamic)
        and no column weights (mse: plain mse); a UserWarning names such layers (gptq refuses them).
    quantize_tied: a Linear whose weight is also another module's parameter (an LM head tied to the token
        embeddings) is left float by default: swapping it would keep the float tensor for the other owner
        and add an NVFP4 copy, so the model would grow. True swaps it anyway; the tie is broken (the other
        owner keeps the float weight) and the model grows by the NVFP4 copy.
    fuse: the q/k/v and gate/up layers of Llama-, Mistral-, Qwen2- and Qwen3-family blocks (transformers)
        run as one NVFP4 GEMM per group (nvfp4_gemm.fused; the parts stay in place, state_dict and
        save_pretrained are unchanged). This changes the numerics: the parts of a group whose every N is a
        multiple of 128 are quantized with ONE per-tensor weight scale, from the group's largest finite |w|
        (ModelOpt's export does the same), instead of each with its own; other groups keep their own scales
        and stay unfused. fuse=False keeps every layer's own scale and GEMM (nvfp4_gemm.fuse_projections
        afterwards runs those groups as one GEMM each with per-part alphas, the same numbers).

    Memory: each float weight is freed as soon as its NVFP4 layer is in place (when nothing else holds it),
    so the peak is the float model plus one layer's NVFP4 copy and quantization work space (gptq: plus one
    block's Hessians).
    """
    check_method(method)
    if method == "gptq" and calibrate is None:
        raise ValueError("quantize_model: method='gptq' needs calibrate (the Hessians come from the layers' inputs)")
    if weight_only and calibrate is not None and method == "rtn":
        raise ValueError("quantize_model: calibrate sets static input scales, which weight_only layers do not have; "
                         "pass calibrate=None (with weight_only it is only used by method='mse' and 'gptq')")

    def say(msg: str) -> None:
        log.info(msg)
        if progress:
            print(msg, file=sys.stderr)

    tied = _tied_weights(model)
    targets = []  # qualified names only: a list of the modules would keep every float weight alive to the end
    for name, mod in model.named_modules():
        if not (type(mod) is nn.Linear and shape_supported(mod.in_features, mod.out_features) is None
                and (filter is None or filter(name, mod))):
            continue
        others = [n for n in tied.get(id(mod.weight), []) if n != (f"{name}.weight" if name else "weight")]
        if others and not quantize_tied:
            say(f"quantize_model: {name} left in float: its weight is tied to {', '.join(others)} "
                f"(quantize_tied=True quantizes it and breaks the tie)")
            continue
        targets.append(name)
    del mod
    in_features = {name: model.get_submodule(name).in_features for name in targets}

    # Fusable q/k/v and gate/up groups share one per-tensor weight scale, from the group's largest finite |w|
    # (ModelOpt's export does the same): one GEMM has one alpha.
    fused_groups = fusable_groups(
        model, set(targets), lambda m: shape_supported(m.in_features, m.out_features) is None) if fuse else []
    group_of = {name: group for group in fused_groups for name in group}
    shared_gs = {}
    for group in fused_groups:
        gs = shared_encode_scale(model.get_submodule(n).weight for n in group)
        shared_gs.update({n: gs for n in group})

    bar = None
    if progress and len(targets) >= _PROGRESS_MIN_LAYERS:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=len(targets), desc="quantize_model", unit="layer")

    def group_amax(name: str, amax: dict):
        """A fused group's parts see the same input; their static scale is the max over the group (the parts
        the calibration missed keep dynamic scales, and the group then stays unfused)."""
        group = group_of.get(name)
        if group is None or name not in amax:
            return amax.get(name)
        return shared_amax(amax[n] for n in group if n in amax)

    def swap(name: str, amax, hessian) -> None:
        # The float module is looked up here and dropped on return: its weight is freed as soon as the
        # NVFP4 layer is in its place (peak: the float model plus one layer's NVFP4 copy and work space).
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, NVFP4Linear.from_linear(getattr(parent, attr), input_amax=amax, weight_only=weight_only,
                                                      method=method, hessian=hessian, global_scale=shared_gs.get(name)))
        if bar is not None:
            bar.update(1)

    def pairs(names):
        return [(n, model.get_submodule(n)) for n in names]

    static = calibrate is not None and not weight_only

    def warn_unseen(seen: set[str]) -> None:
        unseen = [name for name in targets if name not in seen]
        if unseen:
            what = "; ".join(w for w in (
                "their input scales stay dynamic" if static else "",
                "mse runs unweighted for them" if method == "mse" else "") if w)
            names = ", ".join(unseen[:8]) + (f" and {len(unseen) - 8} more" if len(unseen) > 8 else "")
            warnings.warn(f"quantize_model: calibrate(model) never ran {len(unseen)} of the {len(targets)} layers "
                          f"({names}): {what}", UserWarning, stacklevel=3)

    try:
        if method == "gptq":
            accumulator = methods.HessianAccumulator
            blocks = [[n for n, _ in g] for g in _gptq_groups([(n, _InFeatures(in_features[n])) for n in targets])]
            for group in blocks:
                if bar is not None:
                    last = f" .. {group[-1]}" if len(group) > 1 else ""
                    bar.set_postfix_str(f"gptq: {group[0]}{last}")
                hessians = {name: accumulator(in_features[name], model.get_submodule(name).weight.device)
                            for name in group}
                amax, seen = calibrate_inputs(model, pairs(group), calibrate, static, hessians)
                unseen = [name for name in group if name not in seen]
                if unseen:
                    raise ValueError(f"quantize_model: calibrate(model) never ran {unseen}: GPTQ needs each "
                                     f"layer's inputs (leave such layers out with filter=)")
                for name in group:
                    swap(name, group_amax(name, amax), hessians.pop(name).hessian())
        elif method == "mse" and calibrate is not None:
            # One calibrate pass gives every layer's diag(H) (K values each): mse then weighs each column's
            # squared error by the mean square of its input (methods.quantize_weight).
            accumulator = methods.HessianAccumulator
            diags = {name: accumulator(in_features[name], model.get_submodule(name).weight.device, diagonal=True)
                     for name in targets}
            amax, seen = calibrate_inputs(model, pairs(targets), calibrate, static, diags)
            warn_unseen(seen)
            for name in targets:
                swap(name, group_amax(name, amax), diags.pop(name).hessian() if name in seen else None)
        else:
            amax = {}
            if static:
                amax, seen = calibrate_inputs(model, pairs(targets), calibrate, True, None)
                warn_unseen(seen)
            for name in targets:
                swap(name, group_amax(name, amax), None)
    finally:
        if bar is not None:
            bar.close()
    for group in fused_groups:
        parent_name = group[0].rpartition(".")[0]
        fuse_group(model.get_submodule(parent_name) if parent_name else model,
                   tuple(n.rpartition(".")[2] for n in group), parent_name)
    return model


class _InFeatures:
    """What _gptq_groups reads of a layer (its in_features), without holding the layer."""

    def __init__(self, in_features: int) -> None:
        self.in_features = in_features

