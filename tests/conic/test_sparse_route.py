"""The sparse route of dxopt.conic (large problems with sparse shared P, A): the same solution
and gradients as the dense route on every cone kind, its structured Jacobian against the
cones' own dense one, a medium problem against finite differences, gradients on the input's
pattern, and the route decision (singular Jacobians: test_sparse_min_norm.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import dxopt.conic as dc
from dxopt import Status
from dxopt.conic.kkt import cone_jacobian, jacobian
from dxopt.conic.sparse_kkt import SparseJacobian, cone_jacobian_sparse
from dxopt.conic.sparse_problem import SPARSE_MIN

F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)


def _slices(cones):
    out, start = [], 0
    for c in cones:
        out.append(slice(start, start + c.dim))
        start += c.dim
    return tuple(out), start


def _random_problem(cones, n, batch=2, seed=0, density=0.6):
    """``min 1/2 x'Px + q'x`` s.t. ``Ax + s = b, s in K`` with a sparse PD ``P``, a sparse
    ``A`` and ``b = A x0 + s0``, ``s0 = Pi_K(v)`` (feasible); ``q`` batched."""
    g = torch.Generator().manual_seed(seed)
    _, m = _slices(cones)
    A = torch.randn(m, n, generator=g, dtype=F64)
    A = A * (torch.rand(m, n, generator=g, dtype=F64) < density)
    A[torch.arange(min(m, n)), torch.arange(min(m, n))] += 1.0  # no empty row or column
    L = torch.randn(n, n, generator=g, dtype=F64) * (torch.rand(n, n, generator=g) < 0.3)
    P = L @ L.T + 0.5 * torch.eye(n, dtype=F64)
    slices, _ = _slices(cones)
    v = torch.randn(m, generator=g, dtype=F64)
    s0 = torch.cat([c.project(v[sl]) for c, sl in zip(cones, slices)])
    x0 = torch.randn(n, generator=g, dtype=F64)
    b = (A @ x0 + s0).expand(batch, m).clone()
    q = 3.0 * torch.randn(batch, n, generator=g, dtype=F64)
    return P, q, A, b


def _loss_grads(P, q, A, b, cones, route, weights):
    leaves = [t.detach().clone().requires_grad_() for t in (P, q, A, b)]
    sol = dc.solve(*leaves, cones=cones, route=route, **TOL)
    wx, wy, ws = weights
    ((wx * sol.x).sum() + (wy * sol.y).sum() + (ws * sol.s).sum()).backward()
    return sol, [t.grad for t in leaves]


def _values(g):
    return g.coalesce().values() if g.layout == torch.sparse_coo else g.values()


KINDS = {
    "zero+nonneg": ([dc.ZeroCone(2), dc.NonnegCone(8)], 6),
    "soc-small": ([dc.NonnegCone(3), dc.SecondOrderCone(4), dc.SecondOrderCone(3)], 6),
    "soc-structured": ([dc.ZeroCone(1), dc.SecondOrderCone(20)], 19),
    "exp": ([dc.NonnegCone(2), dc.ExpCone(), dc.ExpCone()], 5),
    "power": ([dc.NonnegCone(2), dc.PowerCone(0.3), dc.PowerCone(0.7)], 5),
    "psd": ([dc.ZeroCone(1), dc.PSDCone(3)], 5),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_sparse_route_equals_dense_route(kind):
    cones, n = KINDS[kind]
    P, q, A, b = _random_problem(cones, n, seed=sorted(KINDS).index(kind))
    g = torch.Generator().manual_seed(7)
    weights = tuple(torch.randn(t.shape, generator=g, dtype=F64) for t in (q, b, b))
    Ps, As = P.to_sparse_coo(), A.to_sparse_coo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dc.ConicDegenerateWarning)
        dense, gd = _loss_grads(Ps, q, As, b, cones, "dense", weights)
        sparse, gs = _loss_grads(Ps, q, As, b, cones, "sparse", weights)
    assert dense.info.backward.linear_solver == "lu"
    assert sparse.info.backward.linear_solver == "splu"
    assert sparse.status == dense.status and all(st.ok for st in sparse.status)
    for a, c in ((sparse.x, dense.x), (sparse.y, dense.y), (sparse.s, dense.s)):
        torch.testing.assert_close(a, c, atol=1e-9, rtol=0)
    for name, a, c in zip("PqAb", gs, gd):
        assert a.layout == c.layout, name
        if a.layout != torch.strided:
            a, c = _values(a), _values(c)
        torch.testing.assert_close(a, c, atol=1e-9, rtol=1e-9, msg=f"gradient of {name}")
    if kind == "soc-structured":
        # the large cone is in the third region of its projection (the rank-2 form is used)
        s, y = sparse.s[:, 1:], sparse.y[:, 1:]
        assert bool((s[:, 0] - s[:, 1:].norm(dim=-1) < 1e-7 * s[:, 0]).all())
        assert bool((y[:, 0] > 1e-3).all())


@pytest.mark.parametrize("snapped", [False, True])
def test_structured_jacobian_matches_the_cones(snapped):
    cones = (
        dc.ZeroCone(2),
        dc.NonnegCone(5),
        dc.SecondOrderCone(20),  # structured, third region below
        dc.SecondOrderCone(17),  # structured, made to sit inside K* (identity)
        dc.SecondOrderCone(16),  # structured, inside the polar (zero)
        dc.SecondOrderCone(3),
        dc.ExpCone(),
        dc.PSDCone(3),
    )
    slices, m = _slices(cones)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(m, generator=g, dtype=F64)
    w[slices[3].start] = 10.0
    w[slices[4].start] = -10.0
    w[3] = 1e-9  # a nonnegative entry at its kink
    atol = 1e-6 if snapped else None
    D = cone_jacobian_sparse(cones, slices, w, atol)
    ref = cone_jacobian(cones, slices, w[None], None if atol is None else torch.tensor([atol]))
    np.testing.assert_allclose(D.dense(), ref[0].numpy(), atol=1e-15, rtol=0)
    assert len(D.low_rank) == 1  # only the third-region cone carries a rank-2 part
    n = 7
    A = torch.randn(m, n, generator=g, dtype=F64) * (torch.rand(m, n, generator=g) < 0.5)
    P = torch.eye(n, dtype=F64)
    J = SparseJacobian(sp.csc_matrix(P.numpy()), sp.csc_matrix(A.numpy()), D)
    Jd = jacobian(P[None], A[None], ref, cones=cones, slices=slices)[0].numpy()
    z = torch.randn(n + m, generator=g, dtype=F64).numpy()
    np.testing.assert_allclose(J.matvec(z), Jd @ z, atol=1e-13, rtol=0)
    np.testing.assert_allclose(J.rmatvec(z), Jd.T @ z, atol=1e-13, rtol=0)
    jv, jtv = J.products()  # the assembled form for iterative solves
    np.testing.assert_allclose(jv(z), Jd @ z, atol=1e-13, rtol=0)
    np.testing.assert_allclose(jtv(z), Jd.T @ z, atol=1e-13, rtol=0)
    norm_1, norm_inf = J.norms()
    assert J.norm_1() == norm_1 == pytest.approx(np.abs(Jd).sum(0).max(), rel=1e-13)
    assert norm_inf == pytest.approx(np.abs(Jd).sum(1).max(), rel=1e-13)
    # every row and column sum, not only the largest: scale the rows of A so that each
    # block's rows (the structured cone's among them) hold the largest sum in turn
    for start in (0, slices[2].start, slices[2].start + 5, slices[5].start):
        scaled = A.clone()
        scaled[start] *= 50.0
        Js = SparseJacobian(sp.csc_matrix(P.numpy()), sp.csc_matrix(scaled.numpy()), D)
        Jsd = jacobian(P[None], scaled[None], ref, cones=cones, slices=slices)[0].numpy()
        got = Js.norms()
        assert got[0] == pytest.approx(np.abs(Jsd).sum(0).max(), rel=1e-13), start
        assert got[1] == pytest.approx(np.abs(Jsd).sum(1).max(), rel=1e-13), start
    # the lifted matrix [[L11, L12], [L21, -I]] has the Schur complement L11 + L12 L21 = J
    L = J.lifted().toarray()
    N = n + m
    assert L.shape == (N + J.r, N + J.r) and J.r == 2
    np.testing.assert_array_equal(L[N:, N:], -np.eye(J.r))
    np.testing.assert_allclose(L[:N, :N] + L[:N, N:] @ L[N:, :N], Jd, atol=1e-14, rtol=0)


def _ball_box(n, batch, seed):
    """Least squares with a norm ball and a box, ``n`` variables: tridiagonal ``P``,
    ``A = [I; -I; 0; -I]`` (box rows, then the ball ``(r, x)``)."""
    g = torch.Generator().manual_seed(seed)
    main = 2.0 + torch.rand(n, generator=g, dtype=F64)
    off = -0.5 * torch.ones(n - 1, dtype=F64)
    idx = torch.arange(n)
    P = torch.sparse_coo_tensor(
        torch.stack([torch.cat([idx, idx[:-1], idx[1:]]), torch.cat([idx, idx[1:], idx[:-1]])]),
        torch.cat([main, off, off]),
        (n, n),
    ).coalesce()
    rows = torch.cat([idx, n + idx, 2 * n + 1 + idx])
    cols = torch.cat([idx, idx, idx])
    vals = torch.cat([torch.ones(n), -torch.ones(n), -torch.ones(n)]).to(F64)
    A = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (3 * n + 1, n)).coalesce()
    q = 0.2 * torch.randn(batch, n, generator=g, dtype=F64)
    radius = 0.5 * float(np.sqrt(n)) * 0.2
    b = torch.cat(
        [torch.full((batch, 2 * n), 0.1, dtype=F64), torch.full((batch, 1), radius, dtype=F64),
         torch.zeros(batch, n, dtype=F64)], dim=1,
    )  # fmt: skip
    cones = [dc.NonnegCone(2 * n), dc.SecondOrderCone(n + 1)]
    return P, q, A, b, cones


def test_medium_problem_takes_the_sparse_route_and_matches_finite_differences():
    """n = 2000 (m = 6001): a dense Jacobian would be 8001^2 (512 MB per sample)."""
    n = 2000
    P, q, A, b, cones = _ball_box(n, batch=1, seed=1)
    assert n + A.shape[0] >= SPARSE_MIN
    qv = q.clone().requires_grad_()
    bv = b.clone().requires_grad_()
    sol = dc.solve(P, qv, A, bv, cones=cones, **TOL)
    assert sol.ok
    c = torch.randn(n, generator=torch.Generator().manual_seed(2), dtype=F64)
    (sol.x @ c.unsqueeze(-1)).sum().backward()
    assert sol.info.backward.linear_solver == "splu"
    assert sol.info.backward.residual[0] < 1e-14
    # directional derivatives along dq and db by central differences at two steps
    g = torch.Generator().manual_seed(4)
    dq = torch.randn(q.shape, generator=g, dtype=F64)
    db = torch.zeros_like(b)
    db[:, 2 * n] = 1.0  # the radius
    for direction, grad, which in ((dq, qv.grad, "q"), (db, bv.grad, "b")):
        predicted = float((grad * direction).sum())
        slopes = []
        for h in (1e-5, 1e-6):
            args = {"q": q, "b": b}
            plus = dict(args)
            minus = dict(args)
            plus[which] = args[which] + h * direction
            minus[which] = args[which] - h * direction
            xp = dc.solve(P, plus["q"], A, plus["b"], cones=cones, **TOL).x
            xm = dc.solve(P, minus["q"], A, minus["b"], cones=cones, **TOL).x
            slopes.append(float(((xp - xm) @ c).sum()) / (2 * h))
        assert abs(slopes[0] - slopes[1]) <= 1e-6 * max(1.0, abs(predicted)), slopes  # smooth
        assert abs(predicted - slopes[0]) <= 1e-6 * max(1.0, abs(predicted)), (which, slopes)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_gradients_keep_the_input_pattern(layout):
    cones, n = KINDS["soc-small"]
    P, q, A, b = _random_problem(cones, n, seed=11)
    weights = (torch.ones_like(q), torch.zeros_like(b), torch.zeros_like(b))
    dense_grads = _loss_grads(P, q, A, b, cones, "dense", weights)[1]
    # a zero entry of A with a nonzero derivative, stored explicitly: it is in the pattern
    cand = (A == 0) & (dense_grads[2].abs() > 1e-3)
    i, j = (int(t) for t in torch.nonzero(cand)[0])
    Ps = P.to_sparse_coo()
    As = A.to_sparse_coo()
    idx = torch.cat([As.indices(), torch.tensor([[i], [j]])], dim=1)
    As = torch.sparse_coo_tensor(idx, torch.cat([As.values(), torch.zeros(1, dtype=F64)]),
                                 As.shape).coalesce()  # fmt: skip
    if layout == "csr":
        Ps, As = Ps.to_sparse_csr(), As.to_sparse_csr()
    assert As._nnz() == int((A != 0).sum()) + 1
    _, (gP, _, gA, _) = _loss_grads(Ps, q, As, b, cones, "sparse", weights)
    for g, M, ref in ((gP, Ps, dense_grads[0]), (gA, As, dense_grads[2])):
        assert g.layout == M.layout and g.shape == M.shape
        if layout == "coo":
            assert torch.equal(g.coalesce().indices(), M.coalesce().indices())
            rows, cols = M.coalesce().indices()
        else:
            assert torch.equal(g.crow_indices(), M.crow_indices())
            assert torch.equal(g.col_indices(), M.col_indices())
            counts = M.crow_indices().diff()
            rows = torch.repeat_interleave(torch.arange(M.shape[0]), counts)
            cols = M.col_indices()
        torch.testing.assert_close(_values(g), ref[rows, cols], atol=1e-9, rtol=1e-9)
    at = ((rows == i) & (cols == j)).nonzero()[0, 0]
    assert abs(float(_values(gA)[at])) > 1e-3  # the stored zero's derivative


def test_route_decision_and_refusals():
    P, q, A, b, cones = _ball_box(6, batch=1, seed=0)
    small = dc.solve(P, q.requires_grad_(), A, b, cones=cones, **TOL)
    small.x.sum().backward()
    assert small.info.backward.linear_solver == "lu"  # below SPARSE_MIN: dense
    with pytest.raises(ValueError, match="route"):
        dc.solve(P.to_dense(), q, A.to_dense(), b, cones=cones, route="sparse")
    with pytest.raises(ValueError, match="route"):
        dc.solve(P, q, A, b, cones=cones, route="sparse", backward=dc.Smoothed(mu=1e-3))
    with pytest.raises(ValueError, match="route"):
        dc.solve(P, q, A, b, cones=cones, route="fast")
    indefinite = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=F64).to_sparse_coo()
    A2 = -torch.eye(2, dtype=F64).to_sparse_coo()
    with pytest.raises(ValueError, match="positive semidefinite"):
        dc.solve(indefinite, torch.ones(2, dtype=F64), A2, torch.ones(2, dtype=F64),
                 cones=[dc.NonnegCone(2)], route="sparse")  # fmt: skip
    singular_psd = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=F64).to_sparse_coo()
    sol = dc.solve(singular_psd, torch.ones(2, dtype=F64), A2, torch.zeros(2, dtype=F64),
                   cones=[dc.NonnegCone(2)], route="sparse", **TOL)  # fmt: skip
    torch.testing.assert_close(sol.x, torch.zeros(2, dtype=F64), atol=1e-8, rtol=0)


def test_frontend_passes_route():
    """A CVXPY layer with sparse blocks takes the sparse route (``solver_args={"route": ...}``)
    and gives the dense route's gradient."""
    cp = pytest.importorskip("cvxpy")
    from dxopt.frontend import CvxpyLayer

    n = 30
    Dm = sp.diags([np.ones(n - 1), -np.ones(n - 1)], [0, 1], shape=(n - 1, n))
    x, y, r = cp.Variable(n), cp.Parameter(n - 1), cp.Parameter(nonneg=True)
    prob = cp.Problem(cp.Minimize(cp.norm(Dm @ x - y, 2) + 0.01 * cp.norm(x, 1)),
                      [cp.norm(x, 2) <= r])  # fmt: skip
    yv = torch.randn(n - 1, generator=torch.Generator().manual_seed(0), dtype=F64)
    grads = {}
    for route in ("dense", "sparse"):
        layer = CvxpyLayer(prob, parameters=[y, r], variables=[x], solver_args={"route": route})
        layer.sparse_from = 0  # pass the shared blocks sparse at this small size
        yg = yv.clone().requires_grad_()
        rg = torch.tensor(0.5 * float(yv.norm()), dtype=F64, requires_grad=True)
        out = layer.solve(yg, rg)
        out.values[0].sum().backward()
        assert out.raw.info.backward.linear_solver == ("splu" if route == "sparse" else "lu")
        grads[route] = (yg.grad, rg.grad)
    for a, b in zip(grads["dense"], grads["sparse"]):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_infeasible_and_unbounded_samples_carry_checked_certificates():
    """Per-sample statuses on the sparse route equal the dense route's (LPs in a box): sample
    1 infeasible (x_0 >= 1 and x_0 <= -1 through b), the others solvable; and an LP
    unbounded below (min -x_0 with only x_0 >= -1)."""
    n = 3
    A = torch.cat([-torch.eye(n, dtype=F64), torch.eye(n, dtype=F64)]).to_sparse_coo()
    b = torch.tensor(
        [[1.0] * 3 + [1.0] * 3, [-1.0] + [1.0] * 2 + [-1.0] + [1.0] * 2, [1.0] * 6], dtype=F64
    )  # sample 1: x_0 >= 1 and x_0 <= -1
    q = torch.tensor([[1.0, -1.0, 0.5], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=F64)
    cones = [dc.NonnegCone(2 * n)]
    statuses = {}
    for route in ("dense", "sparse"):
        sol = dc.solve(None, q, A, b, cones=cones, route=route, on_failure="nan", **TOL)
        statuses[route] = sol.status
    assert statuses["sparse"] == statuses["dense"]
    assert statuses["sparse"] == (Status.SOLVED, Status.INFEASIBLE, Status.SOLVED)
    A1 = -torch.eye(1, 2, dtype=F64).to_sparse_coo()
    q1 = torch.tensor([-1.0, 0.0], dtype=F64)
    for route in ("dense", "sparse"):
        sol = dc.solve(None, q1, A1, torch.ones(1, dtype=F64), cones=[dc.NonnegCone(1)],
                       route=route, on_failure="nan", **TOL)  # fmt: skip
        assert sol.status == (Status.UNBOUNDED,), route


def test_warm_start_and_float32():
    P, q, A, b, cones = _ball_box(40, batch=2, seed=3)
    cold = dc.solve(P, q, A, b, cones=cones, route="sparse", **TOL)
    warm = dc.solve(P, q, A, b, cones=cones, route="sparse", warm_start=cold, **TOL)
    assert warm.info.warm == (True, True) and warm.info.solvers == ("warm", "warm")
    torch.testing.assert_close(warm.x, cold.x, atol=1e-9, rtol=0)
    q32 = q.float().requires_grad_()
    sol = dc.solve(P.float(), q32, A.float(), b.float(), cones=cones, route="sparse")
    assert sol.x.dtype == torch.float32
    sol.x.sum().backward()
    assert q32.grad is not None and q32.grad.dtype == torch.float32
    q64 = q.clone().requires_grad_()
    dc.solve(P, q64, A, b, cones=cones, route="sparse").x.sum().backward()
    torch.testing.assert_close(q32.grad.double(), q64.grad, atol=1e-4, rtol=1e-4)
