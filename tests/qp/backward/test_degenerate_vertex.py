"""``degenerate="vertex"``: with dependent active rows the gradient is the derivative of one
affine piece of the solution map (a B-subdifferential element), unlike the minimum-norm
multiplier adjoint, which can lie outside the hull of the one-sided derivatives.

The problem: min 1/2 |x|^2 - x1 - 2 x2 s.t. x1 <= h1, x2 <= h2, x1 + x2 <= h3 at h = 0, with
L = x1 + 5 x2. x* = 0 and the three active rows are dependent. The multiplier set is
{(1 - s, 2 - s, s): s in [0, 1]}; its vertices give the two pieces
{1, 2} active: x = (h1, h2), grad_h L = (1, 5, 0), and {2, 3} active: x = (h3 - h2, h2),
grad_h L = (0, 4, 1). The one-sided derivatives along e_i are the pieces' entries, so the
closed-form intervals are [0, 1], [4, 5], [0, 1]. The minimum-norm adjoint is (-1, 3, 2).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt.qp as dqp

F64 = torch.float64
P = torch.eye(2, dtype=F64)
Q = torch.tensor([-1.0, -2.0], dtype=F64)
G = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
W = torch.tensor([1.0, 5.0], dtype=F64)
PIECES = (torch.tensor([1.0, 5.0, 0.0], dtype=F64), torch.tensor([0.0, 4.0, 1.0], dtype=F64))


def _grad(backward: dqp.BackwardBase, sparse: bool) -> torch.Tensor:
    h = torch.zeros(3, dtype=F64, requires_grad=True)
    Pm, Gm = (P.to_sparse_csr(), G.to_sparse_csr()) if sparse else (P, G)
    sol = dqp.solve(Pm, Q, G=Gm, h=h, backward=backward)
    with pytest.warns(dqp.QPDegenerateWarning, match="linearly dependent"):
        (W * sol.x).sum().backward()
    assert sol.info.backward.licq is False
    assert h.grad is not None
    return h.grad


def _loss(h: torch.Tensor) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float((W * dqp.solve(P, Q, G=G, h=h).x).sum())


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("method", [dqp.KKTBackward, dqp.PenaltyBackward])
def test_vertex_gradient_is_a_piece_and_min_norm_is_not(method, sparse: bool) -> None:
    g = _grad(method(degenerate="vertex"), sparse)
    assert any(torch.allclose(g, p, atol=1e-7) for p in PIECES), g
    # the rule's vertex (minimum cost, ties by row order) drops row 0: the piece {1, 2}
    torch.testing.assert_close(g, PIECES[1], atol=1e-7, rtol=0)
    # the minimum-norm element is outside the hull of the pieces (e.g. entry 0 is -1 < 0)
    g_mn = _grad(method(degenerate="min_norm"), sparse)
    torch.testing.assert_close(g_mn, torch.tensor([-1.0, 3.0, 2.0], dtype=F64), atol=1e-7, rtol=0)


def test_vertex_directional_derivatives_lie_between_the_one_sided_slopes() -> None:
    g = _grad(dqp.PenaltyBackward(degenerate="vertex"), False)
    t, f0 = 1e-6, _loss(torch.zeros(3, dtype=F64))
    gen = torch.Generator().manual_seed(0)
    for d in [*torch.eye(3, dtype=F64), *torch.randn(4, 3, generator=gen, dtype=F64)]:
        plus = (_loss(t * d) - f0) / t
        minus = (f0 - _loss(-t * d)) / t
        claim = float(g @ d)
        lo, hi = min(plus, minus), max(plus, minus)
        assert lo - 1e-5 <= claim <= hi + 1e-5, (d, claim, plus, minus)


def test_vertex_leaves_nondegenerate_samples_and_dual_cotangents_alone() -> None:
    # batch: sample 0 degenerate (h = 0), sample 1 with only row 2 active (h = (5, 1, 5))
    h = torch.tensor([[0.0, 0.0, 0.0], [5.0, 1.0, 5.0]], dtype=F64)
    grads = {}
    for policy in ("vertex", "min_norm"):
        hh = h.clone().requires_grad_()
        sol = dqp.solve(P, Q, G=G, h=hh, backward=dqp.KKTBackward(degenerate=policy))
        with pytest.warns(dqp.QPDegenerateWarning):
            (W * sol.x).sum().backward()
        grads[policy] = hh.grad
    torch.testing.assert_close(grads["vertex"][1], grads["min_norm"][1])
    torch.testing.assert_close(grads["vertex"][1], torch.tensor([0.0, 5.0, 0.0], dtype=F64))
    # the rule does not depend on the cotangents: the vjp is linear in them (a multiplier
    # cotangent used to switch the sample back to the minimum-norm adjoint)
    for policy in ("vertex", "min_norm", "auto"):
        parts = []
        for loss in (
            lambda s: (W * s.x).sum(),
            lambda s: s.ineq_duals.sum(),
            lambda s: (W * s.x).sum() + s.ineq_duals.sum(),
        ):
            hh = torch.zeros(3, dtype=F64, requires_grad=True)
            sol = dqp.solve(P, Q, G=G, h=hh, backward=dqp.KKTBackward(degenerate=policy))
            with pytest.warns(dqp.QPDegenerateWarning):
                loss(sol).backward()
            parts.append(hh.grad)
        torch.testing.assert_close(parts[0] + parts[1], parts[2], atol=1e-9, rtol=0)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_default_is_a_piece_for_general_dependencies(backward: str, sparse: bool) -> None:
    h = torch.zeros(3, dtype=F64, requires_grad=True)
    Pm, Gm = (P.to_sparse_csr(), G.to_sparse_csr()) if sparse else (P, G)
    sol = dqp.solve(Pm, Q, G=Gm, h=h, backward=backward)  # default degenerate="auto"
    with pytest.warns(dqp.QPDegenerateWarning, match="vertex"):
        (W * sol.x).sum().backward()
    assert h.grad is not None
    assert any(torch.allclose(h.grad, p, atol=1e-7) for p in PIECES), h.grad


@pytest.mark.parametrize("solver", ["daqp", "piqp", "clarabel"])
def test_default_keeps_the_equal_split_on_duplicated_rows(solver: str) -> None:
    # x1 <= h1 twice (and x2 <= h2): the minimum-norm rule splits dL/dh1 equally between the
    # copies whatever multipliers the backend returned; "auto" keeps it there.
    G2 = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=F64)
    h = torch.zeros(3, dtype=F64, requires_grad=True)
    sol = dqp.solve(P, Q, G=G2, h=h, solver=solver)
    with pytest.warns(dqp.QPDegenerateWarning, match="minimum-norm"):
        (W * sol.x).sum().backward()
    assert h.grad is not None
    torch.testing.assert_close(h.grad, torch.tensor([0.5, 0.5, 5.0], dtype=F64), atol=1e-7, rtol=0)


def test_dropped_rows_are_named_in_the_diagnostics() -> None:
    h = torch.zeros(3, dtype=F64, requires_grad=True)
    sol = dqp.solve(P, Q, G=G, h=h, backward=dqp.KKTBackward(degenerate="vertex"))
    with pytest.warns(dqp.QPDegenerateWarning, match="dropped_rows"):
        (W * sol.x).sum().backward()
    diag = sol.info.backward
    assert diag.vertex_dropped == (1,) and diag.dropped_rows == ((0,),), diag
    assert sol.info.degenerate == (True,)
