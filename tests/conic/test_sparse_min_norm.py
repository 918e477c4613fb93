"""A singular Jacobian on the sparse route of dxopt.conic: the minimum-norm derivative (LSMR
from zero, checked), flagged and warned, equal to the dense route's SVD one in reverse and
forward mode; a minimum-norm solution that fails its checks is refused."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import dxopt.conic as dc
import dxopt.conic.sparse_adjoint as sparse_adjoint
from dxopt.conic.backward import COND_MAX

from .test_sparse_route import _random_problem

F64 = torch.float64
# polish=False: both routes keep the backend's point, so a non-unique solution is the same one
OPTS = dict(atol=1e-10, rtol=1e-10, polish=False)


def _equal_rows():
    """Two equal equality rows: the multipliers of the pair are not unique."""
    n = 4
    A = torch.tensor(
        [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]],
        dtype=F64,
    )
    A = torch.cat([A, -torch.eye(n, dtype=F64)])
    b = torch.tensor([1.0, 1.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0], dtype=F64)
    q = torch.tensor([1.0, -2.0, 0.3, -0.1], dtype=F64)
    return torch.eye(n, dtype=F64), q, A, b, [dc.ZeroCone(4), dc.NonnegCone(4)]


def _lp_face():
    """min x1 s.t. x1 >= 0, 0 <= x2 <= 1: every x2 in [0, 1] is optimal."""
    A = torch.tensor([[-1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=F64)
    b = torch.tensor([0.0, 0.0, 1.0], dtype=F64)
    return None, torch.tensor([1.0, 0.0], dtype=F64), A, b, [dc.NonnegCone(3)]


def _duplicated_row():
    """A batch of two random QPs with a second-order cone, the first equality row twice."""
    cones = [dc.ZeroCone(4), dc.NonnegCone(20), dc.SecondOrderCone(18)]
    P, q, A, b = _random_problem(cones, 25, batch=2, seed=3)
    A, b = torch.cat([A[:1], A]), torch.cat([b[:, :1], b], dim=1)
    return P, q, A, b, [dc.ZeroCone(5), dc.NonnegCone(20), dc.SecondOrderCone(18)]


PROBLEMS = {"equal-rows": _equal_rows, "lp-face": _lp_face, "duplicated-row": _duplicated_row}


def _sparse(M):
    return None if M is None else M.to_sparse_coo()


def _reverse(P, q, A, b, cones, route, weights):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (P, q, A, b)]
    sol = dc.solve(*leaves, cones=cones, route=route, **OPTS)
    wx, wy, ws = weights
    loss = (wx * sol.x).sum() + (wy * sol.y).sum() + (ws * sol.s).sum()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    assert any(issubclass(w.category, dc.ConicDegenerateWarning) for w in caught), route
    return sol, [g.to_dense() if g.layout != torch.strided else g for g in grads]


def _forward(P, q, A, b, cones, route, tangents):
    dq, db = tangents
    with fwAD.dual_level(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol = dc.solve(P, fwAD.make_dual(q, dq), A, fwAD.make_dual(b, db), cones=cones,
                       route=route, **OPTS)  # fmt: skip
        out = [fwAD.unpack_dual(t).tangent for t in (sol.x, sol.y, sol.s)]
    assert any(issubclass(w.category, dc.ConicDegenerateWarning) for w in caught), route
    return sol, out


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_singular_jacobian_gets_the_dense_routes_minimum_norm_derivative(name):
    P, q, A, b, cones = PROBLEMS[name]()
    Ps, As = _sparse(P), _sparse(A)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=g, dtype=F64) for t in (q, b, b)]
    tangents = [torch.randn(t.shape, generator=g, dtype=F64) for t in (q, b)]
    dense, gd = _reverse(Ps, q, As, b, cones, "dense", weights)
    sparse, gs = _reverse(Ps, q, As, b, cones, "sparse", weights)
    B = q.shape[0] if q.ndim == 2 else 1
    assert dense.info.backward.singular == sparse.info.backward.singular == (True,) * B
    assert sparse.info.backward.linear_solver == "splu"
    assert min(sparse.info.backward.condition) > COND_MAX  # the LU's solve was not taken
    torch.testing.assert_close(sparse.x, dense.x, atol=0, rtol=0)
    for a, c in zip(gs, gd):
        assert float(c.abs().max()) > 1e-3  # not a vacuous comparison
        torch.testing.assert_close(a, c, atol=1e-8, rtol=1e-8)
    _, td = _forward(Ps, q, As, b, cones, "dense", tangents)
    sol, ts = _forward(Ps, q, As, b, cones, "sparse", tangents)
    assert sol.info.backward.singular == (True,) * B
    for a, c, what in zip(ts, td, "xys"):
        torch.testing.assert_close(a, c, atol=1e-8, rtol=1e-8, msg=f"d{what}")


def test_a_minimum_norm_solution_that_fails_its_check_is_refused(monkeypatch):
    """LSMR stopped at a loose tolerance (what diffcp-style LSQR does): the normal equations'
    residual is far from round-off, so both modes refuse and flag the samples."""
    P, q, A, b, cones = _duplicated_row()
    Ps, As = _sparse(P), _sparse(A)
    monkeypatch.setattr(sparse_adjoint, "MIN_NORM_TOL", 1e-4)
    qv = q.clone().requires_grad_()
    sol = dc.solve(Ps, qv, As, b, cones=cones, route="sparse", **OPTS)
    with pytest.raises(dc.ConicBackwardError, match=r"reverse mode.*samples \[0, 1\]"):
        sol.x.sum().backward()
    assert sol.info.backward.singular == (True, True)
    with fwAD.dual_level(), pytest.raises(dc.ConicBackwardError, match=r"forward mode"):
        dc.solve(Ps, fwAD.make_dual(q, torch.ones_like(q)), As, b, cones=cones, route="sparse",
                 **OPTS)  # fmt: skip


def test_flags_are_per_sample_in_a_mixed_batch():
    """Least squares in a box and a ball with the bound x_0 <= 0.1 stored twice: active in
    sample 0 (a non-unique multiplier pair: singular), inactive in sample 1 (regular). Only
    sample 0 takes the minimum-norm solution; both equal the dense route's."""
    from .test_sparse_route import _ball_box

    n = 20
    P, q, A, b, _ = _ball_box(n, batch=2, seed=1)
    A = A.to_dense()
    A, b = torch.cat([A[:1], A]), torch.cat([b[:, :1], b], dim=1)
    q = q.clone()
    q[0, 0], q[1, 0] = -5.0, 5.0
    cones = [dc.NonnegCone(2 * n + 1), dc.SecondOrderCone(n + 1)]
    g = torch.Generator().manual_seed(4)
    weights = [torch.randn(t.shape, generator=g, dtype=F64) for t in (q, b, b)]
    dense, gd = _reverse(P, q, A.to_sparse_coo(), b, cones, "dense", weights)
    sparse, gs = _reverse(P, q, A.to_sparse_coo(), b, cones, "sparse", weights)
    assert sparse.info.backward.singular == dense.info.backward.singular == (True, False)
    assert sparse.info.backward.condition[1] < 1e6  # the regular sample: the LU's solve
    for a, c in zip(gs, gd):
        torch.testing.assert_close(a, c, atol=1e-8, rtol=1e-8)


def test_a_nearly_singular_jacobian_beyond_the_svd_cut_is_refused():
    """P = diag(1, 1e-13), x >= -10 inactive: J's smallest singular value, 1e-13 of the
    largest, is nonzero (dx_2/dq_2 = -1e13) but below the dense route's SVD cut
    (PINV_RTOL = 1e-10), which drops it (and flags the sample). LSMR sees it: its condition
    estimate passes 1 / PINV_RTOL and the error bound of its solution is far above
    MIN_NORM_ERROR (either check alone refuses; the normal equations' residual alone would
    not), so the sparse route refuses rather than return either answer."""
    P = torch.diag(torch.tensor([1.0, 1e-13], dtype=F64)).to_sparse_coo()
    A = (-torch.eye(2, dtype=F64)).to_sparse_coo()
    b = torch.full((2,), 10.0, dtype=F64)
    qv = torch.tensor([1.0, 0.0], dtype=F64, requires_grad=True)
    sol = dc.solve(P, qv, A, b, cones=[dc.NonnegCone(2)], route="sparse", **OPTS)
    assert sol.ok
    with pytest.raises(dc.ConicBackwardError, match=r"samples \[0\]"):
        sol.x.sum().backward()
    assert sol.info.backward.singular == (True,)
    assert sol.info.backward.condition[0] > COND_MAX
