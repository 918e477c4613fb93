"""The pseudo-inverse fallback's sparse least-squares solve (:func:`dxopt.linalg.lstsq_saddle`)
on a LISWET-like system: :math:`P = I`, second-difference rows (nearly dependent:
:math:`\\sigma_{\\min}(C)^2 \\approx 10^{-12}`), beyond the dense SVD's size.

The old code ran LSMR up to :math:`20N` iterations (Maros-Meszaros LISWET2: 400,000, 78 s)
and returned a residual :math:`\\|Kz - r\\|/\\|r\\|` of 2e-4 as the gradient's adjoint; the
seminormal equations with refinement solve it exactly, and where they do not apply LSMR stops
once it stalls instead of running for minutes (the caller then refuses).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import dxopt.linalg.sparse as linalg_sparse
from dxopt.linalg import lstsq_saddle

N_X = 1600  # K is 3198 square: past the dense SVD limit (3000)


def _second_differences(n: int) -> sp.csr_matrix:
    return sp.diags([1.0, -2.0, 1.0], [0, 1, 2], shape=(n - 2, n), format="csr")


def _rhs(n: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.concatenate([rng.standard_normal(n), 1e-3 * rng.standard_normal(k)])


def test_identity_objective_is_solved_exactly():
    C = _second_differences(N_X)
    P = sp.identity(N_X, format="csr")
    r = _rhs(N_X, C.shape[0])
    z, normal = lstsq_saddle(P, C, r)
    K = sp.bmat([[P, C.T], [C, None]], format="csr")
    assert float(np.linalg.norm(K @ z - r)) <= 1e-10 * float(np.linalg.norm(r))
    assert normal <= 1e-9
    # the exact u in closed form: C u = r_2 and u - g orthogonal to null(C) = span{1, t}:
    # u = u_0 + N N^T (g - u_0) with C u_0 = r_2 (the second-difference recursion) and N an
    # orthonormal basis of the affine functions
    g, r2 = r[:N_X], r[N_X:]
    u0 = np.zeros(N_X)
    for j in range(N_X - 2):
        u0[j + 2] = r2[j] + 2.0 * u0[j + 1] - u0[j]
    basis = np.linalg.qr(np.stack([np.ones(N_X), np.arange(N_X, dtype=float)], 1))[0]
    exact = u0 + basis @ (basis.T @ (g - u0))
    assert float(np.abs(z[:N_X] - exact).max()) <= 1e-8 * float(np.abs(exact).max())


def test_lsmr_stops_when_it_stalls(monkeypatch):
    """P not diagonal (the seminormal path declines): LSMR stops after a few chunks of a
    stalled run, far below its 20N-iteration cap, and reports a normal residual the
    fallback then judges."""
    C = _second_differences(N_X)
    P = sp.identity(N_X, format="csr") + sp.diags([1e-3], [1], shape=(N_X, N_X))
    P = ((P + P.T) / 2).tocsr()
    r = _rhs(N_X, C.shape[0])
    iterations: list[int] = []
    lsmr = spla.lsmr

    def counted(*args, **kwargs):
        out = lsmr(*args, **kwargs)
        iterations.append(int(out[2]))
        return out

    monkeypatch.setattr(linalg_sparse.spla, "lsmr", counted)
    z, normal = lstsq_saddle(P, C, r)
    N = N_X + C.shape[0]
    assert iterations and sum(iterations) <= 4 * N, iterations
    assert np.isfinite(normal) and np.all(np.isfinite(z))
