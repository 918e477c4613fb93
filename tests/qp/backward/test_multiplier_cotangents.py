"""Issue 35 item 2 (b): a duplicated active inequality row (P = I2, two copies of x0 <= 1).

With only ``q`` requiring grad, a cotangent on the copy the backend gave multiplier 0 (daqp,
auto, torch return [nu, 0]) was dropped: weights (1, 0) gave -0.5, (0, 1) gave 0 and (1, 1) -1,
so the backward was not linear in its cotangent, and the q-gradient changed when
``h.requires_grad`` was switched on. Now the backward is linear, backend-independent and the
same with or without ``h`` requiring grad; the derivative of the sum nu_0 + nu_1 (unique and
smooth: -(1 + q0) for q0 < -1) is exact, checked against finite differences.

The forward's part of item 2 (every backend now returns the equal split, the minimum-norm
multipliers, whose per-entry derivative the backward gives) is tested in
``tests/qp/certify/test_multiplier_selection.py``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt.qp as dqp

F64 = torch.float64
SOLVERS = ["daqp", "piqp", "clarabel", "auto", "torch"]


def _duals(q: torch.Tensor, h: torch.Tensor, solver: str) -> torch.Tensor:
    P = torch.eye(2, dtype=F64)
    G = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=F64)
    sol = dqp.solve(P, q, G=G, h=h, solver=solver)
    assert sol.status == (dqp.QPStatus.SOLVED,)
    return sol.ineq_duals


def _vjp(weights: tuple[float, float], solver: str, h_grad: bool) -> torch.Tensor:
    q = torch.tensor([-2.0, 0.5], dtype=F64, requires_grad=True)
    h = torch.ones(2, dtype=F64, requires_grad=h_grad)
    nu = _duals(q, h, solver)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dqp.QPDegenerateWarning)
        (nu @ torch.tensor(weights, dtype=F64)).backward()
    assert q.grad is not None
    return q.grad


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_backward_is_linear_in_the_multiplier_cotangent(solver: str) -> None:
    for h_grad in (False, True):
        g10, g01, g11 = (_vjp(w, solver, h_grad) for w in ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0)))
        torch.testing.assert_close(g10 + g01, g11, rtol=0.0, atol=1e-12)
        # the sum of the copies' multipliers is unique: nu_0 + nu_1 = -(1 + q0)
        t = 1e-6
        fd = []
        for s in (t, -t):
            q = torch.tensor([-2.0 + s, 0.5], dtype=F64)
            fd.append(float(_duals(q, torch.ones(2, dtype=F64), solver).sum()))
        slope = (fd[0] - fd[1]) / (2 * t)
        assert abs(slope - -1.0) <= 1e-6  # the reference itself
        torch.testing.assert_close(g11, torch.tensor([slope, 0.0], dtype=F64), rtol=0, atol=1e-6)


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_q_gradient_does_not_change_when_h_requires_grad(solver: str) -> None:
    for weights in ((1.0, 0.0), (0.0, 1.0), (0.3, -2.0)):
        torch.testing.assert_close(
            _vjp(weights, solver, False), _vjp(weights, solver, True), rtol=0.0, atol=1e-12
        )


def test_the_derivative_is_backend_independent() -> None:
    ref = _vjp((0.0, 1.0), "piqp", False)
    for solver in SOLVERS:
        torch.testing.assert_close(_vjp((0.0, 1.0), solver, False), ref, rtol=0.0, atol=1e-9)
