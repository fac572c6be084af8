"""Two or more GPUs in one process, as tensor-parallel serving runs: every dispatch entry on each device,
threads calling mm concurrently on two devices, and an error on one device leaving both usable.

Per-device state (function attributes such as a raised shared-memory limit, device properties, caches)
kept once per process instead of once per device shows here: a kernel set up on cuda:0 fails on cuda:1,
and a launch error left unread fails the next, unrelated call.
"""
from __future__ import annotations

import threading

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import (
    Case,
    Reference,
    case_seed,
    dispatch_entries,
    make_inputs,
    run_dispatch_entries,
)

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
    start = threading.Barrier(len(devs))
    errors: list[str] = []

    def worker(dev: torch.device) -> None:
        try:
            torch.cuda.set_device(dev)
            start.wait(timeout=60)
            for it in range(10):
                outs = [(case, ref, nvfp4_gemm.mm(**inputs)) for case, inputs, ref in work[dev]]
                for case, ref, out in outs:
                    ref.check(out, f"{dev}, iteration {it}, {case.id}, seed {case_seed(case)}")
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{dev}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(dev,)) for dev in devs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 600 s"
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
