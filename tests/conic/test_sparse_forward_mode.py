"""Forward mode and torch.func on the sparse route of dxopt.conic: torch.autograd.forward_ad
and torch.func.jvp give the dense route's tangents on every cone kind, the tangents of the
sparse P and A (SparseConicFunction.jvp) the dense route's, the jvp is the transpose of the
vjp, a kink gets the documented one-sided tangent, and torch.func.grad / vjp give the dense
route's gradients (singular Jacobians: test_sparse_min_norm.py)."""

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
    """All four tangents at once (P and A on their patterns, sparse as forward AD hands them)
    against the dense route's forward AD; the q, b part through torch.autograd.forward_ad
    and torch.func.jvp against the same Function's jvp with zero P, A tangents (one sample:
    batches in the next test)."""
    cones, n = KINDS[kind]
    P, q, A, b = _random_problem(cones, n, batch=1, seed=sorted(KINDS).index(kind))
    g = torch.Generator().manual_seed(17)
    dP, dA = _pattern_tangent(P, g), _pattern_tangent(A, g)
    dq, db = (torch.randn(t.shape, generator=g, dtype=F64) for t in (q, b))
    dense_sol, want = _dense_jvp(P, q, A, b, cones, (dP, dq, dA, db))
    assert all(st.ok for st in dense_sol.status)
    Ps, As = P.to_sparse_coo(), A.to_sparse_coo()
    call = _sparse_call(Ps, q, As, b, cones)
    ctx = types.SimpleNamespace(call=call)
    torch.testing.assert_close(call.x, dense_sol.x, atol=1e-9, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        for layout in ("coo", "csr"):
            to = (lambda M: M.to_sparse_coo()) if layout == "coo" else (lambda M: M.to_sparse_csr())
            got = SparseConicFunction.jvp(ctx, to(dP), dq, to(dA), db, None)
            for name, a, w in zip("xys", got, want):
                torch.testing.assert_close(a, w, atol=1e-9, rtol=1e-9, msg=f"d{name} ({layout})")
        assert max(call.info.backward.residual) <= 1e-13
        qb_only = SparseConicFunction.jvp(ctx, None, dq, None, db, None)
        # q and b through torch's forward AD and torch.func.jvp (P, A sparse constants)
        with fwAD.dual_level():
            sol = dc.solve(Ps, fwAD.make_dual(q, dq), As, fwAD.make_dual(b, db), cones=cones,
                           route="sparse", **TOL)  # fmt: skip
            got = [fwAD.unpack_dual(v).tangent for v in (sol.x, sol.y, sol.s)]
            assert sol.info.backward.linear_solver == "splu"

        def xys(qv, bv):
            out = dc.solve(Ps, qv, As, bv, cones=cones, route="sparse", **TOL)
            return out.x, out.y, out.s

        _, got_func = torch.func.jvp(xys, (q, b), (dq, db))
    for name, a, c, w in zip("xys", got, got_func, qb_only):
        assert float(w.abs().max()) > 1e-3
        torch.testing.assert_close(a, w, atol=1e-9, rtol=1e-9, msg=f"d{name} (forward_ad)")
        torch.testing.assert_close(c, w, atol=1e-9, rtol=1e-9, msg=f"d{name} (torch.func)")


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


def test_tangent_of_the_wrong_shape_is_refused():
    cones, n = KINDS["zero+nonneg"]
    P, q, A, b = _random_problem(cones, n, seed=0)
    call = _sparse_call(P.to_sparse_coo(), q, A.to_sparse_coo(), b, cones)
    bad = torch.zeros(A.shape[0], n + 1, dtype=F64).to_sparse_coo()
    with pytest.raises(ValueError, match="tangent of A: expected shape"):
        SparseConicFunction.jvp(types.SimpleNamespace(call=call), None, None, bad, None, None)


def test_torch_func_grad_and_vjp_match_the_dense_route():
    """Reverse mode inside torch.func (the adjoint runs in its own Function's forward, where
    numpy can read the cotangents): grad and vjp over q and b, P and A sparse constants."""
    cones, n = KINDS["soc-small"]
    P, q, A, b = _random_problem(cones, n, seed=23)
    g = torch.Generator().manual_seed(3)
    wx, wy = (torch.randn(t.shape, generator=g, dtype=F64) for t in (q, b))
    grads = {}
    for route, Pr, Ar in (("dense", P, A), ("sparse", P.to_sparse_coo(), A.to_sparse_coo())):

        def loss(qv, bv, Pr=Pr, Ar=Ar, route=route):
            sol = dc.solve(Pr, qv, Ar, bv, cones=cones, route=route, **TOL)
            return (wx * sol.x).sum() + (wy * sol.y).sum()

        def xs(qv, bv, Pr=Pr, Ar=Ar, route=route):
            return dc.solve(Pr, qv, Ar, bv, cones=cones, route=route, **TOL).x

        _, pull = torch.func.vjp(xs, q, b)
        grads[route] = (*torch.func.grad(loss, argnums=(0, 1))(q, b), *pull(wx))
    assert float(grads["dense"][0].abs().max()) > 1e-3
    for a, c in zip(grads["sparse"], grads["dense"]):
        torch.testing.assert_close(a, c, atol=1e-9, rtol=1e-9)


def test_float32_tangents():
    """Float32 inputs: float32 tangents, the float64 ones rounded (the solve and the
    derivative run in float64)."""
    cones, n = KINDS["zero+nonneg"]
    P, q, A, b = _random_problem(cones, n, seed=2)
    dq = torch.randn(q.shape, generator=torch.Generator().manual_seed(6), dtype=F64)
    out = {}
    for dtype in (torch.float32, F64):
        Ps, As = P.to(dtype).to_sparse_coo(), A.to(dtype).to_sparse_coo()
        with fwAD.dual_level(), warnings.catch_warnings():
            warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
            sol = dc.solve(Ps, fwAD.make_dual(q.to(dtype), dq.to(dtype)), As, b.to(dtype),
                           cones=cones, route="sparse")  # fmt: skip
            out[dtype] = fwAD.unpack_dual(sol.x).tangent
    assert out[torch.float32].dtype == torch.float32
    assert float(out[F64].abs().max()) > 1e-2
    torch.testing.assert_close(out[torch.float32].double(), out[F64], atol=1e-4, rtol=1e-4)
