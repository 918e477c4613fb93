"""A compiled dual active-set solver for batches of small dense QPs, whose factors the
lean backward reuses.

For one problem in daqp's layout (``P`` (n, n) positive definite, ``q``, rows
``C = [G; A]`` with right-hand sides ``upper = [h; b]``, the first ``m`` rows inequalities
:math:`Gx \\le h`, the rest equalities :math:`Ax = b`), with :math:`P = LL^\\top`,
:math:`v = L^{-1}q`, :math:`y_r = L^{-1}c_r` and :math:`u = L^\\top x + v`, the QP is the
least-distance problem (Goldfarb & Idnani, Math. Programming 27, 1983; Arnström, Bemporad &
Axehill, IEEE TAC 67, 2022, the method of daqp)

.. math:: \\min_u \\tfrac12\\|u\\|^2 \\quad\\text{s.t.}\\quad y_r^\\top u \\le d_r\\ (r < m),
    \\qquad y_r^\\top u = d_r\\ (r \\ge m), \\qquad d_r = \\text{upper}_r + y_r^\\top v,

whose constraint values equal the QP's (:math:`y_r^\\top u - d_r = c_r^\\top x -
\\text{upper}_r`) and whose multipliers are the QP's (:math:`u + Y_W\\lambda_W = 0` is
:math:`Px + q + C_W^\\top\\lambda_W = 0`). Its dual, :math:`\\min_\\lambda
\\tfrac12\\lambda^\\top Y^\\top Y\\lambda + d^\\top\\lambda` with :math:`\\lambda_r \\ge 0` for
the inequalities, is solved by a primal active-set method on the working set :math:`W`
(equalities first, then one violated inequality at a time): with the Cholesky factor of
:math:`S_W = Y_W^\\top Y_W`, updated by one row on each addition and by a rank-one update on
each removal (Golub & Van Loan, *Matrix Computations*, 4th ed., 6.5.4), the subspace minimiser
is :math:`\\lambda^\\star = -S_W^{-1}d_W`; when it keeps every inequality multiplier
non-negative it is taken, :math:`u = -Y_W\\lambda^\\star`, and the most violated inequality
(above ``primal_tol``) joins :math:`W`; otherwise the step towards it stops at the first
multiplier to reach zero and that row leaves :math:`W`. Every sample is independent.

On large problems (:math:`mn \\ge 2^{18}`, where one scan of the inequality rows no longer
fits the caches) the joining row is chosen by partial pricing: between full scans only the
:math:`m/16` rows that were most violated at the last full scan are tried, and the most
violated of them joins if it is at least half as violated as the last full scan's worst row;
otherwise a full scan chooses (and refreshes the candidates). The method stops only after a
full scan finds no row violated above ``primal_tol``. Any violated row may join (the dual
objective rises all the same); the half rule keeps the joins near the most violated ones,
without which the removals, and the iterations, doubled on some problems. At n=2000, m=3000
the full scans were half the solve's time. The equality rows join first, all at
once (LAPACK ``dpotrf`` on :math:`Y_E^\\top Y_E`, the same pivot test as one by one).

A violated row that is a combination :math:`y_r = Y_Wa` of the working rows cannot join
as it is: its multiplier rises by :math:`t` while the set's fall by :math:`ta`, which leaves
:math:`u` and the other multipliers' signs alone until the first inequality multiplier with
:math:`a_j > 0` reaches zero; that row leaves :math:`W` and the new one joins (no such row:
the dual is unbounded and the QP infeasible; Goldfarb & Idnani's partial step).

A sample it does not solve returns a non-zero status and the caller solves it otherwise
(daqp): ``P`` not positive definite, an equality row dependent on the others, a certificate
of infeasibility, or more than ``max_iter`` working-set changes. What it returns is not
trusted either: the caller certifies every point
(:func:`dxopt.qp.solvers.kernels.batch.certify_batch`).

**Warm starts.** The method is a primal active-set method on the dual, which converges from
any dual-feasible start whose support lies in the working set. A warm working set (a previous
solve's, ``warm``) joins after the equalities through the same :func:`_add` (a row dependent on
those before it is skipped) with zero multipliers, a dual-feasible start; the first subspace
minimiser then either keeps every inequality multiplier non-negative (a correct guess: no
working-set change is left but the joins the problem still needs) or removes, at step length
zero, the rows whose multipliers it would turn negative, one at a time. A wrong guess costs
those removals, never the answer: the point is the same unique minimiser (``P`` positive
definite), and the caller certifies it as a cold one (and solves cold again when a warm solve
fails, :func:`dxopt.qp.solvers.kernels.batch.forward_batch`). ``iterations`` counts the changes
made after the warm rows joined.

The factors :math:`L` (LAPACK ``dpotrf``) and :math:`Y = L^{-1}C^\\top` (BLAS ``dtrsm``) are
what the block elimination of :func:`dxopt.linalg.small.schur_factor_small` starts from, so
the lean backward takes them instead of factoring ``P`` again.

**Reused factors.** With ``factored`` the caller hands in :math:`L` and :math:`Y` of this very
``P`` and ``C`` (a parametric QP, as in an MPC loop, changes only ``q`` and the right-hand
sides between calls; Ferreau, Bock & Diehl, "An online active set strategy to overcome the
limitations of explicit MPC", Int. J. Robust Nonlinear Control 18, 2008): the solve then
costs :math:`O(n^2 + rows\\cdot n)` for :math:`v` and :math:`d` plus its working-set changes,
instead of the :math:`O(n^3/3 + rows\\cdot n^2/2)` of the factors, which are the same for a
warm or a cold start and otherwise the larger part of a warm solve.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from dxopt.linalg.small import (
    cholesky_lapack,
    dot,
    gram_rows,
    lower_solve_inplace,
    lower_solve_rows_lapack,
    lower_transpose_solve_inplace,
    schur_solve_rows,
)
from dxopt.qp.certify.tolerances import DAS_DEPENDENT, DAS_REFINE_STEPS

__all__ = ["NOT_CERTIFIED", "SOLVE_STATUS", "solve_batch", "solve_one"]

_jit: Any = njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})

SOLVE_STATUS = (
    "solved",
    "factorization",
    "dependent equality",
    "infeasible",
    "iterations",
    "not certified",
)
"""What :func:`solve_batch`'s status code means: 0 solved; otherwise the caller solves the
sample another way (``"not certified"``, :data:`NOT_CERTIFIED`: set by
:func:`dxopt.qp.solvers.kernels.batch.forward_batch` for a point whose certificate fails)."""
NOT_CERTIFIED = 5

_EQ_GRAM = 2048  # p^2 n from which the equality rows join through their Gram matrix


@_jit
def _add(Yt: np.ndarray, W: np.ndarray, LW: np.ndarray, k: int, r: int) -> bool:
    """Append row ``r`` to the working set ``W[:k]`` and the factor ``LW`` of
    :math:`S_W`; ``False`` when it is dependent on the set (``LW[k, :k]`` then holds
    :math:`L_W^{-1}Y_W^\\top y_r`, nothing else changed)."""
    y = Yt[r]
    norm2 = dot(y, y)
    piv2 = norm2
    for j in range(k):
        s = dot(Yt[W[j]], y)
        for c in range(j):
            s -= LW[j, c] * LW[k, c]
        s /= LW[j, j]
        LW[k, j] = s
        piv2 -= s * s
    if k >= y.shape[0] or not piv2 > DAS_DEPENDENT * norm2:  # n rows span everything
        return False
    LW[k, k] = math.sqrt(piv2)
    W[k] = r
    return True


@_jit
def _add_equalities(
    Yt: np.ndarray, W: np.ndarray, LW: np.ndarray, member: np.ndarray, m: int, lapack: Any
) -> int:
    """The equality rows ``m:`` of ``Yt`` as the first working rows (``W``, ``member`` and the
    factor ``LW`` of their :math:`S_W`); their count, or -1 when one is dependent on those
    before it (the pivot test of :func:`_add`). From :data:`_EQ_GRAM` on (:math:`p^2n`): their
    Gram matrix (:func:`dxopt.linalg.small.gram_rows`) and one LAPACK ``dpotrf``, the same
    pivots as adding them one by one (25 rows of n = 50: 3.0 against 4.4 us; below, the
    call costs more than it saves)."""
    rows, n = Yt.shape
    p = rows - m
    if p > n:
        return -1
    if p * p * n < _EQ_GRAM:
        for k in range(p):
            if not _add(Yt, W, LW, k, m + k):
                return -1
            member[m + k] = True
        return p
    S = gram_rows(Yt[m:], lapack)
    norm2 = np.diag(S).copy()
    if cholesky_lapack(S, lapack[0]) != 0:
        return -1
    for j in range(p):
        if not S[j, j] * S[j, j] > DAS_DEPENDENT * norm2[j]:
            return -1
        W[j] = m + j
        member[m + j] = True
        LW[j, : j + 1] = S[j, : j + 1]
    return p


@_jit
def _remove(W: np.ndarray, LW: np.ndarray, lam: np.ndarray, k: int, j: int) -> None:
    """Remove position ``j`` from ``W[:k]``, ``lam`` and the factor ``LW`` (the trailing
    block absorbs the removed column by a rank-one update)."""
    w = LW[j + 1 : k, j].copy()
    for a in range(j + 1, k):
        for b in range(j):
            LW[a - 1, b] = LW[a, b]
        for b in range(j + 1, a + 1):
            LW[a - 1, b - 1] = LW[a, b]
        W[a - 1] = W[a]
        lam[a - 1] = lam[a]
    t = k - j - 1
    for i in range(t):
        ii = j + i
        d = LW[ii, ii]
        r = math.hypot(d, w[i])
        c, s = r / d, w[i] / d
        LW[ii, ii] = r
        for a in range(i + 1, t):
            aa = j + a
            LW[aa, ii] = (LW[aa, ii] + s * w[a]) / c
            w[a] = c * w[a] - s * LW[aa, ii]


@_jit
def _subspace_minimiser(
    LW: np.ndarray, d: np.ndarray, W: np.ndarray, k: int, t: np.ndarray
) -> np.ndarray:
    """:math:`\\lambda^\\star = -S_W^{-1}d_W` from the factor of :math:`S_W`, in ``t[:k]``
    (a view of it comes back; one buffer for every iteration)."""
    for j in range(k):
        t[j] = -d[W[j]]
    lower_solve_inplace(LW, t, k)
    lower_transpose_solve_inplace(LW, t, k)
    return t[:k]


_PRICING_MIN = 1 << 18  # m * n from which partial pricing runs (a scan beyond the caches)
_PRICING_FRACTION = 16  # the candidates: the m / 16 most violated rows of the last full scan
_PRICING_MIN_KEEP = 16
_PRICING_RATIO = 0.5  # a candidate joins only if at least half as violated as at that scan

_REFINE_MIN_ROWS = 64  # for working sets above this size (smaller: accurate already)


@_jit
def _refine(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    L: np.ndarray,
    Yt: np.ndarray,
    W: np.ndarray,
    LW: np.ndarray,
    k: int,
    x: np.ndarray,
    lam: np.ndarray,
) -> None:
    """In place: ``x`` and the working set's multipliers ``lam`` refined by up to
    :data:`DAS_REFINE_STEPS` Newton steps on :math:`Px + q + C_W^\\top\\lambda_W = 0`,
    :math:`C_Wx = \\text{upper}_W` with the factors at hand (iterative refinement: the
    multipliers come from a factor of :math:`S_W` updated row by row, whose error grows with
    the working set; the steps bring the point to the accuracy of one solve). A step that would
    turn an inequality multiplier negative, or not reduce the residual, is not taken."""
    n = x.shape[0]
    YW = np.empty((k, n))
    CW = np.empty((k, n))
    for j in range(k):
        YW[j] = Yt[W[j]]
        CW[j] = C[W[j]]
    r1 = P @ x + q + CW.T @ lam[:k]
    r2 = CW @ x - upper[W[:k]]
    norm = math.sqrt(r1 @ r1 + r2 @ r2)
    for _ in range(DAS_REFINE_STEPS):
        if norm == 0.0:
            return
        dx, dlam = schur_solve_rows(L, YW, LW, -r1, -r2)
        new_x = x + dx
        new_lam = lam[:k] + dlam
        for j in range(k):
            if W[j] < m and not new_lam[j] > 0.0:
                return
        r1 = P @ new_x + q + CW.T @ new_lam
        r2 = CW @ new_x - upper[W[:k]]
        new_norm = math.sqrt(r1 @ r1 + r2 @ r2)
        if not new_norm < norm:
            return
        x[:] = new_x
        lam[:k] = new_lam
        norm = new_norm


@_jit
def solve_one(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    primal_tol: float,
    max_iter: int,
    lapack: Any,
    x_out: np.ndarray,
    duals_out: np.ndarray,
    L: np.ndarray,
    Yt: np.ndarray,
    order_out: np.ndarray,
    LW_out: np.ndarray,
    warm: np.ndarray,
    factored: bool,
) -> tuple[int, int]:
    """``(status, iterations)`` of one problem (module docstring), started from the
    inequality rows of ``warm`` (int64 row indices, ``-1`` or the end closing the list; see
    *Warm starts* in the module docstring); writes ``x``, the
    multipliers of every row (zero off the working set), ``L``, the rows
    :math:`y_r = L^{-1}c_r` of ``Yt``, the final working set in its order (``order_out``, -1
    after it) and the Cholesky factor of its :math:`S_W` (``LW_out``, (w, w) with
    ``w = min(n, rows) + 1``: its lower triangle's leading block; the solver works in it, so
    on a non-zero status it holds no factor). ``factored``: ``L`` and ``Yt`` hold these factors
    of this ``P`` and ``C`` already (*Reused factors* in the module docstring), read, not
    written."""
    n, rows = P.shape[0], C.shape[0]
    order_out[:] = -1
    if not factored:
        L[:] = P
        if cholesky_lapack(L, lapack[0]) != 0:
            return 1, 0
        Yt[:] = C
        lower_solve_rows_lapack(L, Yt, lapack[1])
    v = q.copy()
    lower_solve_inplace(L, v, n)
    d = np.empty(rows)
    for r in range(rows):
        d[r] = upper[r] + dot(Yt[r], v)
    cap = min(n, rows)
    W = np.zeros(cap + 1, np.int64)
    # the caller's array is the working factor (only its lower triangle's leading block is
    # read, each entry after it is written): no per-sample copy, a fifth of the batch's bytes
    LW = LW_out
    lam = np.zeros(cap + 1)
    star_buffer = np.empty(cap + 1)
    member = np.zeros(rows, np.bool_)
    k = _add_equalities(Yt, W, LW, member, m, lapack)
    if k < 0:
        return 2, 0
    for r in warm:  # a warm working set: its independent inequality rows, multipliers zero
        if r < 0:
            break
        if r < m and not member[r] and _add(Yt, W, LW, k, r):
            member[r] = True
            lam[k] = 0.0
            k += 1
    u = np.zeros(n)
    iterations = 0
    # partial pricing on large problems: between full scans of the m inequality rows, only
    # the most violated rows of the last full scan are tried
    pricing = m * n >= _PRICING_MIN
    n_keep = max(_PRICING_MIN_KEEP, m // _PRICING_FRACTION)
    cand = np.empty(n_keep if pricing else 0, np.int64)
    n_cand = 0
    full_worst = math.inf
    scan = np.empty(m if pricing else 0)
    while True:
        star = _subspace_minimiser(LW, d, W, k, star_buffer)
        alpha, block = 1.0, -1
        for j in range(k):
            if W[j] < m and star[j] < 0.0:
                a = lam[j] / (lam[j] - star[j])
                if a < alpha:
                    alpha, block = a, j
        if block < 0:
            lam[:k] = star
            u[:] = 0.0
            for j in range(k):
                f = lam[j]
                y = Yt[W[j]]
                for i in range(n):
                    u[i] -= f * y[i]
            worst, join = primal_tol, -1
            for c in range(n_cand):  # the candidates first (partial pricing)
                r = cand[c]
                if not member[r]:
                    viol = dot(Yt[r], u) - d[r]
                    if viol > worst:
                        worst, join = viol, r
            if join >= 0 and worst < _PRICING_RATIO * full_worst:
                worst, join = primal_tol, -1  # much less violated than at the last full scan
            if join < 0:  # every inequality row, and the most violated become candidates
                for r in range(m):
                    viol = -math.inf
                    if not member[r]:
                        viol = dot(Yt[r], u) - d[r]
                        if viol > worst:
                            worst, join = viol, r
                    if pricing:
                        scan[r] = viol
                if join < 0:
                    break
                if pricing:
                    full_worst = worst
                    n_cand = 0
                    for c, r in enumerate(np.argsort(scan)[::-1][:n_keep]):
                        if not scan[r] > primal_tol:
                            break
                        cand[c] = r
                        n_cand = c + 1
            if iterations >= max_iter:
                return 4, iterations
            start = 0.0
            while not _add(Yt, W, LW, k, join):
                # y_join = Y_W a: raising its multiplier by t and lowering the set's by t a
                # leaves u alone and lowers the dual objective by t (violation); the first
                # inequality multiplier to reach zero leaves the set (none: infeasible)
                a = LW[k, :k].copy()
                lower_transpose_solve_inplace(LW, a, k)
                t, block = math.inf, -1
                for j in range(k):
                    if W[j] < m and a[j] > 0.0 and lam[j] / a[j] < t:
                        t, block = lam[j] / a[j], j
                if block < 0:
                    return 3, iterations
                for j in range(k):
                    lam[j] -= t * a[j]
                start += t
                member[W[block]] = False
                _remove(W, LW, lam, k, block)
                k -= 1
                iterations += 1
                if iterations > max_iter:
                    return 4, iterations
            member[join] = True
            lam[k] = start
            k += 1
        else:
            if iterations >= max_iter:
                return 4, iterations
            for j in range(k):
                lam[j] += alpha * (star[j] - lam[j])
            member[W[block]] = False
            _remove(W, LW, lam, k, block)
            k -= 1
        iterations += 1
    for i in range(n):
        x_out[i] = u[i] - v[i]
    lower_transpose_solve_inplace(L, x_out, n)  # x = L^{-T}(u - v)
    if k > _REFINE_MIN_ROWS:
        _refine(P, q, C, upper, m, L, Yt, W, LW, k, x_out, lam)
    duals_out[:] = 0.0
    order_out[:] = -1
    for j in range(k):
        duals_out[W[j]] = lam[j]
        order_out[j] = W[j]
    return 0, iterations


@_jit
def solve_batch(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    primal_tol: float,
    max_iter: int,
    lapack: Any,
    X: np.ndarray,
    duals: np.ndarray,
    L: np.ndarray,
    Yt: np.ndarray,
    order: np.ndarray,
    LW: np.ndarray,
    warm: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``(status, iterations)`` per sample of the batch ``P`` (B, n, n), ``q`` (B, n), ``C``
    (B, rows, n), ``upper`` (B, rows) in daqp's layout (:data:`SOLVE_STATUS`; working-set
    changes); writes each sample's point ``X`` (B, n), multipliers ``duals`` (B, rows) of
    ``[G; A]`` (daqp's sign convention, :math:`Px + q + C^\\top\\lambda = 0`), Cholesky factor
    ``L`` (B, n, n) of ``P``, :math:`Y^\\top = (L^{-1}C^\\top)^\\top` (B, rows, n), the
    final working set in its order (``order`` (B, w), -1 after it; ``w = min(n, rows) + 1``)
    and the lower Cholesky factor of its :math:`S_W` (``LW`` (B, w, w)), which the backward
    takes when its active set is the working set. ``warm`` (B, k) int64: each sample's warm
    working set for :func:`solve_one` (``(B, 0)``: cold). ``lapack``:
    :func:`dxopt.linalg.small.lapack_kernels`."""
    B = q.shape[0]
    status = np.zeros(B, np.int64)
    iterations = np.zeros(B, np.int64)
    for i in range(B):
        status[i], iterations[i] = solve_one(
            P[i], q[i], C[i], upper[i], m, primal_tol, max_iter, lapack, X[i], duals[i], L[i],
            Yt[i], order[i], LW[i], warm[i], False,
        )  # fmt: skip
    return status, iterations
