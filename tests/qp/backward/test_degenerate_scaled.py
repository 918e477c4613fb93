"""Dependent active rows of very different norms (the structure of Maros-Meszaros PRIMALC8):
the refinement of the minimum-norm multiplier adjoint stalls at its first regularisation there
(it converges down the ladder of :mod:`dxopt.qp.certify.dependence`), and the default
``degenerate="auto"`` must return the derivative of an affine piece (the vertex of the
multiplier set), not the minimum-norm adjoint, which lies outside the one-sided derivatives.

The problem: min 1/2 |x|^2 - x1 - 2 x2 s.t. s x1 <= h1, x2 <= h2, x1 + x2 <= h3 at h = 0 with
s = 1e5 and L = x1 + 5 x2. x* = 0, the three active rows are dependent. Stationarity gives the
multiplier set {z: s z1 + z3 = 1, z2 + z3 = 2, z >= 0}, a segment with
the vertices z3 = 0 (rows {1, 2}: x = (h1/s, h2), grad_h L = (1/s, 5, 0)) and z3 = 1 (rows
{2, 3}: x = (h3 - h2, h2), grad_h L = (0, 4, 1)): the two affine pieces at h = 0. The
minimum-norm (= Moore-Penrose) adjoint gives (-1.5/s, 2.5, 2.5), outside both (entry 2 is not
in [4, 5]).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt.qp as dqp

F64 = torch.float64
S = 1e5
P = torch.eye(2, dtype=F64)
Q = torch.tensor([-1.0, -2.0], dtype=F64)
G = torch.tensor([[S, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
W = torch.tensor([1.0, 5.0], dtype=F64)
PIECES = (torch.tensor([1.0 / S, 5.0, 0.0], dtype=F64), torch.tensor([0.0, 4.0, 1.0], dtype=F64))


def _solve(backward: dqp.BackwardBase, sparse: bool) -> tuple[torch.Tensor, dqp.QPSolution]:
    h = torch.zeros(3, dtype=F64, requires_grad=True)
    Pm, Gm = (P.to_sparse_csr(), G.to_sparse_csr()) if sparse else (P, G)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        sol = dqp.solve(Pm, Q, G=Gm, h=h, backward=backward)
    with pytest.warns(dqp.QPDegenerateWarning):
        (W * sol.x).sum().backward()
    assert h.grad is not None
    return h.grad, sol


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("method", [dqp.KKTBackward, dqp.PenaltyBackward])
def test_default_is_a_piece_on_rows_of_very_different_norms(method, sparse: bool) -> None:
    g, sol = _solve(method(), sparse)
    diag = sol.info.backward
    assert diag.licq is False and diag.pseudo_inverse == (False,), diag
    assert diag.residual <= 1e-10
    assert any(torch.allclose(g, p, rtol=1e-9, atol=1e-12) for p in PIECES), g


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("method", [dqp.KKTBackward, dqp.PenaltyBackward])
def test_min_norm_policy_converges_on_rows_of_very_different_norms(method, sparse: bool) -> None:
    # the refinement at the first regularisation contracts by about 1 - 1e-2 per step here
    # (it used to end in the flagged pseudo-inverse); the ladder reaches the exact adjoint
    g, sol = _solve(method(degenerate="min_norm"), sparse)
    diag = sol.info.backward
    assert diag.pseudo_inverse == (False,) and diag.licq is False, diag
    assert diag.residual <= 1e-12, diag
    torch.testing.assert_close(
        g, torch.tensor([-1.5 / S, 2.5, 2.5], dtype=F64), rtol=1e-7, atol=1e-10
    )


def test_default_lies_between_the_one_sided_slopes() -> None:
    g, _ = _solve(dqp.PenaltyBackward(), False)

    def loss(h: torch.Tensor) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float((W * dqp.solve(P, Q, G=G, h=h).x).sum())

    t, f0 = 1e-6, loss(torch.zeros(3, dtype=F64))
    gen = torch.Generator().manual_seed(0)
    for d in [*torch.eye(3, dtype=F64), *torch.randn(4, 3, generator=gen, dtype=F64)]:
        plus = (loss(t * d) - f0) / t
        minus = (f0 - loss(-t * d)) / t
        claim = float(g @ d)
        assert min(plus, minus) - 1e-5 <= claim <= max(plus, minus) + 1e-5, (d, claim)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("method", [dqp.KKTBackward, dqp.PenaltyBackward])
def test_lp_vertex_branch_is_the_minimum_l1_piece(monkeypatch, method, sparse: bool) -> None:
    # samples too big for a dense null space get the vertex by linear programming; forced here
    # on the unscaled problem of test_degenerate_vertex.py (rows e1, e2, e1 + e2, L = x1 + 5x2):
    # with normalised rows the vertices {1,2} (z = (1, 2, 0)) and {2,3} (z = (0, 1, 1), i.e.
    # normalised (0, 1, sqrt 2)) have l1 norms 3 and 1 + sqrt 2, so the piece {2,3}, whose
    # gradient is (0, 4, 1), is the minimum-l1 vertex
    import dxopt.qp.backward.vertex as vx

    monkeypatch.setattr(vx, "MAX_VERTEX_ENTRIES", 0)
    G1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64)
    h = torch.zeros(3, dtype=F64, requires_grad=True)
    Pm, Gm = (P.to_sparse_csr(), G1.to_sparse_csr()) if sparse else (P, G1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        sol = dqp.solve(Pm, Q, G=Gm, h=h, backward=method(degenerate="vertex"))
    with pytest.warns(dqp.QPDegenerateWarning, match="dropped"):
        (W * sol.x).sum().backward()
    assert h.grad is not None and sol.info.backward.pseudo_inverse == (False,)
    torch.testing.assert_close(h.grad, torch.tensor([0.0, 4.0, 1.0], dtype=F64), atol=1e-9, rtol=0)
