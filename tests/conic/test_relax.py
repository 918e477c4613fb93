"""infeasible="relax" of dxopt.conic.solve: closed forms, finite differences, a training loop."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

import dxopt.conic as dc
from dxopt._core import Status

from ._problems import F64, ball_rows


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        return fn(*args, **kw)


def _interval(a: torch.Tensor, c: torch.Tensor):
    """``x >= a`` and ``x <= c`` in 1-D: ``s = (x - a, c - x)``."""
    A = torch.tensor([[-1.0], [1.0]], dtype=F64)
    b = torch.stack([-a, c], dim=-1)
    return A, b


def test_two_disjoint_half_lines_relax_to_the_midpoint_with_exact_gradient():
    # x >= a, x <= c with a > c: d = ((a - c)/2, (a - c)/2), x = (a + c)/2
    a = torch.tensor(2.0, dtype=F64)
    c = torch.tensor(-1.0, dtype=F64)
    A, b = _interval(a, c)
    b = b.clone().requires_grad_()
    P = torch.eye(1, dtype=F64)
    q = torch.tensor([-5.0], dtype=F64, requires_grad=True)
    sol = _quiet(dc.solve, P, q, A, b, cones=[dc.NonnegCone(2)], infeasible="relax")
    assert sol.status == (Status.RELAXED,)
    assert sol.info.relax_shift[0] == pytest.approx(3 / math.sqrt(2), rel=1e-8)
    assert float(sol.x[0].detach()) == pytest.approx(0.5, abs=1e-8)
    _quiet(sol.x.sum().backward)
    # b = (-a, c): dx/db = (-1/2, 1/2); the single relaxed point does not move with q
    torch.testing.assert_close(b.grad, torch.tensor([-0.5, 0.5], dtype=F64), atol=1e-7, rtol=0)
    torch.testing.assert_close(q.grad, torch.zeros(1, dtype=F64), atol=1e-7, rtol=0)


def _ball_and_half_space(radius: float, beta: float):
    """``||x|| <= radius`` (SOC rows) and ``x_1 >= beta`` (one nonnegative row), n = 2."""
    A_ball, b_ball = ball_rows(2, radius)
    A = torch.cat([A_ball, torch.tensor([[-1.0, 0.0]], dtype=F64)])
    b = torch.cat([b_ball, torch.tensor([-beta], dtype=F64)])
    return A, b, [dc.SecondOrderCone(3), dc.NonnegCone(1)]


def test_a_ball_and_a_half_space_that_do_not_meet():
    # least violation along x = (t, 0): (t - r)^2 / 2 + (beta - t)^2 -> t = (r + 2 beta) / 3,
    # |d| = (beta - r) / sqrt(3); the shifted ball touches the shifted half-space at (t, 0)
    r, beta = 1.0, 2.0
    A, b, cones = _ball_and_half_space(r, beta)
    b = b.clone().requires_grad_()
    P = torch.eye(2, dtype=F64)
    q = torch.tensor([-3.0, -1.0], dtype=F64)
    sol = _quiet(dc.solve, P, q, A, b, cones=cones, infeasible="relax")
    assert sol.status == (Status.RELAXED,)
    assert sol.info.relax_shift[0] == pytest.approx((beta - r) / math.sqrt(3), rel=1e-7)
    # a feasible set without interior (one point): the point is accurate to about sqrt(atol)
    expected = torch.tensor([(r + 2 * beta) / 3, 0.0], dtype=F64)
    torch.testing.assert_close(sol.x, expected, atol=1e-6, rtol=0)
    # gradients: x1 = c1 + (r + 2 (beta - c1)) / 3 with the centre c = -b[1:3], x2 = c2
    (g1,) = _quiet(torch.autograd.grad, sol.x[0], b, retain_graph=True)
    (g2,) = _quiet(torch.autograd.grad, sol.x[1], b)
    torch.testing.assert_close(g1, torch.tensor([1 / 3, -1 / 3, 0.0, -2 / 3], dtype=F64),
                               atol=1e-5, rtol=0)  # fmt: skip
    torch.testing.assert_close(g2, torch.tensor([0.0, 0.0, -1.0, 0.0], dtype=F64),
                               atol=1e-5, rtol=0)  # fmt: skip


def _triangle_problem():
    """x in R^3: x1 >= 1, x2 >= 1, x1 + x2 <= 1 (no common point; relaxed to x1 = x2 = 2/3),
    ||x|| <= 5 (inactive); min 1/2 |x - z|^2, so x3 = z3 on the relaxed set."""
    A_lin = torch.tensor([[-1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [1.0, 1.0, 0.0]], dtype=F64)
    A_lin[:, :2] += 0.1 * torch.sin(torch.arange(6, dtype=F64)).reshape(3, 2)
    b_lin = torch.tensor([-1.0, -1.0, 1.0], dtype=F64)
    A_ball, b_ball = ball_rows(3, 5.0)
    A = torch.cat([A_lin, A_ball])
    b = torch.cat([b_lin, b_ball])
    q = torch.tensor([0.3, -0.7, 0.4], dtype=F64)
    return torch.eye(3, dtype=F64), q, A, b, [dc.NonnegCone(3), dc.SecondOrderCone(4)]


def test_the_relaxed_map_matches_central_differences_in_every_input():
    # the three half-planes act on (x1, x2) only: directions of A keep that structure (a
    # change of it makes the half-spaces meet far away, where the ball decides: another map)
    P, q, A, b, cones = _triangle_problem()

    def relaxed(P, q, A, b):
        sol = _quiet(dc.solve, P, q, A, b, cones=cones, infeasible="relax")
        assert sol.status == (Status.RELAXED,)
        return torch.cat([sol.x, sol.s])  # y: the shifted rows are dependent, not unique

    inputs = [t.clone().requires_grad_() for t in (P, q, A, b)]
    out = relaxed(*inputs)
    weights = torch.cos(torch.arange(out.numel(), dtype=F64))
    grads = _quiet(torch.autograd.grad, (out * weights).sum(), inputs)
    gen = torch.Generator().manual_seed(3)
    dirs = [torch.randn(t.shape, generator=gen, dtype=F64) for t in (P, q, A, b)]
    dirs[0] = dirs[0] + dirs[0].T
    dirs[2][:3, 2] = 0.0
    analytic = sum(float((g * d).sum()) for g, d in zip(grads, dirs))
    for h in (1e-4, 1e-5):
        plus = relaxed(*(t + h * d for t, d in zip((P, q, A, b), dirs)))
        minus = relaxed(*(t - h * d for t, d in zip((P, q, A, b), dirs)))
        numeric = float(((plus - minus) * weights).sum()) / (2 * h)
        assert numeric == pytest.approx(analytic, rel=1e-5, abs=1e-6)


def test_feasible_samples_are_bit_for_bit_those_of_the_mode_off():
    P, q, A, b, cones = _triangle_problem()
    b_ok = b.clone()
    b_ok[2] = 3.0  # x1 + x2 <= 3: feasible
    batch_b = torch.stack([b_ok, b, b_ok])
    runs = {}
    for mode in ("fail", "relax"):
        bb = batch_b.clone().requires_grad_()
        sol = _quiet(dc.solve, P, q, A, bb, cones=cones, infeasible=mode, on_failure="nan")
        _quiet((sol.x[0].sum() + sol.y[2].sum()).backward)
        runs[mode] = (sol, bb.grad)
    off, on = runs["fail"][0], runs["relax"][0]
    assert off.status == (Status.SOLVED, Status.INFEASIBLE, Status.SOLVED)
    assert on.status == (Status.SOLVED, Status.RELAXED, Status.SOLVED)
    assert on.info.relax_shift[0] == 0.0 and on.info.relax_shift[1] > 0.1
    for i in (0, 2):
        for name in ("x", "y", "s"):
            assert torch.equal(getattr(on, name)[i], getattr(off, name)[i])
    assert torch.equal(runs["relax"][1][[0, 2]], runs["fail"][1][[0, 2]])
    assert torch.isfinite(on.x[1]).all() and torch.isnan(off.x[1]).all()


def test_only_certified_infeasible_samples_are_relaxed():
    # min -x s.t. x >= 0 is unbounded: it stays UNBOUNDED (a failure), it is not relaxed
    A = torch.tensor([[-1.0]], dtype=F64)
    b = torch.zeros(1, dtype=F64)
    sol = dc.solve(None, torch.tensor([-1.0], dtype=F64), A, b, cones=[dc.NonnegCone(1)],
                   infeasible="relax", on_failure="nan")  # fmt: skip
    assert sol.status == (Status.UNBOUNDED,)
    assert sol.info.relax_shift == (0.0,)
    with pytest.raises(dc.ConicSolveError, match="unbounded"):
        dc.solve(None, torch.tensor([-1.0], dtype=F64), A, b, cones=[dc.NonnegCone(1)],
                 infeasible="relax")  # fmt: skip


def test_bad_infeasible_value_is_refused_by_name():
    with pytest.raises(ValueError, match="infeasible"):
        dc.ConicOptions(infeasible="clip")


def test_a_training_loop_with_infeasible_samples_converges():
    # x_i = argmin 1/2 (x - m_i - u)^2 over [a_i + u, c_i + u] (m_i = (a_i + c_i) / 2); two
    # intervals are empty (a_i > c_i) and relax to their midpoint m_i + u as well: every
    # x_i = m_i + u, the loss mean (x_i - m_i - 0.7)^2 = (u - 0.7)^2 is learnt through both kinds
    a = torch.tensor([0.0, 1.0, 2.0, 0.5], dtype=F64)
    c = torch.tensor([1.0, 0.0, 3.0, -0.5], dtype=F64)  # samples 1 and 3 are infeasible
    m = 0.5 * (a + c)
    u = torch.zeros(1, dtype=F64, requires_grad=True)
    opt = torch.optim.SGD([u], lr=0.2)
    A = torch.tensor([[-1.0], [1.0]], dtype=F64)
    losses = []
    for _ in range(12):
        b = torch.stack([-(a + u), c + u], dim=-1)
        q = -(m + u)[:, None]
        sol = _quiet(dc.solve, torch.eye(1, dtype=F64), q, A, b, cones=[dc.NonnegCone(2)],
                     infeasible="relax")  # fmt: skip
        assert sol.status.count(Status.RELAXED) == 2
        loss = ((sol.x[:, 0] - m - 0.7) ** 2).mean()
        opt.zero_grad()
        _quiet(loss.backward)
        opt.step()
        losses.append(loss.item())
    assert all(l1 < l0 for l0, l1 in itertools.pairwise(losses))
    assert losses[-1] < 1e-4 * losses[0]
