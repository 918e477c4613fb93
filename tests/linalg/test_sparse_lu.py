"""dxopt.linalg.sparse_lu: the shifted sparse LU refined to round-off against the exact
matrix, the 1-norm estimate of the inverse (a lower bound, and it sees a singular matrix whose
null vector is orthogonal to the ones vector), and the refusal of non-finite input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dxopt.linalg import FactorizationError, inverse_norm_1, refine, shifted_splu

EPS = np.finfo(np.float64).eps


def _matrix(N: int, seed: int) -> sp.csc_matrix:
    rng = np.random.default_rng(seed)
    M = sp.random(N, N, density=0.1, random_state=seed, format="csc")
    return sp.csc_matrix(M + sp.diags(rng.uniform(1.0, 2.0, N)))


def test_refine_reaches_roundoff_against_the_exact_matrix():
    M = _matrix(60, 0)
    norm = float(abs(M).sum(axis=1).max())
    lu = shifted_splu(M, 1e-6 * norm)  # a visibly wrong factor: refinement must remove it
    r = np.random.default_rng(1).standard_normal(60)
    plain = lu.solve(r)
    exact = np.linalg.solve(M.toarray(), r)
    assert np.abs(plain - exact).max() > 1e-9  # the shift is felt without refinement
    sol = refine(lu.solve, lambda v: M @ v, r, norm=norm, target=EPS)
    assert sol.residual <= 1e3 * EPS and sol.steps >= 1
    np.testing.assert_allclose(sol.z, exact, rtol=1e-12, atol=1e-12)
    # the transposed system through trans="T"
    solt = refine(lambda v: lu.solve(v, trans="T"), lambda v: M.T @ v, r,
                  norm=float(abs(M).sum(axis=0).max()), target=EPS)  # fmt: skip
    np.testing.assert_allclose(solt.z, np.linalg.solve(M.toarray().T, r), rtol=1e-12, atol=1e-12)


def test_singular_system_is_seen_by_the_condition_estimate_not_the_residual():
    """On an inconsistent singular system the shifted solve returns a huge ``z`` whose
    normwise relative residual is small (it solves a nearby singular system): the residual
    alone cannot refuse it, the condition estimate does (the sparse route checks both)."""
    M = _matrix(30, 2).tolil()
    M[1, :] = M[0, :]  # two equal rows
    M = sp.csc_matrix(M)
    norm = float(abs(M).sum(axis=1).max())
    lu = shifted_splu(M, 1e2 * EPS * norm)
    r = np.random.default_rng(3).standard_normal(30)  # not in the range of M
    sol = refine(lu.solve, lambda v: M @ v, r, norm=norm, target=EPS)
    assert np.abs(sol.z).max() > 1e10 * np.abs(r).max()
    assert np.abs(r - M @ sol.z).max() > 1e-3  # the system itself is not solved
    est = inverse_norm_1(lu.solve, lambda v: lu.solve(v, trans="T"), 30)
    assert float(abs(M).sum(axis=0).max()) * est > 1e12


def test_inverse_norm_estimate():
    M = _matrix(40, 4)
    lu = shifted_splu(M, 0.0)
    exact = np.abs(np.linalg.inv(M.toarray())).sum(axis=0).max()
    est = inverse_norm_1(lu.solve, lambda v: lu.solve(v, trans="T"), 40)
    assert est <= exact * (1 + 1e-12)
    assert est >= 0.3 * exact
    # equal rows: the left null vector e_0 - e_1 is orthogonal to the ones vector and to
    # any sign vector with equal entries there; the estimate still sees the singularity
    S = M.tolil()
    S[1, :] = S[0, :]
    S = sp.csc_matrix(S)
    norm = float(abs(S).sum(axis=0).max())
    lu = shifted_splu(S, 1e2 * EPS * norm)
    est = inverse_norm_1(lu.solve, lambda v: lu.solve(v, trans="T"), 40)
    assert norm * est > 1e12


def test_non_finite_matrix_is_refused():
    M = _matrix(10, 5)
    M.data[0] = np.nan
    with pytest.raises(FactorizationError, match="non-finite"):
        shifted_splu(M, 1e-12, what="test matrix")
