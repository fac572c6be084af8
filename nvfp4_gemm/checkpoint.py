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

The work is split by job: _checkpoint_formats (what each format's config and tensor names mean),
_checkpoint_io (safetensors shards in and out), _checkpoint_plan (which layers, which tensors, checked before
any data is read), _checkpoint_load (from_pretrained), _checkpoint_save (save_pretrained) and _atomic_dir
(the directory swapped in whole).
"""
from __future__ import annotations

from ._checkpoint_io import CheckpointError, UnsupportedFormatError
from ._checkpoint_load import from_pretrained
from ._checkpoint_save import FORMATS, save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "CheckpointError", "UnsupportedFormatError", "FORMATS"]
