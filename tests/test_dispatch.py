"""The dispatch tables as the arch modules report them (no GPU needed: the modules load on any machine)."""
from __future__ import annotations

import re

import nvfp4_gemm


def test_every_backend_lists_its_rules():
    rules = nvfp4_gemm.dispatch_rules()
    configs = nvfp4_gemm.configs()
    assert "cpu" in rules
    for backend, names in configs.items():
        text = rules[backend]
        lines = [line for line in text.splitlines() if line.strip()]
        assert lines, f"{backend} reports no dispatch rules"
        # Rules cover M from 1 upwards, contiguously, and end unbounded.
        lo = 1
        for line in lines:
            m = re.match(r"M (\d+)\.\.(\d+): ", line) or re.match(r"M >= (\d+): ", line)
            assert m, f"{backend}: unexpected rule {line!r}"
            assert int(m.group(1)) == lo, f"{backend}: rule {line!r} does not start at M = {lo}"
            lo = int(m.group(2)) + 1 if m.lastindex == 2 else None
        assert lo is None, f"{backend}: the last rule must be unbounded, got {lines[-1]!r}"
        # Every config a rule names is a compiled config, and every rule names one.
        for line in lines:
            named = [n for n in names if n in line]
            assert named or "generic" in line, f"{backend}: rule {line!r} names no compiled config"


def test_info_carries_the_rules():
    backends = nvfp4_gemm.info()["backends"]
    for backend, text in nvfp4_gemm.dispatch_rules().items():
        if backend in ("cpu", "generic"):
            continue
        assert backends[backend]["dispatch"] == text


def test_forced_nests_and_restores():
    """nvfp4_gemm.testing.forced sets the resolver's process-wide override (torch.ops.nvfp4_gemm._force) field by
    field, nests, and restores the previous one on exit, also after an error; splits out of range are refused."""
    import pytest
    import torch

    from nvfp4_gemm.testing import forced

    op = torch.ops.nvfp4_gemm._force

    def current():
        prev = op("", "", 0)
        op(*prev)
        return tuple(prev)

    assert current() == ("", "", 0)
    with forced(backend="sm90"):
        assert current() == ("sm90", "", 0)
        with forced(config="cfg", splits=3):
            assert current() == ("sm90", "cfg", 3)
        assert current() == ("sm90", "", 0)
        with pytest.raises(ValueError):
            with forced(splits=2):
                raise ValueError("inside")
        assert current() == ("sm90", "", 0)
    assert current() == ("", "", 0)
    with pytest.raises(RuntimeError, match=r"splits must be in \[0, 2\^20\]"):
        op("", "", -1)
    assert current() == ("", "", 0)
