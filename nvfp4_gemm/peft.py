"""LoRA adapters on NVFP4Linear layers through peft (QLoRA-style fine-tuning of an NVFP4 model).

    from peft import LoraConfig
    from nvfp4_gemm.peft import get_peft_model, load_adapter

    model = nvfp4_gemm.from_pretrained(path, weight_only=True)          # or quantize_model(model, ...)
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    ...train: only the adapters require grad; the NVFP4 weights stay frozen buffers...
    model.save_pretrained("adapter")                                     # peft's own format: adapters only
    model = load_adapter(base_model, "adapter")                          # a PeftModel again

peft wraps layer types it does not know through LoraConfig._register_custom_module (its custom-layer
mechanism); `register(config)` adds NVFP4Linear -> LoraNVFP4Linear to a config, and `get_peft_model` /
`load_adapter` are peft's own functions called with a registered config (the mapping is not saved with the
adapter, so loading registers it again). Targets that are plain nn.Linear keep peft's own LoRA layer.

LoraNVFP4Linear computes base(x) + scaling * lora_B(lora_A(dropout(x))): the base is the NVFP4Linear in its
own mode (weight-only, static or dynamic W4A4), the adapters are ordinary float nn.Linear layers (float32 by
default: peft does not cast them to the base's uint8 weight dtype); gradients reach x through the base by
nvfp4_gemm.autograd (straight-through for W4A4). Plain LoRA only: DoRA and the other variants need the
dense base weight every step and are refused.

Merging is refused: W + scaling * B @ A is not an NVFP4 tensor, and quantizing it again would round away most
of the adapter's small update (and change the base for every other adapter). `merge_and_unload` raises at
the first NVFP4 layer with that reason (float layers met before it are merged, as peft does layer by layer);
`unload()` gives back the NVFP4 model without the adapters.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .nn import NVFP4Linear

try:
    import peft
    from peft.tuners.lora import LoraConfig, LoraLayer
except ImportError as e:  # an optional dependency: say how to get it
    raise ImportError(f"nvfp4_gemm.peft needs peft ({e}); install it without touching torch: "
                      "pip install --no-deps peft==0.21.2 accelerate==1.15.0") from e

_MERGE_REFUSED = ("merging a LoRA adapter into an NVFP4Linear is not supported: W + scaling * B @ A is not an NVFP4 "
                  "tensor, and quantizing it again would round away most of the adapter's update. Keep the adapter "
                  "unmerged (it adds two small GEMMs per layer), or merge into the float model the NVFP4 one was "
                  "quantized from and quantize that")


class LoraNVFP4Linear(nn.Module, LoraLayer):
    """peft's LoRA layer around a frozen NVFP4Linear (module docstring)."""

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: LoraConfig, r: int = 0,
                 lora_alpha: int = 1, **kwargs: Any) -> None:
        super().__init__()
        LoraLayer.__init__(self, base_layer)
        self.fan_in_fan_out = False
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, r, lora_alpha=lora_alpha, config=config, **kwargs)

    def _get_in_out_features(self, module: nn.Module) -> tuple[int, int]:
        # peft's generic lookup would find the same attributes, with an "unsupported layer type" warning.
        base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
        if isinstance(base, NVFP4Linear):
            return base.in_features, base.out_features
        return super()._get_in_out_features(module)

    def resolve_lora_variant(self, *, config: LoraConfig, **kwargs):
        try:
            variant = super().resolve_lora_variant(config=config, **kwargs)
        except ValueError as e:
            raise ValueError(f"LoRA on NVFP4Linear supports plain LoRA only (use_dora=False and no other variant): "
                             f"{e}") from e
        if variant is not None:
            raise ValueError(f"LoRA on NVFP4Linear supports plain LoRA only, got variant {type(variant).__name__}")
        return None

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        raise NotImplementedError(_MERGE_REFUSED)

    def unmerge(self) -> None:
        raise NotImplementedError(_MERGE_REFUSED)

    def get_delta_weight(self, adapter: str) -> torch.Tensor:
        """The float update scaling * B @ A of one adapter ([out_features, in_features])."""
        a, b = self.lora_A[adapter].weight, self.lora_B[adapter].weight
        return (b @ a) * self.scaling[adapter]

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self._check_forward_args(x, *args, **kwargs)
        adapter_names = kwargs.pop("adapter_names", None)
        if adapter_names is not None and not self.disable_adapters:
            return self._mixed_batch_forward(x, *args, adapter_names=adapter_names, **kwargs)
        result = self.base_layer(x, *args, **kwargs)
        if self.disable_adapters:
            return result
        out_dtype = result.dtype
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            lora_a, lora_b = self.lora_A[name], self.lora_B[name]
            # Under autocast the adapters run in the autocast dtype; otherwise x meets them in their own dtype
            # (float32 by default) and the sum comes back in the base's dtype.
            xa = x if torch.is_autocast_enabled() else self._cast_input_dtype(x, lora_a.weight.dtype)
            result = result + (lora_b(lora_a(self.lora_dropout[name](xa))) * self.scaling[name]).to(out_dtype)
        return result

    def __repr__(self) -> str:
        return "lora." + super().__repr__()


def register(config: LoraConfig) -> LoraConfig:
    """Adds NVFP4Linear -> LoraNVFP4Linear to `config`'s custom modules (in place); returns config."""
    if not isinstance(config, LoraConfig):
        raise TypeError(f"nvfp4_gemm.peft.register: config must be a peft LoraConfig, got {type(config).__name__}")
    config._register_custom_module({NVFP4Linear: LoraNVFP4Linear})
    return config


def get_peft_model(model: nn.Module, config: LoraConfig, **kwargs: Any):
    """peft.get_peft_model(model, register(config), **kwargs): NVFP4Linear targets get LoraNVFP4Linear."""
    return peft.get_peft_model(model, register(config), **kwargs)


def load_adapter(model: nn.Module, path: str, **kwargs: Any):
    """peft.PeftModel.from_pretrained(model, path) with the adapter's saved LoraConfig registered (peft does
    not save the custom-module mapping). kwargs go to from_pretrained (is_trainable=True to train on)."""
    config = LoraConfig.from_pretrained(path)
    return peft.PeftModel.from_pretrained(model, path, config=register(config), **kwargs)
