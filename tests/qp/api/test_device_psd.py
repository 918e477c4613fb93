"""Issue 35 item 4: the device path (``solver="torch"``) judged convexity with another
tolerance than the CPU path. Its CPU handover re-checked the float64 copy of a float32 ``P``
against float64's epsilon, so a unit-norm float32 ``P`` with smallest eigenvalue -1.9e-9
(round-off) was refused, and the whole batch raised, while every CPU solver solves it."""

from __future__ import annotations

import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.problem.canonical import NotPSDError
from dxopt.qp.problem.types import QPStatus


def _roundoff_psd(n: int = 6) -> torch.Tensor:
    """A rank-3, unit-norm PSD matrix rounded to float32: its smallest eigenvalue (in exact
    arithmetic on the float32 entries) is about -1.96e-9."""
    g = torch.Generator().manual_seed(0)
    M = torch.randn(n, 3, generator=g, dtype=torch.float64)
    P = M @ M.T
    P = (P / torch.linalg.matrix_norm(P, 2)).float()
    return (P + P.T) / 2


def test_float32_roundoff_p_solves_on_the_device_path_as_on_the_cpu() -> None:
    P0 = _roundoff_psd()
    n = P0.shape[0]
    lowest = float(torch.linalg.eigvalsh(P0.double()).min())
    assert -1e-8 < lowest < -1e-9  # the case of the issue: negative by round-off
    P = torch.stack([P0, torch.eye(n)])
    q = torch.linspace(-1.0, 1.0, 2 * n).reshape(2, n)
    G, h = torch.eye(n), torch.full((2, n), 0.5)
    cpu = dqp.solve(P, q, G=G, h=h, solver="piqp")
    dev = dqp.solve(P, q, G=G, h=h, solver="torch")
    assert cpu.status == dev.status == (QPStatus.SOLVED, QPStatus.SOLVED)
    torch.testing.assert_close(dev.x, cpu.x, rtol=0, atol=1e-4)
    single = dqp.solve(P0, q[0], G=G, h=h[0], solver="torch")  # one problem too
    assert single.status == (QPStatus.SOLVED,)


def test_a_truly_nonconvex_p_is_refused_on_both_paths() -> None:
    """The same decision both ways: an eigenvalue of -1e-3 is no round-off."""
    n = 6
    P = torch.stack([_roundoff_psd(n) - 1e-3 * torch.eye(n), torch.eye(n)])
    q, G, h = torch.ones(2, n), torch.eye(n), torch.ones(2, n)
    for solver in ("piqp", "torch"):
        with pytest.raises(NotPSDError, match="smallest eigenvalue"):
            dqp.solve(P, q, G=G, h=h, solver=solver, on_failure="nan")
