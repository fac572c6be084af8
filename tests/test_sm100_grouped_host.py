"""SM100 grouped (mixture-of-experts) kernels verified on the host, without a Blackwell GPU (issue 40 item 3).

Each test compiles a small C++ program from tests/sm100_host/ against the headers the kernels use
(csrc/common/cutlass_grouped.h: the per-group arguments the device builder writes; csrc/sm100/grouped_gemm.cuh; the
generated grouped table) and runs it on the CPU:
  grouped_layout_test:         every group's scale-factor layout (CUTLASS's Sm1xxBlkScaledConfig for m_g rows, from
                               its pointer at padded row P_g) == docs/CONTRACT.md's grouped blocked offsets, and its
                               A rows, B_g, sfb block, C rows and alpha pointer; empty and clamped groups; the stored
                               argument arrays read back;
  grouped_reference_test:      CUTLASS's host block-scaled GEMM over those per-group arguments == nvfp4_gemm.grouped_mm
                               on CPU tensors (the CPU backend), for routings with empty groups, both configs' forms;
  grouped_can_implement_test:  every grouped config passes CUTLASS's can_implement wherever the table sends a problem,
                               the workspace is sized on the host, refusals come back as messages;
  selfcheck_case_test:         the first-use self-check's fixed case and reference == the CPU backend, and its
                               comparison flags bad outputs.
Nothing here runs a kernel; nothing here says anything about SM100 timing or that the kernels ran.
"""
from __future__ import annotations

import os
import struct
import subprocess

import pytest
import torch

import nvfp4_gemm
from nvfp4_gemm.formats import SF_VEC, round_up
from nvfp4_gemm.testing_grouped import GroupedCase, grouped_reference, make_grouped_inputs
from sm100_host import tools
from test_sm100_host import _DT_CODE, _read, _write

pytestmark = pytest.mark.skipif(tools.find_nvcc() is None, reason="nvcc not found: the SM100 host checks compile C++ with it")


_cutlass_or_skip = tools.cutlass_or_skip


@pytest.fixture(scope="module")
def glayout_exe():
    _cutlass_or_skip()
    return tools.build_host_program("grouped_layout_test", "grouped_layout_test.cu")


@pytest.fixture(scope="module")
def greference_exe():
    _cutlass_or_skip()
    return tools.build_host_program("grouped_reference_test", "grouped_reference_test.cu")


@pytest.fixture(scope="module")
def gcan_implement_exe():
    _cutlass_or_skip()
    return tools.build_host_program(
        "grouped_can_implement_test", "grouped_can_implement_test.cu",
        cpp=("csrc/sm100/grouped_api.cpp", "csrc/sm100/select.cpp"), device_flags=True,
    )


@pytest.fixture(scope="module")
def selfcheck_exe():
    _cutlass_or_skip()
    return tools.build_host_program("selfcheck_case_test", "selfcheck_case_test.cu")


def _run(exe: str, *args: str) -> str:
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=900)
    print(p.stdout)
    assert p.returncode == 0, f"{os.path.basename(exe)} failed:\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def test_grouped_operand_layouts_match_spec(glayout_exe):
    assert "grouped_layout_test: OK" in _run(glayout_exe)


def test_grouped_can_implement_every_config(gcan_implement_exe):
    out = _run(gcan_implement_exe)
    assert "grouped_can_implement_test: OK" in out
    assert "ceil(T/G) 1..64: sm100_nvfp4_grouped_128x64x256_1sm_swap" in out


# Routings with empty groups (first, inside, last), one-row groups, a group past one 128-row atom, G = 1; every output
# dtype, per-group alpha, K/16 not a multiple of 4, the scale corner cases; padded rows of A, B and C.
REFERENCE_CASES = [
    (GroupedCase(37, 64, 96, 4), 0),
    (GroupedCase(200, 136, 160, 8, "skewed", torch.bfloat16, alpha=True), 16),
    (GroupedCase(130, 72, 64, 5, "one", torch.float32, alpha=True), 0),
    (GroupedCase(6, 64, 128, 9, "ones", alpha=True), 0),
    (GroupedCase(1, 8, 32, 1), 0),
    (GroupedCase(301, 64, 256, 1, alpha=True, sfa_size="least"), 16),
    (GroupedCase(70, 16, 64, 6, "edges", sfa_size="exact"), 0),
    (GroupedCase(50, 32, 96, 3, scales="tiny", out_dtype=torch.float32), 0),
    (GroupedCase(40, 32, 64, 3, scales="large"), 0),
    (GroupedCase(40, 32, 64, 3, scales="nan", alpha=True), 16),
    (GroupedCase(260, 264, 544, 3, counts=(0, 131, 129), out_dtype=torch.bfloat16, alpha=True), 0),
]


def _padded(t: torch.Tensor, pad: int, seed: int = 7) -> torch.Tensor:
    """Rows `pad` bytes longer than the data (junk in the gap), as a non-contiguous caller buffer."""
    if pad == 0:
        return t.view(torch.uint8)
    g = torch.Generator().manual_seed(seed)
    full = torch.randint(0, 256, (*t.shape[:-1], t.shape[-1] + pad), dtype=torch.uint8, generator=g)
    full[..., : t.shape[-1]] = t.view(torch.uint8)
    return full


def _host_reference(exe: str, d, inputs: dict, swap: bool, pad: int, sfa=None) -> torch.Tensor:
    """C from CUTLASS's host reference over the builder's per-group arguments (grouped_reference_test)."""
    a, b, sfb, offs, alpha = (inputs[k] for k in ("a", "b", "sfb", "offs", "alpha"))
    sfa = inputs["sfa"] if sfa is None else sfa
    t, g, n, k = a.shape[0], b.shape[0], b.shape[1], a.shape[1] * 2
    ap = _padded(a, pad)
    bp = _padded(b, 2 * pad)                                      # rows k/2 + 2 pad bytes apart
    bgroups = torch.zeros((g, n * bp.shape[-1] + 16 * pad), dtype=torch.uint8)  # groups 16 pad bytes further apart
    bgroups[:, : n * bp.shape[-1]] = bp.reshape(g, -1)
    ldc = n + (8 if pad else 0)
    dt = inputs["out_dtype"]
    sp = round_up(k // SF_VEC, 4)
    sfa_rows = sfa.numel() // sp
    with open(d / "meta.txt", "w") as f:
        f.write(f"{t} {n} {k} {g} {ap.shape[-1]} {bp.shape[-1]} {bgroups.shape[1]} {ldc} {sfa_rows} {int(swap)} "
                f"{_DT_CODE[dt]} {int(alpha is not None)}\n")
    _write(d / "a.bin", ap)
    _write(d / "b.bin", bgroups)
    _write(d / "sfa.bin", sfa.reshape(-1).view(torch.uint8))
    _write(d / "sfb.bin", sfb.reshape(-1).view(torch.uint8))
    _write(d / "offs.bin", offs.to(torch.int32))
    with open(d / "alpha.bin", "wb") as f:
        f.write(b"" if alpha is None else struct.pack(f"<{g}f", *alpha.tolist()))
    _run(exe, str(d))
    return _read(d / "c.bin", dt).reshape(t, ldc)[:, :n]


@pytest.mark.parametrize("swap", [False, True], ids=["noswap", "swap"])
@pytest.mark.parametrize("case,pad", REFERENCE_CASES, ids=[f"{c.id}-pad{p}" for c, p in REFERENCE_CASES])
def test_cutlass_host_reference_agrees_grouped(greference_exe, tmp_path, case, pad, swap):
    inputs = make_grouped_inputs(case, "cpu", seed=case.t * 31 + case.k + case.g)
    out = _host_reference(greference_exe, tmp_path, inputs, swap, pad)
    # The CPU backend (csrc/cpu/grouped_cpu.cpp) on the same operands, and docs/CONTRACT.md's bound against the
    # float64 reference, group by group.
    cpu = nvfp4_gemm.grouped_mm(inputs["a"], inputs["b"], inputs["sfa"], inputs["sfb"], inputs["offs"],
                                alpha=inputs["alpha"], out_dtype=case.out_dtype)
    assert torch.equal(torch.isnan(out), torch.isnan(cpu))
    ref = grouped_reference(inputs)
    ref.check(out, f"CUTLASS host reference over the grouped arguments ({case.id}, swap={swap})")
    ref.check(cpu, "the CPU backend")
    both = ~torch.isnan(cpu) & torch.isfinite(cpu)
    diff = (out[both].double() - cpu[both].double()).abs()
    assert (diff <= 2 * ref.bound[both]).all()


@pytest.mark.parametrize("swap", [False, True], ids=["noswap", "swap"])
def test_sfa_too_small_gives_nan_rows(greference_exe, tmp_path, swap):
    """sfa holds round_up(T,128) rows but the routing needs more: the rows whose scales lie past the buffer come out
    NaN (the builder's fill, as the generic CUDA path gives them), the others right; nothing reads past sfa
    (grouped_layout_test checks the spans)."""
    case = GroupedCase(100, 16, 64, 3, counts=(60, 30, 10))
    inputs = make_grouped_inputs(case, "cpu", seed=8)
    sp = round_up(case.k // SF_VEC, 4)
    small = inputs["sfa"].reshape(-1)[: 128 * sp].clone()
    out = _host_reference(greference_exe, tmp_path, inputs, swap, 0, sfa=small)
    assert not torch.isnan(out[:60]).any()
    assert torch.isnan(out[60:]).all()
    ref = grouped_reference(inputs)
    ref.m = 60
    ref.ref, ref.bound = ref.ref[:60], ref.bound[:60]
    ref.check(out[:60])


def test_selfcheck_case_matches_cpu_backend(selfcheck_exe, tmp_path):
    """The self-check's exact reference (grouped_selfcheck.h) == nvfp4_gemm.grouped_mm on the CPU for its case."""
    out = _run(selfcheck_exe, str(tmp_path))
    assert "selfcheck_case_test: OK" in out
    t, n, k, g, sfa_rows = map(int, (tmp_path / "meta.txt").read_text().split())
    a = _read(tmp_path / "a.bin", torch.uint8).reshape(t, k // 2)
    b = _read(tmp_path / "b.bin", torch.uint8).reshape(g, n, k // 2)
    sfa = _read(tmp_path / "sfa.bin", torch.uint8).view(torch.float8_e4m3fn)
    sfb = _read(tmp_path / "sfb.bin", torch.uint8).view(torch.float8_e4m3fn).reshape(g, -1)
    offs = _read(tmp_path / "offs.bin", torch.int32)
    alpha = _read(tmp_path / "alpha.bin", torch.float32)
    ref = _read(tmp_path / "ref.bin", torch.float32).reshape(t, n)
    assert offs.tolist() == [100, 100, 101, 137, 257] and sfa.numel() == sfa_rows * (k // 16)
    cpu = nvfp4_gemm.grouped_mm(a, b, sfa, sfb, offs, alpha=alpha, out_dtype=torch.float32)
    exact = nvfp4_gemm.reference_grouped_mm(a, b, sfa, sfb, offs, alpha=alpha, out_dtype=torch.float32)
    assert torch.equal(ref, exact), "the self-check's reference is the float64 reference rounded to float32"
    torch.testing.assert_close(cpu, ref, rtol=2**-12, atol=ref.abs().max().item() * 2**-12)
