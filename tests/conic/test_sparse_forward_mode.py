"""Forward mode on the sparse route of dxopt.conic: torch.autograd.forward_ad and
torch.func.jvp give the dense route's tangents on every cone kind, the tangents of the
sparse P and A (SparseConicFunction.jvp) the dense route's, the jvp is the transpose of the
vjp, a kink gets the documented one-sided tangent and a singular Jacobian is refused."""

from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import dxopt.conic as dc
from dxopt import Status
from dxopt.conic.sparse_route import SparseConicFunction, SparseSpec
from dxopt.conic.types import ConicOptions

from .test_sparse_route import KINDS, TOL, _random_problem

F64 = torch.float64


def _pattern_tangent(M, g):
    """A random tangent on the stored entries of the dense matrix ``M`` (not symmetric)."""
    return torch.randn(M.shape, generator=g, dtype=F64) * (M != 0)


def _dense_jvp(P, q, A, b, cones, tangents):
    """The dense route's forward-mode tangents ``(dx, dy, ds)`` (dense duals)."""
    with fwAD.dual_level(), warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        duals = [fwAD.make_dual(t, d) for t, d in zip((P, q, A, b), tangents)]
        sol = dc.solve(*duals, cones=cones, route="dense", **TOL)
        return sol, [fwAD.unpack_dual(v).tangent for v in (sol.x, sol.y, sol.s)]


def _sparse_call(Ps, q, As, b, cones):
    """A forward pass of SparseConicFunction; its ``call`` (for jvp with P, A tangents)."""
    spec = SparseSpec(tuple(cones), ConicOptions(route="sparse", **TOL), None, True)
    SparseConicFunction.apply(Ps, q, As, b, spec)
    return spec.call


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_forward_mode_equals_the_dense_route(kind):
    cones, n = KINDS[kind]
    P, q, A, b = _random_problem(cones, n, seed=sorted(KINDS).index(kind))
    g = torch.Generator().manual_seed(17)
    dP, dA = _pattern_tangent(P, g), _pattern_tangent(A, g)
    dq, db = (torch.randn(t.shape, generator=g, dtype=F64) for t in (q, b))
    zero = (torch.zeros_like(P), dq, torch.zeros_like(A), db)
    dense_sol, want_qb = _dense_jvp(P, q, A, b, cones, zero)
    assert all(st.ok for st in dense_sol.status)
    Ps, As = P.to_sparse_coo(), A.to_sparse_coo()
    # q and b through torch's forward AD and torch.func.jvp (P, A sparse constants)
    with fwAD.dual_level(), warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        sol = dc.solve(Ps, fwAD.make_dual(q, dq), As, fwAD.make_dual(b, db), cones=cones,
                       route="sparse", **TOL)  # fmt: skip
        got = [fwAD.unpack_dual(v).tangent for v in (sol.x, sol.y, sol.s)]
        assert sol.info.backward.linear_solver == "splu"

    def xys(qv, bv):
        out = dc.solve(Ps, qv, As, bv, cones=cones, route="sparse", **TOL)
        return out.x, out.y, out.s

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        primal, got_func = torch.func.jvp(xys, (q, b), (dq, db))
    torch.testing.assert_close(primal[0], dense_sol.x, atol=1e-9, rtol=0)
    for name, a, c, w in zip("xys", got, got_func, want_qb):
        torch.testing.assert_close(a, w, atol=1e-9, rtol=1e-9, msg=f"d{name} (forward_ad)")
        torch.testing.assert_close(c, w, atol=1e-9, rtol=1e-9, msg=f"d{name} (torch.func)")
    # P and A tangents on their patterns (sparse, as forward AD hands them) and q, b at once
    _, want = _dense_jvp(P, q, A, b, cones, (dP, dq, dA, db))
    call = _sparse_call(Ps, q, As, b, cones)
    ctx = types.SimpleNamespace(call=call)
    for layout in ("coo", "csr"):
        sparse = (lambda M: M.to_sparse_coo()) if layout == "coo" else (lambda M: M.to_sparse_csr())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
            tx, ty, ts = SparseConicFunction.jvp(ctx, sparse(dP), dq, sparse(dA), db, None)
        for name, a, w in zip("xys", (tx, ty, ts), want):
            torch.testing.assert_close(a, w, atol=1e-9, rtol=1e-9, msg=f"d{name} ({layout})")
    assert max(call.info.backward.residual) <= 1e-13


def test_forward_mode_is_the_transpose_of_reverse_mode():
    """<v, J u> = <J' v, u> with u = (dP, dq, dA, db) on the patterns and v on (x, y, s); q
    shared, b batched (the jvp expands the shared tangent, the vjp sums over the batch)."""
    cones, n = KINDS["soc-structured"]
    P, q, A, b = _random_problem(cones, n, batch=3, seed=5)
    q = q[0]
    g = torch.Generator().manual_seed(8)
    dP, dA = _pattern_tangent(P, g), _pattern_tangent(A, g)
    dq, db = torch.randn(n, generator=g, dtype=F64), torch.randn(b.shape, generator=g, dtype=F64)
    wx = torch.randn(3, n, generator=g, dtype=F64)
    wy, ws = (torch.randn(b.shape, generator=g, dtype=F64) for _ in range(2))
    Ps, As = P.to_sparse_coo(), A.to_sparse_coo()
    call = _sparse_call(Ps, q, As, b, cones)
    tx, ty, ts = SparseConicFunction.jvp(
        types.SimpleNamespace(call=call), dP.to_sparse_coo(), dq, dA.to_sparse_coo(), db, None
    )
    forward = float((wx * tx).sum() + (wy * ty).sum() + (ws * ts).sum())
    leaves = [t.detach().clone().requires_grad_() for t in (Ps, q, As, b)]
    sol = dc.solve(*leaves, cones=cones, route="sparse", **TOL)
    loss = (wx * sol.x).sum() + (wy * sol.y).sum() + (ws * sol.s).sum()
    gP, gq, gA, gb = torch.autograd.grad(loss, leaves)
    reverse = float(
        (gP.to_dense() * dP).sum() + (gq * dq).sum() + (gA.to_dense() * dA).sum()
        + (gb * db).sum()
    )  # fmt: skip
    assert abs(forward) > 1e-3
    assert forward == pytest.approx(reverse, rel=1e-10)


def test_forward_mode_at_a_kink_is_the_documented_one_sided_tangent():
    """min 1/2 (x - c)^2 s.t. x <= 1 at c = 1: the row is weakly active; the rule takes it as
    inactive, dx/dc = 1 (the slope for c decreasing), and warns, on both routes."""
    P = torch.eye(1, dtype=F64).to_sparse_coo()
    A = torch.ones(1, 1, dtype=F64).to_sparse_coo()
    b = torch.ones(1, dtype=F64)
    c, dc_ = torch.ones(1, dtype=F64), torch.ones(1, dtype=F64)
    tangents = {}
    for route in ("dense", "sparse"):
        with fwAD.dual_level(), pytest.warns(dc.ConicDegenerateWarning, match="one-sided"):
            sol = dc.solve(P, -fwAD.make_dual(c, dc_), A, b, cones=[dc.NonnegCone(1)],
                           route=route, atol=1e-10)  # fmt: skip
            assert sol.status[0] is Status.DEGENERATE and sol.info.kink == (True,)
            tangents[route] = float(fwAD.unpack_dual(sol.x).tangent)
    # the one-sided slopes by differences at two steps: 1 on the left, 0 on the right
    for h in (1e-3, 1e-5):
        x = [float(dc.solve(P, -(c + t), A, b, cones=[dc.NonnegCone(1)], route="sparse",
                            atol=1e-10).x) for t in (-h, 0.0, h)]  # fmt: skip
        assert (x[1] - x[0]) / h == pytest.approx(1.0, abs=1e-6)
        assert (x[2] - x[1]) / h == pytest.approx(0.0, abs=1e-6)
    assert tangents["sparse"] == pytest.approx(1.0, abs=1e-12)
    assert tangents["dense"] == pytest.approx(1.0, abs=1e-12)


def test_forward_mode_refuses_a_singular_jacobian():
    """Two equal equality rows (a non-unique multiplier): the sparse route's forward mode
    raises, naming the sample, and flags it; a well-posed sample beside it is not enough."""
    n = 4
    A = torch.tensor(
        [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]],
        dtype=F64,
    )
    A = torch.cat([A, -torch.eye(n, dtype=F64)]).to_sparse_coo()
    b = torch.tensor([1.0, 1.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0], dtype=F64)
    q = torch.tensor([1.0, -2.0, 0.3, -0.1], dtype=F64)
    P = torch.eye(n, dtype=F64).to_sparse_coo()
    cones = [dc.ZeroCone(4), dc.NonnegCone(4)]
    with fwAD.dual_level():
        sol = None
        with pytest.raises(dc.ConicBackwardError, match=r"forward mode.*samples \[0\]"):
            sol = dc.solve(P, fwAD.make_dual(q, torch.ones(n, dtype=F64)), A, b, cones=cones,
                           route="sparse", **TOL)  # fmt: skip
    assert sol is None
    call = _sparse_call(P, q, A, b, cones)
    with pytest.raises(dc.ConicBackwardError, match="singular"):
        SparseConicFunction.jvp(types.SimpleNamespace(call=call), None, torch.ones(n, dtype=F64),
                                None, None, None)  # fmt: skip
    assert call.info.backward.singular == (True,)
    assert call.info.backward.condition[0] > 1e12


def test_tangent_of_the_wrong_shape_is_refused():
    cones, n = KINDS["zero+nonneg"]
    P, q, A, b = _random_problem(cones, n, seed=0)
    call = _sparse_call(P.to_sparse_coo(), q, A.to_sparse_coo(), b, cones)
    bad = torch.zeros(A.shape[0], n + 1, dtype=F64).to_sparse_coo()
    with pytest.raises(ValueError, match="tangent of A: expected shape"):
        SparseConicFunction.jvp(types.SimpleNamespace(call=call), None, None, bad, None, None)
