"""Kernel launches per NVFP4Linear forward on the GPU, counted with the profiler, and no host sync.

Issue 12's budget per forward: dynamic <= 3, static <= 2, weight-only <= 2. What this design issues, besides
the GEMM's own launches (counted here by profiling mm alone on the same operands, so the test follows
whatever the GEMM backend does):
  * where the GEMM quantizes x itself (the sm90 kernels on Hopper, except at M <= 16 with K % 256 == 0, where
    mm runs the packed form on the K-sliced kernel and linear quantizes first): dynamic 1, the input scales
    kernel (finite amax + encode / decode / alpha in one launch), except where the call forms the scales itself
    (the K-sliced path and the wgmma configs at M > 32); static none; weight-only none;
  * elsewhere quantize runs first: dynamic 2 (scales + quantize), static 1 (quantize forms its encode scale
    from input_scale and writes alpha), weight-only none;
  * a bias: 1 more (one add that reads the bias in its dtype and rounds the fp32 sum to x's dtype).
The GEMM on Hopper is 1-2 launches (an A prepass + the GEMM at M > 32, a counter reset + the GEMM when it
splits K at M <= 32 without a free counter slot; the K-sliced kernel at M = 1 here does not split), so there
without a bias: dynamic <= 3, static <= 2, weight-only <= 2, the budget.
"""
from __future__ import annotations

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.testing import MODES
from conftest import cuda_kernels, requires_cuda
from test_nn import layer_for, make_activations, make_linear

pytestmark = requires_cuda



def on_sm90() -> bool:
    """Whether the GEMMs run on the sm90 kernels: a Hopper GPU, unless a test run forces another backend."""
    import os

    return (torch.cuda.get_device_capability() == (9, 0) and "sm90" in nvfp4_gemm.configs()
            and os.environ.get("NVFP4_GEMM_BACKEND", "auto") in ("", "auto", "sm90"))


def quantizes_in_its_own_kernel(m: int, k: int) -> bool:
    """Whether that GEMM call quantizes x in a kernel ahead of the GEMM's, one launch more than mm of the packed
    form makes: sm90's K-sliced path (M <= 16, K % 256 == 0: csrc/sm90/backend.cu, run_wk). In dynamic mode that
    kernel forms the input scales too (Problem::a_dynamic_ws2)."""
    return on_sm90() and m <= 16 and k % 256 == 0


def forms_scales_in_the_call(m: int, k: int) -> bool:
    """Whether linear's dynamic W4A4 GEMM call forms the input scales itself, with no input-scales launch: sm90's
    K-sliced path (its quantization kernel) and its wgmma configs at M > 32 (their A prepass)."""
    return on_sm90() and ((m <= 16 and k % 256 == 0) or m > 32)


def own_launches(mode: str, m: int, k: int) -> int:
    if on_sm90():  # linear's W4A4 GEMM call quantizes x itself: no separate quantize launch
        own_kernel = mode != "weight_only" and quantizes_in_its_own_kernel(m, k)
        return int(mode == "dynamic" and not forms_scales_in_the_call(m, k)) + int(own_kernel)
    return {"dynamic": 2, "static": 1, "weight_only": 0}[mode]


def mm_alone(layer, x: torch.Tensor, bias: bool):
    """mm on the operands the layer's forward gives it, prepared beforehand."""
    out_dtype = torch.float32 if bias else x.dtype
    if layer.weight_only:
        return lambda: nvfp4_gemm.mm(x, layer.weight, None, layer.weight_scale, layer.weight_scale_2, out_dtype)
    scales = torch.ops.nvfp4_gemm._input_scales(x, layer.weight_scale_2, layer.input_scale)
    packed, sf = nvfp4_gemm.quantize(x, scales[0:1])
    alpha = scales[2:3]
    return lambda: nvfp4_gemm.mm(packed, layer.weight, sf, layer.weight_scale, alpha, out_dtype)


@pytest.mark.parametrize("m", (1, 64), ids=("m1", "m64"))
@pytest.mark.parametrize("bias", (False, True), ids=("nobias", "bias"))
@pytest.mark.parametrize("mode", MODES)
def test_launches_per_forward(mode, bias, m):
    layer = layer_for(mode, make_linear(256, 256, bias, torch.float32, 31)).cuda()
    x = make_activations(m, 256, torch.bfloat16, 32).cuda()
    got = cuda_kernels(lambda: layer(x))
    mm_kernels = cuda_kernels(mm_alone(layer, x, bias))
    own = own_launches(mode, m, 256) + int(bias)
    print(f"\n{mode} bias={bias} M={m}: {len(got)} launches per forward = mm {len(mm_kernels)} + ours {own}: {got}")
    assert len(got) == len(mm_kernels) + own, (got, mm_kernels)
    own_kernel = mode != "weight_only" and quantizes_in_its_own_kernel(m, 256)
    scales_launch = mode == "dynamic" and not forms_scales_in_the_call(m, 256)
    assert sum("scales_kernel" in name for name in got) == scales_launch, got
    separate_quantize = mode != "weight_only" and not on_sm90()
    assert sum("quantize_kernel" in name for name in got) == separate_quantize, got
    assert sum("quant_a_wk_" in name for name in got) == own_kernel, got
    if on_sm90() and not bias:  # issue 12's budget
        assert len(got) <= {"dynamic": 3, "static": 2, "weight_only": 2}[mode], got


@pytest.mark.parametrize("mode", MODES)
def test_forward_never_syncs_the_host(mode):
    layer = layer_for(mode, make_linear(256, 256, True, torch.float32, 33)).cuda()
    x = make_activations(16, 256, torch.float16, 34).cuda()
    want = layer(x)  # first use outside the check (one-time self-checks may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = layer(x)
        got3 = layer(x.reshape(2, 8, 256))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got, want) and torch.equal(got3.reshape(16, -1), want)


@pytest.mark.parametrize("m", (4, 40), ids=("m4", "m40"))
@pytest.mark.parametrize("mode", MODES)
def test_forward_replays_in_a_cuda_graph(mode, m):
    """Captured once, replayed on new activations: the replay equals an eager forward bit for bit (on sm90 at
    M = 4 the W4A4 call quantizes x in a kernel of its own ahead of the K-sliced GEMM, both captured)."""
    layer = layer_for(mode, make_linear(256, 256, True, torch.float32, 35)).cuda()
    static_x = make_activations(m, 256, torch.bfloat16, 36).cuda()
    layer(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    for seed in (37, 38, 39):
        static_x.copy_(make_activations(m, 256, torch.bfloat16, seed).cuda() * (seed - 36))
        graph.replay()
        assert torch.equal(static_y, layer(static_x)), seed
