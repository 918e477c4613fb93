"""dxopt.conic.solve and ConicLayer inside torch.compile(fullgraph=True): eager outputs and
gradients (the op runs the eager solve, its backward the eager vjp: equal up to the order in
which the compiled graph sums around them)."""

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

    def model(z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sol = solve(torch.eye(2, dtype=F64), -2 * lin(z), A, b, cones)
        loss = (sol.x**2).sum() + (sol.y * torch.arange(5, dtype=F64)).sum() + sol.s.sum()
        return loss, sol.x, sol.y, sol.s

    return model, lin


def _eager_and_compiled(model, lin, z):
    out = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        loss, *xys = fn(z)
        (g,) = torch.autograd.grad(loss, lin.weight)
        out.append((loss.detach(), g, [t.detach() for t in xys]))
    (le, ge, pe), (lc, gc, pc) = out
    for a, c in zip(pe, pc):  # the op's outputs are the eager solve's
        assert torch.equal(a, c)
    torch.testing.assert_close(lc, le, rtol=1e-13, atol=0)
    torch.testing.assert_close(gc, ge, rtol=1e-12, atol=1e-14)
    return ge


def test_solve_compiles_without_a_graph_break_and_matches_eager():
    torch.manual_seed(0)
    model, lin = _model(lambda P, q, A, b, cones: dc.solve(P, q, A, b, cones=cones))
    z = torch.randn(4, 3, dtype=F64)
    ge = _eager_and_compiled(model, lin, z)
    assert ge.abs().sum() > 0


def test_conic_layer_compiles_and_matches_eager():
    torch.manual_seed(1)
    layer = dc.ConicLayer(cones=[dc.SecondOrderCone(3), dc.NonnegCone(2)], atol=1e-9)
    model, lin = _model(lambda P, q, A, b, cones: layer(P, q, A, b))
    z = torch.randn(3, 3, dtype=F64)
    _eager_and_compiled(model, lin, z)


def test_a_warm_start_is_refused_under_compile():
    A, b = ball_rows(2)

    def fn(q):
        return dc.solve(torch.eye(2, dtype=F64), q, A, b, cones=[dc.SecondOrderCone(3)],
                        warm_start=(q, b, b)).x  # fmt: skip

    with pytest.raises(Exception, match=r"warm_start: not supported under torch\.compile"):
        torch.compile(fn, fullgraph=True)(torch.ones(2, dtype=F64))
