"""Degenerate active sets (LICQ fails) on the dQP sparse Laplacian family, both backwards.

dQP's sparse generator (Magoon et al., arXiv 2410.06324): :math:`P` is the Laplacian of the
symmetrised 3-nearest-neighbour graph of ``make_blobs`` points (PSD and singular), ``G`` and
``A`` are N(0, 1) matrices of density :math:`5\\cdot10^{-4}` with one forced entry per row,
:math:`h = G\\mathbf 1 + 1`, :math:`b = A\\mathbf 1`. Many rows touch a single coordinate, so
active rows are linearly dependent; :math:`\\partial L/\\partial q` is still unique and is
checked against central finite differences of the forward solve.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from qp_zoo import QPData, complementary_qp, stack
from torch import Tensor

import dxopt.qp as dqp

F64 = torch.float64


def _sparse_rows(rows: int, n: int, rng: np.random.Generator) -> sp.coo_matrix:
    nnz = round(5e-4 * rows * n)
    r = np.concatenate([rng.integers(rows, size=nnz), np.arange(rows)])
    c = np.concatenate([rng.integers(n, size=nnz), rng.integers(n, size=rows)])
    mat = sp.coo_matrix((np.ones(r.size), (r, c)), shape=(rows, n)).tocsr().tocoo()
    mat.data = rng.standard_normal(mat.data.size)
    return mat


def _torch(mat: sp.spmatrix) -> Tensor:
    coo = sp.coo_matrix(mat)
    idx = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
    return torch.sparse_coo_tensor(
        idx, torch.from_numpy(coo.data), coo.shape, check_invariants=True
    ).coalesce()


def laplacian_qp(n: int, seed: int = 0) -> tuple[Tensor, ...]:
    """``(P, q, A, b, G, h)`` of dQP's sparse Laplacian family (sparse COO, float64)."""
    from sklearn.datasets import make_blobs
    from sklearn.neighbors import kneighbors_graph

    points, _ = make_blobs(n_samples=n, n_features=2, centers=3, random_state=seed)
    knn = kneighbors_graph(points, 3, mode="connectivity", include_self=False)
    adjacency = knn.maximum(knn.T)
    P = sp.diags(np.asarray(adjacency.sum(axis=1)).ravel()) - adjacency
    rng = np.random.default_rng(seed)
    q = torch.from_numpy(rng.standard_normal(n))
    G = _sparse_rows(n, n, rng)
    A = _sparse_rows(math.ceil(n / 2), n, rng)
    h = torch.from_numpy(np.asarray(G.sum(axis=1)).ravel() + 1.0)
    b = torch.from_numpy(np.asarray(A.sum(axis=1)).ravel())
    return _torch(P), q, _torch(A), b, _torch(G), h


def _loss(x: Tensor, weights: Tensor) -> Tensor:
    return (weights * x).sum()


@pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")
def test_sparse_laplacian_dependent_rows_both_backwards_match_finite_differences() -> None:
    P, q, A, b, G, h = laplacian_qp(100, seed=0)
    weights = torch.randn(100, generator=torch.Generator().manual_seed(0), dtype=F64)
    grads = {}
    for backward in ("penalty", "kkt"):
        leaves = [t.clone().requires_grad_() for t in (q, b, h)]
        sol = dqp.solve(P, leaves[0], A=A, b=leaves[1], G=G, h=leaves[2], backward=backward)
        with pytest.warns(dqp.QPDegenerateWarning):
            grads[backward] = torch.autograd.grad(_loss(sol.x, weights), leaves)
        diag = sol.info.backward
        assert not diag.licq and max(diag.dependent_rows) >= 1
        assert diag.residual <= 1e-8
    for g_pen, g_kkt in zip(grads["penalty"], grads["kkt"]):
        torch.testing.assert_close(g_pen, g_kkt, rtol=0, atol=1e-8 * float(g_kkt.norm()))
    step, gen = 1e-2, torch.Generator().manual_seed(1)  # x(q) is affine near q
    for _ in range(6):  # central differences along random directions of q
        d = torch.randn(100, generator=gen, dtype=F64)
        d = d / d.norm()
        plus = dqp.solve(P, q + step * d, A=A, b=b, G=G, h=h).x
        minus = dqp.solve(P, q - step * d, A=A, b=b, G=G, h=h).x
        fd = float(_loss(plus - minus, weights)) / (2 * step)
        for backward in ("penalty", "kkt"):
            analytic = float(grads[backward][0] @ d)
            assert abs(analytic - fd) <= 1e-6 * max(abs(fd), 1.0), (backward, analytic, fd)


@pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")
@pytest.mark.parametrize("weak_policy", ["inactive", "active"])
def test_batched_kkt_with_many_weak_rows_equals_loop(
    weak_policy: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """FINDINGS section 4: a batched KKT backward with many weakly active (zero-multiplier)
    rows, some samples with more used rows than unknowns (dependent rows under
    ``weak_policy="active"``), must not crash or print LAPACK/MKL errors, and must equal a
    per-sample loop."""
    problems = [
        complementary_qp(16, m=40, p=2, n_active=6, weak=weak, seed=seed)
        for seed, weak in enumerate((4, 10, 12, 0, 8, 12))
    ]
    data = stack(problems)
    gen = torch.Generator().manual_seed(3)
    grad_x = torch.randn(len(problems), 16, generator=gen, dtype=F64)
    method = dqp.KKTBackward(weak_policy=weak_policy)

    def grads(d: QPData, gx: Tensor) -> tuple[Tensor, ...]:
        assert d.b is not None and d.h is not None
        leaves = [t.clone().requires_grad_() for t in (d.q, d.b, d.h)]
        # one solver for batch and loop: with more used rows than unknowns the multipliers
        # are not unique, and which rows carry them (so which are weak) is the solver's
        sol = dqp.solve(d.P, leaves[0], A=d.A, b=leaves[1], G=d.G, h=leaves[2], backward=method,
                        solver="daqp")  # fmt: skip
        out = torch.autograd.grad((sol.x * gx).sum(), leaves)
        dependent.append(sol.info.backward.dependent_rows)
        return out

    dependent: list[tuple[int, ...]] = []
    batched = grads(data, grad_x)
    if weak_policy == "active":
        assert sum(c > 0 for c in dependent[0]) >= 3  # samples with > 16 used rows
    for i, problem in enumerate(problems):
        for g_batch, g_one in zip(batched, grads(problem, grad_x[i])):
            torch.testing.assert_close(g_batch[i], g_one, rtol=1e-9, atol=1e-10)
    captured = capfd.readouterr()
    assert "MKL" not in captured.out + captured.err
    assert "DLASWP" not in captured.out + captured.err


@pytest.mark.parametrize("dense_limit", [300, 0])
def test_dependent_row_counts_equal_the_svd_rank_deficiency(
    dense_limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Detection (dense Cholesky of the row-normalised Gram matrix, or SuperLU of it for many
    sparse rows) counts k - rank(C) against numpy's SVD rank; zero (padding) rows don't count."""
    from dxopt.qp.certify import dependence as _degenerate

    monkeypatch.setattr(_degenerate, "_DENSE_GRAM", dense_limit)
    gen = torch.Generator().manual_seed(5)
    for trial in range(4):
        base = sp.random(30, 80, density=0.1, random_state=trial, format="csr")
        base = base + sp.eye(30, 80, format="csr")  # no zero rows: rank 30
        extra = [base[:trial] * 3.0, sp.csr_matrix(base[4] - 2.0 * base[7])]
        C = sp.vstack([base, *extra], format="csr")
        expected = C.shape[0] - int(np.linalg.matrix_rank(C.toarray()))
        assert _degenerate.count_dependent_sparse(C) == expected == trial + 1
        dense = torch.from_numpy(C.toarray())
        padded = torch.cat([dense, torch.zeros(2, 80, dtype=F64)])[None]
        shuffled = padded[:, torch.randperm(padded.shape[1], generator=gen)]
        assert int(_degenerate.count_dependent_dense(shuffled)[0]) == expected
