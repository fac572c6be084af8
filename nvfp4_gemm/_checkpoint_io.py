"""safetensors shards in and out for nvfp4_gemm.checkpoint: headers, validated reads, sharded writes.

Headers are parsed and validated by the safetensors package itself (`safe_open`: the header size cap, the
JSON table, every dtype x shape = byte count, offsets contiguous from 0 and ending at the file's end); a
file it refuses is a CheckpointError naming the file. What it does not give is each tensor's byte range,
which follows from its validated table: the tensors in offset order, back to back after the header. Each
tensor is then read with one `readinto`, straight into the tensor that keeps it (`read_into`), instead of
copied out of `safe_open`'s memory map: the mapped pages that a copy touches stay in the process's
resident memory until the shard is closed. Measured on the 1.18 GB checkpoint of
benchmarks/checkpoint_memory.py (0.5 GB shards): copying every tensor out of safe_open peaks at 1.24x the
checkpoint, this way at 1.01x (the excess of the first grows with the shard size). Parsing every header
first also lets every name, dtype, shape and byte range be checked before any data is read, so a
truncated or inconsistent file fails at once, naming the file and the tensor.
Every file the loader opens is named by the checkpoint directory or its index; `checked_file` refuses
names that leave the directory and anything but regular files (a FIFO would block the loader forever).
Writes go through safetensors' own `save_file`.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass

import torch

# safetensors dtype names (the format's spec) -> torch dtypes
ST_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
    "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64,
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: the message names the file and the tensor."""


class UnsupportedFormatError(CheckpointError):
    """A checkpoint in a quantization format or algorithm this package does not run (FP8, INT4, MXFP4, ...)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    file: str          # absolute path of its shard
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int         # absolute byte offsets in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def where(self) -> str:
        return f"{self.file}: tensor '{self.name}'"


def checked_file(directory: str, name: str, what: str) -> str:
    """The path of `name` (from the checkpoint: an index entry, or a fixed file name) inside `directory`,
    refused with a CheckpointError naming `what` unless it stays inside the directory and is a regular file.
    Symlinks are followed only to where the checkpoint may keep its data: inside the directory, or, for a
    Hugging Face cache snapshot (<repo>/snapshots/<revision>), into the repository's blobs/ directory."""
    if not isinstance(name, str) or not name or os.path.isabs(name) or "\0" in name \
            or ".." in name.replace("\\", "/").split("/"):
        raise CheckpointError(f"{what}: {name!r} is not a file name inside the checkpoint directory")
    path = os.path.join(directory, name)
    root = os.path.realpath(directory)
    roots = [root]
    if os.path.basename(os.path.dirname(root)) == "snapshots":
        roots.append(os.path.join(os.path.dirname(os.path.dirname(root)), "blobs"))
    real = os.path.realpath(path)
    if not any(os.path.commonpath([real, r]) == r for r in roots):
        raise CheckpointError(f"{what}: '{name}' resolves to {real}, outside the checkpoint directory {root}")
    try:
        st = os.stat(real)
    except OSError as e:
        raise CheckpointError(f"{what}: '{name}' cannot be read ({e.strerror})") from e
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{what}: '{name}' is not a regular file")
    return path


def read_header(path: str) -> dict[str, TensorEntry]:
    """name -> TensorEntry for one safetensors file (a regular file: checked_file); CheckpointError for a
    file the safetensors package refuses, or a dtype this package does not load."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            specs = [(name, f.get_slice(name)) for name in f.offset_keys()]
            specs = [(name, sl.get_dtype(), tuple(sl.get_shape())) for name, sl in specs]
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
    except Exception as e:  # noqa: BLE001 - whatever the reference reader refuses is a bad file
        size = os.path.getsize(path)
        raise CheckpointError(f"{path}: not a valid safetensors file ({size} bytes; {type(e).__name__}: {e})") from e
    pos = 8 + n  # safe_open checked that the tensors lie back to back, in offset order, after the header
    out: dict[str, TensorEntry] = {}
    for name, dname, shape in specs:
        if dname not in ST_DTYPES:
            raise CheckpointError(f"{path}: tensor '{name}': dtype {dname} is not supported here "
                                  f"(supported: {', '.join(ST_DTYPES)})")
        dtype = ST_DTYPES[dname]
        end = pos + math.prod(shape) * dtype.itemsize
        out[name] = TensorEntry(name, path, dtype, shape, pos, end)
        pos = end
    return out


def list_shards(directory: str) -> tuple[list[str], dict[str, str] | None]:
    """The shard files of a checkpoint directory and the index's weight_map (None for a single file)."""
    index = os.path.join(directory, INDEX_FILE)
    if os.path.lexists(index):
        checked_file(directory, INDEX_FILE, index)
        try:
            with open(index) as f:
                doc = json.load(f)
        except (OSError, ValueError, RecursionError) as e:
            raise CheckpointError(f"{index}: cannot read the shard index ({type(e).__name__}: {e})") from e
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in weight_map.items()):
            raise CheckpointError(f"{index}: 'weight_map' must be an object of tensor name -> shard file name")
        files = sorted(set(weight_map.values()))
        for name in files:
            if isinstance(name, str) and name and not os.path.lexists(os.path.join(directory, name)):
                raise CheckpointError(f"{index}: lists shard '{name}', which is not in {directory}")
            checked_file(directory, name, f"{index}: weight_map")
        return [os.path.join(directory, n) for n in files], weight_map
    single = os.path.join(directory, SINGLE_FILE)
    if os.path.lexists(single):
        return [checked_file(directory, SINGLE_FILE, single)], None
    others = sorted(n for n in os.listdir(directory) if n.endswith((".bin", ".pt", ".pth", ".gguf")))
    raise CheckpointError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}" +
                          (f" (found {others[:3]}: only safetensors checkpoints are read)" if others else ""))


def read_all_headers(directory: str) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint, checked against the index: a name in two shards, or listed in the
    index under another shard than the one holding it, is an error."""
    files, weight_map = list_shards(directory)
    entries: dict[str, TensorEntry] = {}
    for path in files:
        for name, entry in read_header(path).items():
            if name in entries:
                raise CheckpointError(f"{path}: tensor '{name}' is also in {entries[name].file}")
            entries[name] = entry
    if weight_map is not None:
        index = os.path.join(directory, INDEX_FILE)
        for name, shard in weight_map.items():
            if name not in entries:
                raise CheckpointError(f"{os.path.join(directory, shard)}: tensor '{name}' is listed in {index} "
                                      f"but missing from the shard")
            if entries[name].file != os.path.join(directory, shard):
                raise CheckpointError(f"{entries[name].where()} is listed in {index} under '{shard}'")
        for name, entry in entries.items():
            if name not in weight_map:
                raise CheckpointError(f"{entry.where()} is not listed in {index}")
    return entries


def read_tensor(f, entry: TensorEntry) -> torch.Tensor:
    """The tensor's bytes straight from the open file into a CPU tensor of its dtype and shape."""
    buf = torch.empty(entry.nbytes, dtype=torch.uint8)
    if entry.nbytes:
        f.seek(entry.start)
        got = f.readinto(buf.numpy())
        if got != entry.nbytes:
            raise CheckpointError(f"{entry.where()}: read {got} of {entry.nbytes} bytes (file changed or truncated)")
    return buf.view(entry.dtype).reshape(entry.shape)


def read_into(f, entry: TensorEntry, dst: torch.Tensor) -> None:
    """Reads the tensor into `dst` (same shape): straight into its memory when dst is a contiguous CPU tensor
    of the entry's dtype, so that loading allocates each tensor once; else through a temporary (dtype
    conversion, another device)."""
    if dst.device.type == "cpu" and dst.dtype == entry.dtype and dst.is_contiguous() and dst.dtype != torch.bool:
        if entry.nbytes:
            f.seek(entry.start)
            got = f.readinto(dst.reshape(-1).view(torch.uint8).numpy())
            if got != entry.nbytes:
                raise CheckpointError(f"{entry.where()}: read {got} of {entry.nbytes} bytes (file changed or truncated)")
        return
    dst.copy_(read_tensor(f, entry))


_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """5_000_000_000, "5GB" (10^9, as Hugging Face counts) or "4GiB" -> bytes."""
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}")
        return size
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]I?B|B)\s*", str(size).upper())
    if not m:
        raise ValueError(f"max_shard_size must be bytes (int) or like '5GB' / '500MiB', got {size!r}")
    return max(1, int(float(m.group(1)) * _SIZE_UNITS[m.group(2)]))


class ShardWriter:
    """Collects tensors into shards of at most max_bytes (a tensor larger than that gets a shard of its own)
    and writes each with safetensors' save_file as soon as it is full, so saving holds one shard at a time.
    Files are renamed to Hugging Face's model-0000i-of-0000n names (or model.safetensors) by close()."""

    def __init__(self, directory: str, max_bytes: int, progress_bar=None) -> None:
        from safetensors.torch import save_file

        self._save_file = save_file
        self.directory, self.max_bytes, self.bar = directory, max_bytes, progress_bar
        self.current: dict[str, torch.Tensor] = {}
        self.current_bytes = 0
        self.written: list[tuple[str, list[str]]] = []  # (temporary file, names)
        self.total = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        if self.current and self.current_bytes + nbytes > self.max_bytes:
            self.flush()
        t = t.detach().to("cpu").contiguous()
        if t.untyped_storage().nbytes() != nbytes:  # a view of a larger tensor (a fused layer's part):
            t = t.clone()                             # safetensors refuses tensors that share memory
        self.current[name] = t
        self.current_bytes += nbytes
        self.total += nbytes

    def flush(self) -> None:
        if not self.current:
            return
        tmp = os.path.join(self.directory, f".nvfp4_shard_{len(self.written):05d}.tmp")
        self._save_file(self.current, tmp, metadata={"format": "pt"})
        self.written.append((tmp, list(self.current)))
        self.current, self.current_bytes = {}, 0
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> list[str]:
        self.flush()
        n = len(self.written)
        names = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        weight_map = {}
        for (tmp, tensors), final in zip(self.written, names):
            os.replace(tmp, os.path.join(self.directory, final))
            weight_map.update({t: final for t in tensors})
        index = os.path.join(self.directory, INDEX_FILE)
        if n > 1:
            with open(index, "w") as f:
                json.dump({"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))},
                          f, indent=2)
        elif os.path.exists(index):  # a stale index from an earlier save would point at missing shards
            os.remove(index)
        return names
