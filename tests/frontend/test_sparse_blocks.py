"""The front end's sparse blocks: a shared P or A above the size threshold goes to
dxopt.conic as a sparse matrix and gives the same solution and gradients as the dense path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

cp = pytest.importorskip("cvxpy")

from dxopt.frontend import CvxpyLayer  # noqa: E402
from dxopt.frontend._blocks import conic_blocks  # noqa: E402

D = torch.float64


def _problem():
    n = 8
    x = cp.Variable(n)
    F, g, r = cp.Parameter((5, n)), cp.Parameter(5), cp.Parameter(nonneg=True)
    Dm = np.diff(np.eye(n), axis=0)
    prob = cp.Problem(
        cp.Minimize(cp.sum_squares(F @ x - g) + cp.norm(Dm @ x, 1)),
        [cp.norm(x, 2) <= r, x >= -1],
    )
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((5, n)), 3 * rng.standard_normal((2, 5)), np.array(0.7)]
    return prob, [F, g, r], x, values


def _run(layer, values):
    leaves = [torch.tensor(v, dtype=D, requires_grad=True) for v in values]
    (x,) = layer(*leaves)
    w = torch.linspace(-1.0, 2.0, x.shape[-1], dtype=D)
    (x * w).sum().backward()
    return x.detach(), [leaf.grad for leaf in leaves]


def test_sparse_blocks_match_the_dense_path():
    prob, params, x, values = _problem()
    dense = CvxpyLayer(prob, parameters=params, variables=[x], solver_args={"tol": 1e-10})
    sparse = CvxpyLayer(prob, parameters=params, variables=[x], solver_args={"tol": 1e-10})
    sparse.sparse_from = 0
    # F is shared (2-D value) and enters P and A: those blocks go sparse, g's b stays dense
    x_d, g_d = _run(dense, values)
    x_s, g_s = _run(sparse, values)
    torch.testing.assert_close(x_s, x_d, atol=1e-10, rtol=0)
    for a, b in zip(g_s, g_d, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert float(g_d[0].abs().max()) > 1e-3


def test_blocks_are_sparse_only_where_shared_and_large():
    prob, params, x, _ = _problem()
    layer = CvxpyLayer(prob, parameters=params, variables=[x])
    c = layer.compiled
    theta = torch.ones(2, c.matrix.shape[1], dtype=D)
    from dxopt.qp.frontend._affine import affine_map

    entries = affine_map(theta, layer._map)
    P, q, A, _ = conic_blocks(c, entries, set(), sparse_from=0)
    assert P is not None and P.layout == torch.sparse_coo and A.layout == torch.sparse_coo
    assert q.layout == torch.strided and q.dim() == 1
    # F batched: A (where F enters) per sample and dense; P (constant: CVXPY's epigraph of
    # the sum of squares) stays shared and sparse
    P2, _, A2, _ = conic_blocks(c, entries, {0}, sparse_from=0)
    assert P2 is not None and P2.layout == torch.sparse_coo
    assert A2.layout == torch.strided and A2.dim() == 3
    torch.testing.assert_close(A.to_dense(), A2[0])
    P3, _, A3, _ = conic_blocks(c, entries, set())  # small: dense
    assert P3 is not None and P3.layout == torch.strided and A3.layout == torch.strided
