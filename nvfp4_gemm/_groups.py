"""Projections that engines run as ONE GEMM, and the per-tensor scales such a group shares: the one table the
fused layers (nvfp4_gemm.fused), quantize_model and the checkpoints (shared scales when quantizing on load,
the warning on save) all read.

vLLM and TensorRT-LLM concatenate a group's weights along N and run one GEMM with one alpha, so ModelOpt's
and llm-compressor's exports give the parts of a group ONE per-tensor weight scale (the encode scale of the
group's largest finite |w|) and one static input scale (from the largest input amax of the parts).
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from .quantize import finite_amax, global_encode_scale

# The groups, first part first: the part a decoder block calls first (fused.py runs the group's GEMM on that
# call). q/k/v and gate/up: Llama-style attention and MLP; w1/w3: Mixtral-style experts, act(w1(x)) * w3(x).
FUSABLE_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"))


def group_key(name: str) -> str | None:
    """'model.layers.3.self_attn.k_proj' -> 'model.layers.3.self_attn:q_proj' (one key per group), None for
    a layer that is no part of a group."""
    parent, _, leaf = name.rpartition(".")
    for group in FUSABLE_GROUPS:
        if leaf in group:
            return f"{parent}:{group[0]}"
    return None


def group_members(parent: nn.Module) -> list[tuple[str, ...]]:
    """The groups whose every part is a child module of `parent`, as tuples of the children's names."""
    return [names for names in FUSABLE_GROUPS if all(isinstance(getattr(parent, n, None), nn.Module) for n in names)]


def shared_encode_scale(weights: Iterable[torch.Tensor]) -> torch.Tensor:
    """The per-tensor ENCODE scale the parts of a group are quantized with: that of their largest finite |w|
    (for one weight, exactly its own: global_encode_scale(finite_amax(w)))."""
    return global_encode_scale(shared_amax([finite_amax(w) for w in weights]))


def shared_amax(amaxes: Iterable[torch.Tensor]) -> torch.Tensor:
    """The largest of the parts' amaxes (calibrated input amaxes: the group's one static input scale)."""
    return torch.stack([a.reshape(()) for a in amaxes]).amax()
