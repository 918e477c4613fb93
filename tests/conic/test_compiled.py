"""dxopt.conic.solve and ConicLayer inside torch.compile(fullgraph=True): eager outputs and
gradients, bit for bit (the op runs the eager solve; its backward the eager vjp)."""

from __future__ import annotations

import pytest
import torch

import dxopt.conic as dc

from ._problems import F64, ball_rows


def _model(solve):
    A_ball, b_ball = ball_rows(2)
    A = torch.cat([A_ball, -torch.eye(2, dtype=F64)])
    b = torch.cat([b_ball, torch.full((2,), 0.5, dtype=F64)])
    cones = [dc.SecondOrderCone(3), dc.NonnegCone(2)]
    lin = torch.nn.Linear(3, 2).double()

    def model(z: torch.Tensor) -> torch.Tensor:
        sol = solve(torch.eye(2, dtype=F64), -2 * lin(z), A, b, cones)
        return (sol.x**2).sum() + (sol.y * torch.arange(5, dtype=F64)).sum() + sol.s.sum()

    return model, lin


def _eager_and_compiled(model, lin, z):
    out = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        loss = fn(z)
        (g,) = torch.autograd.grad(loss, lin.weight)
        out.append((loss.detach(), g))
    return out


def test_solve_compiles_without_a_graph_break_and_matches_eager():
    torch.manual_seed(0)
    model, lin = _model(lambda P, q, A, b, cones: dc.solve(P, q, A, b, cones=cones))
    z = torch.randn(4, 3, dtype=F64)
    (le, ge), (lc, gc) = _eager_and_compiled(model, lin, z)
    assert torch.equal(le, lc) and torch.equal(ge, gc)
    assert ge.abs().sum() > 0


def test_conic_layer_compiles_and_matches_eager():
    torch.manual_seed(1)
    layer = dc.ConicLayer(cones=[dc.SecondOrderCone(3), dc.NonnegCone(2)], atol=1e-9)
    model, lin = _model(lambda P, q, A, b, cones: layer(P, q, A, b))
    z = torch.randn(3, 3, dtype=F64)
    (le, ge), (lc, gc) = _eager_and_compiled(model, lin, z)
    assert torch.equal(le, lc) and torch.equal(ge, gc)


def test_a_warm_start_is_refused_under_compile():
    A, b = ball_rows(2)

    def fn(q):
        return dc.solve(torch.eye(2, dtype=F64), q, A, b, cones=[dc.SecondOrderCone(3)],
                        warm_start=(q, b, b)).x  # fmt: skip

    with pytest.raises(Exception, match=r"warm_start: not supported under torch\.compile"):
        torch.compile(fn, fullgraph=True)(torch.ones(2, dtype=F64))
