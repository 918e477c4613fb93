"""The log-penalty problem of cvxpylayers issue 135 / diffcp issue 57, where cvxpylayers'
gradient (-45.69) disagreed with finite differences (-2.10): here in its one-variable form
with a closed form,

.. math::

    \\max_x\\ x + \\lambda(\\log(1 - x) + \\log(1 + x)),\\qquad
    x^\\star = \\sqrt{\\lambda^2 + 1} - \\lambda,\\qquad
    \\frac{dx^\\star}{d\\lambda} = \\frac{\\lambda}{\\sqrt{\\lambda^2 + 1}} - 1,

written as a cone program in ``(x, t_1, t_2)``: :math:`\\min -x - \\lambda t_1 - \\lambda t_2`
with :math:`(t_1, 1, 1 + x), (t_2, 1, 1 - x) \\in K_{\\exp}`.
"""

from __future__ import annotations

import math

import pytest
import torch

from dxopt import conic

F64 = torch.float64


def _data(lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.stack([-torch.ones_like(lam), -lam, -lam], dim=-1)
    # s = b - A z with z = (x, t1, t2): s = (t1, 1, 1 + x, t2, 1, 1 - x)
    A = torch.tensor(
        [[0, -1, 0], [0, 0, 0], [-1, 0, 0], [0, 0, -1], [0, 0, 0], [1, 0, 0]], dtype=F64
    )
    b = torch.tensor([0, 1, 1, 0, 1, 1], dtype=F64)
    return q, A.expand(lam.shape[0], 6, 3), b.expand(lam.shape[0], 6)


def _x(lam: torch.Tensor) -> torch.Tensor:
    q, A, b = _data(lam)
    sol = conic.solve(None, q, A, b, cones=[conic.ExpCone(), conic.ExpCone()], atol=1e-10,
                      rtol=1e-10)  # fmt: skip
    assert all(st.ok for st in sol.status)
    return sol.x[:, 0]


@pytest.mark.parametrize("lam0", [1.0, 0.1, 3.0])
def test_log_penalty_solution_and_gradient_match_closed_form_and_fd(lam0: float) -> None:
    lam = torch.tensor([lam0], dtype=F64, requires_grad=True)
    x = _x(lam)
    x_exact = math.sqrt(lam0**2 + 1) - lam0
    assert abs(x.item() - x_exact) < 1e-8
    (g,) = torch.autograd.grad(x.sum(), lam)
    exact = lam0 / math.sqrt(lam0**2 + 1) - 1
    assert abs(g.item() - exact) <= 1e-6 * abs(exact)
    # one-sided slopes at several steps agree with each other (a smooth point) and with autograd
    with torch.no_grad():
        base = _x(lam.detach()).item()
        for h in (1e-4, 1e-5):
            right = (_x(lam.detach() + h).item() - base) / h
            left = (base - _x(lam.detach() - h).item()) / h
            assert abs(right - left) < 1e-3 * abs(exact)
            assert abs(0.5 * (right + left) - g.item()) < 1e-4 * abs(exact)
