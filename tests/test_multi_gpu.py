"""Two or more GPUs in one process, as tensor-parallel serving runs: every dispatch entry on each device
(NVFP4 x NVFP4 and the weight-only form), the linear op in each mode on each device, threads calling mm and
linear concurrently on two devices, and an error on one device leaving both usable.

Per-device state (function attributes such as a raised shared-memory limit, device properties, caches)
kept once per process instead of once per device shows here: a kernel set up on cuda:0 fails on cuda:1,
and a launch error left unread fails the next, unrelated call.
"""
from __future__ import annotations

import threading
import zlib

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import (
    MODES,
    Case,
    Reference,
    case_seed,
    dispatch_entries,
    forced_entry,
    make_inputs,
    run_dispatch_entries,
    spread_activations,
)
from test_linear_op import call, composed, make_layer, make_x

_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(_count < 2, reason=f"needs >= 2 CUDA devices, this machine has {_count}")

# Decode (small-M kernel on sm90), a partial prefill tile, and a GPU MODE shape: different kernels and
# workspaces per device.
THREAD_CASES = (Case(16, 4096, 7168), Case(300, 512, 2080, torch.bfloat16, alpha=0.5), Case(128, 7168, 2048))


@pytest.fixture(autouse=True)
def _automatic_dispatch(monkeypatch):
    monkeypatch.delenv("NVFP4_GEMM_BACKEND", raising=False)
    monkeypatch.delenv("NVFP4_GEMM_CONFIG", raising=False)


def _devices() -> list[torch.device]:
    return [torch.device("cuda", i) for i in range(_count)]


def _concurrently(devs, body) -> list[str]:
    """Runs body(dev, errors) in one thread per device, all started together (after set_device); returns
    what the bodies appended to errors, and any exception as an error of its device."""
    start = threading.Barrier(len(devs))
    errors: list[str] = []

    def worker(dev: torch.device) -> None:
        try:
            torch.cuda.set_device(dev)
            start.wait(timeout=60)
            body(dev, errors)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{dev}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(dev,)) for dev in devs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 600 s"
    return errors


def _report(results) -> str:
    return "\n".join(f"{r.device} {r.backend}:{r.config}: " + "; ".join(r.failures) for r in results if not r.ok)


def test_every_dispatch_entry_on_each_device():
    """Each entry of each device in turn, then each entry of the first device again: a per-process setting
    made on cuda:0 fails on cuda:1, and an error left behind there fails cuda:0's next call."""
    order = _devices() + _devices()[:1]
    results, skipped = [], []
    for dev in order:
        entries, not_here = dispatch_entries(dev)
        skipped += not_here
        assert entries, f"{dev}: no dispatch entry can run ({not_here})"
        results += run_dispatch_entries(dev, entries)
    if skipped:
        print("\nnot run: " + "; ".join(sorted(set(skipped))))
    assert all(r.ok for r in results), _report(results)


def test_threads_on_two_devices_concurrently():
    """One thread per device (the first two), started together, each calling mm (automatic dispatch)
    repeatedly on THREAD_CASES and checking every result on its own device."""
    devs = _devices()[:2]
    work = {}
    for dev in devs:
        for case in THREAD_CASES:
            inputs = make_inputs(case, dev, seed=case_seed(case))
            work.setdefault(dev, []).append((case, inputs, Reference(inputs)))
    for dev in devs:
        torch.cuda.synchronize(dev)

    def body(dev: torch.device, errors: list[str]) -> None:
        for it in range(10):
            outs = [(case, ref, nvfp4_gemm.mm(**inputs)) for case, inputs, ref in work[dev]]
            for case, ref, out in outs:
                ref.check(out, f"{dev}, iteration {it}, {case.id}, seed {case_seed(case)}")

    errors = _concurrently(devs, body)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("bad", [0, 1], ids=["error-on-cuda0", "error-on-cuda1"])
def test_an_error_on_one_device_does_not_poison_the_next_call(monkeypatch, bad):
    """A rejected call (bad input; a forced config that names nothing) on one device, then valid calls on
    that device and the other: both right."""
    devs = _devices()[:2]
    case = Case(32, 4096, 7168)
    good = {dev: make_inputs(case, dev, seed=case_seed(case)) for dev in devs}
    refs = {dev: Reference(good[dev]) for dev in devs}
    dev = devs[bad]

    bad_k = dict(good[dev], b=good[dev]["b"][:, :1792])
    with pytest.raises(RuntimeError, match=r"a and b must have the same K"):
        nvfp4_gemm.mm(**bad_k)
    monkeypatch.setenv("NVFP4_GEMM_CONFIG", "no_such_config")
    with pytest.raises(RuntimeError, match=r"names no compiled kernel config"):
        nvfp4_gemm.mm(**good[dev])
    monkeypatch.delenv("NVFP4_GEMM_CONFIG")

    for d in (dev, devs[1 - bad], dev):
        out = nvfp4_gemm.mm(**good[d])
        refs[d].check(out, f"{d} after an error on {dev}, {case.id}, seed {case_seed(case)}")
    m128 = Case(128, 4096, 7168)
    inputs = make_inputs(m128, dev, seed=case_seed(m128))
    Reference(inputs).check(nvfp4_gemm.mm(**inputs), f"{dev}, {m128.id} after the errors")


# The weight-only form: a float16 / bfloat16 [M, K] in place of packed a and sfa. Small-M and wgmma kernels,
# each with its own 16-bit instantiation (and shared-memory attribute) per device.
WO_CASES = (Case(7, 136, 544), Case(300, 512, 2080, torch.bfloat16, alpha=0.5))


def _weight_only_inputs(case: Case, dev: torch.device, a_dtype: torch.dtype) -> dict:
    inputs = make_inputs(case, dev, seed=case_seed(case))
    a = spread_activations(case.m, case.k, case_seed(case) + 1)
    return dict(inputs, a=a.to(a_dtype).to(dev), sfa=None)


def test_weight_only_every_entry_on_each_device():
    """Each dispatch entry forced in turn with fp16 and bf16 activations, device after device and back to
    the first; a forced config's refusal of a shape (its stated limit) is not a failure."""
    failures, ran = [], 0
    for dev in _devices() + _devices()[:1]:
        prepared = [(c, dt, _weight_only_inputs(c, dev, dt)) for c in WO_CASES for dt in (torch.float16, torch.bfloat16)]
        refs = [Reference(inputs) for _, _, inputs in prepared]
        for backend, config in dispatch_entries(dev)[0]:
            for (case, dt, inputs), ref in zip(prepared, refs):
                tag = f"{dev} {backend}:{config} {case.id} a={dt} (seed {case_seed(case)})"
                try:
                    with forced_entry(backend, config):
                        out = nvfp4_gemm.mm(**inputs)
                        torch.cuda.synchronize(dev)
                except RuntimeError as e:
                    if "cannot run M=" not in str(e):
                        failures.append(f"{tag}: {str(e).splitlines()[0]}")
                    continue
                worst, msg = ref.ratio(out)
                ran += 1
                if worst > 1.0:
                    failures.append(f"{tag}: {msg}")
    assert ran, "no weight-only call ran"
    assert not failures, "\n".join(failures)


LINEAR_CASES = tuple((mode, dt, m) for mode in MODES for dt in (torch.float16, torch.bfloat16) for m in (1, 200))


def _linear_case(dev: torch.device, mode: str, dtype: torch.dtype, m: int) -> tuple:
    seed = zlib.crc32(f"multi-gpu-{mode}-{dtype}-{m}".encode())
    layer = make_layer(512, 1024, dev, seed, bias_dtype=dtype if m == 200 else None)
    x = make_x((m, 1024), dtype, dev, seed + 1)
    input_scale = (x.float().abs().amax() / 2688.0).reshape(1)
    return layer, x, input_scale, seed


def test_linear_every_mode_on_each_device():
    """nvfp4_gemm.linear in each mode (its input-scales step keeps per-device reduction state), on each
    device and back to the first: equal bit for bit to quantize + mm on the same device."""
    for dev in _devices() + _devices()[:1]:
        for mode, dtype, m in LINEAR_CASES:
            layer, x, input_scale, seed = _linear_case(dev, mode, dtype, m)
            y = call(x, layer, mode, input_scale)
            ref, _ = composed(x, layer, mode, input_scale)
            assert torch.equal(y, ref), f"{dev} {mode} x={dtype} M={m} (seed {seed})"


def test_linear_threads_on_two_devices_concurrently():
    """One thread per device calling linear in each mode repeatedly; each result equal to the composed ops'
    result computed beforehand on that device."""
    devs = _devices()[:2]
    work = {}
    for dev in devs:
        for mode, dtype, m in LINEAR_CASES:
            layer, x, input_scale, seed = _linear_case(dev, mode, dtype, m)
            work.setdefault(dev, []).append((mode, x, layer, input_scale, composed(x, layer, mode, input_scale)[0]))
        torch.cuda.synchronize(dev)

    def body(dev: torch.device, errors: list[str]) -> None:
        for it in range(10):
            outs = [(mode, x, ref, call(x, layer, mode, s)) for mode, x, layer, s, ref in work[dev]]
            for mode, x, ref, y in outs:
                if not torch.equal(y, ref):
                    errors.append(f"{dev}, iteration {it}, {mode} x={x.dtype} M={x.shape[0]}: differs")

    errors = _concurrently(devs, body)
    assert not errors, "\n".join(errors[:20])
