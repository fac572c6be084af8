"""torch.ops.nvfp4_gemm.mm as a custom op: opcheck, torch.compile without graph breaks, CUDA graphs."""
from __future__ import annotations

import os

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, case_seed, check_against_reference, make_inputs, run_after_slow_producer
from conftest import requires_cuda

OPCHECK_CASES = [Case(7, 64, 96), Case(130, 16, 128, torch.float32, alpha=0.5), Case(1, 8, 64, torch.bfloat16, sf_view="6d")]


def _args(inputs):
    return (inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"]), {"alpha": inputs["alpha"], "out_dtype": inputs["out_dtype"]}


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=lambda c: c.id)
def test_opcheck(backend, case):
    _, device = backend
    inputs = make_inputs(case, device, seed=case_seed(case))
    # opcheck's schema check compares inputs before / after with arithmetic that float8 lacks: pass the
    # scales as their uint8 bytes (an accepted dtype, same memory).
    inputs["sfa"], inputs["sfb"] = inputs["sfa"].view(torch.uint8), inputs["sfb"].view(torch.uint8)
    args, kwargs = _args(inputs)
    torch.library.opcheck(torch.ops.nvfp4_gemm.mm.default, args, kwargs)


def test_is_the_registered_op():
    assert nvfp4_gemm.mm.__module__ == "nvfp4_gemm.ops"
    schema = str(torch.ops.nvfp4_gemm.mm.default._schema)
    assert schema.startswith("nvfp4_gemm::mm(Tensor a, Tensor b, Tensor"), schema
    assert "Tensor? alpha=None" in schema and "ScalarType? out_dtype=None" in schema, schema


def test_torch_compile_fullgraph(backend):
    _, device = backend
    torch._dynamo.reset()
    case = Case(130, 64, 128, torch.float32, alpha=0.25)
    inputs = make_inputs(case, device, seed=case_seed(case))

    @torch.compile(fullgraph=True)
    def f(a, b, sfa, sfb, alpha):
        c = nvfp4_gemm.mm(a, b, sfa, sfb, alpha=alpha, out_dtype=torch.float32)
        return c, c * 2.0

    c, d = f(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], inputs["alpha"])
    check_against_reference(c, inputs)
    assert torch.equal(d, c * 2.0)  # the graph feeds the op's output on (doubling is exact in fp32)


def test_torch_compile_dynamic_m(backend):
    _, device = backend
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, sfa, sfb: nvfp4_gemm.mm(a, b, sfa, sfb), fullgraph=True, dynamic=True)
    for m in (3, 17, 130):
        case = Case(m, 32, 64)
        inputs = make_inputs(case, device, seed=case_seed(case))
        check_against_reference(f(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"]), inputs)


@requires_cuda
def test_cuda_graph_replay_with_new_values(backend):
    name, device = backend
    if name == "cpu":
        pytest.skip("CUDA graphs need a CUDA backend")
    case = Case(130, 256, 512, torch.float16, alpha=0.5)
    static = make_inputs(case, device, seed=10)
    nvfp4_gemm.mm(**static)  # warm up outside capture (module load, handles)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = nvfp4_gemm.mm(**static)
    for seed in (11, 12):
        fresh = make_inputs(case, device, seed=seed)
        for key in ("a", "b", "sfa", "sfb", "alpha"):
            static[key].copy_(fresh[key])
        g.replay()
        torch.cuda.synchronize()
        check_against_reference(out, fresh)


@requires_cuda
@pytest.mark.parametrize("case", [Case(300, 512, 1024, torch.bfloat16), Case(8, 1024, 2048, alpha=0.5),
                                  Case(130, 256, 512, torch.float32, sf_view="6d")], ids=lambda c: c.id)
def test_runs_on_the_current_stream(backend, case):
    """Inputs still being produced on a side stream (a slow kernel, then device copies), mm called on that
    stream, only that stream synchronized before the check (run_after_slow_producer): a launch on any
    other stream (the legacy default stream included) reads zeros or is unfinished when checked."""
    name, device = backend
    if name == "cpu":
        pytest.skip("streams need a CUDA backend")
    seed = case_seed(case)
    inputs = make_inputs(case, device, seed=seed)
    out, _ = run_after_slow_producer(nvfp4_gemm.mm, inputs)
    check_against_reference(out, inputs, f"backend {name}, {case.id}, seed {seed}: mm on a side stream")


def test_info_reports_build_and_device():
    info = nvfp4_gemm.info()
    assert "_C" in info["modules"]
    assert "cpu" in info["backends"]
    assert info["device_backends"], info
    if torch.cuda.is_available():
        assert info["device"]["sm"] == "{}.{}".format(*torch.cuda.get_device_capability())


def test_selftest_reports_every_entry_here(monkeypatch, capsys):
    """python -m nvfp4_gemm --selftest: versions, build, one PASS line per dispatch entry of this machine
    (the CPU backend at least) and per grouped_mm entry, what was skipped, exit status 0."""
    from nvfp4_gemm.__main__ import main
    from nvfp4_gemm.testing import dispatch_entries
    from nvfp4_gemm.testing_grouped import grouped_dispatch_entries

    monkeypatch.setenv("NVFP4_GEMM_SELFCHECK", os.environ.get("NVFP4_GEMM_SELFCHECK", "0"))  # restored after
    rc = main(["--selftest"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"torch      {torch.__version__}" in out and '"with_cuda"' in out, out
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] + ["cpu"]
    for dev in devices:
        for backend, config in dispatch_entries(dev)[0] + grouped_dispatch_entries(dev):
            prefix = f"{dev:<7} {backend:<8} {config} "
            rows = [ln for ln in out.splitlines() if ln.startswith(prefix)]
            assert len(rows) == 1 and rows[0][len(prefix):].split()[0] == "PASS", (prefix, out)
    if not torch.cuda.is_available():
        assert "skipped: " in out and "no CUDA device visible" in out, out
    assert out.rstrip().endswith("0 failed"), out


def test_selftest_fails_on_a_wrong_result(monkeypatch, capsys):
    """A result 1% off (far beyond the bound) turns the entry into FAIL, names the seed, exit status 1."""
    from nvfp4_gemm import ops
    from nvfp4_gemm.__main__ import main

    real = ops.mm
    monkeypatch.setattr(ops, "mm", lambda *a, **k: real(*a, **k) * 1.01)
    monkeypatch.setenv("NVFP4_GEMM_SELFCHECK", os.environ.get("NVFP4_GEMM_SELFCHECK", "0"))
    rc = main(["--selftest"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAIL" in out and "out of bound" in out and "(seed " in out, out
