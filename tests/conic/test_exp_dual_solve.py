"""Rows in the dual exponential cone go through :func:`dxopt.conic.solve` (as primal rows)."""

from __future__ import annotations

import math

import torch

import dxopt.conic as dc


def _problem(beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # min w  s.t.  (-1, beta, w) in K_exp^*:  -u e^{v/u} <= e w  =>  w* = exp(-beta - 1)
    q = torch.ones(1, dtype=torch.float64)
    A = torch.tensor([[0.0], [0.0], [-1.0]], dtype=torch.float64)
    b = torch.stack([torch.tensor(-1.0, dtype=torch.float64), beta, beta.new_zeros(())])
    return q, A, b


def test_dual_exp_rows_match_the_closed_form_value_and_gradient() -> None:
    for value in (-0.5, 0.0, 1.3):
        beta = torch.tensor(value, dtype=torch.float64, requires_grad=True)
        q, A, b = _problem(beta)
        sol = dc.solve(None, q, A, b, cones=[dc.ExpDualCone()])
        assert sol.ok
        exact = math.exp(-value - 1)
        assert abs(sol.x.item() - exact) <= 1e-7 * max(1.0, exact)
        (grad,) = torch.autograd.grad(sol.x.sum(), beta)
        assert abs(grad.item() + exact) <= 1e-6 * max(1.0, exact)
        # the slack is in K_exp^*, the dual in K_exp, and s = b - A x
        s, y = sol.s.detach(), sol.y.detach()
        assert dc.ExpCone().dist_dual(s).item() <= 1e-7
        assert dc.ExpCone().dist(y).item() <= 1e-7
        assert torch.allclose(s, (b - A @ sol.x).detach(), atol=1e-9)
        assert abs(float(s @ y)) <= 1e-7  # complementarity


def test_dual_exp_rows_match_finite_differences_in_a_batch() -> None:
    betas = torch.tensor([-0.2, 0.4, 0.9], dtype=torch.float64)
    q, A, _ = _problem(torch.tensor(0.0, dtype=torch.float64))
    b = torch.stack(
        [-torch.ones(3, dtype=torch.float64), betas, torch.zeros(3, dtype=torch.float64)], -1
    )
    b.requires_grad_(True)
    sol = dc.solve(None, q.expand(3, 1), A.expand(3, 3, 1), b, cones=[dc.ExpDualCone()])
    (grad,) = torch.autograd.grad(sol.x.sum(), b)
    h = 1e-6
    for k in range(3):
        for j in range(3):
            bp, bm = b.detach().clone(), b.detach().clone()
            bp[k, j] += h
            bm[k, j] -= h
            xp = dc.solve(None, q.expand(3, 1), A.expand(3, 3, 1), bp, cones=[dc.ExpDualCone()]).x
            xm = dc.solve(None, q.expand(3, 1), A.expand(3, 3, 1), bm, cones=[dc.ExpDualCone()]).x
            fd = (xp - xm)[k].item() / (2 * h)
            assert abs(grad[k, j].item() - fd) <= 1e-5 * max(1.0, abs(fd)), (k, j)
