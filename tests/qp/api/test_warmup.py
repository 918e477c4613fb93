"""Issue 28, warm-up: ``dxopt.qp.warmup()`` compiles (or loads) every compiled kernel of the
lean QP routes up front, so a model's first call does not pay numba's compilation."""

from __future__ import annotations

import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.api.warmup import _problems, _run, compiled_kernels


@pytest.mark.slow  # 5-25 s: loads (or, in a fresh install, compiles) every kernel
def test_warmup_reports_and_leaves_nothing_to_compile() -> None:
    """After warmup(), user-like calls along every lean route (one problem and a batch, with
    and without each kind of row, float64 and float32, penalty and KKT) dispatch no kernel
    signature that was not already compiled or loaded."""
    report = dqp.warmup()
    assert isinstance(report, dqp.WarmupReport)
    assert report.seconds > 0.0 and len(report.calls) >= 10
    assert all(": " in line and line.endswith(" s") for line in report.calls)
    assert report.kernels and report.signatures >= 1
    assert any(name.startswith("dxopt.qp.solvers.kernels.") for name in report.kernels)
    before = compiled_kernels()
    for dtype in (torch.float64, torch.float32):
        for batch in (None, 5):
            data = _problems(dtype, batch, 6)  # other sizes than the warm-up's own
            for backward in ("penalty", "kkt"):
                _run(data, backward=backward)
            _run({k: data[k] for k in "PqGh"})
            _run({k: data[k] for k in "PqAb"})
        _run(_problems(dtype, None, 70))
    assert compiled_kernels() == before


def test_warmup_is_exported_with_its_report() -> None:
    assert "warmup" in dqp.__all__ and "WarmupReport" in dqp.__all__
    assert dqp.warmup.__doc__ and "numba" in dqp.warmup.__doc__
