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
    "SaddleSolveInfo",
    "lstsq_saddle",
    "saddle_matrix",
    "saddle_solve",
    "splu",
]

_DENSE_LIMIT = 3000  # lstsq_saddle: SVD-based dense solve up to this size, LSMR beyond


class FactorizationError(DxoptError):
    """A factorization failed (the matrix is numerically singular)."""


def splu(M: Any, *, what: str = "matrix") -> spla.SuperLU:
    """SuperLU factor of a square scipy sparse matrix (converted to CSC).

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
    for _ in range(rounds):
        S = (sp.diags(d) @ K @ sp.diags(d)) if sp.issparse(K) else d[:, None] * K * d[None, :]
        if sp.issparse(S):
            row = np.asarray(abs(S).max(axis=1).todense()).ravel()
        else:
            row = np.abs(S).max(1)
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


def lstsq_saddle(P: Any, C: Any, rhs: np.ndarray) -> tuple[np.ndarray, float]:
    """Minimum-norm least-squares solution :math:`z = K^+ r` of the saddle-point system.

    Dense SVD-based ``lstsq`` up to 3000 unknowns, LSMR (Fong & Saunders, SIAM J. Sci. Comput.
    33(5), 2011; from zero it converges to the minimum-norm least-squares solution) beyond.
    Returns ``(z, rel)`` with ``rel`` the relative residual of the normal equations
    :math:`\\|K(Kz - r)\\|/(\\|K\\|_F \\|r\\|)` (small: ``z`` is a least-squares solution).
    """
    K = saddle_matrix(P, C)
    N = K.shape[0]
    if N <= _DENSE_LIMIT:
        Kd = K.toarray() if sp.issparse(K) else K
        z = np.linalg.lstsq(Kd, rhs, rcond=1e-12)[0]
        norm_k = float(np.linalg.norm(Kd))
    else:
        Ks = sp.csr_matrix(K)
        z = spla.lsmr(Ks, rhs, atol=1e-15, btol=1e-15, maxiter=20 * N)[0]
        norm_k = float(spla.norm(Ks))
    normal = K @ (K @ z - rhs)
    rel = float(np.linalg.norm(normal)) / max(norm_k**2 * float(np.linalg.norm(rhs)), 1e-300)
    return z, rel
