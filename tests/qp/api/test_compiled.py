"""``torch.compile(fullgraph=True)`` around ``solve``, ``QPLayer`` and ``CvxpyQPLayer``
(:mod:`dxopt.qp.api.compiled`): no graph break (``fullgraph=True`` raises on one, see
``test_fullgraph_refuses_an_option_the_op_does_not_carry``), and the eager outputs and
gradients in float64."""

from __future__ import annotations

import pytest
import torch

import dxopt.qp as dqp

F64 = torch.float64


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, m, B = 4, 3, 2
    L = torch.randn(B, n, n, dtype=F64, generator=g)
    P = L @ L.transpose(-1, -2) + torch.eye(n, dtype=F64)
    q = torch.randn(B, n, dtype=F64, generator=g)
    G = torch.randn(m, n, dtype=F64, generator=g)
    h = 0.1 * torch.rand(m, dtype=F64, generator=g)
    A = torch.randn(1, n, dtype=F64, generator=g)
    b = torch.zeros(1, dtype=F64)
    return P, q, G, h, A, b


def _grads(f, *args):
    leaves = [a.detach().clone().requires_grad_() for a in args]
    out = f(*leaves)
    return out.detach(), torch.autograd.grad(out, leaves)


def test_solve_fullgraph_matches_eager_outputs_and_gradients():
    P, q, G, h, A, b = _batch()

    def f(q, G, b):
        s = dqp.solve(P, torch.sin(q) * 2, G=G, h=h, A=A, b=b, backward="kkt")
        assert s.eq_duals is not None and s.ineq_duals is not None
        return (s.x**2).sum() + s.ineq_duals.sum() + (s.eq_duals**2).sum()

    eager, g_eager = _grads(f, q, G, b)
    torch._dynamo.reset()
    compiled, g_compiled = _grads(torch.compile(f, fullgraph=True), q, G, b)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-12)
    for gc, ge in zip(g_compiled, g_eager):
        assert ge.abs().max() > 0  # a gradient that can be wrong
        torch.testing.assert_close(gc, ge, rtol=0, atol=1e-10)


def test_qplayer_fullgraph_with_bounds():
    """``lb_duals`` under compilation have ``n`` entries: the eager ones at the finite bounds,
    zero at the infinite one."""
    P = 2 * torch.eye(3, dtype=F64)
    q = torch.tensor([0.9, -0.4, 1.5], dtype=F64)
    G, h = torch.ones(1, 3, dtype=F64), torch.ones(1, dtype=F64)
    lb = torch.tensor([-0.1, -float("inf"), -0.2], dtype=F64)
    layer = dqp.QPLayer(backward="kkt")
    seen = {}

    def f(q):
        s = layer(P, q, G=G, h=h, lb=lb)
        seen["sol"] = s
        assert s.lb_duals is not None
        return (s.x * torch.arange(1.0, 4.0, dtype=F64)).sum() + (s.lb_duals**2).sum()

    eager_sol = layer(P, q, G=G, h=h, lb=lb)
    assert eager_sol.lb_duals is not None
    eager, g_eager = _grads(f, q)
    torch._dynamo.reset()
    compiled, g_compiled = _grads(torch.compile(f, fullgraph=True, backend="aot_eager"), q)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_compiled[0], g_eager[0], rtol=0, atol=1e-10)
    sol = seen["sol"]
    assert sol.info.route == "compiled" and sol.status == ()
    expected = torch.zeros(3, dtype=F64)
    expected[[0, 2]] = eager_sol.lb_duals
    assert expected.abs().max() > 0  # an active bound, so the scatter is tested
    torch.testing.assert_close(sol.lb_duals.detach(), expected, rtol=0, atol=1e-12)


def test_cvxpy_layer_fullgraph_matches_eager():
    cp = pytest.importorskip("cvxpy")
    x = cp.Variable(2)
    theta = cp.Parameter(2)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(x) + theta @ x), [x >= 0, cp.sum(x) <= 1])
    layer = dqp.CvxpyQPLayer(problem, parameters=[theta], variables=[x])
    values = torch.tensor([[-0.3, 0.4], [-2.0, -1.0]], dtype=F64)

    def f(t):
        (xs,) = layer(t)
        return (xs**2).sum() + xs[:, 0].sum()

    eager, g_eager = _grads(f, values)
    torch._dynamo.reset()
    compiled, g_compiled = _grads(torch.compile(f, fullgraph=True, backend="aot_eager"), values)
    # closed form: sample 0 x = (0.3, 0), sample 1 on the simplex face x = (1, 0)
    torch.testing.assert_close(eager, torch.tensor(0.09 + 0.3 + 1.0 + 1.0, dtype=F64))
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_compiled[0], g_eager[0], rtol=0, atol=1e-10)


def test_fullgraph_refuses_an_option_the_op_does_not_carry():
    """``max_workers`` keeps the graph break, which ``fullgraph=True`` reports: the tests above
    would fail the same way if the custom op were not used."""
    P = torch.eye(2, dtype=F64)

    def f(q):
        return dqp.solve(P, q, max_workers=1).x.sum()

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(f, fullgraph=True, backend="aot_eager")(torch.ones(2, dtype=F64))


def test_failures_under_compilation_raise_or_are_nan_rows():
    """An infeasible QP (x_0 <= -1 and x_0 >= 1): ``QPSolveError`` from inside the op, or a NaN
    row with ``on_failure="nan"``, as documented for the compiled path."""
    P = torch.eye(2, dtype=F64)
    G = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=F64)
    h = torch.tensor([-1.0, -1.0], dtype=F64)

    def f(q, mode):
        return dqp.solve(P, q, G=G, h=h, on_failure=mode, solver="daqp", fallback=False).x

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with pytest.raises(dqp.QPSolveError, match="infeasible"):
        compiled(torch.zeros(2, dtype=F64), "raise")
    assert torch.isnan(compiled(torch.zeros(2, dtype=F64), "nan")).all()
