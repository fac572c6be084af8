"""Checkpoints under failure and attack: saves that fail or race, files that lie, configs that cost.

Every class of fault has a test here that failed before the loader and saver were hardened (issue 27):
lost or mixed checkpoints, malformed safetensors / index / config files, paths leaving the checkpoint,
FIFOs, backtracking regexes, configs claiming thousands of layers, scale values that decode to NaN or
inf, process-wide dtype changes. A seeded mutation fuzz test closes: every mutated checkpoint loads as
the original model or raises CheckpointError, within a time bound.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import pytest
import torch

from nvfp4_gemm import NVFP4Linear
from nvfp4_gemm.checkpoint import CheckpointError, from_pretrained, save_pretrained
from nvfp4_gemm.formats import from_blocked

pytest.importorskip("transformers")
import safetensors.torch  # noqa: E402
from test_checkpoint import float_model, token_ids, write_modelopt  # noqa: E402

INDEX = "model.safetensors.index.json"


@contextlib.contextmanager
def time_limit(seconds: float):
    """Fails the test, instead of hanging it, if the body blocks (a FIFO open) or spins (a regex) too long."""
    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def load(d, **kw):
    return from_pretrained(d, progress=False, **kw)


def snapshot(d) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def same_state(a, b) -> bool:
    """Same names, dtypes, shapes and bits."""
    def bits(t):
        return t.detach().reshape(-1).contiguous().view(torch.uint8)

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape and torch.equal(bits(sa[k]), bits(sb[k])) for k in sa)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny ModelOpt checkpoint (two shards + index, hf_quant_config.json) and the model it loads as."""
    d = tmp_path_factory.mktemp("safety") / "modelopt"
    write_modelopt(d, float_model(21), token_ids(21))
    return d, load(d)


@pytest.fixture(scope="module")
def ct_ckpt(ckpt, tmp_path_factory):
    """The same model saved as compressed-tensors (one file)."""
    d = tmp_path_factory.mktemp("safety_ct") / "ct"
    save_pretrained(ckpt[1], d, format="compressed-tensors", progress=False)
    return d


def fresh(src, tmp_path, name="ck"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def other_model(model):
    """A model that differs from `model` in every NVFP4 weight and the embeddings (so that a mix of the two
    checkpoints' shards is never equal to either)."""
    other = load_like(model)
    with torch.no_grad():
        for m in other.modules():
            if isinstance(m, NVFP4Linear):
                m.weight.bitwise_xor_(0x11)
        other.model.embed_tokens.weight.mul_(2.0)
    return other


def load_like(model):
    import copy

    return copy.deepcopy(model)


# ---------------------------------------------------------------------------------------- atomic saves

def test_bad_max_shard_size_leaves_the_old_checkpoint(ckpt, tmp_path):
    d = fresh(ckpt[0], tmp_path)
    before = snapshot(d)
    with pytest.raises(ValueError, match="max_shard_size"):
        save_pretrained(ckpt[1], d, max_shard_size="5 gigabytes", progress=False)
    assert snapshot(d) == before
    assert sorted(os.listdir(tmp_path)) == ["ck"], "no staging directory may be left behind"


def test_write_failure_mid_save_leaves_the_old_checkpoint(ckpt, tmp_path, monkeypatch):
    """A disk-full error after the first shard: the old checkpoint is byte for byte as it was."""
    d = fresh(ckpt[0], tmp_path)
    before = snapshot(d)
    real, calls = safetensors.torch.save_file, []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        return real(*args, **kw)

    monkeypatch.setattr(safetensors.torch, "save_file", failing)
    with pytest.raises(OSError, match="simulated"):
        save_pretrained(other_model(ckpt[1]), d, max_shard_size="20KB", progress=False)
    assert len(calls) == 2
    assert snapshot(d) == before
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    monkeypatch.undo()
    assert same_state(load(d), ckpt[1])


def test_save_over_a_checkpoint_keeps_unrelated_files(ckpt, tmp_path):
    d = fresh(ckpt[0], tmp_path)
    (d / "README.md").write_text("notes")
    save_pretrained(ckpt[1], d, progress=False)  # one file now: the old two shards and index must go
    assert (d / "README.md").read_text() == "notes"
    assert sorted(f for f in os.listdir(d) if "safetensors" in f) == ["model.safetensors"]
    assert same_state(load(d), ckpt[1])


def test_save_without_an_atomic_exchange(ckpt, tmp_path, monkeypatch):
    """Where renameat2(RENAME_EXCHANGE) is missing, the old checkpoint is moved aside, the new one in, and
    the old one removed: the result is the new checkpoint alone."""
    from nvfp4_gemm import _atomic_dir

    d = fresh(ckpt[0], tmp_path)
    monkeypatch.setattr(_atomic_dir, "_rename_exchange", lambda a, b: False)
    save_pretrained(ckpt[1], d, format="compressed-tensors", progress=False)
    assert not (d / "hf_quant_config.json").exists() and (d / "model.safetensors").exists()
    assert json.load(open(d / "config.json"))["quantization_config"]["quant_method"] == "compressed-tensors"
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_save_fsyncs_every_file_before_the_swap(ckpt, tmp_path, monkeypatch):
    from nvfp4_gemm import _checkpoint_save

    synced, swapped = [], []
    real_fsync, real_swap = os.fsync, _checkpoint_save.swap_in

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def swap(staging, target):
        swapped.append(list(synced))
        real_swap(staging, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(_checkpoint_save, "swap_in", swap)
    save_pretrained(ckpt[1], tmp_path / "out", max_shard_size="20KB", progress=False)
    names = {os.path.basename(p) for p in swapped[0]}
    assert set(os.listdir(tmp_path / "out")) <= names, "a file was not fsynced before the swap"
    assert any(p.rsplit("/", 1)[-1].startswith(".out.nvfp4-save-") for p in swapped[0]), "the directory too"


def test_concurrent_saves_end_with_one_complete_checkpoint(ckpt, tmp_path, monkeypatch):
    """Two threads save different models into one path, shard for shard, taking turns in an order that
    alternates (A's first shard, then B's; B's second, then A's; ...): the result is one of the two models,
    complete. Before, they shared temporary file names, and this order loaded as a mix of both."""
    a, b = ckpt[1], other_model(ckpt[1])
    target = tmp_path / "out"
    real = safetensors.torch.save_file
    state = {"done": 0, "aborted": False}
    cond, local = threading.Condition(), threading.local()

    def in_turn(*args, **kw):
        k, local.writes = local.writes, local.writes + 1
        slot = 2 * k + (local.me if k % 2 == 0 else 1 - local.me)
        with cond:
            cond.wait_for(lambda: state["done"] >= slot or state["aborted"], timeout=20)
        try:
            return real(*args, **kw)
        finally:
            with cond:
                state["done"] += 1
                cond.notify_all()

    monkeypatch.setattr(safetensors.torch, "save_file", in_turn)
    errors = []

    def run(model, me):
        local.me, local.writes = me, 0
        try:
            save_pretrained(model, target, max_shard_size="20KB", progress=False)
        except Exception as e:  # noqa: BLE001 - an error is an allowed outcome; a mix is not
            errors.append(e)
        finally:
            with cond:
                state["aborted"] = True
                cond.notify_all()

    threads = [threading.Thread(target=run, args=(m, i)) for i, m in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    monkeypatch.undo()
    assert state["done"] > 4, "the saves must have written several shards each"
    assert len(errors) < 2, errors
    got = load(target)
    assert same_state(got, a) or same_state(got, b), "the checkpoint mixes the two saves"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_save_refuses_values_the_loader_refuses(ckpt, tmp_path):
    for attr, value in (("weight_scale_2", float("nan")), ("weight_scale_2", 0.0), ("input_scale", float("inf"))):
        model = load_like(ckpt[1])
        getattr(model.model.layers[0].self_attn.q_proj, attr).fill_(value)
        with pytest.raises(ValueError, match=rf"q_proj.{attr}' \(a decode scale\) must be"):
            save_pretrained(model, tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()
    model = load_like(ckpt[1])
    model.model.layers[1].mlp.down_proj.weight_scale.view(torch.uint8)[5] = 0x7F
    with pytest.raises(ValueError, match=r"down_proj.weight_scale' holds 1 NaN block scale"):
        save_pretrained(model, tmp_path / "out", progress=False)
    assert sorted(os.listdir(tmp_path)) == []


# ---------------------------------------------------------------------------------------- value checks

def _layer_tensors(layer: NVFP4Linear) -> dict[str, torch.Tensor]:
    return {"weight": layer.weight.clone(), "weight_scale": from_blocked(layer.weight_scale, layer.out_features,
                                                                         layer.in_features).clone(),
            "weight_scale_2": layer.weight_scale_2.clone(), "input_scale": layer.input_scale.clone()}


@pytest.mark.parametrize("name,value", [("weight_scale_2", float("nan")), ("weight_scale_2", 0.0),
                                        ("weight_scale_2", -1.0), ("weight_scale_2", float("inf")),
                                        ("weight_scale_2", 1e-45), ("input_scale", float("nan")),
                                        ("input_scale", -2.0)])
def test_from_modelopt_refuses_bad_scales(ckpt, name, value):
    sd = _layer_tensors(ckpt[1].model.layers[0].mlp.up_proj)
    NVFP4Linear.from_modelopt(sd)  # the good one builds
    sd[name] = torch.tensor(value)
    with pytest.raises(ValueError, match=rf"'{name}' \(a decode scale\) must be"):
        NVFP4Linear.from_modelopt(sd)


@pytest.mark.parametrize("byte,match", [(0xFF, "1 NaN block scale"), (0x7F, "1 NaN block scale"),
                                        (0x88, "1 negative block scale")])
def test_from_modelopt_refuses_bad_block_scales(ckpt, byte, match):
    sd = _layer_tensors(ckpt[1].model.layers[0].mlp.up_proj)
    sd["weight_scale"].view(torch.uint8)[3, 2] = byte
    with pytest.raises(ValueError, match=rf"'weight_scale' holds {match}"):
        NVFP4Linear.from_modelopt(sd)


def _edit_tensors(path, fn):
    sd = safetensors.torch.load_file(str(path))
    fn(sd)
    safetensors.torch.save_file(sd, str(path), metadata={"format": "pt"})


def test_global_scale_whose_reciprocal_overflows_is_refused(ct_ckpt, tmp_path):
    """compressed-tensors stores 1 / weight_scale_2; g = 1e-45 decodes to inf (every logit NaN before)."""
    d = fresh(ct_ckpt, tmp_path)
    key = "model.layers.0.self_attn.v_proj.weight_global_scale"
    _edit_tensors(d / "model.safetensors", lambda sd: sd[key].fill_(1e-45))
    with pytest.raises(CheckpointError, match=rf"tensor '{key}': a global \(encode\) scale must be a normal float32"):
        load(d)


def test_nan_block_scale_in_a_checkpoint_is_refused(ckpt, tmp_path):
    d = fresh(ckpt[0], tmp_path)
    key = "model.layers.1.mlp.gate_proj.weight_scale"
    shard = json.load(open(d / INDEX))["weight_map"][key]
    _edit_tensors(d / shard, lambda sd: sd[key].view(torch.uint8).__setitem__((0, 0), 0x7F))
    with pytest.raises(CheckpointError, match=rf"tensor '{key}': holds 1 NaN block scale"):
        load(d)


# ---------------------------------------------------------------------------------------- safetensors files

def _rewrite_header(path, edit):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    table, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = edit(table)
    head = out if isinstance(out, bytes) else json.dumps(out).encode()
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head + data)


def _by_offset(table):
    return sorted((k for k in table if k != "__metadata__"), key=lambda k: table[k]["data_offsets"][0])


def _negative_offset(t):
    first = _by_offset(t)[0]
    b, e = t[first]["data_offsets"]
    t[first]["data_offsets"] = [b - 16, e - 16]  # would read the header's own JSON text as the weight
    return t


def _overlap(t):
    same = [k for k in _by_offset(t) if k.endswith("weight_scale_2")]
    t[same[1]]["data_offsets"] = t[same[0]]["data_offsets"]  # two tensors, one byte range
    return t


def _fractional_shape(t):
    k = next(k for k in _by_offset(t) if k.endswith("mlp.up_proj.weight"))
    t[k]["shape"] = [t[k]["shape"][0] + 0.5, t[k]["shape"][1]]
    return t


MALFORMED = {
    "negative offset": _negative_offset,
    "overlapping offsets": _overlap,
    "fractional shape": _fractional_shape,
    "header is a list": lambda t: b"[1, 2, 3]",
    "entry is a number": lambda t: {**t, _by_offset(t)[0]: 5},
    "not json": lambda t: b"{\"a\": ",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_safetensors_header(ckpt, tmp_path, case):
    d = fresh(ckpt[0], tmp_path)
    shard = d / "model-00001-of-00002.safetensors"
    _rewrite_header(shard, MALFORMED[case])
    with pytest.raises(CheckpointError, match=rf"{shard}: not a valid safetensors file"):
        load(d)


def test_huge_header_length_is_refused_without_reading_it(ckpt, tmp_path):
    """A header length of 200 MB (the reference reader caps headers at 100 MB) in a sparse file of that size:
    refused without allocating it (before, the loader read all of it)."""
    d = fresh(ckpt[0], tmp_path)
    shard = d / "model-00001-of-00002.safetensors"
    n = 200 << 20
    with open(shard, "wb") as f:
        f.write(n.to_bytes(8, "little") + b"{")
        f.truncate(8 + n + 64)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=str(shard)):
            load(d)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (32 << 20), f"{peak / 2**20:.0f} MiB allocated to refuse the file"


# ---------------------------------------------------------------------------------------- JSON files

def _write_json(path, doc):
    with open(path, "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))


def _edit_json(path, fn):
    doc = json.load(open(path))
    fn(doc)
    _write_json(path, doc)


JSON_CASES = {
    "config is a list": ("config.json", lambda p: _write_json(p, [1]), r"config.json: must hold a JSON object"),
    "config nested 100000 deep": ("config.json", lambda p: _write_json(p, "[" * 100000 + "]" * 100000),
                                  r"config.json: cannot read \(RecursionError"),
    "index is a list": (INDEX, lambda p: _write_json(p, []), r"'weight_map' must be an object"),
    "weight_map value a number": (INDEX, lambda p: _edit_json(p, lambda d: d["weight_map"].update(x=5)),
                                  r"'weight_map' must be an object of tensor name -> shard file name"),
    "quantization is a list": ("hf_quant_config.json", lambda p: _write_json(p, {"quantization": []}),
                               r"hf_quant_config.json: no 'quantization' object"),
    "exclude_modules a number": ("hf_quant_config.json",
                                 lambda p: _edit_json(p, lambda d: d["quantization"].update(exclude_modules=5)),
                                 r"hf_quant_config.json: exclude_modules must be a list of strings"),
    "unknown model_type": ("config.json", lambda p: _edit_json(p, lambda d: d.update(model_type="no-such-model")),
                           r"config.json: transformers cannot read it"),
    "unknown activation": ("config.json", lambda p: _edit_json(p, lambda d: d.update(hidden_act="no-such-act")),
                           r"config.json: transformers cannot build the model"),
    "dtype not a dtype": ("config.json", lambda p: _edit_json(p, lambda d: d.update(dtype="int8", torch_dtype="int8")),
                          r"config.json: (dtype must name a torch floating-point dtype|transformers cannot)"),
}


@pytest.mark.parametrize("case", JSON_CASES)
def test_malformed_json_files(ckpt, tmp_path, case):
    name, edit, match = JSON_CASES[case]
    d = fresh(ckpt[0], tmp_path)
    edit(d / name)
    with pytest.raises(CheckpointError, match=match):
        load(d)


def _ct_config(d, fn):
    _edit_json(d / "config.json", lambda c: fn(c["quantization_config"]))


@pytest.mark.parametrize("edit,match", [
    (lambda q: q.update(config_groups={"g": 5}), r"config_groups.g must be an object"),
    (lambda q: q["config_groups"]["group_0"].update(targets=[5]), r"config_groups.group_0.targets must be a list"),
    (lambda q: q.update(ignore="lm_head"), r"ignore must be a list of strings"),
    (lambda q: q["config_groups"]["group_0"].update(targets=["re:(unclosed"]), r"is not a valid regex"),
], ids=["group not an object", "target not a string", "ignore a string", "invalid regex"])
def test_malformed_compressed_tensors_config(ct_ckpt, tmp_path, edit, match):
    d = fresh(ct_ckpt, tmp_path)
    _ct_config(d, edit)
    with pytest.raises(CheckpointError, match=match):
        load(d)


def test_backtracking_regex_target_is_refused_in_time(ct_ckpt, tmp_path):
    """A target that backtracks exponentially on a module name (seconds to hours with Python's re): refused
    within the matcher's time limit."""
    d = fresh(ct_ckpt, tmp_path)
    _ct_config(d, lambda q: q["config_groups"]["group_0"].update(targets=[r"re:(\w|[a-z]|\.)*(?<!m)$"]))
    start = time.perf_counter()
    with time_limit(20), pytest.raises(CheckpointError, match=r"0.5 s on '[\w.]+' \(catastrophic backtracking"):
        load(d)
    assert time.perf_counter() - start < 10


def test_regex_targets_still_work(ct_ckpt, tmp_path):
    d = fresh(ct_ckpt, tmp_path)
    _ct_config(d, lambda q: q["config_groups"]["group_0"].update(targets=[r"re:.*_proj$"]))
    assert sum(isinstance(m, NVFP4Linear) for m in load(d).modules()) == 14


def test_config_claiming_thousands_of_layers_is_refused_fast(ckpt, tmp_path):
    d = fresh(ckpt[0], tmp_path)
    _edit_json(d / "config.json", lambda c: c.update(num_hidden_layers=5000))
    start = time.perf_counter()
    with time_limit(30), pytest.raises(CheckpointError, match=r"num_hidden_layers = 5000, but no tensor .* 4999"):
        load(d)
    assert time.perf_counter() - start < 3


# ---------------------------------------------------------------------------------------- paths and file types

@pytest.mark.parametrize("where", ["../secret.safetensors", "ABSOLUTE"])
def test_index_entries_outside_the_directory_are_refused(ckpt, tmp_path, where):
    d = fresh(ckpt[0], tmp_path)
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00SECRET-CONTENTS!")
    name = str(secret) if where == "ABSOLUTE" else where
    _edit_json(d / INDEX, lambda i: i["weight_map"].update({"model.norm.weight": name}))
    with pytest.raises(CheckpointError, match=r"not a file name inside the checkpoint directory") as e:
        load(d)
    assert "SECRET" not in str(e.value)


def test_symlink_out_of_the_directory_is_refused(ckpt, tmp_path):
    d = fresh(ckpt[0], tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(d / "model-00002-of-00002.safetensors", outside)
    os.symlink(outside, d / "model-00002-of-00002.safetensors")
    with pytest.raises(CheckpointError, match=r"resolves to .*elsewhere.safetensors, outside the checkpoint"):
        load(d)


def test_hugging_face_cache_layout_loads(ckpt, tmp_path):
    """snapshots/<rev>/<file> -> ../../blobs/<hash>, as huggingface_hub lays a cached repository out."""
    repo = tmp_path / "models--x--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, name in enumerate(sorted(os.listdir(ckpt[0]))):
        shutil.copy(ckpt[0] / name, blobs / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / name)
    assert same_state(load(snap), ckpt[1])


@pytest.mark.parametrize("name", ["model-00002-of-00002.safetensors", "config.json", INDEX])
def test_fifo_is_refused_without_blocking(ckpt, tmp_path, name):
    """A FIFO named by the checkpoint blocked the loader forever in open(); its type is checked first."""
    d = fresh(ckpt[0], tmp_path)
    os.remove(d / name)
    os.mkfifo(d / name)
    with time_limit(20), pytest.raises(CheckpointError, match=rf"'{name}' is not a regular file"):
        load(d)


# ---------------------------------------------------------------------------------------- process-wide state

def test_torch_dtype_does_not_change_the_default_dtype(ckpt, monkeypatch):
    """from_config(dtype=...) sets torch's default dtype for the whole process while the model is built;
    the loader builds without touching it and the model still comes out in torch_dtype."""
    from transformers import LlamaForCausalLM

    seen = []
    init = LlamaForCausalLM.__init__

    def spy(self, *args, **kw):
        seen.append(torch.get_default_dtype())
        init(self, *args, **kw)

    monkeypatch.setattr(LlamaForCausalLM, "__init__", spy)
    model = load(ckpt[0], torch_dtype=torch.bfloat16)
    assert seen == [torch.float32], seen
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.bfloat16
    assert model.model.norm.weight.dtype == torch.bfloat16
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_two_fresh_threads_load_at_once(ckpt):
    """In a fresh process (transformers not imported yet), two threads load at once while the main thread
    watches the default dtype: both loads succeed, and the default never changes."""
    script = textwrap.dedent(f"""
        import sys, threading, time, torch
        import nvfp4_gemm
        errors, dtypes, done = [], set(), threading.Event()
        def run():
            try:
                nvfp4_gemm.from_pretrained({str(ckpt[0])!r}, torch_dtype=torch.bfloat16, progress=False)
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            dtypes.add(torch.get_default_dtype())
            time.sleep(0.0005)  # a loop that never sleeps starves the loading threads of the GIL (300+ s in CI)
        print("errors", errors, "dtypes", sorted(map(str, dtypes)))
        sys.exit(1 if errors or dtypes != {{torch.float32}} else 0)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]


# ---------------------------------------------------------------------------------------- mutation fuzzing

_VALUES = [None, -1, 0, 1, 2**63, 1e308, -0.5, "", "x", "../x", "re:(a+)+$", [], {}, [1, 2], {"a": 1}, True]
# config fields whose other valid values mean another model, not a broken checkpoint (a float16 model,
# a tied head): mutating them legitimately loads something else
_MEANINGFUL = {"dtype", "torch_dtype", "tie_word_embeddings"}


def _json_paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k not in _MEANINGFUL:
                yield from _json_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _json_paths(v, prefix + (i,))


def _mutate_json(rng, path):
    doc = json.load(open(path))
    paths = [p for p in _json_paths(doc) if p]
    target = rng.choice(paths)
    parent = doc
    for k in target[:-1]:
        parent = parent[k]
    if isinstance(parent, dict) and rng.random() < 0.3:
        del parent[target[-1]]
        what = f"del {target}"
    else:
        parent[target[-1]] = rng.choice(_VALUES)
        what = f"{target} = {parent[target[-1]]!r}"
    _write_json(path, doc)
    return what


def _mutate_bytes(rng, path, limit=None):
    raw = bytearray(open(path, "rb").read())
    end = limit(raw) if limit else len(raw)
    pos = rng.randrange(end)
    raw[pos] = rng.randrange(256) if rng.random() < 0.5 else raw[pos] ^ (1 << rng.randrange(8))
    open(path, "wb").write(bytes(raw))
    return f"byte {pos}"


def _header_end(raw):
    return min(len(raw), 8 + int.from_bytes(raw[:8], "little"))


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
def test_mutation_fuzz(ckpt, ct_ckpt, tmp_path, fmt):
    """Seeded random mutations of a valid checkpoint's safetensors headers and JSON files (values replaced by
    other types, keys deleted, bytes flipped): each load either gives the original model (a mutation that
    changes nothing that matters) or raises CheckpointError, within 10 s; no other exception, no hang, and
    the process grows by less than 1 GB over all cases. Tensor data bytes are not mutated: any value there
    is a valid (different) model. NVFP4_FUZZ_CASES=n runs n cases per format (default 300, ~8 s each)."""
    rng = random.Random(27)
    src = ckpt[0] if fmt == "modelopt" else ct_ckpt
    original = load(src)
    files = sorted(os.listdir(src))
    shards = [f for f in files if f.endswith(".safetensors")]
    jsons = [f for f in files if f.endswith(".json")]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = {"refused": 0, "same": 0}
    for case in range(int(os.environ.get("NVFP4_FUZZ_CASES", "300"))):
        d = tmp_path / f"case{case}"
        shutil.copytree(src, d)
        kind = rng.choice(("header", "json", "json_bytes"))
        if kind == "header":
            name = rng.choice(shards)
            what = _mutate_bytes(rng, d / name, _header_end)
        else:
            name = rng.choice(jsons)
            what = _mutate_json(rng, d / name) if kind == "json" else _mutate_bytes(rng, d / name)
        start = time.perf_counter()
        try:
            with time_limit(30):
                model = load(d)
        except CheckpointError:
            outcomes["refused"] += 1
        except Exception as e:  # noqa: BLE001 - the failure this test exists for
            pytest.fail(f"case {case}: {kind} {name} {what}: {type(e).__name__}: {e}")
        else:
            assert same_state(model, original), f"case {case}: {kind} {name} {what} loaded a different model"
            outcomes["same"] += 1
        assert time.perf_counter() - start < 10, f"case {case}: {kind} {name} {what} took too long"
        shutil.rmtree(d)
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    print(f"mutation fuzz: {outcomes}, peak RSS grew {grown_kb / 1024:.0f} MB")
    assert grown_kb < (1 << 20)
    assert outcomes["refused"] > 0 and outcomes["same"] > 0


def test_save_refuses_to_replace_the_working_directory(ckpt, tmp_path, monkeypatch):
    d = fresh(ckpt[0], tmp_path)
    monkeypatch.chdir(d)
    before = snapshot(d)
    with pytest.raises(ValueError, match="is the working directory or holds it"):
        save_pretrained(ckpt[1], ".", progress=False)
    assert snapshot(d) == before
