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
    assert torch.equal(le, lc) and torch.equal(ge, gc)
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
