"""dxopt.frontend.CvxpyLayer: exact answers, routing, gp, duals, statuses and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

cp = pytest.importorskip("cvxpy")

from dxopt import Status  # noqa: E402
from dxopt.frontend import CvxpyLayer  # noqa: E402
from dxopt.qp import CvxpyQPLayer  # noqa: E402

D = torch.float64


def _softmax_problem(k: int = 4):
    x, c = cp.Variable(k), cp.Parameter(k)
    eq = cp.sum(x) == 1
    return cp.Problem(cp.Minimize(-c @ x - cp.sum(cp.entr(x))), [eq]), x, c, eq


def test_map_reproduces_cvxpys_data() -> None:
    """M theta_1 equals CVXPY's own Clarabel data (SOC, exp, PSD rows) at random values."""
    from dxopt.frontend._compile import compile_conic

    x, X = cp.Variable(3), cp.Variable((2, 2))
    t, C, G = cp.Parameter(3), cp.Parameter((2, 2)), cp.Parameter((2, 3))
    prob = cp.Problem(
        cp.Minimize(-t @ x - cp.sum(cp.entr(x)) + cp.trace(C @ X) + cp.sum_squares(G @ x)),
        [cp.sum(x) == 1, X >> 0, cp.trace(X) == 1, cp.norm(x, 2) <= 3, x >= 0.01],
    )
    rng = np.random.default_rng(0)
    params = [t, C, G]
    for p in params:
        p.value = rng.standard_normal(p.shape)
    comp = compile_conic(prob, params, [x], gp=False)
    data, _, _ = prob.get_problem_data(cp.CLARABEL)
    theta = np.concatenate([p.value.reshape(-1) for p in params] + [np.ones(1)])
    flat = np.zeros(comp.total)
    flat[comp.rows] = comp.matrix @ theta
    n, m = comp.n, comp.m
    P = flat[: n * n].reshape(n, n)
    q = flat[n * n : n * n + n]
    A = flat[n * n + n : n * n + n + m * n].reshape(m, n)
    b = flat[n * n + n + m * n :]
    Pc = data["P"].toarray()
    np.testing.assert_allclose(np.triu(P), np.triu(Pc + Pc.T - np.diag(np.diag(Pc))), atol=1e-12)
    np.testing.assert_allclose(q, data["c"], atol=1e-12)
    np.testing.assert_allclose(A, data["A"].toarray(), atol=1e-12)
    np.testing.assert_allclose(b, data["b"], atol=1e-12)
    assert sum(cone.dim for cone in comp.cones) == m


def test_softmax_layer_is_torch_softmax_with_its_jacobian() -> None:
    prob, x, c, _ = _softmax_problem()
    layer = CvxpyLayer(prob, parameters=[c], variables=[x])
    assert layer.engine == "conic"
    theta = torch.tensor([[0.3, -1.0, 2.0, 0.5], [1.0, 1.0, 0.0, -2.0]], dtype=D)
    theta.requires_grad_(True)
    (p,) = layer(theta, solver_args={"tol": 1e-10})
    torch.testing.assert_close(p, torch.softmax(theta, -1), atol=1e-8, rtol=0)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=D)
    (g,) = torch.autograd.grad((p * w).sum(), theta)
    ref = torch.softmax(theta.detach(), -1)
    expect = ref * (w - (ref * w).sum(-1, keepdim=True))  # exact Jacobian of softmax
    torch.testing.assert_close(g, expect, atol=1e-7, rtol=0)
    assert all(s is Status.SOLVED or s.ok for s in layer.last_status)


def test_sigmoid_layer_is_torch_sigmoid() -> None:
    x, c = cp.Variable(3), cp.Parameter(3)
    prob = cp.Problem(cp.Minimize(-c @ x - cp.sum(cp.entr(x)) - cp.sum(cp.entr(1 - x))))
    layer = CvxpyLayer(prob, parameters=[c], variables=[x])
    theta = torch.tensor([-2.0, 0.1, 3.0], dtype=D, requires_grad=True)
    (s,) = layer(theta)
    torch.testing.assert_close(s, torch.sigmoid(theta), atol=1e-8, rtol=0)
    (g,) = torch.autograd.grad(s.sum(), theta)
    sig = torch.sigmoid(theta.detach())
    torch.testing.assert_close(g, sig * (1 - sig), atol=1e-7, rtol=0)


def test_ball_projection_closed_form_and_one_sided_differences() -> None:
    """x = y / max(1, |y|): the SOC route, value and Jacobian (away from the kink |y| = 1)."""
    x, y = cp.Variable(3), cp.Parameter(3)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.norm(x, 2) <= 1])
    layer = CvxpyLayer(prob, parameters=[y], variables=[x])
    for point in ([2.0, -1.0, 0.5], [0.2, 0.3, -0.1]):
        yv = torch.tensor(point, dtype=D, requires_grad=True)
        (xs,) = layer(yv)
        r = yv.detach().norm()
        torch.testing.assert_close(xs, yv.detach() / max(1.0, float(r)), atol=1e-8, rtol=0)
        w = torch.tensor([1.0, 2.0, -1.0], dtype=D)
        (g,) = torch.autograd.grad((xs * w).sum(), yv)
        for h in (1e-5,):
            fd = []
            for i in range(3):
                e = torch.zeros(3, dtype=D)
                e[i] = h
                up = (layer(yv.detach() + e)[0] * w).sum()
                down = (layer(yv.detach() - e)[0] * w).sum()
                fd.append(float(up - down) / (2 * h))
            torch.testing.assert_close(g, torch.tensor(fd, dtype=D), atol=1e-5, rtol=0)


def test_qp_routing_matches_cvxpyqplayer_and_conic_engine() -> None:
    x, y = cp.Variable(3), cp.Parameter(3)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.sum(x) == 1, x >= 0])
    routed = CvxpyLayer(prob, parameters=[y], variables=[x])
    assert routed.engine == "qp"
    direct = CvxpyQPLayer(prob, parameters=[y], variables=[x])
    conic = CvxpyLayer(prob, parameters=[y], variables=[x], solver="CLARABEL")
    assert conic.engine == "conic"
    yv = torch.tensor([[0.5, 0.2, -1.0], [0.1, 0.4, 0.3]], dtype=D, requires_grad=True)
    w = torch.tensor([1.0, -1.0, 2.0], dtype=D)
    results = []
    for layer in (routed, direct, conic):
        (xs,) = layer(yv)
        (g,) = torch.autograd.grad((xs * w).sum(), yv)
        results.append((xs.detach(), g))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-12, rtol=0)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-12, rtol=0)
    torch.testing.assert_close(results[2][0], results[1][0], atol=1e-7, rtol=0)
    torch.testing.assert_close(results[2][1], results[1][1], atol=1e-6, rtol=0)
    torch.testing.assert_close(results[0][0][0], torch.tensor([0.65, 0.35, 0.0], dtype=D))


def test_gp_closed_form() -> None:
    """min x + y s.t. a / (x y) <= 1: x = y = sqrt(a), dx/da = 1 / (2 sqrt(a))."""
    x, y = cp.Variable(pos=True), cp.Variable(pos=True)
    a = cp.Parameter(pos=True)
    prob = cp.Problem(cp.Minimize(x + y), [a / (x * y) <= 1])
    layer = CvxpyLayer(prob, parameters=[a], variables=[x, y], gp=True)
    av = torch.tensor([4.0, 9.0], dtype=D, requires_grad=True)
    xs, ys = layer(av, solver_args={"tol": 1e-10})
    torch.testing.assert_close(xs, av.detach().sqrt(), atol=1e-7, rtol=0)
    torch.testing.assert_close(ys, av.detach().sqrt(), atol=1e-7, rtol=0)
    (g,) = torch.autograd.grad(xs.sum(), av)
    torch.testing.assert_close(g, 0.5 / av.detach().sqrt(), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="positive"):
        layer(torch.tensor(-1.0, dtype=D))


def test_mixed_batched_and_shared_parameters() -> None:
    x, y, r = cp.Variable(2), cp.Parameter(2), cp.Parameter(nonneg=True)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.norm(x, 2) <= r])
    layer = CvxpyLayer(prob, parameters=[y, r], variables=[x])
    yv = torch.tensor([[3.0, 4.0], [0.3, 0.4], [-6.0, 8.0]], dtype=D)
    rv = torch.tensor(2.0, dtype=D, requires_grad=True)
    (xs,) = layer(yv, rv)
    norms = yv.norm(dim=1, keepdim=True)
    torch.testing.assert_close(xs, yv * torch.clamp(2.0 / norms, max=1.0), atol=1e-8, rtol=0)
    (g,) = torch.autograd.grad(xs.norm(dim=1).sum(), rv)
    assert abs(float(g) - 2.0) < 1e-6  # two samples on the sphere, one inside


def test_equality_dual_matches_cvxpy() -> None:
    prob, x, c, eq = _softmax_problem(3)
    layer = CvxpyLayer(prob, parameters=[c], variables=[x, eq])
    cv = np.array([0.5, -1.0, 1.5])
    _, dual = layer(torch.tensor(cv, dtype=D))
    c.value = cv
    prob.solve(solver=cp.CLARABEL)
    # the optimum: y = log(sum(exp(c))) - 1 (stationarity of -c'x - entr(x) + y(1'x - 1))
    expect = float(np.log(np.exp(cv).sum()) - 1.0)
    assert abs(float(dual) - expect) < 1e-7
    assert abs(float(dual) - float(eq.dual_value)) < 1e-3  # cvxpy's default tolerance


def test_infeasible_sample_gets_its_status() -> None:
    x, a = cp.Variable(2), cp.Parameter(2)
    prob = cp.Problem(cp.Minimize(cp.norm(x, 2)), [x >= a, x <= 1])
    layer = CvxpyLayer(prob, parameters=[a], variables=[x], solver_args={"on_failure": "nan"})
    av = torch.tensor([[0.5, 0.2], [3.0, 0.0]], dtype=D)
    (xs,) = layer(av)
    assert layer.last_status[0].ok and not layer.last_status[1].ok
    assert layer.last_status[1] is Status.INFEASIBLE
    torch.testing.assert_close(xs[0], torch.tensor([0.5, 0.2], dtype=D), atol=1e-7, rtol=0)
    assert torch.isnan(xs[1]).all()
    strict = CvxpyLayer(prob, parameters=[a], variables=[x])
    with pytest.raises(Exception, match="1 of 2"):
        strict(av)


def test_refusals_name_the_problem() -> None:
    x, p = cp.Variable(2), cp.Parameter(2)
    bad = cp.Problem(cp.Minimize(cp.sum(x)), [cp.norm(x, 2) >= 1])
    with pytest.raises(ValueError, match="not DCP: constraint"):
        CvxpyLayer(bad, parameters=[], variables=[x])
    s = cp.Parameter(nonneg=True)
    nondpp = cp.Problem(cp.Minimize(cp.norm(x - p, 2)), [s * s * x >= 1])
    with pytest.raises(ValueError, match="not DPP: constraint"):
        CvxpyLayer(nondpp, parameters=[p, s], variables=[x])
    good = cp.Problem(cp.Minimize(cp.norm(x - p, 2)))
    with pytest.raises(ValueError, match="parameters: expected exactly"):
        CvxpyLayer(good, parameters=[p, s], variables=[x])
    with pytest.raises(ValueError, match="solver: expected None or one of"):
        CvxpyLayer(good, parameters=[p], variables=[x], solver="MOSEK")
    with pytest.raises(ValueError, match="unknown key 'foo'"):
        CvxpyLayer(good, parameters=[p], variables=[x], solver_args={"foo": 1})
    layer = CvxpyLayer(good, parameters=[p], variables=[x])
    with pytest.raises(ValueError, match=r"p.*expected shape \(2,\)"):
        layer(torch.zeros(3, dtype=D))
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor"):
        layer(np.zeros(2))
    with pytest.raises(ValueError, match="unknown key 'bar'"):
        layer(torch.zeros(2, dtype=D), solver_args={"bar": 1})
    two = cp.Problem(cp.Minimize(cp.norm(x - p, 2) + s * cp.sum(x)), [x >= -1])
    layer2 = CvxpyLayer(two, parameters=[p, s], variables=[x])
    with pytest.raises(TypeError, match="dtype"):
        layer2(torch.zeros(2, dtype=D), torch.tensor(1.0, dtype=torch.float32))
