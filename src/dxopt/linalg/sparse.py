"""Factorizations of (possibly singular) symmetric saddle-point systems, dense or scipy sparse.

The system is :math:`K z = r` with :math:`K = [[P, C^\\top], [C, 0]]`, :math:`P \\succeq 0`
(``n x n``) and constraint rows :math:`C` (``k x n``). ``K`` is singular when the rows of
``C`` are linearly dependent or when ``P`` is singular on :math:`\\ker C`. The quasi-definite
regularisation

.. math:: K_\\delta = [[P + \\delta_P I, C^\\top], [C, -\\delta I]]

is nonsingular for any :math:`\\delta_P, \\delta > 0` (Vanderbei, SIAM J. Optim. 5(1), 1995),
so it always factors (LU with partial pivoting: SuperLU for sparse, LAPACK for dense). Iterative
refinement against the exact ``K``, :math:`z \\leftarrow z + K_\\delta^{-1}(r - Kz)`, is the
proximal-point method on the KKT operator in the metric :math:`\\mathrm{diag}(\\delta_P I,
\\delta I)` (Rockafellar, SIAM J. Control Optim. 14(5), 1976): on a consistent system it
converges to the solution nearest to the start :math:`z_0` in that metric (from
:math:`z_0 = 0`: the minimum-norm one), and it stalls on an inconsistent system. The relative
residual :math:`\\|r - Kz\\|/\\|r\\|` is always recomputed and returned, so callers refuse an
unconverged answer instead of using it.

:func:`splu` is the one SuperLU wrapper: it maps SuperLU's ``RuntimeError`` ("Factor is
exactly singular") to :class:`FactorizationError`. :func:`lstsq_saddle` is the rank-revealing
fallback: the minimum-norm least-squares solution (Moore-Penrose) of ``K z = r``.

:func:`unit_rows` and :func:`kkt_factor` serve constraint blocks made mostly of *unit rows*
(one nonzero entry, such as the bound rows :math:`\\pm e_j^\\top x \\le h_j`). With the
columns permuted so that the distinct unit rows :math:`s_j e_j^\\top` (columns :math:`U`) come
first and :math:`F` the remaining columns, the other rows are :math:`[X, R]` and

.. math:: C = \\begin{bmatrix} D & 0 \\\\ X & R \\end{bmatrix},\\quad
    \\operatorname{rank} C = |U| + \\operatorname{rank} R

(block elimination with the diagonal :math:`D = \\mathrm{diag}(s)`). So the rows of ``C`` are
independent iff :math:`R` has full row rank, and the saddle-point system is solved exactly by
eliminating the unit rows: :math:`u_U = D^{-1}r_{2,U}`, then the reduced system
:math:`[[P_{FF}, R^\\top], [R, 0]][u_F; w_O] = [r_1 - Pu^0; r_{2,O} - Cu^0]_{F,O}`
(:math:`u^0` is :math:`u_U` padded with zeros), then
:math:`w_U = D^{-1}(r_1 - Pu - C_O^\\top w_O)_U`. The reduced matrix is
:math:`(|F| + |O|)`-square instead of :math:`(n + k)`-square; it is singular iff ``K`` is
(given the unit rows are distinct).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from dxopt._core import DxoptError

__all__ = [
    "FactorizationError",
    "KKTFactor",
    "SaddleSolveInfo",
    "UnitRows",
    "kkt_factor",
    "lstsq_saddle",
    "saddle_matrix",
    "saddle_solve",
    "splu",
    "take_rows",
    "unit_rows",
]

_KKT_DELTA = 1e-10  # KKTFactor: regularisation relative to the equilibrated matrix
_KKT_STEPS = 30  # KKTFactor: refinement steps at most
_KKT_SINGULAR = 1e-10  # KKTFactor: a probe refined no further than this means singular
_DENSE_LIMIT = 3000  # lstsq_saddle: SVD-based dense solve up to this size, LSMR beyond
_DIAGONAL_STEPS = 20  # _diagonal_saddle: most refinement steps
_DIAGONAL_LIMIT = 1e-10  # _diagonal_saddle: largest accepted relative residual ||Kz - r||/||r||
_LSMR_CHUNK = 500  # lstsq_saddle: fewest LSMR iterations between two convergence checks
_LSMR_STALL = 0.99  # lstsq_saddle: two chunks in a row lowering the normal residual < 1% stall


class FactorizationError(DxoptError):
    """A factorization failed (the matrix is numerically singular)."""


def splu(M: Any, *, what: str = "matrix") -> spla.SuperLU:
    """SuperLU factor of a square scipy sparse matrix (converted to CSC).

    Only for matrices nonsingular by construction (quasi-definite, or shifted): on an exactly
    singular matrix SuperLU can read uninitialised memory and crash the process instead of
    raising, so every caller in dxopt passes a regularised matrix and refines against the
    exact one (:class:`KKTFactor`, :func:`saddle_solve`).

    Raises:
        FactorizationError: SuperLU found the matrix exactly singular; the message names
            ``what``.
    """
    try:
        return spla.splu(sp.csc_matrix(M))
    except RuntimeError as err:
        raise FactorizationError(f"sparse LU of the {what} failed: {err}") from err


@dataclass(frozen=True)
class SaddleSolveInfo:
    """How :func:`saddle_solve` went.

    Attributes:
        residual: final relative residual :math:`\\|r - Kz\\|_2/\\|r\\|_2` against the exact K.
        steps: refinement steps taken.
        delta: the regularisation :math:`\\delta` (and :math:`\\delta_P`) used.
        converged: ``residual <= tol``.
    """

    residual: float
    steps: int
    delta: float
    converged: bool


def _is_sparse(*mats: Any) -> bool:
    return any(sp.issparse(M) for M in mats)


def saddle_matrix(P: Any, C: Any, delta_p: float = 0.0, delta: float = 0.0) -> Any:
    """:math:`[[P + \\delta_P I, C^\\top], [C, -\\delta I]]` (scipy CSC if any input is sparse,
    else a dense numpy array)."""
    n, k = P.shape[0], C.shape[0]
    if _is_sparse(P, C):
        P_ = sp.csc_matrix(P) + delta_p * sp.identity(n, format="csc") if delta_p else P
        C_ = sp.csc_matrix(C)
        lower = -delta * sp.identity(k, format="csc") if k else None
        if k == 0:
            return sp.csc_matrix(P_)
        return sp.bmat([[P_, C_.T], [C_, lower]], format="csc")
    K = np.zeros((n + k, n + k))
    K[:n, :n] = P
    K[:n, :n][np.diag_indices(n)] += delta_p
    if k:
        K[n:, :n] = C
        K[:n, n:] = np.asarray(C).T
        K[n:, n:][np.diag_indices(k)] = -delta
    return K


def equilibrate(K: Any, *, rounds: int = 8) -> np.ndarray:
    """Symmetric Ruiz equilibration of a symmetric matrix: ``d`` with every row of
    :math:`DKD` (``D = diag(d)``) of largest entry close to 1 (Ruiz, "A scaling algorithm to
    equilibrate both rows and columns norms in matrices", RAL-TR-2001-034; OSQP scales its
    KKT matrix the same way). All-zero rows keep the factor 1."""
    d = np.ones(K.shape[0])
    if sp.issparse(K):  # row maxima of |d_i K_ij d_j| straight from the CSR arrays
        Kc = sp.csr_matrix(K)
        absdata, cols = np.abs(Kc.data), Kc.indices
        row_of = np.repeat(np.arange(Kc.shape[0]), np.diff(Kc.indptr))
        filled = np.flatnonzero(np.diff(Kc.indptr) > 0)  # reduceat needs nonempty segments
        starts = Kc.indptr[filled]
    for _ in range(rounds):
        if sp.issparse(K):
            row = np.zeros(K.shape[0])
            if filled.size:
                row[filled] = np.maximum.reduceat(absdata * d[cols] * d[row_of], starts)
        else:
            row = np.abs(d[:, None] * K * d[None, :]).max(1)
        row = np.where(row > 0, row, 1.0)
        if np.all(np.abs(row - 1.0) < 0.1):
            break
        d = d / np.sqrt(row)
    return d


def saddle_solve(
    P: Any,
    C: Any,
    rhs: np.ndarray,
    *,
    z0: np.ndarray | None = None,
    relative_delta: float = 1e-8,
    max_steps: int = 30,
    tol: float = 1e-13,
) -> tuple[np.ndarray, SaddleSolveInfo]:
    """Solve :math:`[[P, C^\\top], [C, 0]] z = r` by a regularised factorization plus refinement.

    The system is first equilibrated, :math:`\\hat K = DKD` with :func:`equilibrate`, so that
    blocks of very different size (``P`` of order 1e6 next to rows of ``C`` of order 1) neither
    make the regularisation dominate one block nor let one block's residual hide the other's;
    the regularised matrix :math:`\\hat K + \\mathrm{diag}(\\delta I, -\\delta I)` is factored
    and refined against :math:`\\hat K` (the proximal-point iteration on the KKT operator: from a
    point of a consistent singular system it converges to the nearest solution in the scaled
    metric), and :math:`z = D\\hat z`.

    Args:
        P: ``(n, n)`` symmetric PSD (numpy or scipy sparse).
        C: ``(k, n)`` constraint rows (``k`` may be 0).
        rhs: ``(n + k,)``.
        z0: starting point of the refinement (default 0: the limit is the minimum-norm
            solution of a consistent singular system, in the scaled metric).
        relative_delta: :math:`\\delta` = this times the largest entry of the equilibrated
            matrix (about 1). Round-off in the null-space part of the answer grows like
            :math:`u/\\delta`, the refinement's rate on a nearly singular system like
            :math:`\\delta/(\\delta + \\sigma)`: 1e-8 keeps the first below 1e-8 relative.
        max_steps: refinement steps at most.
        tol: target relative residual of the equilibrated system; refinement also stops once
            it stalls.

    Returns:
        ``(z, info)``; check ``info.converged`` (or ``info.residual``, the relative residual
        :math:`\\|D(r - Kz)\\| / \\|Dr\\|`) before using ``z``.
    """
    n, k = P.shape[0], C.shape[0]
    K = saddle_matrix(P, C)
    d = equilibrate(K)
    if sp.issparse(K):
        Dm = sp.diags(d)
        Ks = sp.csc_matrix(Dm @ K @ Dm)
    else:
        Ks = d[:, None] * K * d[None, :]
    delta = relative_delta * max(float(abs(Ks).max()) if Ks.shape[0] else 0.0, 1e-300)
    reg = np.concatenate([np.full(n, delta), np.full(k, -delta)])
    if sp.issparse(Ks):
        solve = splu(Ks + sp.diags(reg, format="csc"), what="regularised KKT matrix").solve
    else:
        lu = sla.lu_factor(Ks + np.diag(reg), check_finite=False)

        def solve(v: np.ndarray) -> np.ndarray:
            return sla.lu_solve(lu, v, check_finite=False)

    rhs_s = d * rhs
    y = np.zeros(n + k) if z0 is None else np.asarray(z0, dtype=np.float64) / d
    norm = max(float(np.linalg.norm(rhs_s)), 1e-300)
    steps = 0
    r = rhs_s - Ks @ y
    rel = float(np.linalg.norm(r)) / norm
    while steps < max_steps and rel > tol:
        # an inconsistent singular system (an unbounded LP's polish) makes the step blow up:
        # that is the divergence test below, not a numpy warning on every call
        with np.errstate(over="ignore", invalid="ignore"):
            y_new = y + solve(r)
            r_new = rhs_s - Ks @ y_new
            rel_new = float(np.linalg.norm(r_new)) / norm
        steps += 1
        if not np.isfinite(rel_new) or rel_new > rel:  # diverging or round-off level
            break
        y, r = y_new, r_new
        stalled = rel_new > 0.9 * rel
        rel = rel_new
        if stalled and rel < 1e-10:
            break
    return d * y, SaddleSolveInfo(residual=rel, steps=steps, delta=delta, converged=rel <= tol)


def _diagonal_saddle(P: Any, C: Any, rhs: np.ndarray, K: sp.csr_matrix) -> np.ndarray | None:
    """:math:`K^{-1}r` for a positive diagonal :math:`P = D` and rows :math:`C` of full rank
    (Maros-Meszaros LISWET: :math:`P = I`), by the seminormal equations
    :math:`CD^{-1}C^\\top y = CD^{-1}r_1 - r_2`, :math:`u = D^{-1}(r_1 - C^\\top y)` (SuperLU
    of the sparse :math:`CD^{-1}C^\\top`) with iterative refinement against :math:`K`
    (Björck, *Numerical Methods for Least Squares Problems*, SIAM 1996, section 6.6: the
    corrected seminormal equations converge while :math:`\\kappa(C)^2\\varepsilon < 1`).
    ``None`` where it does not apply (``P`` not a positive diagonal, the factorization
    fails) or the refined relative residual :math:`\\|Kz - r\\|/\\|r\\|` stays above
    ``_DIAGONAL_LIMIT`` (LISWET2: it stalls at 5e-12, round-off of :math:`\\|C^\\top y\\|`
    with :math:`\\kappa(C)^2 \\approx 10^{14}`); then LSMR decides."""
    Ps = sp.csr_matrix(P)
    n = Ps.shape[0]
    d = Ps.diagonal()
    Cs = sp.csr_matrix(C)
    if Cs.shape[0] == 0 or not bool((d > 0).all()) or (Ps - sp.diags(d)).count_nonzero():
        return None
    inv_d = 1.0 / d
    try:
        lu = spla.splu(sp.csc_matrix(Cs @ sp.diags(inv_d) @ Cs.T))
    except RuntimeError:
        return None
    rhs_norm = max(float(np.linalg.norm(rhs)), 1e-300)
    z, r = np.zeros_like(rhs), rhs.copy()
    best = np.inf
    for _ in range(_DIAGONAL_STEPS):
        y = lu.solve(Cs @ (inv_d * r[:n]) - r[n:])
        z = z + np.concatenate([inv_d * (r[:n] - Cs.T @ y), y])
        r = rhs - K @ z
        rel = float(np.linalg.norm(r)) / rhs_norm
        if not np.isfinite(rel) or rel > 0.5 * best:
            break
        best = rel
        if rel <= 1e-14:
            break
    return z if best <= _DIAGONAL_LIMIT else None


def lstsq_saddle(
    P: Any, C: Any, rhs: np.ndarray, *, target: float = 1e-9
) -> tuple[np.ndarray, float]:
    """Minimum-norm least-squares solution :math:`z = K^+ r` of the saddle-point system.

    Dense SVD-based ``lstsq`` up to 3000 unknowns, LSMR (Fong & Saunders, SIAM J. Sci. Comput.
    33(5), 2011; from zero it converges to the minimum-norm least-squares solution) beyond.
    Returns ``(z, rel)`` with ``rel`` the relative residual of the normal equations
    :math:`\\|K(Kz - r)\\|/(\\|K\\|_F^2 \\|r\\|)` (small: ``z`` is a least-squares solution).

    A positive diagonal :math:`P` with rows of full rank (:math:`K` nonsingular) is solved
    first by the corrected seminormal equations (:func:`_diagonal_saddle`), accepted when its
    ``rel <= target``. LSMR runs in chunks of ``max(500, N/20)`` iterations, each warm-started
    from the last (the correction of a restart is again the minimum-norm one, in the range of
    :math:`K`, so the sum stays :math:`K^+ r`), and stops at LSMR's own convergence test
    (``atol = btol = 1e-15``), at ``rel <= target``, once two chunks in a row lower
    ``rel`` by less than 1% each (LSMR's :math:`\\|K^\\top(Kz - r)\\|` decreases monotonically,
    so a flat chunk means a stall: at that rate the target is many times :math:`N`
    iterations away), or at :math:`20N` iterations. A stalled solve returns its ``rel`` for
    the caller to refuse. Maros-Meszaros LISWET2 (:math:`P = I`, :math:`\\sigma_{\\min}(C)^2
    \\approx 10^{-14}`): LSMR ran 400,000 iterations (78 s) to a residual
    :math:`\\|Kz - r\\|/\\|r\\|` of 2e-4; the seminormal path takes 0.01 s to 2e-12.
    """
    K = saddle_matrix(P, C)
    N = K.shape[0]
    rhs_norm = max(float(np.linalg.norm(rhs)), 1e-300)
    if N <= _DENSE_LIMIT:
        Kd = K.toarray() if sp.issparse(K) else K
        z = np.linalg.lstsq(Kd, rhs, rcond=1e-12)[0]
        norm_k = float(np.linalg.norm(Kd))
        normal = K @ (K @ z - rhs)
        return z, float(np.linalg.norm(normal)) / max(norm_k**2 * rhs_norm, 1e-300)
    Ks = sp.csr_matrix(K)
    norm_k2 = max(float(spla.norm(Ks)) ** 2, 1e-300)
    exact = _diagonal_saddle(P, C, rhs, Ks)
    if exact is not None:
        z = exact
        rel = float(np.linalg.norm(Ks @ (Ks @ z - rhs))) / (norm_k2 * rhs_norm)
        if rel <= target:
            return z, rel
    chunk = max(_LSMR_CHUNK, N // 20)
    z = np.zeros(N)
    rel, done, flat = float("inf"), 0, 0
    while done < 20 * N:
        out = spla.lsmr(Ks, rhs, atol=1e-15, btol=1e-15, maxiter=chunk, x0=z if done else None)
        z, iterations = out[0], int(out[2])
        done += chunk
        new = float(np.linalg.norm(Ks @ (Ks @ z - rhs))) / (norm_k2 * rhs_norm)
        flat = flat + 1 if new > _LSMR_STALL * rel else 0
        rel = min(rel, new)
        # converged by LSMR's own test, at the caller's target, or two flat chunks in a row
        if iterations < chunk or rel <= target or flat >= 2:
            break
    return z, rel


@dataclass(frozen=True)
class UnitRows:
    """The split of :func:`unit_rows`: rows ``unit`` of ``C`` are :math:`s_j e_j^\\top` with
    distinct columns ``cols`` (``vals`` = :math:`s_j`), ``other`` are the remaining rows (in
    order; a second unit row on a taken column is one of them), ``free`` the columns not in
    ``cols`` (ascending) and ``R`` the rows ``other`` restricted to ``free`` (CSR);
    ``norms`` are the Euclidean norms of all rows of ``C``."""

    unit: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    other: np.ndarray
    free: np.ndarray
    R: sp.csr_matrix
    norms: np.ndarray


def _gather(
    M: sp.csr_matrix, rows: np.ndarray, where: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """COO triplets (new row, new column, value) of ``M[rows]`` with the columns mapped by
    ``where`` (-1: dropped; ``None``: kept as they are); one pass over the nonzeros."""
    counts = np.diff(M.indptr)[rows]
    starts = M.indptr[rows]
    take = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    row_of = np.repeat(np.arange(rows.size), counts)
    if where is None:
        return row_of, M.indices[take], M.data[take]
    new_cols = where[M.indices[take]]
    mask = new_cols >= 0
    return row_of[mask], new_cols[mask], M.data[take][mask]


def _csr(row: np.ndarray, col: np.ndarray, data: np.ndarray, shape: tuple[int, int]) -> Any:
    """CSR from COO triplets whose rows are already sorted (no duplicates)."""
    indptr = np.zeros(shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=shape[0]), out=indptr[1:])
    return sp.csr_matrix((data, col, indptr), shape=shape)


def take_rows(M: Any, rows: np.ndarray, extra: Any = None) -> sp.csr_matrix:
    """``M[rows]`` of a CSR matrix, with the rows of the CSR matrix ``extra`` appended, as
    one CSR matrix (no scipy fancy indexing or stacking)."""
    r, c, d = _gather(M, rows, None)
    k = rows.size
    if extra is not None and extra.shape[0]:
        rows_e = np.repeat(np.arange(extra.shape[0]), np.diff(extra.indptr))
        r, c = np.concatenate([r, rows_e + k]), np.concatenate([c, extra.indices])
        d = np.concatenate([d, extra.data])
        k += extra.shape[0]
    return _csr(r, c, d, (k, M.shape[1]))


def unit_rows(C: Any) -> UnitRows:
    """Split the rows of the scipy matrix ``C`` (``k x n``) into distinct unit rows and the
    rest (module docstring); explicit zeros do not count as entries."""
    C = C if isinstance(C, sp.csr_matrix) else sp.csr_matrix(C)
    k, n = C.shape
    nz = C.data != 0
    row_of = np.repeat(np.arange(k), np.diff(C.indptr))
    nnz = np.bincount(row_of[nz], minlength=k)
    norms = np.sqrt(np.bincount(row_of, weights=C.data * C.data, minlength=k))
    entry = np.flatnonzero(nz & (nnz == 1)[row_of])  # the one nonzero of each single row
    cols_all = C.indices[entry]
    _, first = np.unique(cols_all, return_index=True)  # first unit row of each column
    first.sort()
    entry = entry[first]
    unit, cols, vals = row_of[entry], C.indices[entry], C.data[entry]
    is_unit = np.zeros(k, dtype=bool)
    is_unit[unit] = True
    other = np.flatnonzero(~is_unit)
    where = np.zeros(n, dtype=np.int64)
    where[cols] = -1
    free = np.flatnonzero(where == 0)
    where[free] = np.arange(free.size)
    R = _csr(*_gather(C, other, where), (other.size, free.size))
    return UnitRows(unit, cols, vals, other, free, R, norms)


class KKTFactor:
    """Factorization of :math:`K = [[P, C^\\top], [C, 0]]` (scipy sparse ``P`` and ``C``) by
    eliminating the unit rows of ``C`` (module docstring) and SuperLU of the regularised
    reduced matrix, refined to the exact solve (:meth:`_factor`). ``split`` is
    :func:`unit_rows` of ``C`` when the caller has it.

    Raises:
        FactorizationError: the reduced matrix (so ``K``) is exactly singular.
    """

    def __init__(self, P: Any, C: Any, split: UnitRows | None = None) -> None:
        self.P = P if isinstance(P, sp.csr_matrix) else sp.csr_matrix(P)
        self.C = C if isinstance(C, sp.csr_matrix) else sp.csr_matrix(C)
        self.n, self.k = self.P.shape[0], self.C.shape[0]
        s = unit_rows(self.C) if split is None else split
        self.split = s
        where = np.full(self.n, -1, dtype=np.int64)
        where[s.free] = np.arange(s.free.size)
        p_row, p_col, p_data = _gather(self.P, s.free, where)
        nf = s.free.size
        r_row = np.repeat(np.arange(s.R.shape[0]), np.diff(s.R.indptr)) + nf
        rows = np.concatenate([p_row, r_row, s.R.indices])
        cols = np.concatenate([p_col, s.R.indices, r_row])
        data = np.concatenate([p_data, s.R.data, s.R.data])
        size = nf + s.other.size
        self.lu: spla.SuperLU | None = None
        if size:
            M = sp.csc_matrix((data, (rows, cols)), shape=(size, size))
            self._factor(M, nf)

    def _factor(self, M: sp.csc_matrix, nf: int) -> None:
        """SuperLU of the equilibrated, quasi-definitely regularised reduced matrix
        :math:`\\hat M + \\mathrm{diag}(\\delta I, -\\delta I)`, never of ``M`` itself: on an
        exactly singular matrix SuperLU can read uninitialised memory and crash the process
        (seen on Maros-Meszaros QSHARE1B and QSC205). The regularised matrix is nonsingular
        for every :math:`\\delta > 0` (Vanderbei, SIAM J. Optim. 5(1), 1995); solves refine
        against the exact ``M`` (:meth:`_solve_reduced`), and a random right-hand side whose
        refinement stalls shows that ``M`` is singular (or too close to it to refine)."""
        d = equilibrate(M)
        Dm = sp.diags(d)
        Ms = sp.csc_matrix(Dm @ M @ Dm)
        delta = _KKT_DELTA * max(float(abs(Ms).max()) if Ms.nnz else 0.0, 1e-300)
        reg = np.concatenate([np.full(nf, delta), np.full(M.shape[0] - nf, -delta)])
        self.lu = splu(Ms + sp.diags(reg, format="csc"), what="regularised reduced KKT matrix")
        self._Ms, self._d = Ms, d
        probe = np.random.default_rng(0).standard_normal(M.shape[0])
        if self._refine(probe)[1] > _KKT_SINGULAR:
            raise FactorizationError(
                "sparse LU of the reduced KKT matrix failed: it is singular (iterative "
                "refinement of its regularised factor stalls)"
            )

    def _refine(self, b: np.ndarray) -> tuple[np.ndarray, float]:
        """``(y, relative residual)`` for :math:`\\hat M y = b` (scaled space)."""
        assert self.lu is not None
        norm = max(float(np.linalg.norm(b)), 1e-300)
        y = self.lu.solve(b)
        rel = np.inf
        for _ in range(_KKT_STEPS):
            r = b - self._Ms @ y
            new = float(np.linalg.norm(r)) / norm
            if not np.isfinite(new) or new > 0.5 * rel:  # stalled, diverging or round-off
                rel = min(rel, new) if np.isfinite(new) else rel
                break
            rel = new
            if rel <= 1e-15:
                break
            y = y + self.lu.solve(r)
        return y, rel

    def _solve_reduced(self, b: np.ndarray) -> np.ndarray:
        y, _ = self._refine(self._d * b)
        return self._d * y

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        """:math:`z = K^{-1}r`, ``rhs`` of length ``n + k`` (``[u; w]`` in the row order of
        ``C``)."""
        n, s = self.n, self.split
        r1, r2 = rhs[:n], rhs[n:]
        u = np.zeros(n)
        w = np.zeros(self.k)
        u[s.cols] = r2[s.unit] / s.vals
        if self.lu is not None:
            b1 = r1 - self.P @ u
            b2 = r2[s.other] - (self.C @ u)[s.other]
            z = self._solve_reduced(np.concatenate([b1[s.free], b2]))
            u[s.free] = z[: s.free.size]
            w[s.other] = z[s.free.size :]
        if s.unit.size:  # w is still zero on the unit rows: C^T w = C_O^T w_O
            t = r1 - self.P @ u - self.C.T @ w
            w[s.unit] = t[s.cols] / s.vals
        return np.concatenate([u, w])


def kkt_factor(P: Any, C: Any, split: UnitRows | None = None) -> KKTFactor:
    """:class:`KKTFactor` of :math:`[[P, C^\\top], [C, 0]]`."""
    return KKTFactor(P, C, split)
