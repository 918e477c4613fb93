"""Sparse P and A for dxopt.conic.solve: the same solution and gradients as the dense path,
gradients in the input's layout and pattern, and refusals of what is not taken."""

from __future__ import annotations

import pytest
import torch

import dxopt.conic as dc

F64 = torch.float64


def _problem(batch: int = 3, n: int = 6):
    """Least squares with a norm ball and a box: a sparse tridiagonal P, a sparse A (ball rows
    plus a box), batched q, b. The ball is active for some samples."""
    g = torch.Generator().manual_seed(0)
    main = 2.0 + torch.rand(n, generator=g, dtype=F64)
    off = -0.5 * torch.ones(n - 1, dtype=F64)
    P = torch.diag(main) + torch.diag(off, 1) + torch.diag(off, -1)
    ball = torch.cat([torch.zeros(1, n, dtype=F64), -torch.eye(n, dtype=F64)])
    box = torch.cat([torch.eye(n, dtype=F64), -torch.eye(n, dtype=F64)])
    box[0, 1] = 0.3  # an off-diagonal entry in the box rows
    A = torch.cat([box, ball])
    q = 2.0 * torch.randn(batch, n, generator=g, dtype=F64)
    b = torch.cat([torch.ones(batch, 2 * n, dtype=F64), torch.full((batch, 1), 1.2, dtype=F64),
                   torch.zeros(batch, n, dtype=F64)], dim=1)  # fmt: skip
    cones = [dc.NonnegCone(2 * n), dc.SecondOrderCone(n + 1)]
    return P, q, A, b, cones


def _grads(P, q, A, b, cones, w):
    leaves = [t.detach().clone().requires_grad_() for t in (P, q, A, b)]
    sol = dc.solve(*leaves, cones=cones, atol=1e-10, rtol=1e-10)
    ((w * sol.x).sum() + (w[:, :1] * sol.y[:, :1]).sum()).backward()
    return sol, [t.grad for t in leaves]


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_matches_dense_and_keeps_the_pattern(layout):
    P, q, A, b, cones = _problem()
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    dense_sol, (gP, gq, gA, gb) = _grads(P, q, A, b, cones, w)

    def sparse(M):
        return M.to_sparse_coo() if layout == "coo" else M.to_sparse_csr()

    Ps, As = sparse(P), sparse(A)
    sp_sol, (sP, sq, sA, sb) = _grads(Ps, q, As, b, cones, w)
    torch.testing.assert_close(sp_sol.x, dense_sol.x, atol=1e-10, rtol=0)
    torch.testing.assert_close(sp_sol.y, dense_sol.y, atol=1e-10, rtol=0)
    torch.testing.assert_close(sq, gq, atol=1e-10, rtol=0)
    torch.testing.assert_close(sb, gb, atol=1e-10, rtol=0)
    want = torch.sparse_coo if layout == "coo" else torch.sparse_csr
    for g_sparse, g_dense, M in ((sP, gP, Ps), (sA, gA, As)):
        assert g_sparse.layout == want and g_sparse.shape == M.shape
        if layout == "coo":
            g_sparse = g_sparse.coalesce()
            assert torch.equal(g_sparse.indices(), M.coalesce().indices())
        else:
            assert torch.equal(g_sparse.crow_indices(), M.crow_indices())
            assert torch.equal(g_sparse.col_indices(), M.col_indices())
        mask = g_sparse.to_dense() != 0
        pattern = M.to_dense() != 0
        assert not bool((mask & ~pattern).any())  # nothing outside the pattern
        torch.testing.assert_close(
            g_sparse.to_dense(), torch.where(pattern, g_dense, 0.0), atol=1e-10, rtol=0
        )
    assert float(gA.abs().max()) > 1e-3  # the comparison is not between zeros


def test_uncoalesced_coo_sums_duplicates():
    P, q, A, b, cones = _problem(batch=1)
    idx = A.nonzero().T
    vals = A[idx[0], idx[1]]
    doubled = torch.sparse_coo_tensor(torch.cat([idx, idx], 1), torch.cat([vals, vals]) / 2,
                                      A.shape)  # fmt: skip
    x_dense = dc.solve(P, q[0], A, b[0], cones=cones).x
    x_sparse = dc.solve(P, q[0], doubled, b[0], cones=cones).x
    torch.testing.assert_close(x_sparse, x_dense, atol=1e-9, rtol=0)


def test_refusals_name_the_argument():
    P, q, A, b, cones = _problem(batch=2)
    batched = torch.stack([A, A]).to_sparse_coo()
    with pytest.raises(ValueError, match="A: expected a 2-D sparse matrix"):
        dc.solve(P, q, batched, b, cones=cones)
    with pytest.raises(TypeError, match="P: expected dtype float32 or float64"):
        dc.solve(P.to(torch.int64).to_sparse_coo(), q, A, b, cones=cones)
