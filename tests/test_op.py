"""torch.ops.nvfp4_gemm.mm as a custom op: opcheck, torch.compile without graph breaks, CUDA graphs."""
from __future__ import annotations

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import Case, check_against_reference, make_inputs
from conftest import requires_cuda

OPCHECK_CASES = [Case(7, 64, 96), Case(130, 16, 128, torch.float32, alpha=0.5), Case(1, 8, 64, torch.bfloat16, sf_view="6d")]


def _args(inputs):
    return (inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"]), {"alpha": inputs["alpha"], "out_dtype": inputs["out_dtype"]}


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=lambda c: c.id)
def test_opcheck(backend, case):
    _, device = backend
    inputs = make_inputs(case, device)
    # opcheck's schema check compares inputs before / after with arithmetic that float8 lacks: pass the
    # scales as their uint8 bytes (an accepted dtype, same memory).
    inputs["sfa"], inputs["sfb"] = inputs["sfa"].view(torch.uint8), inputs["sfb"].view(torch.uint8)
    args, kwargs = _args(inputs)
    torch.library.opcheck(torch.ops.nvfp4_gemm.mm.default, args, kwargs)


def test_is_the_registered_op():
    assert nvfp4_gemm.mm.__module__ == "nvfp4_gemm.ops"
    schema = str(torch.ops.nvfp4_gemm.mm.default._schema)
    assert schema.startswith("nvfp4_gemm::mm(Tensor a, Tensor b, Tensor sfa, Tensor sfb, *, Tensor? alpha=None")


def test_torch_compile_fullgraph(backend):
    _, device = backend
    torch._dynamo.reset()
    inputs = make_inputs(Case(130, 64, 128, torch.float32, alpha=0.25), device)

    @torch.compile(fullgraph=True)
    def f(a, b, sfa, sfb, alpha):
        return nvfp4_gemm.mm(a, b, sfa, sfb, alpha=alpha, out_dtype=torch.float32) * 2.0 + 1.0

    out = f(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], inputs["alpha"])
    ref = nvfp4_gemm.mm(**inputs) * 2.0 + 1.0
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_torch_compile_dynamic_m(backend):
    _, device = backend
    torch._dynamo.reset()
    f = torch.compile(lambda a, b, sfa, sfb: nvfp4_gemm.mm(a, b, sfa, sfb), fullgraph=True, dynamic=True)
    for m in (3, 17, 130):
        inputs = make_inputs(Case(m, 32, 64), device, seed=m)
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
def test_non_default_stream(backend):
    name, device = backend
    if name == "cpu":
        pytest.skip("streams need a CUDA backend")
    inputs = make_inputs(Case(300, 512, 1024, torch.bfloat16), device, seed=5)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = nvfp4_gemm.mm(**inputs)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    check_against_reference(out, inputs)


def test_info_reports_build_and_device():
    info = nvfp4_gemm.info()
    assert "_C" in info["modules"]
    assert "cpu" in info["backends"]
    assert info["device_backends"], info
    if torch.cuda.is_available():
        assert info["device"]["sm"] == "{}.{}".format(*torch.cuda.get_device_capability())
