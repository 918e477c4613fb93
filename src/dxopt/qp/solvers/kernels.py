"""Compiled kernels of the lean path (:mod:`dxopt.qp.api.small`): the checks before the solve,
the certificate of the solved point, and the whole lean backward, each one numba call.

The data are one problem in daqp's layout: ``P`` (n, n), ``q`` (n,), the constraint rows
``C = [G; A]`` ((m + p), n) with right-hand sides ``upper = [h; b]``, the first ``m`` rows
inequalities :math:`Gx \\le h`, the rest equalities :math:`Ax = b`. The arithmetic is that of
the general path's functions named in each kernel (the same tests, tolerances and formulas);
only the order of floating-point operations differs. Any NaN met where a test is made fails
the test (the caller then takes the general path).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from dxopt.linalg.small import (
    dot,
    matvec,
    schur_complement_rows,
    schur_factor_small,
    schur_solve_indexed,
    schur_solve_small,
)
from dxopt.qp.solvers.dual_active_set import solve_one

__all__ = [
    "ADJOINT_STATUS",
    "certify_batch",
    "certify_point",
    "forward_batch",
    "lean_adjoint",
    "lean_adjoint_batch",
    "prepare",
    "prepare_batch",
    "reused_adjoint_rows",
]

_jit: Any = njit(cache=True, nogil=True)
# kernels whose sums may be reassociated (vectorised; the last bits differ): the active set's
# scales and margins (10x the general path's thresholds), the certificate's and the adjoint's
# residuals (held against tolerances far above round-off; the certificate's loops measured
# 2.9 -> 1.8 us a sample at n = 50, 75 rows)
_jit_sums: Any = njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})

ADJOINT_STATUS = ("ok", "ambiguous", "factorization", "dependent", "residual")
"""What :func:`lean_adjoint`'s status code means: 0 solved; otherwise the general path
decides (an active set that is not unambiguous, ``P``'s Cholesky factorization failed, a
row dependent on the others, a refined residual above the bound)."""


@_jit
def prepare_batch(
    P: np.ndarray,
    q: np.ndarray,
    A: np.ndarray,
    b: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    sym_tol: float,
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    g_inf: np.ndarray,
) -> int:
    """:func:`prepare` for a batch (a leading axis of ``B`` samples on every argument; shared
    data as broadcast views), into the given float64 arrays ``Pn`` (B, n, n), ``qn`` (B, n),
    ``C`` (B, m + p, n), ``upper`` (B, m + p), ``g_inf`` (B, m); returns the first failing
    sample's status (0: all ready)."""
    B = q.shape[0]
    g_inf[:] = 0.0
    for i in range(B):
        status = prepare(
            P[i], q[i], A[i], b[i], G[i], h[i], sym_tol, Pn[i], qn[i], C[i], upper[i], g_inf[i]
        )
        if status:
            return status
    return 0


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def prepare(
    P: np.ndarray,
    q: np.ndarray,
    A: np.ndarray,
    b: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    sym_tol: float,
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    g_inf: np.ndarray,
) -> int:
    """``status``, with float64 copies of the data in daqp's layout and the row max-norms
    :math:`\\|g_i\\|_\\infty` of ``G`` written into the caller's ``Pn`` (n, n), ``qn`` (n,),
    ``C = [G; A]`` (m + p, n), ``upper = [h; b]`` (m + p,) and ``g_inf`` (m,), zero on entry
    (absent constraints: arrays with no rows). ``status``: 0 ready; 1 a NaN or Inf entry; 2
    ``P`` asymmetric beyond ``sym_tol * max(max|P|, 1)``; 3 a zero row of ``G``. (The checks
    of :func:`dxopt.qp.api.small.small_forward`; each failure is the general path's to report.)
    Compiled with reassociation allowed: it only changes the order of the sum whose finiteness
    is the NaN/Inf test (a NaN or Inf entry makes any order of it non-finite) and of
    maxima."""
    n, m, p = P.shape[0], G.shape[0], A.shape[0]
    total = 0.0
    for i in range(n):
        qn[i] = q[i]
        total += qn[i]
        for j in range(n):
            Pn[i, j] = P[i, j]
            total += Pn[i, j]
    for i in range(m):
        upper[i] = h[i]
        total += upper[i]
        for j in range(n):
            C[i, j] = G[i, j]
            total += C[i, j]
    for i in range(p):
        upper[m + i] = b[i]
        total += upper[m + i]
        for j in range(n):
            C[m + i, j] = A[i, j]
            total += C[m + i, j]
    if not math.isfinite(total):  # a NaN or Inf entry (or finite entries summing past it)
        for vector in (Pn.ravel(), qn, C.ravel(), upper):
            if not np.isfinite(vector).all():
                return 1
    big = asym = 0.0
    for i in range(n):
        for j in range(i + 1):
            big = max(big, abs(Pn[i, j]))
            asym = max(asym, abs(Pn[i, j] - Pn[j, i]))
    if asym > sym_tol * max(big, 1.0):  # big: the largest |P_ij| (P symmetric within asym)
        return 2
    for i in range(m):
        r = 0.0
        for j in range(n):
            r = max(r, abs(C[i, j]))
        if r == 0.0:
            return 3
        g_inf[i] = r
    return 0


@_jit
def _point(
    x: np.ndarray, duals: np.ndarray, working: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x, mu, nu, working)`` as float64 arrays from the point ``x`` and the multipliers
    ``duals = [nu; mu]`` of ``[G; A]``. ``working``: the active set; with no entries for
    ``m > 0`` rows (daqp's point) it is read off the multipliers,
    :math:`\\nu = \\max(\\lambda, 0) > 0`."""
    mu = duals[m:].astype(np.float64)
    if working.shape[0] != m:
        nu = np.maximum(duals[:m], 0.0)
        working = nu > 0.0
    else:
        nu = duals[:m].astype(np.float64)
    return np.ascontiguousarray(x).astype(np.float64), mu, nu, working


@_jit
def certify_point(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    duals: np.ndarray,
    working: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    x_out: np.ndarray,
    mu_out: np.ndarray,
    nu_out: np.ndarray,
) -> tuple[bool, float, float]:
    """``(ok, primal, dual)``: the certificate of :func:`_certificate` for the point of
    :func:`_point` (``ok`` and the primal and dual residuals), with copies of the point's
    ``(x, mu, nu)`` written into the caller's ``x_out, mu_out, nu_out``. (Only these come
    back: every array a kernel hands back to Python costs a third of a microsecond, more than
    the caller's allocation; the backward recomputes the rest.)"""
    ok, primal, dual, _, _, _, _, _ = _certified(
        P, q, C, upper, m, x, duals, working, g_inf, eps_abs, rel, roundoff, x_out, mu_out,
        nu_out,
    )  # fmt: skip
    return ok, primal, dual


@_jit
def _certified(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    duals: np.ndarray,
    working: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    x_out: np.ndarray,
    mu_out: np.ndarray,
    nu_out: np.ndarray,
) -> tuple[bool, float, float, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`certify_point`, also handing back (within the kernels) the point ``x``, its
    working set and the certificate's ``slack, nu_inf, eq_residual``."""
    x, mu, nu, working = _point(x, duals, working, m)
    ok, primal, dual, slack, nu_inf, eq_residual = _certificate(
        P, q, C, upper, m, x, mu, nu, working, g_inf, eps_abs, rel, roundoff
    )
    x_out[:] = x
    mu_out[:] = mu
    nu_out[:] = nu
    return ok, primal, dual, x, working, slack, nu_inf, eq_residual


@_jit_sums
def _certificate(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    working: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
) -> tuple[bool, float, float, np.ndarray, np.ndarray, np.ndarray]:
    """``(ok, primal, dual, slack, nu_inf, eq_residual)``: the certificate of
    :func:`dxopt.qp.certify.polish.batch_accept_exact` for one point with an exact active set
    (``working``): the stationarity residual within :math:`\\epsilon_{abs} + \\epsilon_{rel}`
    times the largest term, the equality residual and the inequality violation within theirs,
    no violated row outside the set beyond round-off, and complementarity
    (:math:`\\min(s_i/tol_p, \\nu_i\\|g_i\\|_\\infty/tol_d) \\le 1`). ``slack`` is
    :math:`h - Gx`, ``nu_inf`` :math:`\\nu_i\\|g_i\\|_\\infty`, ``eq_residual`` :math:`Ax - b`;
    ``rel`` is :math:`\\max(\\epsilon_{rel}, \\text{RELATIVE\\_FLOOR})`."""
    n, rows = x.shape[0], C.shape[0]
    p = rows - m
    dual = np.empty(n)
    px_inf = q_inf = 0.0
    for i in range(n):
        s = 0.0
        for j in range(n):
            s += P[i, j] * x[j]
        px_inf = max(px_inf, abs(s))
        q_inf = max(q_inf, abs(q[i]))
        dual[i] = s + q[i]
    cx = np.empty(rows)
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += C[r, j] * x[j]
        cx[r] = s
    # C^T [nu; mu], the two blocks apart (their max-norms are separate scales)
    gt_nu = np.zeros(n)
    at_mu = np.zeros(n)
    for r in range(m):
        f = nu[r]
        for j in range(n):
            gt_nu[j] += f * C[r, j]
    for r in range(p):
        f = mu[r]
        for j in range(n):
            at_mu[j] += f * C[m + r, j]
    at_inf = gt_inf = dual_inf = 0.0
    for j in range(n):
        at_inf = max(at_inf, abs(at_mu[j]))
        gt_inf = max(gt_inf, abs(gt_nu[j]))
        dual[j] = dual[j] + at_mu[j] + gt_nu[j]
        dual_inf = max(dual_inf, abs(dual[j]))
        if math.isnan(dual[j]):
            dual_inf = math.nan
    eq_residual = np.empty(p)
    slack = np.empty(m)
    nu_inf = np.empty(m)
    primal = 0.0
    ax_inf = b_inf = 0.0
    for r in range(p):
        eq_residual[r] = cx[m + r] - upper[m + r]
        ax_inf = max(ax_inf, abs(cx[m + r]))
        b_inf = max(b_inf, abs(upper[m + r]))
        primal = max(primal, abs(eq_residual[r]))
        if math.isnan(eq_residual[r]):
            return False, 0.0, 0.0, slack, nu_inf, eq_residual
    big = px_inf
    if p:
        if primal > eps_abs + rel * max(ax_inf, b_inf):
            return False, 0.0, 0.0, slack, nu_inf, eq_residual
        big = max(big, at_inf)
    if m:
        big = max(big, gt_inf)
    tol_d = eps_abs + rel * max(big, q_inf)
    if not dual_inf <= tol_d:
        return False, 0.0, 0.0, slack, nu_inf, eq_residual
    if m:
        gx_inf = h_inf = 0.0
        low = math.inf
        for r in range(m):
            slack[r] = upper[r] - cx[r]
            gx_inf = max(gx_inf, abs(cx[r]))
            h_inf = max(h_inf, abs(upper[r]))
            low = min(low, slack[r])
            if math.isnan(slack[r]) or math.isnan(nu[r]):
                return False, 0.0, 0.0, slack, nu_inf, eq_residual
        p_scale = max(gx_inf, h_inf)
        tol_p = eps_abs + rel * p_scale
        viol = max(-low, 0.0)
        primal = max(primal, viol)
        if viol > tol_p:
            return False, 0.0, 0.0, slack, nu_inf, eq_residual
        noise = roundoff * max(p_scale, 1e-300)
        if viol > noise:
            for r in range(m):
                if slack[r] < -noise and not working[r]:
                    return False, 0.0, 0.0, slack, nu_inf, eq_residual
        inv_p, inv_d = 1.0 / tol_p, 1.0 / tol_d
        for r in range(m):
            nu_inf[r] = nu[r] * g_inf[r]
            if min(max(slack[r], 0.0) * inv_p, nu_inf[r] * inv_d) > 1.0:
                return False, 0.0, 0.0, slack, nu_inf, eq_residual
    return True, primal, dual_inf, slack, nu_inf, eq_residual


@_jit_sums
def _active_accuracy(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    working: np.ndarray,
    slack: np.ndarray,
    nu_inf: np.ndarray,
    g_inf: np.ndarray,
    eq_residual: np.ndarray,
    margin_min: float,
) -> tuple[float, float, float]:
    """``(eps, smallest, dual_scale)``: the accuracy :math:`\\varepsilon` of
    :func:`dxopt.qp.certify.active.identify_active` with the forward's set when that set is
    unambiguous by the margin :math:`\\max(10^{-8}, 10^4\\varepsilon)` (``margin_min`` the
    floor; :mod:`dxopt.qp.api.small`'s module docstring), else -1; and the smallest working
    multiplier over the dual scale (``inf`` without working rows), which the caller also holds
    against the stationarity residual, and that dual scale. The scales are
    ``identify_active``'s; the dual scale is formed only when some row is in the set (it
    enters nothing else)."""
    n, rows = x.shape[0], C.shape[0]
    p = rows - m
    tiny = np.finfo(np.float64).tiny
    eq_eps = 0.0
    for r in range(p):
        a2 = 0.0
        for j in range(n):
            a2 += C[m + r, j] * C[m + r, j]
        eq_eps = max(eq_eps, abs(eq_residual[r]) / max(math.sqrt(a2), tiny))
    if m == 0:
        return eq_eps, math.inf, 0.0
    k = 0
    for r in range(m):
        k += working[r]
    dual_scale = comp = 0.0
    if k:
        for i in range(n):
            s = abs(q[i])
            for j in range(n):
                s += abs(P[i, j]) * abs(x[j])
            dual_scale = max(dual_scale, s)
        for r in range(m):
            dual_scale = max(dual_scale, nu_inf[r])
        dual_scale = max(dual_scale, tiny)
        for r in range(m):  # below the floor of the margin: declined before the pass over C
            if working[r] and not nu_inf[r] - margin_min * dual_scale > 0.0:
                return -1.0, 0.0, 0.0
    ax_max = 0.0
    for j in range(n):
        ax_max = max(ax_max, abs(x[j]))
    low = math.inf
    rel_slack = np.empty(m)
    for r in range(m):
        s = 0.0
        for j in range(n):
            s += abs(C[r, j]) * abs(x[j])
        # g_inf > 0 on every row (zero rows never reach the lean path): sigma_p > 0
        rel_slack[r] = slack[r] / (abs(upper[r]) + s + g_inf[r] * (1.0 + ax_max))
        low = min(low, rel_slack[r])
    if math.isnan(low):
        return -1.0, 0.0, 0.0
    if k:
        for r in range(m):
            comp = max(comp, max(rel_slack[r], 0.0) * nu_inf[r])
        comp = comp / dual_scale
    eps = max(eq_eps, -low, comp)
    margin = max(margin_min, 1e4 * eps)  # >= 10 x identify_active's max(1e3 eps, 1e-9)
    # a working-set row with a small multiplier (weak, or near it), or a row outside the set
    # at (or near) zero slack: the general path decides
    if not k:
        return (eq_eps if low > margin else -1.0), math.inf, 0.0
    used, smallest = 0.0, math.inf
    for r in range(m):
        if working[r]:
            if not nu_inf[r] - margin * dual_scale > 0.0:
                return -1.0, 0.0, 0.0
            smallest = min(smallest, nu_inf[r] / dual_scale)
            g2 = 0.0
            for j in range(n):
                g2 += C[r, j] * C[r, j]
            used = max(used, abs(slack[r]) / math.sqrt(g2))
        elif not rel_slack[r] - margin > 0.0:
            return -1.0, 0.0, 0.0
    return max(used, eq_eps), smallest, dual_scale


@_jit_sums
def _point_accuracy(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    nu: np.ndarray,
    mu: np.ndarray,
    working: np.ndarray,
    g_inf: np.ndarray,
    margin_min: float,
) -> float:
    """:func:`_active_accuracy` at the point ``x`` with inequality multipliers ``nu``,
    equality multipliers ``mu`` and the working set ``working`` (its slacks and residuals
    computed here), -1 also when a working multiplier is within 1e4 times the relative
    stationarity residual :math:`\\|Px + q + C^\\top\\lambda\\|_\\infty` of zero (a multiplier
    that close to zero could be the residual's doing). The residual is formed only for a set
    that passed the other tests."""
    n, rows = x.shape[0], C.shape[0]
    p = rows - m
    slack = np.empty(m)
    nu_inf = np.empty(m)
    eq_residual = np.empty(p)
    for r in range(rows):
        s = 0.0
        for j in range(n):
            s += C[r, j] * x[j]
        if r < m:
            slack[r] = upper[r] - s
            nu_inf[r] = nu[r] * g_inf[r]
        else:
            eq_residual[r - m] = s - upper[r]
    eps, smallest, dual_scale = _active_accuracy(
        P, q, C, upper, m, x, working, slack, nu_inf, g_inf, eq_residual, margin_min
    )
    if eps < 0.0 or smallest == math.inf:
        return eps
    grad = np.empty(n)  # P x + q + C' [nu; mu]
    for i in range(n):
        s = q[i]
        for j in range(n):
            s += P[i, j] * x[j]
        grad[i] = s
    for r in range(rows):
        lam = nu[r] if r < m else mu[r - m]
        for j in range(n):
            grad[j] += C[r, j] * lam
    stationarity = 0.0
    for i in range(n):
        stationarity = max(stationarity, abs(grad[i]))
    return _clear_of_residual(eps, smallest, dual_scale, stationarity)


@_jit
def _clear_of_residual(
    eps: float, smallest: float, dual_scale: float, stationarity: float
) -> float:
    """``eps``, or -1 when the smallest working multiplier (over the dual scale; ``inf``
    without working rows) is within 1e4 times the relative stationarity residual
    ``stationarity / dual_scale`` of zero (:func:`_point_accuracy`)."""
    if eps < 0.0 or smallest == math.inf or smallest > 1e4 * stationarity / dual_scale:
        return eps
    return -1.0


@_jit
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
    (:func:`dxopt.qp.api.small.small_backward`) at the certified point ``x``, ``duals``,
    ``working`` (as for :func:`certify_point`). The active set is the forward's when
    unambiguous (:func:`_active_accuracy`); the reduced KKT system
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
    x, mu, nu, working = _point(x, duals, working, m)
    n, rows = x.shape[0], C.shape[0]
    p = rows - m
    accuracy = _point_accuracy(P, q, C, upper, m, x, nu, mu, working, g_inf, margin_min)
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
    _gradients_into(x, mu, nu, working, J, u, w, m, p, needs, gP, gq, gA, gb, gG, gh)
    return 0, rel, steps, k, accuracy


@_jit
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
    :func:`dxopt.qp.backward.kkt.schur_refine`."""
    norm = max(math.sqrt(dot(g, g) + dot(r2, r2)), 1e-300)
    u, w = schur_solve_small(L, Y, LS, g, r2)
    r1, rr, rel = _residual(P, CJ, g, r2, u, w, norm)
    steps, best = 0, math.inf
    while not (steps >= steps_max or rel <= tol or (rel > 0.5 * best and rel < 1e-12)):
        best = min(best, rel)
        du, dw = schur_solve_small(L, Y, LS, r1, rr)
        new_u, new_w = u + du, w + dw
        new_r1, new_rr, new_rel = _residual(P, CJ, g, r2, new_u, new_w, norm)
        steps += 1
        if new_rel < rel:
            u, w, r1, rr, rel = new_u, new_w, new_r1, new_rr, new_rel
    return u, w, rel, steps


@_jit
def _row(G: np.ndarray, A: np.ndarray, m: int, r: int) -> np.ndarray:
    """Row ``r`` of ``[G; A]``."""
    return G[r] if r < m else A[r - m]


@_jit
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
        status[i], u, w, residual[i], steps[i] = _reused_solve(
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


@_jit
def _reused_solve(
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
    below ``dependent_tol``)."""
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


@_jit_sums
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


@_jit
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


@_jit
def _gradients_into(
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


@_jit
def certify_batch(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    samples: np.ndarray,
    Xo: np.ndarray,
    MU: np.ndarray,
    NU: np.ndarray,
    primal: np.ndarray,
    dual: np.ndarray,
) -> bool:
    """:func:`certify_point` for the ``samples`` of a batch of daqp points (``X`` (B, n),
    ``duals`` (B, m + p); the working sets read off the multipliers): whether they all
    certify, with their primal and dual residuals and copies of their ``(x, mu, nu)`` written
    into the caller's ``primal``, ``dual`` (B,) and ``Xo`` (B, n), ``MU`` (B, p), ``NU``
    (B, m); it stops at the first sample that does not certify."""
    none, no_accuracy = np.zeros(0, np.bool_), np.zeros(0)
    for i in samples:
        if not _certify_into(P, q, C, upper, m, X, duals, g_inf, eps_abs, rel, roundoff, i,
                             none, Xo, MU, NU, primal, dual, no_accuracy, 0.0):  # fmt: skip
            return False
    return True


@_jit
def _certify_into(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    i: int,
    none: np.ndarray,
    Xo: np.ndarray,
    MU: np.ndarray,
    NU: np.ndarray,
    primal: np.ndarray,
    dual: np.ndarray,
    accuracy: np.ndarray,
    margin_min: float,
) -> bool:
    """Sample ``i`` of :func:`certify_batch`: :func:`certify_point` on its rows; with entries
    in ``accuracy`` (B,), also the lean backward's accuracy of its active set
    (:func:`_point_accuracy`) from the certificate's own slacks and stationarity residual,
    written to ``accuracy[i]``, so that the backward does not form them again."""
    ok, primal[i], dual[i], x, working, slack, nu_inf, eq_residual = _certified(
        P[i], q[i], C[i], upper[i], m, X[i], duals[i], none, g_inf[i], eps_abs, rel, roundoff,
        Xo[i], MU[i], NU[i],
    )  # fmt: skip
    if ok and accuracy.shape[0]:
        eps, smallest, dual_scale = _active_accuracy(
            P[i], q[i], C[i], upper[i], m, x, working, slack, nu_inf, g_inf[i], eq_residual,
            margin_min,
        )  # fmt: skip
        # dual[i]: the certificate's ||P x + q + C' [nu; mu]||_inf, _point_accuracy's residual
        accuracy[i] = _clear_of_residual(eps, smallest, dual_scale, dual[i])
    return ok


@_jit
def forward_batch(
    P: np.ndarray,
    q: np.ndarray,
    A: np.ndarray,
    b: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    sym_tol: float,
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    g_inf: np.ndarray,
    primal_tol: float,
    max_iter: int,
    lapack: Any,
    X: np.ndarray,
    duals: np.ndarray,
    L: np.ndarray,
    Yt: np.ndarray,
    order: np.ndarray,
    LW: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    Xo: np.ndarray,
    MU: np.ndarray,
    NU: np.ndarray,
    primal: np.ndarray,
    dual: np.ndarray,
    accuracy: np.ndarray,
    margin_min: float,
) -> tuple[int, np.ndarray, bool]:
    """:func:`prepare_batch`, the compiled solver's :func:`~.dual_active_set.solve_batch`
    and :func:`certify_batch` of its points, sample by sample in one loop (each sample's data
    read while it is still in cache: a third of a millisecond of 7 at 128 x n=50 against the
    three passes over the batch). Returns ``(status, solved, ok)``: ``status`` the first
    failing sample's check (:func:`prepare`; 0: all ready), ``solved`` the solver's status per
    sample (:data:`~dxopt.qp.solvers.dual_active_set.SOLVE_STATUS`; the caller solves and certifies
    the others), ``ok`` whether every sample it solved certifies (it stops at the first that
    does not). Arguments as for those three (``m = G.shape[1]``); with entries in ``accuracy``
    (B,), each solved sample's active-set accuracy for the lean backward (:func:`_certify_into`,
    ``margin_min`` as in :func:`lean_adjoint`'s settings)."""
    B, m = q.shape[0], G.shape[1]
    solved = np.zeros(B, np.int64)
    none = np.zeros(0, np.bool_)
    g_inf[:] = 0.0
    for i in range(B):
        status = prepare(
            P[i], q[i], A[i], b[i], G[i], h[i], sym_tol, Pn[i], qn[i], C[i], upper[i], g_inf[i]
        )
        if status:
            return status, solved, False
        solved[i], _ = solve_one(
            Pn[i], qn[i], C[i], upper[i], m, primal_tol, max_iter, lapack, X[i], duals[i], L[i],
            Yt[i], order[i], LW[i],
        )  # fmt: skip
        if solved[i] == 0 and not _certify_into(
            Pn, qn, C, upper, m, X, duals, g_inf, eps_abs, rel, roundoff, i, none, Xo, MU, NU,
            primal, dual, accuracy, margin_min,
        ):  # fmt: skip
            return 0, solved, False
    return 0, solved, True


@_jit
def lean_adjoint_batch(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    g_inf: np.ndarray,
    g: np.ndarray,
    r_ineq: np.ndarray,
    r_eq: np.ndarray,
    settings: np.ndarray,
    needs: np.ndarray,
    L_given: np.ndarray,
    Y_given: np.ndarray,
    order_given: np.ndarray,
    LW_given: np.ndarray,
    given: np.ndarray,
    accuracy_given: np.ndarray,
    lapack: Any,
    grads: tuple[np.ndarray, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lean_adjoint` for a batch of daqp points: ``(status, residual, steps, k,
    accuracy)``, each with a leading ``B`` axis, and the gradients written into the caller's
    ``grads = (gP, gq, gA, gb, gG, gh)``: (B, n, n), (B, n), (B, p, n), (B, p), (B, m, n),
    (B, m) (no rows, or no entries, where not needed); a sample with ``status != 0`` is not
    written (the caller hands it to the general path); ``settings`` as there. ``L_given``
    (B, n, n), ``Y_given`` (B, m + p, n), ``order_given``, ``LW_given``: the forward's
    Cholesky factors of ``P``, rows :math:`L^{-1}c_r`, working sets and factors of their Schur
    complements (:mod:`dxopt.qp.solvers.dual_active_set`) of the samples with ``given[i]`` (no
    entries when none has them), from which the block elimination of the working rows is
    taken (:func:`_reused_solve`, the rows read in place; ``lapack``: a
    :class:`dxopt.linalg.small.LapackKernels`) instead of factoring again; ``accuracy_given``
    (B,), or no entries: their active sets' accuracies, as the forward's certificate found them
    (:func:`forward_batch`), instead of :func:`_point_accuracy` here."""
    B = X.shape[0]
    rows = C.shape[1]
    p = rows - m
    steps_max, tol, max_residual = int(settings[0]), settings[1], settings[2]
    dependent_tol, margin_min = settings[3], settings[4]
    gP, gq, gA, gb, gG, gh = grads
    status = np.zeros(B, np.int64)
    residual, accuracy = np.zeros(B), np.zeros(B)
    steps, k = np.zeros(B, np.int64), np.zeros(B, np.int64)
    none = np.zeros(0, np.bool_)
    for i in range(B):
        if given[i]:  # the forward's factors, every row read in place
            x, mu, nu, working = _point(X[i], duals[i], none, m)
            if accuracy_given.shape[0]:
                accuracy_i = accuracy_given[i]
            else:
                accuracy_i = _point_accuracy(
                    P[i], q[i], C[i], upper[i], m, x, nu, mu, working, g_inf[i], margin_min
                )
            if accuracy_i < 0.0:
                status[i] = 1  # ambiguous: the general path (nothing gathered in vain)
                continue
            J = np.flatnonzero(working)
            rows_sel = np.empty(J.shape[0] + p, np.int64)
            rows_sel[: J.shape[0]] = J
            rows_sel[J.shape[0] :] = np.arange(m, m + p)
            r2 = np.empty(rows_sel.shape[0])
            for a in range(J.shape[0]):
                r2[a] = r_ineq[i, J[a]]
            r2[J.shape[0] :] = r_eq[i]
            Ci = C[i]
            status[i], u, w, rel, done = _reused_solve(
                P[i], Ci[:m], Ci[m:], m, rows_sel, g[i], r2, L_given[i], Y_given[i],
                order_given[i], LW_given[i], lapack, steps_max, tol, dependent_tol,
            )  # fmt: skip
            if status[i] == 0 and not rel <= max_residual:
                status[i] = 4
            if status[i]:
                continue
            residual[i], steps[i], k[i], accuracy[i] = rel, done, J.shape[0], accuracy_i
            _gradients_into(
                x, mu, nu, working, J, u, w, m, p, needs, gP[i], gq[i], gA[i], gb[i], gG[i],
                gh[i],
            )  # fmt: skip
            continue
        status[i], residual[i], steps[i], k[i], accuracy[i] = lean_adjoint(
            P[i], q[i], C[i], upper[i], m, X[i], duals[i], none, g_inf[i], g[i], r_ineq[i],
            r_eq[i], settings, needs, gP[i], gq[i], gA[i], gb[i], gG[i], gh[i],
        )  # fmt: skip
        if status[i]:
            residual[i] = 0.0
    return status, residual, steps, k, accuracy
