"""cvxpylayers' torch examples, re-implemented, run on dxopt with a one-line change.

Each model is built once; dxopt's values and gradients (of a fixed random linear functional)
are checked against cvxpylayers (test-only reference, at tight tolerances) and, for one
parameter entry, against float64 central differences at two step sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

cp = pytest.importorskip("cvxpy")

from dxopt.frontend import CvxpyLayer  # noqa: E402

D = torch.float64


def _loss(outs, weights):
    return sum((o * w).sum() for o, w in zip(outs, weights))


def _check(prob, params, variables, values, *, gp=False, fd_index=0, tol=1e-9):
    layer = CvxpyLayer(prob, parameters=params, variables=variables, gp=gp)
    assert layer.engine == "conic"
    vals = [v.clone().requires_grad_(True) for v in values]
    outs = layer(*vals, solver_args={"tol": tol})
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(o.shape, generator=gen, dtype=D) for o in outs]
    grads = torch.autograd.grad(_loss(outs, weights), vals)
    # central differences in one entry of the first parameter, two step sizes
    flat = vals[0].detach().reshape(-1)
    k = fd_index
    for h in (1e-3, 1e-4):
        e = torch.zeros_like(flat)
        e[k] = h
        shift = [v.detach() for v in vals]
        shift[0] = (flat + e).reshape(vals[0].shape)
        up = _loss(layer(*shift, solver_args={"tol": tol}), weights)
        shift[0] = (flat - e).reshape(vals[0].shape)
        down = _loss(layer(*shift, solver_args={"tol": tol}), weights)
        fd = float(up - down) / (2 * h)
        g = float(grads[0].reshape(-1)[k])
        assert abs(g - fd) <= 1e-4 * max(1.0, abs(fd)), (h, g, fd)
    # values: CVXPY's own Clarabel solve at tight tolerances, sample by sample
    for p, v in zip(params, values):
        p.value = v.numpy()
    prob.solve(solver=cp.CLARABEL, gp=gp, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    for o, var in zip(outs, variables):
        torch.testing.assert_close(o.detach(), torch.tensor(var.value, dtype=D), atol=1e-5, rtol=0)
    # gradients: cvxpylayers (its default, looser tolerances: 1e-3 relative)
    cvl = pytest.importorskip("cvxpylayers.torch")
    ref = cvl.CvxpyLayer(prob, parameters=params, variables=variables, gp=gp)
    rvals = [v.clone().requires_grad_(True) for v in values]
    routs = ref(*rvals)
    rgrads = torch.autograd.grad(_loss(routs, weights), rvals)
    for g, r in zip(grads, rgrads):
        torch.testing.assert_close(g, r, atol=2e-3, rtol=2e-3)
    return outs, grads


def test_monotone_regression_norm2() -> None:
    n = 6
    y, x = cp.Parameter(n), cp.Variable(n)
    prob = cp.Problem(cp.Minimize(cp.norm(x - y, 2)), [cp.diff(x) >= 0])
    yv = torch.tensor([0.3, -0.2, 0.5, 0.4, 1.2, 0.9], dtype=D)
    (xs,), _ = _check(prob, [y], [x], [yv], fd_index=1)
    assert bool((xs[1:] - xs[:-1] >= -1e-8).all())


def test_convex_adp_norm_u_le_1() -> None:
    n, m = 3, 2
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((n, n)) * 0.5, rng.standard_normal((n, m))
    x0 = rng.standard_normal(n)
    P_sqrt, q = cp.Parameter((n, n)), cp.Parameter(n)
    u = cp.Variable(m)
    xn = A @ x0 + B @ u
    prob = cp.Problem(cp.Minimize(cp.sum_squares(P_sqrt @ xn) + q @ xn), [cp.norm(u, 2) <= 1])
    vals = [
        torch.tensor(np.eye(n) + 0.1 * rng.standard_normal((n, n)), dtype=D),
        torch.tensor(rng.standard_normal(n), dtype=D),
    ]
    (us,), _ = _check(prob, [P_sqrt, q], [u], vals)
    assert float(us.norm()) <= 1 + 1e-7


@pytest.mark.slow
def test_logistic_regression() -> None:
    rng = np.random.default_rng(2)
    N, d = 8, 2
    X = rng.standard_normal((N, d))
    yv = (rng.random(N) > 0.5).astype(float)
    Xp, lam = cp.Parameter((N, d)), cp.Parameter(nonneg=True)
    w, b0 = cp.Variable(d), cp.Variable()
    z = Xp @ w + b0
    loss = cp.sum(cp.logistic(z)) - yv @ z
    prob = cp.Problem(cp.Minimize(loss / N + lam * cp.sum_squares(w)))
    _check(prob, [Xp, lam], [w, b0], [torch.tensor(X, dtype=D), torch.tensor(0.1, dtype=D)])


@pytest.mark.slow
def test_optimal_transport_entropic() -> None:
    n = 3
    C = cp.Parameter((n, n))
    T = cp.Variable((n, n))
    a = np.full(n, 1.0 / n)
    prob = cp.Problem(
        cp.Minimize(cp.sum(cp.multiply(C, T)) - 1.0 * cp.sum(cp.entr(T))),
        [cp.sum(T, axis=1) == a, cp.sum(T, axis=0) == a],
    )
    Cv = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 1.5], [2.0, 1.5, 0.0]], dtype=D)
    (Ts,), _ = _check(prob, [C], [T], [Cv], fd_index=1, tol=1e-7)
    torch.testing.assert_close(Ts.sum(1), torch.full((n,), 1.0 / n, dtype=D), atol=1e-8, rtol=0)


def test_resource_allocation_exp() -> None:
    n = 4
    w, x = cp.Parameter(n, nonneg=True), cp.Variable(n)
    prob = cp.Problem(cp.Minimize(w @ cp.exp(-x)), [cp.sum(x) == 1, x >= 0])
    wv = torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=D)
    (xs,), _ = _check(prob, [w], [x], [wv], fd_index=1)
    # KKT: w_i exp(-x_i) equal on the support (x_1, x_3 > 0), below it off the support
    marginal = wv * torch.exp(-xs.detach())
    assert abs(float(marginal[1] - marginal[3])) < 1e-8
    assert bool((marginal[[0, 2]] < marginal[1]).all()) and abs(float(xs.sum()) - 1) < 1e-9


def test_constrained_lqr_quadratic_constraint() -> None:
    n, m, T = 2, 1, 4
    A = np.array([[1.0, 0.1], [0.0, 1.0]])
    B = np.array([[0.0], [0.1]])
    x0 = cp.Parameter(n)
    x, u = cp.Variable((n, T + 1)), cp.Variable((m, T))
    cons = [x[:, 0] == x0]
    cons += [x[:, t + 1] == A @ x[:, t] + B @ u[:, t] for t in range(T)]
    cons += [cp.sum_squares(u[:, t]) <= 0.5 for t in range(T)]
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x) + cp.sum_squares(u)), cons)
    _check(prob, [x0], [u], [torch.tensor([1.0, -0.5], dtype=D)])


def test_lqr_sdp() -> None:
    """min tr(Q X) s.t. X >> 0, tr(X) == 1: X = v v' for Q's smallest eigenvector."""
    Q = cp.Parameter((2, 2))
    X = cp.Variable((2, 2))
    prob = cp.Problem(
        cp.Minimize(cp.trace(Q @ X) + 0.5 * cp.sum_squares(X)), [X >> 0, cp.trace(X) == 1]
    )
    Qv = torch.tensor([[2.0, 0.3], [0.3, 1.0]], dtype=D)
    _check(prob, [Q], [X], [Qv], fd_index=1)
