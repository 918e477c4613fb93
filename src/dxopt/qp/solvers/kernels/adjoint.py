"""Compiled lean backward (numba): the reduced KKT system of the forward's active set, solved by
block elimination and refined, and the gradients of ``(P, q, A, b, G, h)``, one call a problem;
and the same systems from the forward's own factors (:func:`reused_adjoint_rows`, the general
path's dense backward).

Layout as in :mod:`dxopt.qp.solvers.kernels.certify` (``C = [G; A]``, ``upper = [h; b]``). The
formulas are those of :mod:`dxopt.qp.backward.grads` and the refinement rules of
:func:`dxopt.qp.backward.kkt.schur_refine`; ``dependent_tol`` is
:data:`dxopt.qp.certify.tolerances.DEPENDENT_TOL` (passed by the callers).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dxopt.linalg.small import (
    dot,
    matvec,
    schur_complement_rows,
    schur_factor_small,
    schur_solve_indexed,
    schur_solve_small,
)
from dxopt.qp.certify.tolerances import EVALUATION_ROUNDOFF, REFINE_ROUNDOFF
from dxopt.qp.solvers.kernels.certify import (
    kernel_jit,
    kernel_jit_sums,
    point_accuracy,
    split_point,
)

__all__ = [
    "ADJOINT_STATUS",
    "gradients_into",
    "lean_adjoint",
    "reused_adjoint_rows",
    "reused_solve",
]

ADJOINT_STATUS = ("ok", "ambiguous", "factorization", "dependent", "residual")
"""What :func:`lean_adjoint`'s status code means: 0 solved; otherwise the general path
decides (an active set that is not unambiguous, ``P``'s Cholesky factorization failed, a
row dependent on the others, a refined residual above the bound)."""


@kernel_jit
def lean_adjoint(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    duals: np.ndarray,
    working: np.ndarray,
    g_inf: np.ndarray,
    g: np.ndarray,
    r_ineq: np.ndarray,
    r_eq: np.ndarray,
    settings: np.ndarray,
    needs: np.ndarray,
    gP: np.ndarray,
    gq: np.ndarray,
    gA: np.ndarray,
    gb: np.ndarray,
    gG: np.ndarray,
    gh: np.ndarray,
) -> tuple[int, float, int, int, float]:
    """``(status, residual, steps, k, accuracy)``: the lean backward of one problem
    (:func:`dxopt.qp.lean.small_backward.small_backward`) at the certified point ``x``, ``duals``,
    ``working`` (as for :func:`certify_point`). The active set is the forward's when
    unambiguous (:func:`active_accuracy`); the reduced KKT system
    :math:`[[P, C_J^\\top], [C_J, 0]][u; w] = [g; r]` (:math:`C_J` the working rows of ``G``
    and all of ``A``) is solved by block elimination (:func:`schur_factor_small`), refined
    against the exact matrix with the stopping and best-iterate rules of
    :func:`dxopt.qp.backward.kkt.schur_refine`, and turned into the gradients of
    :mod:`dxopt.qp.backward.grads` for ``(P, q, A, b, G, h)``, written into the caller's arrays
    ``gP, ..., gh`` where ``needs[i]`` (whole; untouched unless ``status`` is 0; the others may
    be empty arrays). ``settings = (refinement steps, tolerance, residual bound, dependence
    tolerance, margin floor)``. ``status`` indexes :data:`ADJOINT_STATUS`. (Where the forward
    has factors, :func:`lean_adjoint_batch` reads them in place instead.)"""
    steps_max, tol, max_residual = int(settings[0]), settings[1], settings[2]
    dependent_tol, margin_min = settings[3], settings[4]
    x, mu, nu, working = split_point(x, duals, working, m)
    n, rows = x.shape[0], C.shape[0]
    p = rows - m
    accuracy = point_accuracy(P, q, C, upper, m, x, nu, mu, working, g_inf, margin_min)
    if accuracy < 0.0:
        return 1, 0.0, 0, 0, 0.0
    J = np.flatnonzero(working)
    k = J.shape[0]
    CJ = np.empty((k + p, n))
    r2 = np.empty(k + p)
    for a in range(k):
        CJ[a] = C[J[a]]
        r2[a] = r_ineq[J[a]]
    for a in range(p):
        CJ[k + a] = C[m + a]
        r2[k + a] = r_eq[a]
    info_p, L, Y, _, _, _, LS, pivots, info_s = schur_factor_small(P, CJ, 1e-14)
    if info_p != 0:
        return 2, 0.0, 0, 0, 0.0
    if info_s != 0 or (pivots < dependent_tol).any():
        return 3, 0.0, 0, 0, 0.0
    u, w, rel, steps = _refined_solve(P, CJ, L, Y, LS, g, r2, steps_max, tol)
    if not rel <= max_residual:
        return 4, rel, steps, k, accuracy
    gradients_into(x, mu, nu, working, J, u, w, m, p, needs, gP, gq, gA, gb, gG, gh)
    return 0, rel, steps, k, accuracy


@kernel_jit
def _refined_solve(
    P: np.ndarray,
    CJ: np.ndarray,
    L: np.ndarray,
    Y: np.ndarray,
    LS: np.ndarray,
    g: np.ndarray,
    r2: np.ndarray,
    steps_max: int,
    tol: float,
) -> tuple[np.ndarray, np.ndarray, float, int]:
    """``(u, w, relative residual, steps)``: :math:`[[P, C_J^\\top], [C_J, 0]][u; w] =
    [g; r_2]` by the block elimination's factors (``Y`` the columns :math:`L^{-1}c_j`),
    refined against the exact matrix with the stopping and best-iterate rules of
    :func:`dxopt.qp.backward.kkt.schur_refine`, and stopped once a step leaves the residual at
    the round-off of its evaluation (:func:`_at_roundoff`)."""
    norm = max(math.sqrt(dot(g, g) + dot(r2, r2)), 1e-300)
    u, w = schur_solve_small(L, Y, LS, g, r2)
    r1, rr, rel = _residual(P, CJ, g, r2, u, w, norm)
    steps, best = 0, math.inf
    k = CJ.shape[0]
    while not (steps >= steps_max or rel <= tol or (rel > 0.5 * best and rel < 1e-12)):
        # at round-off after a step (the first solve's residual is the factorization's)
        if steps and _at_roundoff(P, CJ, CJ[:0], k, np.arange(k), g, r2, u, w, r1, rr):
            break
        best = min(best, rel)
        du, dw = schur_solve_small(L, Y, LS, r1, rr)
        new_u, new_w = u + du, w + dw
        new_r1, new_rr, new_rel = _residual(P, CJ, g, r2, new_u, new_w, norm)
        steps += 1
        if new_rel < rel:
            u, w, r1, rr, rel = new_u, new_w, new_r1, new_rr, new_rel
    return u, w, rel, steps


@kernel_jit
def _row(G: np.ndarray, A: np.ndarray, m: int, r: int) -> np.ndarray:
    """Row ``r`` of ``[G; A]``."""
    return G[r] if r < m else A[r - m]


@kernel_jit
def reused_adjoint_rows(
    P: np.ndarray,
    G: np.ndarray,
    A: np.ndarray,
    used: np.ndarray,
    g: np.ndarray,
    grad_ineq: np.ndarray,
    grad_eq: np.ndarray,
    ok: np.ndarray,
    L_given: np.ndarray,
    Y_given: np.ndarray,
    order_given: np.ndarray,
    LW_given: np.ndarray,
    lapack: Any,
    steps_max: int,
    tol: float,
    dependent_tol: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(status, u, w_ineq, w_eq, residual, steps)`` of the general path's reduced KKT
    systems from the forward's factors, for the used inequality rows ``used`` (S, m) and every
    equality row: ``P`` (1 or S, n, n), ``G`` (1 or S, m, n), ``A`` (1 or S, p, n) (shared
    with one entry), cotangents ``g`` (S, n), ``grad_ineq`` (S, m), ``grad_eq`` (S, p), and per
    sample the Cholesky factor ``L_given`` of ``P``, the rows :math:`L^{-1}c_r` of ``[G; A]``
    (``Y_given`` (S, m + p, n)), its final working set and factor (``order_given``,
    ``LW_given``: :mod:`dxopt.qp.solvers.dual_active_set`). The Schur complement of the used rows is
    the forward's when they are its working set, else formed from their rows
    (:func:`dxopt.linalg.small.schur_complement_rows`); its squared pivots are tested against
    ``dependent_tol`` (status 3 below it, 2 when its factorization fails) and the system is
    solved and refined as the lean backward does (the stopping and best-iterate rules of
    :func:`dxopt.qp.backward.kkt.schur_refine`), the rows read in place (no copies)."""
    S, n = g.shape
    m, p = used.shape[1], grad_eq.shape[1]
    status = np.zeros(S, np.int64)
    steps = np.zeros(S, np.int64)
    residual = np.zeros(S)
    u_out, w_ineq, w_eq = np.zeros((S, n)), np.zeros((S, m)), np.zeros((S, p))
    for i in range(S):
        if not ok[i]:
            continue
        Pi = P[i if P.shape[0] > 1 else 0]
        Gi = G[i if G.shape[0] > 1 else 0]
        Ai = A[i if A.shape[0] > 1 else 0]
        J = np.flatnonzero(used[i])
        rows_sel = np.empty(J.shape[0] + p, np.int64)
        rows_sel[: J.shape[0]] = J
        rows_sel[J.shape[0] :] = np.arange(m, m + p)
        r2 = np.empty(rows_sel.shape[0])
        for a in range(rows_sel.shape[0]):
            r = rows_sel[a]
            r2[a] = grad_ineq[i, r] if r < m else grad_eq[i, r - m]
        status[i], u, w, residual[i], steps[i] = reused_solve(
            Pi, Gi, Ai, m, rows_sel, g[i], r2, L_given[i], Y_given[i], order_given[i],
            LW_given[i], lapack, steps_max, tol, dependent_tol,
        )  # fmt: skip
        if status[i]:
            continue
        u_out[i] = u
        for a in range(rows_sel.shape[0]):
            r = rows_sel[a]
            if r < m:
                w_ineq[i, r] = w[a]
            else:
                w_eq[i, r - m] = w[a]
    return status, u_out, w_ineq, w_eq, residual, steps


@kernel_jit
def reused_solve(
    P: np.ndarray,
    G: np.ndarray,
    A: np.ndarray,
    m: int,
    rows_sel: np.ndarray,
    g: np.ndarray,
    r2: np.ndarray,
    L: np.ndarray,
    Y_all: np.ndarray,
    order: np.ndarray,
    LW: np.ndarray,
    lapack: Any,
    steps_max: int,
    tol: float,
    dependent_tol: float,
) -> tuple[int, np.ndarray, np.ndarray, float, int]:
    """``(status, u, w, residual, steps)``: one sample of :func:`reused_adjoint_rows`, the
    reduced KKT system of the rows ``rows_sel`` of ``[G; A]`` (right-hand side ``g``, ``r2``
    in ``rows_sel``'s order; ``w`` comes back in that order) from the forward's factors, the
    rows read in place (status 2: the Schur complement's factorization failed, 3: a pivot
    below ``dependent_tol``), refined as :func:`_refined_solve` refines."""
    n, k = L.shape[0], rows_sel.shape[0]
    count = 0
    while count < order.shape[0] and order[count] >= 0:
        count += 1
    where = np.full(Y_all.shape[0], -1, np.int64)  # position of a row in rows_sel
    for a in range(k):
        where[rows_sel[a]] = a
    same = count == k
    for j in range(count if same else 0):
        if where[order[j]] < 0:
            same = False
            break
    if same:  # the working set's factor, in its order
        rows = order[:k].copy()
        LS = LW
        pivots = np.empty(k)
        for j in range(k):
            y = Y_all[rows[j]]
            pivots[j] = LS[j, j] * LS[j, j] / max(dot(y, y), 1e-300)
        info = 0
    else:
        rows = rows_sel
        Yt = np.empty((k, n))
        for a in range(k):
            Yt[a] = Y_all[rows[a]]
        LS, pivots, info = schur_complement_rows(Yt, 1e-14, lapack)
    if info != 0:
        return 2, np.zeros(0), np.zeros(0), 0.0, 0
    if (pivots < dependent_tol).any():
        return 3, np.zeros(0), np.zeros(0), 0.0, 0
    rhs = np.empty(k)  # r2 in the order of rows
    for a in range(k):
        rhs[a] = r2[where[rows[a]]]
    norm = max(math.sqrt(dot(g, g) + dot(rhs, rhs)), 1e-300)
    u, w = schur_solve_indexed(L, Y_all, rows, LS, g, rhs)
    r1, rr, rel = _residual_rows(P, G, A, m, rows, g, rhs, u, w, norm)
    done, best = 0, math.inf
    while not (done >= steps_max or rel <= tol or (rel > 0.5 * best and rel < 1e-12)):
        # at round-off after a step (the first solve's residual is the factorization's)
        if done and _at_roundoff(P, G, A, m, rows, g, rhs, u, w, r1, rr):
            break
        best = min(best, rel)
        du, dw = schur_solve_indexed(L, Y_all, rows, LS, r1, rr)
        new_u, new_w = u + du, w + dw
        new_r1, new_rr, new_rel = _residual_rows(P, G, A, m, rows, g, rhs, new_u, new_w, norm)
        done += 1
        if new_rel < rel:
            u, w, r1, rr, rel = new_u, new_w, new_r1, new_rr, new_rel
    w_sel = np.empty(k)
    for a in range(k):
        w_sel[where[rows[a]]] = w[a]
    return 0, u, w_sel, rel, done


@kernel_jit_sums
def _residual_rows(
    P: np.ndarray,
    G: np.ndarray,
    A: np.ndarray,
    m: int,
    rows: np.ndarray,
    r1: np.ndarray,
    r2: np.ndarray,
    u: np.ndarray,
    w: np.ndarray,
    norm: float,
) -> tuple[np.ndarray, np.ndarray, float]:
    """:func:`_residual` with the rows :math:`c_j` of ``[G; A]`` read in place."""
    a = r1 - matvec(P, u)
    b = r2.copy()
    for j in range(rows.shape[0]):
        c = _row(G, A, m, rows[j])
        f = w[j]
        s = 0.0
        for i in range(u.shape[0]):
            a[i] -= f * c[i]
            s += c[i] * u[i]
        b[j] -= s
    return a, b, math.sqrt(dot(a, a) + dot(b, b)) / norm


@kernel_jit_sums
def _at_roundoff(
    P: np.ndarray,
    G: np.ndarray,
    A: np.ndarray,
    m: int,
    rows: np.ndarray,
    r1: np.ndarray,
    r2: np.ndarray,
    u: np.ndarray,
    w: np.ndarray,
    res1: np.ndarray,
    res2: np.ndarray,
) -> bool:
    """Whether the residual ``(res1, res2)`` of :math:`K[u; w] = [r_1; r_2]`
    (:math:`K = [[P, C^\\top], [C, 0]]`, the rows :math:`c_j` of ``[G; A]`` read in place as in
    :func:`_residual_rows`) is at the round-off of its own evaluation: its componentwise
    backward error (Oettli & Prager, Numer. Math. 6, 1964; LAPACK's refinement stops on it,
    Arioli, Demmel & Duff, SIAM J. Matrix Anal. Appl. 10, 1989) is within
    ``REFINE_ROUNDOFF`` units of round-off, :math:`|r_i| \\le c\\,(|b| + |K||z|)_i` for every
    component (no division: a component whose magnitudes all vanish passes only with a zero
    residual). A refinement step there only moves round-off, whatever the relative residual
    (for an ill-conditioned :math:`P`, where :math:`|P||u| \\gg |r_1|`, that one stays above the
    stall test's :math:`10^{-12}`)."""
    n, k = u.shape[0], rows.shape[0]
    bound = REFINE_ROUNDOFF * EVALUATION_ROUNDOFF
    a = np.abs(r1)
    for i in range(n):
        s = 0.0
        for j in range(n):
            s += abs(P[i, j] * u[j])
        a[i] += s
    for j in range(k):
        c = _row(G, A, m, rows[j])
        f = abs(w[j])
        s = 0.0
        for i in range(n):
            t = abs(c[i])
            a[i] += f * t
            s += t * abs(u[i])
        if not abs(res2[j]) <= bound * (abs(r2[j]) + s):
            return False
    for i in range(n):  # noqa: SIM110 (numba: a loop, no generator)
        if not abs(res1[i]) <= bound * a[i]:
            return False
    return True


@kernel_jit
def _residual(
    P: np.ndarray,
    C: np.ndarray,
    r1: np.ndarray,
    r2: np.ndarray,
    u: np.ndarray,
    w: np.ndarray,
    norm: float,
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(r1 - P u - C^T w, r2 - C u, relative norm)`` (:func:`_residual_rows` on every row
    of ``C``)."""
    k = C.shape[0]
    return _residual_rows(P, C, C[:0], k, np.arange(k), r1, r2, u, w, norm)


@kernel_jit
def gradients_into(
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    working: np.ndarray,
    J: np.ndarray,
    u: np.ndarray,
    w: np.ndarray,
    m: int,
    p: int,
    needs: np.ndarray,
    gP: np.ndarray,
    gq: np.ndarray,
    gA: np.ndarray,
    gb: np.ndarray,
    gG: np.ndarray,
    gh: np.ndarray,
) -> None:
    """The formulas of :mod:`dxopt.qp.backward.grads` for one sample, written into the caller's
    arrays (those ``needs`` asks for): :math:`\\bar P = -\\tfrac12(ux^\\top + xu^\\top)`,
    :math:`\\bar q = -u`, :math:`\\bar A = -(\\mu u^\\top + w_Ex^\\top)`, :math:`\\bar b =
    w_E`, :math:`\\bar G = -(\\operatorname{diag}(\\nu_J)u^\\top + w_Jx^\\top)` on the working
    rows, :math:`\\bar h = w_J` (zero elsewhere); ``w``: the working rows' multipliers in
    ``J``'s order, then the equality rows'."""
    n, k = x.shape[0], J.shape[0]
    if needs[0]:
        for i in range(n):
            for j in range(n):
                gP[i, j] = -0.5 * (u[i] * x[j] + x[i] * u[j])
    if needs[1]:
        for j in range(n):
            gq[j] = -u[j]
    if p and needs[2]:
        for r in range(p):
            for j in range(n):
                gA[r, j] = -(mu[r] * u[j] + w[k + r] * x[j])
    if p and needs[3]:
        for r in range(p):
            gb[r] = w[k + r]
    if m and (needs[4] or needs[5]):
        wG = np.zeros(m)
        for a in range(k):
            wG[J[a]] = w[a]
        if needs[4]:
            for r in range(m):
                f = nu[r] if working[r] else 0.0
                for j in range(n):
                    gG[r, j] = -(f * u[j] + wG[r] * x[j])
        if needs[5]:
            gh[:] = wG
