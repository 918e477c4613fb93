"""Benchmark problem generators for differentiable QPs (after the dQP benchmark suite).

Every problem is the convex QP

.. math::

    \\min_x \\tfrac12 x^\\top P x + q^\\top x \\quad\\text{s.t.}\\quad Ax = b,\\; Gx \\le h,

stored as numpy arrays (dense families) or ``scipy.sparse`` CSC matrices (sparse families).
The families follow Magoon et al., *dQP* (NeurIPS 2025, repo cwmagoon/dQP,
``experiments/mega_test/create_random_data.py``), also used by the dXPP paper
(Linghu et al., arXiv 2602.14154); the seed of problem ``i`` is ``i``.

- :func:`random_dense`: :math:`P = MM^\\top + 10^{-4}I`, :math:`M, q, G, A \\sim U[0,1]`,
  :math:`m = n`, :math:`p = \\lceil n/2 \\rceil`, :math:`h = G\\mathbf 1 + 1`,
  :math:`b = A\\mathbf 1`.
- :func:`random_sparse_laplacian`: :math:`P` is the graph Laplacian of the symmetrised
  3-nearest-neighbour graph of ``make_blobs(n, 2 features, 3 centers)``, sparse ``G, A`` of
  density :math:`5\\cdot10^{-4}` with at least one entry per row.
- :func:`simplex_projection`: :math:`P = I, G = -I, h = 0, A = \\mathbf 1^\\top, b = 1`,
  with the closed-form gradient :func:`simplex_closed_form_grad`.
- :func:`chains_projection`: :math:`P = \\tfrac12 I + L_1^\\top L_1` with
  :math:`L_1 = \\mathrm{tridiag}(-1,2,-1) \\otimes I_k`, cyclic difference constraints
  :math:`|x_{i} - x_{i+1}| \\le 1` (coordinate-wise), no equalities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

Matrix = Any  # np.ndarray or scipy.sparse.csc_matrix


@dataclass(frozen=True)
class QPProblem:
    """One QP instance; ``A, b`` or ``G, h`` may be ``None``."""

    family: str
    n: int
    P: Matrix
    q: np.ndarray
    A: Matrix | None
    b: np.ndarray | None
    G: Matrix | None
    h: np.ndarray | None

    @property
    def sparse(self) -> bool:
        return sp.issparse(self.P)

    @property
    def m(self) -> int:
        return 0 if self.G is None else self.G.shape[0]

    @property
    def p(self) -> int:
        return 0 if self.A is None else self.A.shape[0]


def random_dense(n: int, *, seed: int = 0, m: int | None = None, p: int | None = None) -> QPProblem:
    """dQP's random dense QP (``m = n``, ``p = ceil(n/2)`` unless given)."""
    m = n if m is None else m
    p = math.ceil(n / 2) if p is None else p
    rng = np.random.default_rng(seed)
    M = rng.uniform(size=(n, n))
    P = M @ M.T + 1e-4 * np.eye(n)
    q = rng.uniform(size=n)
    G = rng.uniform(size=(m, n))
    A = rng.uniform(size=(p, n))
    h = G.sum(axis=1) + 1.0
    b = A.sum(axis=1)
    return QPProblem("dense", n, P, q, A, b, G, h)


def batched_dense(batch: int, n: int, m: int, p: int, *, seed: int = 0) -> list[QPProblem]:
    """``batch`` independent :func:`random_dense` problems with seeds ``seed .. seed+batch-1``."""
    return [random_dense(n, seed=seed + i, m=m, p=p) for i in range(batch)]


def _sparse_rows(rows: int, n: int, density: float, rng: np.random.Generator) -> sp.csc_matrix:
    """Sparse N(0,1) matrix of about the given density with at least one nonzero per row."""
    nnz = max(round(density * rows * n), 0)
    r = rng.integers(rows, size=nnz)
    c = rng.integers(n, size=nnz)
    # guarantee one entry per row
    r = np.concatenate([r, np.arange(rows)])
    c = np.concatenate([c, rng.integers(n, size=rows)])
    mat = sp.coo_matrix((np.ones(r.size), (r, c)), shape=(rows, n)).tocsc()
    mat.data = rng.standard_normal(mat.data.size)  # duplicates were summed into one entry
    return mat


def random_sparse_laplacian(n: int, *, seed: int = 0) -> QPProblem:
    """dQP's random sparse QP with a 3-NN graph Laplacian objective (PSD, singular)."""
    from sklearn.datasets import make_blobs
    from sklearn.neighbors import kneighbors_graph

    points, _ = make_blobs(n_samples=n, n_features=2, centers=3, random_state=seed)
    knn = kneighbors_graph(points, 3, mode="connectivity", include_self=False)
    adjacency = knn.maximum(knn.T).tocsc()  # undirected graph: edge if either is a neighbour
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    P = (sp.diags(degree) - adjacency).tocsc()
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(n)
    G = _sparse_rows(n, n, 5e-4, rng)
    A = _sparse_rows(math.ceil(n / 2), n, 5e-4, rng)
    h = np.asarray(G.sum(axis=1)).ravel() + 1.0
    b = np.asarray(A.sum(axis=1)).ravel()
    return QPProblem("sparse", n, P, q, A, b, G, h)


def simplex_projection(n: int, *, seed: int = 0) -> QPProblem:
    """Projection of ``-q`` onto the probability simplex, ``q ~ N(0, I)``."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(n)
    eye = sp.identity(n, format="csc")
    return QPProblem(
        "simplex", n, eye, q, sp.csc_matrix(np.ones((1, n))), np.ones(1), -eye, np.zeros(n)
    )


def chains_projection(k: int, *, seed: int = 0, points: int = 100) -> QPProblem:
    """dQP's chains projection with ``points`` points in R^k (``n = points * k``)."""
    N = points
    lap = sp.diags([-np.ones(N - 1), 2 * np.ones(N), -np.ones(N - 1)], [-1, 0, 1], format="csc")
    eye_k = sp.identity(k, format="csc")
    L1 = sp.kron(lap, eye_k, format="csc")
    P = (0.5 * sp.identity(N * k, format="csc") + L1.T @ L1).tocsc()
    G0 = sp.lil_matrix((N, N))
    for i in range(N - 1):
        G0[i, i], G0[i, i + 1] = 1.0, -1.0
    G0[N - 1, N - 1], G0[N - 1, 0] = 1.0, -1.0
    Gk = sp.kron(G0.tocsc(), eye_k, format="csc")
    G = sp.vstack([Gk, -Gk], format="csc")
    rng = np.random.default_rng(seed)
    q = -10.0 * rng.standard_normal((N, k)).ravel()
    return QPProblem("chains", N * k, P, q, None, None, G, np.ones(2 * N * k))


def make_problem(family: str, n: int, *, seed: int = 0) -> QPProblem:
    """Build one problem of ``family`` (dense, sparse, simplex, chains) with ``n`` variables."""
    if family == "dense":
        return random_dense(n, seed=seed)
    if family == "sparse":
        return random_sparse_laplacian(n, seed=seed)
    if family == "simplex":
        return simplex_projection(n, seed=seed)
    if family == "chains":
        if n % 100:
            raise ValueError(f"chains: n must be a multiple of 100 (100 points in R^k); got {n}.")
        return chains_projection(n // 100, seed=seed)
    raise ValueError(f"family must be dense, sparse, simplex or chains; got {family!r}.")


def simplex_solution(q: np.ndarray) -> np.ndarray:
    """Closed-form :math:`x^\\star = \\max(-q - \\tau, 0)` by sorting (Held et al. 1974)."""
    y = -np.asarray(q, dtype=float)
    u = np.sort(y)[::-1]
    css = np.cumsum(u) - 1.0
    idx = np.arange(1, y.size + 1)
    rho = int(np.nonzero(u - css / idx > 0)[0][-1])
    tau = css[rho] / (rho + 1)
    return np.maximum(y - tau, 0.0)


def simplex_closed_form_grad(q: np.ndarray, grad_x: np.ndarray) -> dict[str, np.ndarray]:
    """Exact gradients of :math:`L(x^\\star)` for the simplex projection QP.

    With support :math:`S = \\{i: x^\\star_i > 0\\}`, :math:`s = \\mathbf 1_S` and
    :math:`\\bar g_S` the mean of :math:`\\bar g = \\partial L/\\partial x^\\star` over S:

    .. math::

        \\partial_q L = -s \\circ (\\bar g - \\bar g_S), \\quad
        \\partial_b L = \\bar g_S, \\quad
        \\partial_{h_i} L = (\\bar g_S - \\bar g_i)\\,[i \\notin S].

    Returns a dict with keys ``x``, ``q``, ``h``, ``b``.
    """
    x = simplex_solution(q)
    support = x > 0
    g = np.asarray(grad_x, dtype=float)
    g_mean = g[support].mean()
    dq = -np.where(support, g - g_mean, 0.0)
    dh = np.where(support, 0.0, g_mean - g)
    return {"x": x, "q": dq, "h": dh, "b": np.array([g_mean])}
