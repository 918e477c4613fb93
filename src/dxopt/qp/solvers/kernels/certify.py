"""Compiled certificate of the lean path (numba): is a daqp point a solution, and is its active
set clear enough of the weak-activity test for the lean backward to keep it.

The data are one problem in daqp's layout: ``P`` (n, n), ``q`` (n,), the constraint rows
``C = [G; A]`` ((m + p), n) with right-hand sides ``upper = [h; b]``, the first ``m`` rows
inequalities :math:`Gx \\le h`, the rest equalities :math:`Ax = b`. :func:`certify_point`
(``_certificate``) is the rule of :func:`dxopt.qp.certify.polish.batch_accept_exact`, with the
tolerances of :mod:`dxopt.qp.certify.tolerances` (``rel``, ``roundoff`` and ``margin_min`` come
as arguments, ``LEAN_MARGIN_FACTOR``, ``EVALUATION_ROUNDOFF`` and ``ROW_FLOOR`` as globals
fixed at compile time; a tiny row's absolute floor, ``tolerances.row_floor``, is formed in
the loop over the rows, its norm only for rows whose own scale is below ``eps_abs``); only the
order of floating-point operations differs. Any NaN met where
a test is made fails the test (the caller then takes the general path).
:func:`active_accuracy` / :func:`point_accuracy` are the accuracy of
:func:`dxopt.qp.certify.active.identify_active` with the forward's set, or -1 when the set is
not clear of its weak test by the lean margin.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from dxopt.qp.certify.tolerances import EVALUATION_ROUNDOFF, LEAN_MARGIN_FACTOR, ROW_FLOOR

__all__ = [
    "active_accuracy",
    "certified_point",
    "certify_point",
    "clear_of_residual",
    "kernel_jit",
    "kernel_jit_sums",
    "may_be_dependent",
    "may_be_dependent_batch",
    "point_accuracy",
    "split_point",
]

kernel_jit: Any = njit(cache=True, nogil=True)
# sums that may be reassociated (vectorised): their values are held against margins and
# tolerances far above the last bits (10x the general path's thresholds, or above round-off)
kernel_jit_sums: Any = njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


@kernel_jit
def split_point(
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


@kernel_jit
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
    :func:`split_point` (``ok`` and the primal and dual residuals), with copies of the point's
    ``(x, mu, nu)`` written into the caller's ``x_out, mu_out, nu_out``. (Only these come
    back: every array a kernel hands back to Python costs a third of a microsecond, more than
    the caller's allocation; the backward recomputes the rest.)"""
    ok, primal, dual, _, _, _, _, _ = certified_point(
        P, q, C, upper, m, x, duals, working, g_inf, eps_abs, rel, roundoff, x_out, mu_out,
        nu_out,
    )  # fmt: skip
    return ok, primal, dual


@kernel_jit
def certified_point(
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
    x, mu, nu, working = split_point(x, duals, working, m)
    ok, primal, dual, slack, nu_inf, eq_residual = _certificate(
        P, q, C, upper, m, x, mu, nu, working, g_inf, eps_abs, rel, roundoff
    )
    x_out[:] = x
    mu_out[:] = mu
    nu_out[:] = nu
    return ok, primal, dual, x, working, slack, nu_inf, eq_residual


@kernel_jit_sums
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
    row_scale = np.empty(rows)  # per row: max(|c_r||x|, |upper_r|) (tolerances.py)
    row_abs = np.empty(rows)  # per row: its absolute floor (tolerances.row_floor)
    for r in range(rows):
        s = a = 0.0
        for j in range(n):
            s += C[r, j] * x[j]
            a += abs(C[r, j]) * abs(x[j])
        cx[r] = s
        row_scale[r] = max(a, abs(upper[r]))
        row_abs[r] = eps_abs
        if row_scale[r] < eps_abs:  # rare: is it a tiny row (norm below 1)?
            c_inf = 0.0
            for j in range(n):
                c_inf = max(c_inf, abs(C[r, j]))
            if 0.0 < c_inf < 1.0:
                row_abs[r] = eps_abs * c_inf
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
    row_rel = max(rel, ROW_FLOOR)
    ax_inf = b_inf = 0.0
    for r in range(p):
        ax_inf = max(ax_inf, abs(cx[m + r]))
        b_inf = max(b_inf, abs(upper[m + r]))
    common = rel * max(ax_inf, b_inf)
    for r in range(p):
        eq_residual[r] = cx[m + r] - upper[m + r]
        primal = max(primal, abs(eq_residual[r]))
        tol_e = row_abs[m + r] + min(common, row_rel * row_scale[m + r])  # row_tolerance
        if not abs(eq_residual[r]) <= tol_e:  # NaN fails
            return False, 0.0, 0.0, slack, nu_inf, eq_residual
    big = px_inf
    if p:
        big = max(big, at_inf)
    if m:
        big = max(big, gt_inf)
    tol_d = eps_abs + rel * max(big, q_inf)
    if not dual_inf <= tol_d and not _within_roundoff(P, q, C, m, x, mu, nu, dual, tol_d):
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
        viol = max(-low, 0.0)
        primal = max(primal, viol)
        common = rel * p_scale
        for r in range(m):
            if -slack[r] > row_abs[r] + min(common, row_rel * row_scale[r]):
                return False, 0.0, 0.0, slack, nu_inf, eq_residual
        noise = roundoff * max(p_scale, 1e-300)
        if viol > noise:
            for r in range(m):
                if slack[r] < -noise and not working[r]:
                    return False, 0.0, 0.0, slack, nu_inf, eq_residual
        inv_p, inv_d = 1.0 / (eps_abs + common), 1.0 / tol_d  # complementarity: common scale
        for r in range(m):
            nu_inf[r] = nu[r] * g_inf[r]
            if min(max(slack[r], 0.0) * inv_p, nu_inf[r] * inv_d) > 1.0:
                return False, 0.0, 0.0, slack, nu_inf, eq_residual
    return True, primal, dual_inf, slack, nu_inf, eq_residual


@kernel_jit
def _within_roundoff(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    m: int,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    dual: np.ndarray,
    tol_d: float,
) -> bool:
    """Whether every component of the stationarity residual ``dual`` is within
    :math:`t_d + \\text{EVALUATION\\_ROUNDOFF}\\,(|P||x| + |q| + |A|^\\top|\\mu| +
    |G|^\\top|\\nu|)_j`, the round-off of its own evaluation
    (:mod:`dxopt.qp.certify.tolerances`); NaN fails."""
    n, rows = x.shape[0], C.shape[0]
    terms = np.empty(n)
    for i in range(n):
        s = abs(q[i])
        for j in range(n):
            s += abs(P[i, j]) * abs(x[j])
        terms[i] = s
    for r in range(rows):
        f = abs(nu[r]) if r < m else abs(mu[r - m])
        for j in range(n):
            terms[j] += f * abs(C[r, j])
    for j in range(n):  # noqa: SIM110 (numba: a loop, no generator)
        if not abs(dual[j]) <= tol_d + EVALUATION_ROUNDOFF * terms[j]:
            return False
    return True


@kernel_jit_sums
def active_accuracy(
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
    floor and ``LEAN_MARGIN_FACTOR`` the factor of :mod:`dxopt.qp.certify.tolerances`;
    :mod:`dxopt.qp.lean.small`'s module docstring), else -1; and the smallest working multiplier
    over the dual scale (``inf`` without working rows), which the caller also holds
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
    margin = max(margin_min, LEAN_MARGIN_FACTOR * eps)  # 10 x identify_active's WEAK_FACTOR
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


@kernel_jit_sums
def point_accuracy(
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
    """:func:`active_accuracy` at the point ``x`` with inequality multipliers ``nu``,
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
    eps, smallest, dual_scale = active_accuracy(
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
    return clear_of_residual(eps, smallest, dual_scale, stationarity)


@kernel_jit
def clear_of_residual(eps: float, smallest: float, dual_scale: float, stationarity: float) -> float:
    """``eps``, or -1 when the smallest working multiplier (over the dual scale; ``inf``
    without working rows) is within ``LEAN_MARGIN_FACTOR`` times the relative stationarity
    residual ``stationarity / dual_scale`` of zero (:func:`point_accuracy`)."""
    if eps < 0.0 or smallest == math.inf:
        return eps
    if smallest > LEAN_MARGIN_FACTOR * stationarity / dual_scale:
        return eps
    return -1.0


@kernel_jit
def may_be_dependent(
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    duals: np.ndarray,
    eps_abs: float,
    rel: float,
) -> bool:
    """Whether an exact working set's point (daqp's: ``duals = [nu; mu]``, the working set
    ``nu > 0`` satisfies LICQ) may have dependent active rows: a zero multiplier on a row of
    ``A``, or a nonzero row of ``G`` outside the working set with slack within
    :math:`t_p = \\varepsilon_{abs} + r\\max(\\|Gx\\|_\\infty, \\|h\\|_\\infty)` (the cheap test of
    :func:`dxopt.qp.certify.multipliers.select_multipliers`, in one pass)."""
    rows, n = C.shape
    for r in range(m, rows):
        if duals[r] == 0.0:
            return True
    scale = 0.0
    gx = np.empty(m)
    for r in range(m):
        s = 0.0
        for j in range(n):
            s += C[r, j] * x[j]
        gx[r] = s
        scale = max(scale, abs(s), abs(upper[r]))
    t_p = eps_abs + rel * scale
    for r in range(m):
        if duals[r] <= 0.0 and upper[r] - gx[r] <= t_p:
            nonzero = False
            for j in range(n):
                if C[r, j] != 0.0:
                    nonzero = True
                    break
            if nonzero:
                return True
    return False


@kernel_jit
def may_be_dependent_batch(
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    eps_abs: float,
    rel: float,
) -> np.ndarray:
    """:func:`may_be_dependent` for every sample of a batch (``C`` (B, rows, n), ``upper``
    (B, rows), ``X`` (B, n), ``duals`` (B, rows) = ``[nu; mu]``), in one compiled pass."""
    batch = X.shape[0]
    out = np.zeros(batch, dtype=np.bool_)
    for i in range(batch):
        out[i] = may_be_dependent(C[i], upper[i], m, X[i], duals[i], eps_abs, rel)
    return out
