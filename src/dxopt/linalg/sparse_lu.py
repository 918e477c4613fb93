"""Refined solves with a sparse LU of a general (nonsymmetric) square matrix.

:func:`shifted_splu` factors :math:`M + \\delta E` (SuperLU, scipy's ``splu``) with
:math:`E` the identity on the first ``size`` diagonal entries: a small shift keeps SuperLU
off exactly singular matrices (on which it can read uninitialised memory instead of
raising, :func:`dxopt.linalg.sparse.splu`) and adds a diagonal entry to an all-zero row.
The shifted factor is only a preconditioner: :func:`refine` runs iterative refinement
:math:`z \\leftarrow z + \\tilde M^{-1}(r - Mz)` against the exact operator until the relative
residual

.. math:: \\rho = \\frac{\\Vert r - Mz\\Vert_\\infty}{\\Vert M\\Vert_\\infty \\Vert z\\Vert_\\infty
    + \\Vert r\\Vert_\\infty}

reaches the caller's target or stops falling (it contracts by about
:math:`\\delta \\Vert\\tilde M^{-1}\\Vert` per round: at once on a well-conditioned matrix, not
at all on a singular one), and returns :math:`\\rho` for the caller to accept or refuse.
:func:`inverse_norm_1` estimates :math:`\\Vert M^{-1}\\Vert_1` from the factor (Hager, 1984;
Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, sec. 15.3),
for a condition estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from dxopt.linalg.sparse import FactorizationError

__all__ = ["RefinedSolve", "inverse_norm_1", "refine", "shifted_splu"]

Solve = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class RefinedSolve:
    """The result of :func:`refine`: the solution, its relative residual :math:`\\rho` (module
    doc; ``inf`` where non-finite) and the refinement rounds taken."""

    z: np.ndarray
    residual: float
    steps: int


def shifted_splu(
    M: sp.spmatrix,
    shift: float,
    *,
    size: int | None = None,
    what: str = "matrix",
    permc_spec: str = "COLAMD",
) -> spla.SuperLU:
    """SuperLU of :math:`M + \\delta E` (module doc), ``E`` the identity on the first
    ``size`` (default: all) diagonal entries. ``permc_spec`` is SuperLU's column ordering
    (``"MMD_AT_PLUS_A"`` for a matrix of nearly symmetric pattern, such as a KKT matrix).

    Raises:
        FactorizationError: SuperLU still found the shifted matrix singular or it has a
            non-finite entry; the message names ``what``.
    """
    N = M.shape[0]
    k = N if size is None else size
    E = sp.diags(np.concatenate([np.full(k, shift), np.zeros(N - k)]), format="csc")
    S = sp.csc_matrix(M + E)
    if not np.isfinite(S.data).all():
        raise FactorizationError(f"sparse LU of the {what} failed: a non-finite entry")
    try:
        return spla.splu(S, permc_spec=permc_spec)
    except RuntimeError as err:
        raise FactorizationError(f"sparse LU of the {what} failed: {err}") from err


def _relres(r: np.ndarray, Mz: np.ndarray, z: np.ndarray, norm: float) -> float:
    res = float(np.abs(r - Mz).max(initial=0.0))
    scale = norm * float(np.abs(z).max(initial=0.0)) + float(np.abs(r).max(initial=0.0))
    out = res / scale if scale > 0 else res
    return out if np.isfinite(out) else float("inf")


def refine(
    solve: Solve,
    apply: Solve,
    r: np.ndarray,
    *,
    norm: float,
    target: float,
    max_steps: int = 6,
) -> RefinedSolve:
    """Solve :math:`Mz = r` with ``solve`` (an approximate inverse: a shifted or nearby
    factor) and refinement against ``apply`` (:math:`v \\mapsto Mv`, exact), stopping once
    :math:`\\rho \\le` ``target`` or a round does not lower it (module doc). ``norm`` is
    :math:`\\Vert M\\Vert_\\infty` (of :math:`M^\\top` when solving the transposed system:
    :math:`\\Vert M\\Vert_1`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        z = solve(r)
        res = _relres(r, apply(z), z, norm)
        steps = 0
        while steps < max_steps and res > target:
            z_new = z + solve(r - apply(z))
            res_new = _relres(r, apply(z_new), z_new, norm)
            steps += 1
            if not res_new < res:
                break
            z, res = z_new, res_new
    return RefinedSolve(z, res, steps)


def _hager(solve: Solve, solve_t: Solve, v: np.ndarray, rounds: int) -> float:
    N = v.size
    est = 0.0
    j_prev = -1
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(rounds):
            y = solve(v)
            if not np.isfinite(y).all():
                return float("inf")
            est = max(est, float(np.abs(y).sum()))
            z = solve_t(np.where(y >= 0, 1.0, -1.0))
            if not np.isfinite(z).all():
                return float("inf")
            j = int(np.abs(z).argmax())
            if j == j_prev:
                break  # the next round would repeat this one
            j_prev = j
            v = np.zeros(N)
            v[j] = 1.0
    return est


def inverse_norm_1(
    solve: Solve, solve_t: Solve, N: int, *, rounds: int = 5, starts: int = 2
) -> float:
    """A lower estimate of :math:`\\Vert M^{-1}\\Vert_1` from ``solve`` (:math:`M^{-1}v`)
    and ``solve_t`` (:math:`M^{-\\top}v`): the largest of Hager's iterations started from
    :math:`e/N` (as :func:`dxopt.conic.kkt.condition_1` does for the dense route) and from
    ``starts`` Gaussian vectors of a fixed seed (deterministic). The random starts matter
    for a (nearly) singular ``M`` whose null vector is orthogonal to :math:`e` (two equal
    rows): there :math:`e/N` alone misses it (and so does a sign vector with equal entries
    at those rows), a Gaussian start does not (with probability 1).
    ``inf`` where a solve is non-finite."""
    rng = np.random.default_rng(0)
    vs = [np.full(N, 1.0 / N)]
    for _ in range(starts):
        g = rng.standard_normal(N)
        vs.append(g / np.abs(g).sum())
    return max(_hager(solve, solve_t, v, rounds) for v in vs)
