"""backward=Smoothed(mu) of dxopt.conic: the exact derivative of the barrier solution z(mu)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import dxopt.conic as dc
from dxopt._core import Status
from dxopt.conic.smoothed import barrier_solution

from ._problems import F64, ball_rows


def _half_line(c: float, mu: float):
    """min 1/2 (x - c)^2 s.t. x >= 0: x(mu) = (c + sqrt(c^2 + 4 mu)) / 2, y(mu) = mu / x."""
    cc = torch.tensor([c], dtype=F64, requires_grad=True)
    sol = dc.solve(torch.eye(1, dtype=F64), -cc, -torch.eye(1, dtype=F64),
                   torch.zeros(1, dtype=F64), cones=[dc.NonnegCone(1)],
                   backward=dc.Smoothed(mu=mu))  # fmt: skip
    return cc, sol


@pytest.mark.parametrize("c", [1.0, 0.0, -0.5])
def test_the_closed_form_of_the_half_line(c):
    mu = 1e-2
    cc, sol = _half_line(c, mu)
    (gx,) = torch.autograd.grad(sol.x.sum(), cc, retain_graph=True)
    (gy,) = torch.autograd.grad(sol.y.sum(), cc)
    root = math.sqrt(c * c + 4 * mu)
    x_mu = 0.5 * (c + root)
    dx = 0.5 * (1 + c / root)
    assert float(gx) == pytest.approx(dx, rel=1e-10)
    # y(mu) = mu / x(mu): dy/dc = -mu / x^2 dx/dc
    assert float(gy) == pytest.approx(-mu / x_mu**2 * dx, rel=1e-8)
    assert sol.info.backward.linear_solver == "lu (smoothed)"
    assert sol.info.backward.residual[0] < 1e-14


def _mixed():
    """One program with every barrier cone: zero, SOC, orthant, PSD (2x2), exponential."""
    n = 3
    A_ball, b_ball = ball_rows(n, 1.0)
    r2 = math.sqrt(2)
    A = torch.cat([
        torch.tensor([[1.0, 1.0, 1.0]], dtype=F64), A_ball, -torch.eye(n, dtype=F64),
        -torch.tensor([[1.0, 0.0, 0.0], [0.0, r2, 0.0], [0.0, 0.0, -1.0]], dtype=F64),
        torch.tensor([[0.0, 0.0, -1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64),
    ])  # fmt: skip
    b = torch.cat([torch.tensor([0.2], dtype=F64), b_ball, torch.full((n,), 0.3, dtype=F64),
                   torch.tensor([1.0, 0.0, 1.2, 0.0, 1.0, 2.0], dtype=F64)])  # fmt: skip
    cones = (dc.ZeroCone(1), dc.SecondOrderCone(4), dc.NonnegCone(3), dc.PSDCone(2), dc.ExpCone())
    P = torch.eye(n, dtype=F64) + 0.1
    q = torch.tensor([-2.0, 0.5, 1.0], dtype=F64)
    return P, q, A, b, cones


def _smoothed_vjp(P, q, A, b, cones, mu, weights):
    inputs = [t.clone().requires_grad_() for t in (P, q, A, b)]
    sol = dc.solve(*inputs, cones=cones, backward=dc.Smoothed(mu=mu))
    out = torch.cat([sol.x, sol.y, sol.s])
    return torch.autograd.grad((out * weights).sum(), inputs)


def test_the_gradient_matches_central_differences_of_the_barrier_solution():
    P, q, A, b, cones = _mixed()
    mu = 1e-2
    m = b.numel()
    weights = torch.cos(torch.arange(3 + 2 * m, dtype=F64))
    grads = _smoothed_vjp(P, q, A, b, cones, mu, weights)
    gen = torch.Generator().manual_seed(0)
    dirs = [torch.randn(t.shape, generator=gen, dtype=F64) for t in (P, q, A, b)]
    dirs[0] = 0.5 * (dirs[0] + dirs[0].T)
    analytic = sum(float((g * d).sum()) for g, d in zip(grads, dirs))

    def z(t: float) -> torch.Tensor:
        data = [v + t * d for v, d in zip((P, q, A, b), dirs)]
        x, y, s, ok = barrier_solution(*data, cones=cones, smoothed=dc.Smoothed(mu=mu))
        assert bool(ok.all())
        return torch.cat([x[0], y[0], s[0]])

    errors = []
    for h in (1e-3, 1e-4, 1e-5):
        numeric = float(((z(h) - z(-h)) * weights).sum()) / (2 * h)
        errors.append(abs(numeric - analytic))
    assert errors[1] < 0.05 * errors[0]  # the O(h^2) truncation error of a smooth map
    assert min(errors) < 1e-7 * abs(analytic)


def test_the_gradient_tends_to_the_exact_one_as_mu_goes_to_zero():
    P, q, A, b, cones = _mixed()
    sol = dc.solve(P, q, A, b, cones=cones)
    assert sol.status == (Status.SOLVED,)
    assert not sol.info.kink[0]  # strictly complementary (no cone kink)
    weights = torch.cos(torch.arange(3 + 2 * b.numel(), dtype=F64))
    inputs = [t.clone().requires_grad_() for t in (P, q, A, b)]
    exact_sol = dc.solve(*inputs, cones=cones)
    out = torch.cat([exact_sol.x, exact_sol.y, exact_sol.s])
    exact = torch.autograd.grad((out * weights).sum(), inputs)
    errors = []
    for mu in (1e-2, 1e-3, 1e-4, 1e-5):
        smooth = _smoothed_vjp(P, q, A, b, cones, mu, weights)
        errors.append(max(float((g - e).abs().max()) for g, e in zip(smooth, exact)))
    scale = max(float(e.abs().max()) for e in exact)
    for e0, e1 in itertools.pairwise(errors):  # O(mu): about 10x per decade
        assert e1 < 0.2 * e0
    assert errors[-1] < 1e-3 * scale


def test_the_gradient_is_continuous_across_an_active_set_switch():
    # the half line at c = -d and c = +d: the exact derivative jumps from 0 to 1
    d = 1e-7
    g = {}
    for c in (-d, d):
        cc, sol = _half_line(c, 1e-3)
        (g[c],) = torch.autograd.grad(sol.x.sum(), cc)
    assert abs(float(g[d] - g[-d])) < 1e-4
    # the ball: the nearest point of ||x|| <= 1 to c crossing the sphere
    A, b = ball_rows(2)
    grads = []
    for radius in (1 - d, 1 + d):
        c = torch.tensor([0.6, 0.8], dtype=F64) * radius
        c.requires_grad_()
        sol = dc.solve(torch.eye(2, dtype=F64), -c, A, b, cones=[dc.SecondOrderCone(3)],
                       backward=dc.Smoothed(mu=1e-3))  # fmt: skip
        grads.append(torch.autograd.grad((sol.x * torch.tensor([1.0, 2.0], dtype=F64)).sum(), c)[0])
    assert float((grads[0] - grads[1]).abs().max()) < 1e-4


def test_the_power_cone_and_forward_mode_are_refused():
    A = -torch.eye(3, dtype=F64)
    b = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="PowerCone"):
        dc.solve(None, torch.ones(3, dtype=F64), A, b, cones=[dc.PowerCone(0.3)],
                 backward=dc.Smoothed(mu=1e-3))  # fmt: skip
    with pytest.raises(ValueError, match="mu"):
        dc.Smoothed(mu=0.0)
    A, b = ball_rows(2)
    c = torch.tensor([0.3, 0.4], dtype=F64)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(c, torch.ones(2, dtype=F64))
        with pytest.raises(dc.ConicBackwardError, match="reverse mode only"):
            dc.solve(torch.eye(2, dtype=F64), -dual, A, b, cones=[dc.SecondOrderCone(3)],
                     backward=dc.Smoothed(mu=1e-3))  # fmt: skip
