"""Gradients of dxopt.conic.solve against float64 central differences of the solve (at two
step sizes), against dxopt.qp on a QP written as a cone program, the jvp against the vjp,
and the one-sided rule at a kink against one-sided differences."""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt.conic as dc
import dxopt.qp as dqp
from dxopt import Status

from ._problems import F64, ball_rows, box_rows


def _socp(seed: int, B: int = 3, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    Ab, bb = box_rows(n, -0.5, 0.5)
    As, bs = ball_rows(n, radius=0.9)
    A, b = torch.cat([Ab, As]), torch.cat([bb, bs])
    M = torch.randn(n, n, dtype=F64, generator=g)
    P = M @ M.T + 0.5 * torch.eye(n, dtype=F64)
    q = 2.0 * torch.randn(B, n, dtype=F64, generator=g)
    cones = [dc.NonnegCone(2 * n), dc.SecondOrderCone(n + 1)]
    return P, q, A, b, cones


def _loss(P, q, A, b, cones, wx, wy, ws):
    sol = dc.solve(P, q, A, b, cones=cones, atol=1e-10, rtol=1e-10)
    return (wx * sol.x).sum() + (wy * sol.y).sum() + (ws * sol.s).sum(), sol


def _central(f, t: torch.Tensor, d: torch.Tensor, h: float) -> float:
    with torch.no_grad():
        return (float(f(t + h * d)) - float(f(t - h * d))) / (2 * h)


def test_gradients_of_an_socp_batch_match_central_differences():
    P, q, A, b, cones = _socp(0)
    g = torch.Generator().manual_seed(9)
    wx = torch.randn(3, P.shape[0], dtype=F64, generator=g)
    wy = torch.randn(3, A.shape[0], dtype=F64, generator=g)
    ws = torch.randn(3, A.shape[0], dtype=F64, generator=g)
    leaves = [t.clone().requires_grad_(True) for t in (P, q, A, b)]
    loss, sol = _loss(*leaves, cones, wx, wy, ws)
    assert all(st is Status.SOLVED for st in sol.status)
    grads = torch.autograd.grad(loss, leaves)
    for k, (t, grad) in enumerate(zip((P, q, A, b), grads)):
        d = torch.randn(t.shape, dtype=F64, generator=g)
        if k == 0:
            d = d + d.mT  # P stays symmetric

        def f(v, k=k):
            args = [P, q, A, b]
            args[k] = v
            return _loss(*args, cones, wx, wy, ws)[0]

        analytic = float((grad * d).sum())
        for h in (1e-5, 1e-6):
            fd = _central(f, t, d, h)
            assert fd == pytest.approx(analytic, rel=1e-6, abs=1e-8), (k, h, fd, analytic)


def test_gradients_of_a_psd_program_match_central_differences():
    # min 1/2 |X - C|_F^2 s.t. X PSD: the projection of C (a smooth point: no zero eigenvalue)
    C = torch.tensor([[1.0, 2.0, 0.0], [2.0, -1.0, 0.5], [0.0, 0.5, 0.3]], dtype=F64)
    c = dc.svec(C).requires_grad_(True)
    A, b = -torch.eye(6, dtype=F64), torch.zeros(6, dtype=F64)
    wx = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(1))

    def f(cv):
        sol = dc.solve(torch.eye(6, dtype=F64), -cv, A, b, cones=[dc.PSDCone(3)], atol=1e-10)
        return (wx * sol.x).sum()

    (grad,) = torch.autograd.grad(f(c), c)
    # exact: d/dc of P_PSD(c) is the cone's Jacobian
    assert torch.allclose(grad, dc.PSDCone(3).dproject(c.detach()).T @ wx, atol=1e-9)
    d = torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(2))
    assert _central(f, c.detach(), d, 1e-6) == pytest.approx(float(grad @ d), rel=1e-6)


def test_jvp_is_the_transpose_of_the_vjp():
    P, q, A, b, cones = _socp(3, B=2)
    g = torch.Generator().manual_seed(4)
    tangents = [torch.randn(t.shape, dtype=F64, generator=g) for t in (P, q, A, b)]
    tangents[0] = tangents[0] + tangents[0].mT
    wx = torch.randn(2, P.shape[0], dtype=F64, generator=g)
    wy = torch.randn(2, A.shape[0], dtype=F64, generator=g)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        duals = [fwAD.make_dual(t, d) for t, d in zip((P, q, A, b), tangents)]
        sol = dc.solve(*duals, cones=cones, atol=1e-10)
        jx = fwAD.unpack_dual(sol.x).tangent
        jy = fwAD.unpack_dual(sol.y).tangent
    forward = float((wx * jx).sum() + (wy * jy).sum())
    leaves = [t.clone().requires_grad_(True) for t in (P, q, A, b)]
    sol = dc.solve(*leaves, cones=cones, atol=1e-10)
    grads = torch.autograd.grad((wx * sol.x).sum() + (wy * sol.y).sum(), leaves)
    reverse = sum(float((gr * d).sum()) for gr, d in zip(grads, tangents))
    assert forward == pytest.approx(reverse, rel=1e-10)


def test_a_qp_as_a_cone_program_matches_dxopt_qp():
    g = torch.Generator().manual_seed(5)
    n, me, mi = 5, 2, 6
    M = torch.randn(n, n, dtype=F64, generator=g)
    P = M @ M.T + torch.eye(n, dtype=F64)
    q = torch.randn(n, dtype=F64, generator=g)
    Ae = torch.randn(me, n, dtype=F64, generator=g)
    be = torch.randn(me, dtype=F64, generator=g)
    G = torch.randn(mi, n, dtype=F64, generator=g)
    h = torch.randn(mi, dtype=F64, generator=g).abs() * 0.2
    w = torch.randn(n, dtype=F64, generator=g)
    lq = [t.clone().requires_grad_(True) for t in (P, q, Ae, be, G, h)]
    ref = dqp.solve(lq[0], lq[1], A=lq[2], b=lq[3], G=lq[4], h=lq[5], backward="kkt")
    gq = torch.autograd.grad((w * ref.x).sum(), lq)
    lc = [t.clone().requires_grad_(True) for t in (P, q, Ae, be, G, h)]
    sol = dc.solve(
        lc[0], lc[1], torch.cat([lc[2], lc[4]]), torch.cat([lc[3], lc[5]]),
        cones=[dc.ZeroCone(me), dc.NonnegCone(mi)], atol=1e-10,
    )  # fmt: skip
    assert sol.status[0] is Status.SOLVED
    assert torch.allclose(sol.x, ref.x, atol=1e-8)
    gc = torch.autograd.grad((w * sol.x).sum(), lc)
    for a, r in zip(gc, gq):
        assert torch.allclose(a, r, atol=1e-7, rtol=1e-6)


def test_at_a_kink_the_gradient_is_the_documented_one_sided_derivative():
    # min 1/2 (x - c)^2 s.t. x <= 1 with c = 1: x = 1 is weakly active (y = 0, s = 0).
    # The rule takes the row as inactive: dx/dc = 1, the slope for c decreasing (left).
    A = torch.ones(1, 1, dtype=F64)
    b = torch.ones(1, dtype=F64)
    P = torch.eye(1, dtype=F64)

    def x_of(c):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
            return dc.solve(P, -c, A, b, cones=[dc.NonnegCone(1)], atol=1e-10).x

    c = torch.ones(1, dtype=F64, requires_grad=True)
    sol = dc.solve(P, -c, A, b, cones=[dc.NonnegCone(1)], atol=1e-10)
    assert sol.status[0] is Status.DEGENERATE and sol.info.kink == (True,)
    with pytest.warns(dc.ConicDegenerateWarning, match="one-sided"):
        (grad,) = torch.autograd.grad(sol.x.sum(), c)
    with torch.no_grad():
        for h in (1e-3, 1e-5):
            left = float((x_of(c) - x_of(c - h)) / h)
            right = float((x_of(c + h) - x_of(c)) / h)
            assert left == pytest.approx(1.0, abs=1e-6) and right == pytest.approx(0.0, abs=1e-6)
    assert float(grad) == pytest.approx(1.0, abs=1e-9)


def test_singular_jacobian_is_flagged_and_gets_the_minimum_norm_adjoint():
    # an LP with a face of solutions: min x1 s.t. 0 <= x1, 0 <= x2 <= 1 (x2 free in [0, 1])
    A = torch.tensor([[-1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=F64)
    b = torch.tensor([0.0, 0.0, 1.0], dtype=F64)
    q = torch.tensor([1.0, 0.0], dtype=F64, requires_grad=True)
    sol = dc.solve(None, q, A, b, cones=[dc.NonnegCone(3)], atol=1e-9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (grad,) = torch.autograd.grad(sol.x.sum(), q)
    assert torch.isfinite(grad).all()
    assert sol.info.backward.singular == (True,) and sol.info.kink == (False,)
    assert any(issubclass(w.category, dc.ConicDegenerateWarning) for w in caught)
