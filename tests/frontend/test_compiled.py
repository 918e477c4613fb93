"""CvxpyLayer (the conic route) inside torch.compile(fullgraph=True): eager outputs and
gradients; warm_start= from the previous solution."""

from __future__ import annotations

import pytest
import torch

cp = pytest.importorskip("cvxpy")

from dxopt.frontend import CvxpyLayer  # noqa: E402

F64 = torch.float64


def _softmax_layer():
    x, c = cp.Variable(3), cp.Parameter(3)
    prob = cp.Problem(cp.Minimize(-c @ x - cp.sum(cp.entr(x))), [cp.sum(x) == 1])
    return CvxpyLayer(prob, parameters=[c], variables=[x])


def test_the_conic_route_compiles_and_matches_eager():
    torch.manual_seed(0)
    layer = _softmax_layer()
    assert layer.engine == "conic"
    lin = torch.nn.Linear(2, 3).double()

    def model(z):
        (p,) = layer(lin(z))
        return (p * torch.arange(3.0, dtype=F64)).sum()

    z = torch.randn(4, 2, dtype=F64)
    results = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        loss = fn(z)
        (g,) = torch.autograd.grad(loss, lin.weight)
        results.append((loss.detach(), g))
    (le, ge), (lc, gc) = results
    torch.testing.assert_close(lc, le, rtol=1e-13, atol=0)
    torch.testing.assert_close(gc, ge, rtol=1e-12, atol=1e-14)
    # the exact answer: a softmax
    (p,) = layer(lin(z))
    torch.testing.assert_close(p, torch.softmax(lin(z), -1), atol=1e-8, rtol=0)


def test_warm_start_from_the_previous_solution_certifies_and_agrees():
    layer = _softmax_layer()
    c = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]], dtype=F64)
    first = layer.solve(c)
    again = layer.solve(c + 1e-4, warm_start=first)
    assert again.raw.info.warm == (True, True)
    torch.testing.assert_close(again.values[0], torch.softmax(c + 1e-4, -1), atol=1e-8, rtol=0)
    with pytest.raises(TypeError, match="warm_start"):
        layer.solve(c, warm_start=first.raw)


def test_solver_args_take_relax_and_smoothed():
    import dxopt.conic as dc
    from dxopt._core import Status

    # x in [a, c] nearest to 0, as a conic problem (a norm objective); empty when a > c
    x, a, c = cp.Variable(1), cp.Parameter(1), cp.Parameter(1)
    prob = cp.Problem(cp.Minimize(cp.norm(x, 2) + cp.sum_squares(x)), [x >= a, x <= c])
    layer = CvxpyLayer(prob, parameters=[a, c], variables=[x], solver="CLARABEL",
                       solver_args={"infeasible": "relax"})  # fmt: skip
    assert layer.engine == "conic"
    av = torch.tensor([[2.0], [0.5]], dtype=F64, requires_grad=True)
    cv = torch.tensor([[1.0], [3.0]], dtype=F64)
    sol = layer.solve(av, cv)
    assert sol.status == (Status.RELAXED, Status.SOLVED)
    torch.testing.assert_close(sol.values[0][:, 0], torch.tensor([1.5, 0.5], dtype=F64),
                               atol=1e-7, rtol=0)  # fmt: skip
    (g,) = torch.autograd.grad(sol.values[0].sum(), av)
    torch.testing.assert_close(g[:, 0], torch.tensor([0.5, 1.0], dtype=F64), atol=1e-6, rtol=0)
    smoothed = {"backward": dc.Smoothed(mu=1e-3)}
    feasible = layer.solve(av[1:], cv[1:], solver_args=smoothed)
    (gs,) = torch.autograd.grad(feasible.values[0].sum(), av)
    assert 0.9 < float(gs[1, 0]) < 1.0 and float(gs[0, 0]) == 0.0  # the barrier's slope
    # a relaxed sample's shifted set here is one point: no barrier solution, so it is refused
    relaxed = layer.solve(av, cv, solver_args=smoothed)
    with pytest.raises(dc.ConicBackwardError, match="Smoothed"):
        relaxed.values[0].sum().backward()
