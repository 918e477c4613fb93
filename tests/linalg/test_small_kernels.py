"""The compiled kernels of dxopt.linalg.small against numpy/scipy references: Cholesky
factorization (and where it stops), triangular solves, and the block elimination with its
row-dependence pivots (duplicate, scaled and zero rows)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from dxopt.linalg import small_schur
from dxopt.linalg.small import (
    MATVEC_BLAS,
    cholesky_lower,
    dot,
    gram_rows,
    lapack_kernels,
    lower_solve,
    lower_transpose_solve,
    matvec,
    schur_factor_small,
    schur_solve_small,
)


def _spd(n: int, rng: np.random.Generator, scale: float = 0.0) -> np.ndarray:
    """A random SPD matrix; ``scale`` > 0 spreads its diagonal over 10^(+-scale)."""
    M = rng.standard_normal((n, n))
    A = M @ M.T + n * np.eye(n)
    if scale:
        d = 10.0 ** rng.uniform(-scale, scale, n)
        A = d[:, None] * A * d[None, :]
    return A


@pytest.mark.parametrize("n", [1, 2, 5, 10, 33, 64])
@pytest.mark.parametrize("scale", [0.0, 8.0])
def test_cholesky_matches_lapack(n, scale):
    rng = np.random.default_rng(n)
    A = _spd(n, rng, scale)
    L, info = cholesky_lower(A)
    assert info == 0
    ref = np.linalg.cholesky(A)
    assert np.allclose(L, ref, rtol=1e-10, atol=0), np.abs(L - ref).max()
    assert np.array_equal(np.triu(L, 1), np.zeros((n, n)))  # a clean lower factor
    # backward error relative to the diagonal scaling (Higham, theorem 10.3)
    d = np.sqrt(np.diag(A))
    assert np.abs((L @ L.T - A) / np.outer(d, d)).max() < 1e-13


def test_cholesky_reads_only_the_lower_triangle():
    A = _spd(6, np.random.default_rng(0))
    B = A.copy()
    B[np.triu_indices(6, 1)] = 1e300  # garbage above the diagonal
    assert np.array_equal(cholesky_lower(B)[0], cholesky_lower(A)[0])


@pytest.mark.parametrize(
    ("matrix", "info"),
    [
        (np.diag([1.0, 2.0, -1.0]), 3),  # indefinite: stops at the third pivot
        (np.zeros((3, 3)), 1),
        (np.array([[1.0, 1.0], [1.0, 1.0]]), 2),  # singular PSD: the second pivot is 0
        (np.array([[np.nan, 0.0], [0.0, 1.0]]), 1),
        (np.array([[1.0, 0.0], [0.0, np.inf]]), 2),
    ],
)
def test_cholesky_reports_the_first_bad_pivot(matrix, info):
    assert cholesky_lower(matrix)[1] == info


@pytest.mark.parametrize(("n", "r"), [(1, 1), (7, 3), (64, 40)])
def test_triangular_solves(n, r):
    rng = np.random.default_rng(n + r)
    L = np.linalg.cholesky(_spd(n, rng))
    B = rng.standard_normal((n, r))
    np.testing.assert_allclose(
        lower_solve(L, B), solve_triangular(L, B, lower=True), rtol=1e-12, atol=1e-14
    )
    b = rng.standard_normal(n)
    np.testing.assert_allclose(
        lower_transpose_solve(L, b),
        solve_triangular(L, b, lower=True, trans="T"),
        rtol=1e-12,
        atol=1e-14,
    )


def _kkt(P: np.ndarray, C: np.ndarray) -> np.ndarray:
    k = C.shape[0]
    return np.block([[P, C.T], [C, np.zeros((k, k))]])


@pytest.mark.parametrize(("n", "k"), [(1, 0), (5, 0), (5, 3), (10, 10), (40, 25), (64, 64)])
def test_block_elimination_solves_the_saddle_point_system(n, k):
    rng = np.random.default_rng(10 * n + k)
    P, C = _spd(n, rng), rng.standard_normal((k, n))
    info_p, L, Y, S, inv_scale, nonzero, LS, pivots, info_s = schur_factor_small(P, C, 1e-14)
    assert info_p == 0 and info_s == 0
    np.testing.assert_allclose(L @ Y, C.T, rtol=1e-10, atol=1e-10)
    Sref = C @ np.linalg.solve(P, C.T)
    np.testing.assert_allclose(np.tril(LS @ LS.T), np.tril(S), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.diag(S), np.diag(Sref) * (1 + 1e-14), rtol=1e-9)
    np.testing.assert_allclose(inv_scale, 1 / np.sqrt(np.diag(Sref)), rtol=1e-9)
    assert nonzero.all() and ((pivots > 0) & (pivots <= 1 + 1e-12)).all()
    r1, r2 = rng.standard_normal(n), rng.standard_normal(k)
    u, w = schur_solve_small(L, Y, LS, r1, r2)
    ref = np.linalg.solve(_kkt(P, C), np.concatenate([r1, r2]))
    cond = np.linalg.cond(_kkt(P, C))
    err = np.abs(np.concatenate([u, w]) - ref).max() / np.abs(ref).max()
    assert err < 1e-14 * cond, (err, cond)


@pytest.mark.parametrize("factor", [1.0, 1e8, -1e-8])
def test_a_dependent_row_has_a_zero_pivot_whatever_its_scale(factor):
    rng = np.random.default_rng(3)
    P = _spd(8, rng)
    C = rng.standard_normal((4, 8))
    C = np.vstack([C, factor * (C[0] - 2.0 * C[2])])  # row 4 in the span of rows 0 and 2
    small = small_schur(P, C)
    assert small is not None
    assert small.dependent(1e-10) >= 1
    assert small.pivots[4] < 1e-10 and (small.pivots[:4] > 1e-3).all()


def test_a_zero_row_gets_a_unit_pivot_and_no_dependence():
    rng = np.random.default_rng(4)
    P = _spd(6, rng)
    C = rng.standard_normal((3, 6))
    C[1] = 0.0
    small = small_schur(P, C)
    assert small is not None
    assert not small.nonzero[1] and small.nonzero[[0, 2]].all()
    assert small.pivots[1] == pytest.approx(1.0) and small.dependent(1e-10) == 0
    r2 = np.array([1.0, 2.0, 3.0])
    u, w = small.solve(np.ones(6), r2)
    assert w[1] == pytest.approx(-2.0)  # the zero row's equation 0 = r2 is the caller's check
    np.testing.assert_allclose(C[[0, 2]] @ u, r2[[0, 2]], rtol=1e-12)  # the others hold
    np.testing.assert_allclose(P @ u + C.T @ w, np.ones(6), rtol=1e-12, atol=1e-12)


def test_small_schur_declines_a_matrix_that_is_not_positive_definite():
    assert small_schur(-np.eye(3), np.ones((1, 3))) is None
    P = np.diag([1.0, 0.0, 1.0])
    assert small_schur(P, np.ones((1, 3))) is None


@pytest.mark.parametrize(("rows", "n"), [(0, 3), (1, 1), (7, 50), (50, 50), (200, 120)])
def test_dot_matvec_and_gram_rows_against_numpy(rows, n):
    """The compiled products on both sides of their BLAS thresholds (``matvec`` from
    :data:`MATVEC_BLAS` entries, ``gram_rows`` from ``BLAS_GRAM``), including badly scaled
    entries (1e-150 .. 1e150): the same values as numpy's to round-off."""
    rng = np.random.default_rng(rows + n)
    M = rng.standard_normal((rows, n)) * 10.0 ** rng.uniform(-150, 150, (rows, 1))
    v = rng.standard_normal(n)
    assert (rows * n >= MATVEC_BLAS) == ((rows, n) == (200, 120))  # one case above it
    ref = M @ v
    got = matvec(M, v)
    scale = np.abs(M) @ np.abs(v)
    assert got.shape == (rows,)
    assert np.all(np.abs(got - ref) <= 1e-13 * scale + 1e-300)
    for r in range(rows):
        assert abs(dot(M[r], v) - ref[r]) <= 1e-13 * scale[r] + 1e-300
    assert dot(v[:0], v[:0]) == 0.0
    Y = rng.standard_normal((min(rows, 40), n))
    S = gram_rows(Y, lapack_kernels())
    ref_S = np.tril(Y @ Y.T)
    np.testing.assert_allclose(np.tril(S), ref_S, rtol=1e-12, atol=1e-12 * n)
