"""Certification and polishing of a forward solution (one sample, numpy / scipy).

**Certification** uses norm scales (as the backends' own stopping rules do) and never
normalises a row, so a zero or tiny row cannot poison it (each row is also held to its own
scale, and a tiny row to its norm times :math:`\\varepsilon_{abs}`: the primal rule of
:mod:`dxopt.qp.certify.tolerances`, which is authoritative where this summary is short). With
:math:`r = \\max(\\varepsilon_{rel}, 10^{-10})` (the relative part never goes below a
round-off floor; every constant of the rule is in :mod:`dxopt.qp.certify.tolerances`),
:math:`t_p = \\varepsilon_{abs} + r\\max(\\|Gx\\|_\\infty, \\|h\\|_\\infty)`,
:math:`t_e` likewise for :math:`Ax = b`, and :math:`t_d = \\varepsilon_{abs} +
r\\max(\\|Px\\|_\\infty, \\|q\\|_\\infty, \\|A^\\top\\mu\\|_\\infty, \\|G^\\top\\nu\\|_\\infty)`,
a point :math:`(x, \\mu, \\nu)` is certified when
:math:`\\|(Gx - h)_+\\|_\\infty \\le t_p`, :math:`\\|Ax - b\\|_\\infty \\le t_e`,
:math:`\\|Px + q + A^\\top\\mu + G^\\top\\nu\\|_\\infty \\le t_d`,
:math:`(-\\nu_i)_+\\|g_i\\|_\\infty \\le t_d` and the complementarity natural residual
:math:`\\min((h_i - g_i^\\top x)_+/t_p,\\ (\\nu_i)_+\\|g_i\\|_\\infty/t_d) \\le 1` for every row
(each row has its slack or its multiplier within tolerance: the point is *settled*), or, failing
that, the duality-gap form :math:`\\sum_i (h_i - g_i^\\top x)_+\\nu_i \\le \\varepsilon_{abs} +
r\\max(|x^\\top Px|, |q^\\top x|, |h^\\top\\nu|)` that the backends themselves use. A point
certified only by the gap (an interior-point point on a degenerate problem whose polish failed:
some rows have slack and multiplier both of order :math:`\\sqrt\\mu`) is *unsettled*: its
active set is a guess, which the backward flags (``QPDegenerateWarning``). The certificate is the
authority: a point that passes is a solution within tolerance whatever the backend reported.

**Zero rows** are handled explicitly: an all-zero row of ``G`` is never active (multiplier 0);
it is feasible iff :math:`h_i \\ge -\\varepsilon_{abs}`, otherwise the sample is infeasible. An
all-zero row of ``A`` needs :math:`|b_j| \\le \\varepsilon_{abs}` and gets multiplier 0.

**Polishing** (the idea of OSQP's polish, Stellato et al., arXiv 1711.08013, section 5.2):

1. Guess the active set :math:`J` from the solver's point: a nonzero row is active when its
   relative multiplier exceeds its relative slack,
   :math:`\\nu_i\\|g_i\\|_\\infty/\\|\\sigma^d\\|_\\infty > (h_i - g_i^\\top x)_+/\\hat\\sigma_i`
   with :math:`\\hat\\sigma_i = \\sigma^p_i + \\|g_i\\|_\\infty(1 + \\|x\\|_\\infty)`
   (:func:`identification_scale`).
2. Solve the equality-constrained QP on :math:`J` (rows :math:`C = [A; G_J]`) by the
   regularised saddle-point solve of :func:`dxopt.linalg.sparse.saddle_solve`, refined from the
   solver's own point, so on a problem with a non-unique solution it lands on the solution
   nearest to the solver's.
3. Drop rows of :math:`J` with negative multipliers and add rows that are violated, both
   judged at round-off level (``ROUNDOFF`` times the norm scales, not at the requested
   tolerance, so the active set does not depend on it; a *tiny row* of
   :mod:`dxopt.qp.certify.tolerances`, whose violation is below that round-off, joins when it is
   violated beyond its own primal tolerance); repeat (at most ``max_rounds``
   times) until the multipliers have the right signs and the point is feasible.

The polished point is kept only if it certifies; otherwise the solver's point is certified as it
is. The returned active set is the polished :math:`J` (or, unpolished, the guess).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dxopt.linalg.sparse import FactorizationError, saddle_solve
from dxopt.qp.certify.tolerances import (
    AMBIGUITY,
    EVALUATION_ROUNDOFF,
    ROUNDOFF,
    relative_tolerance,
    row_floor,
    row_tolerance,
)
from dxopt.qp.problem.canonical import QPProblem

__all__ = [
    "BatchCertificate",
    "Certificate",
    "PolishResult",
    "batch_accept_exact",
    "certify",
    "identification_scale",
    "numpy_matrix",
    "polish",
    "row_inf",
]


@dataclass(frozen=True)
class Certificate:
    """Largest tolerance ratios (pass: all at most 1) and whether the point passed."""

    primal: float
    dual: float
    sign: float
    complementarity: float
    zero_row_infeasible: bool
    ambiguous: bool = False
    gap: float = float("inf")

    @property
    def settled(self) -> bool:
        """Complementarity holds row by row (natural residual): the active set is known."""
        return bool(self.complementarity <= 1.0)

    @property
    def ok(self) -> bool:
        worst = max(self.primal, self.dual, self.sign, min(self.complementarity, self.gap))
        return bool(np.isfinite(worst) and worst <= 1.0) and not self.zero_row_infeasible


@dataclass(frozen=True)
class PolishResult:
    x: np.ndarray
    mu: np.ndarray
    nu: np.ndarray
    active: np.ndarray
    polished: bool
    certificate: Certificate


def _abs(M: Any) -> Any:
    return abs(M) if sp.issparse(M) else np.abs(M)


def row_inf(M: Any) -> np.ndarray:
    """The max-norm of every row of the dense or scipy sparse ``M`` (none for ``None``)."""
    if M is None or M.shape[0] == 0:
        return np.zeros(0 if M is None else M.shape[0])
    if sp.issparse(M):  # one reduceat over the CSR rows (scipy's max(axis=1): ten times slower)
        R = M.tocsr()
        if not R.has_canonical_format:
            R = R.copy()
            R.sum_duplicates()
        out = np.zeros(R.shape[0])
        filled = np.diff(R.indptr) > 0
        if R.nnz:
            out[filled] = np.maximum.reduceat(np.abs(R.data), R.indptr[:-1][filled])
        return out
    return np.abs(M).max(axis=1)


@dataclass
class _Data:
    P: Any
    q: np.ndarray
    A: Any
    b: np.ndarray | None
    G: Any
    h: np.ndarray | None
    g_inf: np.ndarray
    a_inf: np.ndarray
    eps_abs: float
    rel: float


def _make(P, q, A, b, G, h, eps_abs: float, eps_rel: float, g_inf=None, a_inf=None) -> _Data:
    g_inf = row_inf(G) if g_inf is None else g_inf
    a_inf = row_inf(A) if a_inf is None else a_inf
    return _Data(P, q, A, b, G, h, g_inf, a_inf, eps_abs, relative_tolerance(eps_rel))


def _inf(v: Any) -> float:
    return float(np.abs(v).max()) if v.size else 0.0


def certify(d: _Data, x: np.ndarray, mu: np.ndarray, nu: np.ndarray) -> Certificate:
    """Certificate of ``(x, mu, nu)`` against the requested tolerances (module docstring)."""
    return _check(d, x, mu, nu, None)[0]


def _check(
    d: _Data, x: np.ndarray, mu: np.ndarray, nu: np.ndarray, J: np.ndarray | None
) -> tuple[Certificate, np.ndarray | None, np.ndarray | None]:
    """The certificate and, if ``J`` is given, the round-off-level flags: rows violated beyond
    round-off and rows of ``J`` whose multiplier is negative beyond round-off (``ROUNDOFF``
    times the norm scales; independent of the requested tolerance, so the polished active set
    does not depend on it)."""
    px = d.P @ x
    dual = px + d.q
    dual_scale = max(_inf(px), _inf(d.q))
    primal = comp = sign = 0.0
    zero_bad = False
    violated = negative = None
    if d.A is not None and d.A.shape[0]:
        ax = d.A @ x
        row = np.maximum(_abs(d.A) @ np.abs(x), np.abs(d.b))  # type: ignore[arg-type]
        tol_e = row_tolerance(d.eps_abs, d.rel, max(_inf(ax), _inf(d.b)), row, d.a_inf)
        primal = max(primal, _inf(np.abs(ax - d.b) / tol_e))
        at_mu = d.A.T @ mu
        dual = dual + at_mu
        dual_scale = max(dual_scale, _inf(at_mu))
        if not d.a_inf.all():
            zero_bad = bool(np.any(np.abs(d.b[d.a_inf == 0]) > d.eps_abs))  # type: ignore[index]
    if d.G is not None and d.G.shape[0]:
        gx = d.G @ x
        s = d.h - gx
        p_scale = max(_inf(gx), _inf(d.h))
        row = np.maximum(_abs(d.G) @ np.abs(x), np.abs(d.h))  # type: ignore[arg-type]
        tol_rows = row_tolerance(d.eps_abs, d.rel, p_scale, row, d.g_inf)
        primal = max(primal, float(np.max(np.maximum(-s, 0.0) / tol_rows, initial=0.0)))
        tol_p = d.eps_abs + d.rel * p_scale  # complementarity: the common scale
        gt_nu = d.G.T @ nu
        dual = dual + gt_nu
        dual_scale = max(dual_scale, _inf(gt_nu))
        if not d.g_inf.all():
            zero_bad = zero_bad or bool(np.any(d.h[d.g_inf == 0] < -d.eps_abs))  # type: ignore[index]
        nu_g = nu * d.g_inf
        if J is not None:
            violated = (s < -ROUNDOFF * max(p_scale, 1e-300)) & ~J & (d.g_inf > 0)
            # a tiny row (tolerances.py) violated beyond its own tolerance joins too: its
            # violation is below round-off of the common scale
            tiny = row_floor(d.eps_abs, row, d.g_inf) < d.eps_abs
            violated |= (-s > tol_rows) & tiny & ~J
            negative = J & (nu_g < -ROUNDOFF * max(dual_scale, _inf(nu_g), 1e-300))
    tol_d = d.eps_abs + d.rel * dual_scale
    dual_ratio = _inf(dual) / tol_d
    if dual_ratio > 1.0:  # within the round-off of its own evaluation? (tolerances.py)
        terms = _abs(d.P) @ np.abs(x) + np.abs(d.q)
        if d.A is not None and d.A.shape[0]:
            terms = terms + _abs(d.A).T @ np.abs(mu)
        if d.G is not None and d.G.shape[0]:
            terms = terms + _abs(d.G).T @ np.abs(nu)
        allowed = tol_d + EVALUATION_ROUNDOFF * terms
        dual_ratio = float(np.max(np.abs(dual) / allowed, initial=0.0))
    ambiguous = False
    gap = 0.0
    if d.G is not None and d.G.shape[0]:
        sign = max(-float(nu_g.min()), 0.0) / tol_d
        # natural residual: each row has its slack or its multiplier within tolerance
        s_ratio, nu_ratio = np.maximum(s, 0.0) / tol_p, np.maximum(nu_g, 0.0) / tol_d
        comp = float(np.minimum(s_ratio, nu_ratio).max())
        objective = max(abs(float(x @ px)), abs(float(d.q @ x)), abs(float(d.h @ nu)), 1e-300)
        gap = float(np.maximum(s, 0.0) @ np.maximum(nu, 0.0)) / (d.eps_abs + d.rel * objective)
        # a row whose slack and multiplier are both below AMBIGUITY tolerances: its side is
        # not settled by this point (zero rows are never active, so never ambiguous)
        ambiguous = bool((np.maximum(s_ratio, nu_ratio)[d.g_inf > 0] < AMBIGUITY).any())
    cert = Certificate(primal, dual_ratio, sign, comp, zero_bad, ambiguous, gap)
    return cert, violated, negative


def identification_scale(h: np.ndarray, G: Any, x: np.ndarray, g_inf: np.ndarray) -> np.ndarray:
    """Scale of the slack used to identify active rows:
    :math:`|h_i| + (|G||x|)_i + \\|g_i\\|_\\infty(1 + \\|x\\|_\\infty)` (never zero on a
    nonzero row, even where the entries of ``x`` that the row sees are zero)."""
    return np.abs(h) + _abs(G) @ np.abs(x) + g_inf * (1.0 + float(np.max(np.abs(x), initial=0.0)))


def _guess(d: _Data, x: np.ndarray, nu: np.ndarray) -> np.ndarray:
    if d.G is None or d.G.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    s = np.maximum(d.h - d.G @ x, 0.0)
    sig = identification_scale(d.h, d.G, x, d.g_inf)  # type: ignore[arg-type]
    rel_s = s / np.maximum(sig, 1e-300)
    dual_scale = float(np.max(_abs(d.P) @ np.abs(x) + np.abs(d.q), initial=0.0))
    dual_scale = max(dual_scale, float(np.max(np.maximum(nu, 0.0) * d.g_inf, initial=0.0)))
    rel_nu = np.maximum(nu, 0.0) * d.g_inf / max(dual_scale, 1e-300)
    return (rel_nu > rel_s) & (d.g_inf > 0)


def _stack(d: _Data, J: np.ndarray) -> Any:
    blocks = []
    if d.A is not None and d.A.shape[0]:
        blocks.append(d.A)
    if d.G is not None and J.any():
        blocks.append(d.G[np.flatnonzero(J)])
    n = d.q.shape[0]
    sparse = any(sp.issparse(M) for M in (d.P, d.A, d.G) if M is not None)
    if not blocks:
        return sp.csr_matrix((0, n)) if sparse else np.zeros((0, n))
    if sparse:
        return sp.vstack([sp.csr_matrix(B) for B in blocks], format="csr")
    return np.concatenate(blocks, 0)


def _solve_on(
    d: _Data, J: np.ndarray, x0: np.ndarray, mu0: np.ndarray, nu0: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    C = _stack(d, J)
    n, p = d.q.shape[0], 0 if d.A is None else d.A.shape[0]
    rhs = [-d.q]
    if p:
        rhs.append(d.b)  # type: ignore[arg-type]
    if J.any():
        rhs.append(d.h[J])  # type: ignore[index]
    z0 = np.concatenate([x0, mu0, nu0[J]])
    try:
        z, info = saddle_solve(d.P, C, np.concatenate(rhs), z0=z0, tol=1e-14)
    except FactorizationError:
        return None
    if not info.residual <= 1e-9:
        return None
    nu = np.zeros_like(nu0)
    nu[J] = z[n + p :]
    return z[:n], z[n : n + p], nu


def polish(
    P: Any,
    q: np.ndarray,
    A: Any,
    b: np.ndarray | None,
    G: Any,
    h: np.ndarray | None,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    *,
    eps_abs: float,
    eps_rel: float,
    enabled: bool = True,
    force: bool = False,
    exact_working_set: bool = False,
    max_rounds: int = 8,
    g_inf: np.ndarray | None = None,
    a_inf: np.ndarray | None = None,
) -> PolishResult:
    """Certify, and (``enabled``) polish, one sample's solution (module docstring).

    The point is polished when it does not certify or is not settled (module docstring), when
    a row is violated or a multiplier of
    :math:`J` is negative beyond round-off, or when some row is *ambiguous* (its slack and its
    multiplier are both below ``AMBIGUITY`` tolerances, as at an interior-point solution);
    ``force=True`` always polishes. ``exact_working_set=True`` (daqp) takes the rows with a
    positive multiplier as :math:`J` and skips the ambiguity test. ``g_inf``/``a_inf`` are the
    row max-norms of ``G``/``A`` when the caller has them (shared matrices: once per batch).
    """
    d = _make(P, q, A, b, G, h, eps_abs, eps_rel, g_inf, a_inf)
    m = 0 if G is None else G.shape[0]
    nu = np.maximum(nu, 0.0) if m else np.zeros(0)
    if m and not d.g_inf.all():
        nu = np.where(d.g_inf > 0, nu, 0.0)  # zero rows are never active
    # an exact working set is its own guess: the rows with a multiplier
    J = (nu > 0) & (d.g_inf > 0) if exact_working_set and m else _guess(d, x, nu)
    raw, violated, negative = _check(d, x, mu, nu, J if m else None)
    if raw.zero_row_infeasible:
        return PolishResult(x, mu, nu, J, False, raw)
    inexact = bool(m) and bool(violated.any() or negative.any())  # type: ignore[union-attr]
    unsettled = raw.ambiguous and not exact_working_set
    if enabled and (force or not raw.ok or not raw.settled or inexact or unsettled):
        seen: set[bytes] = set()
        for _ in range(max_rounds):
            key = J.tobytes()
            if key in seen:
                break
            seen.add(key)
            out = _solve_on(d, J, x, mu, nu)
            if out is None:
                break
            xp, mup, nup = out
            if not m:
                cert = certify(d, xp, mup, nup)
                if cert.ok:
                    return PolishResult(xp, mup, np.maximum(nup, 0.0), J, True, cert)
                break
            cert, violated, negative = _check(d, xp, mup, nup, J)
            if not violated.any() and not negative.any():  # type: ignore[union-attr]
                if cert.ok:
                    return PolishResult(xp, mup, np.maximum(nup, 0.0), J, True, cert)
                break
            # drop wrong-signed multipliers, add violated rows
            J = (J & ~negative) | violated  # type: ignore[operator]
    return PolishResult(x, mu, nu, J, False, raw)


@dataclass(frozen=True)
class BatchCertificate:
    """:func:`batch_accept_exact` per sample: ``ok`` (S,) where the point certifies as it is
    and needs no polish, and the residuals :class:`~dxopt.qp.QPInfo` reports, computed from
    the same products: ``primal`` = :math:`\\max(\\|Ax - b\\|_\\infty, \\|(Gx - h)_+\\|_\\infty)`,
    ``dual`` = :math:`\\|Px + q + A^\\top\\mu + G^\\top\\nu\\|_\\infty`."""

    ok: np.ndarray
    primal: np.ndarray
    dual: np.ndarray


_max = np.maximum.reduce  # the ufunc reductions themselves (ndarray.max adds two Python calls)
_min = np.minimum.reduce
_all = np.logical_and.reduce


def _rows_inf(v: np.ndarray) -> np.ndarray:
    """Max-norm over the last axis (a vector's norm is a scalar; it broadcasts)."""
    return _max(np.abs(v), -1) if v.shape[-1] else np.zeros(v.shape[:-1])


def numpy_matrix(problem: QPProblem, name: str) -> Any:
    """The dense numpy view of a matrix parameter, or its scipy CSR if it is sparse."""
    pair = problem.csr.get(name)
    return pair[0] if pair is not None else getattr(problem, name).numpy()


def _mv(M: Any, v: np.ndarray) -> np.ndarray:
    """``M @ v`` per sample: ``v`` (S, n) -> (S, k); ``M`` shared (k, n), batched, or CSR."""
    if sp.issparse(M):
        return np.ascontiguousarray((M @ v.T).T)
    return v @ M.T if M.ndim == 2 else np.matmul(M, v[:, :, None])[:, :, 0]


def _rmv(M: Any, w: np.ndarray) -> np.ndarray:
    """``M^T @ w`` per sample: ``w`` (S, k) -> (S, n)."""
    if sp.issparse(M):
        return np.ascontiguousarray((M.T @ w.T).T)
    return w @ M if M.ndim == 2 else np.matmul(w[:, None, :], M)[:, 0, :]


def _row_norms(M: Any, needed: np.ndarray) -> Any:
    """The max-norms of the rows of ``M`` (shared, batched or CSR), or ``1.0`` (no row is
    tiny, :func:`~dxopt.qp.certify.tolerances.row_floor`) when no row's own scale is below
    ``eps_abs`` (``needed`` is all False: the common case costs nothing)."""
    if not needed.any():
        return 1.0
    if sp.issparse(M) or M.ndim == 2:
        return row_inf(M)
    return np.abs(M).max(-1)


def batch_accept_exact(
    problem: QPProblem,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    g_inf: np.ndarray,
    *,
    eps_abs: float,
    eps_rel: float,
) -> BatchCertificate:
    """The certificate of :func:`polish`, vectorised over a batch of exact-working-set points
    (daqp), in numpy (one batched product per matrix): ``ok`` is True where the point
    certifies as it is and no row is violated beyond round-off (the point needs no polish).
    ``nu`` must be clipped at 0 and zero on zero rows; ``g_inf`` is ``(m,)`` or ``(S, m)``.
    Samples it rejects go through :func:`polish` one by one.

    The tests are those of :func:`_check` row for row; the norms of the dual scale are taken
    as one max-norm of the componentwise maximum :math:`\\max(|Px|, |A^\\top\\mu|,
    |G^\\top\\nu|)` (the same number, fewer passes over small arrays)."""
    rel = relative_tolerance(eps_rel)
    q = problem.q.numpy()
    px = _mv(numpy_matrix(problem, "P"), x)
    dual = px + q
    big = np.abs(px)  # componentwise max of |Px|, |A^T mu|, |G^T nu|
    ok: Any = True
    primal: Any = 0.0
    if problem.A is not None and problem.p:
        A, b = numpy_matrix(problem, "A"), problem.b.numpy()  # type: ignore[union-attr]
        ax = _mv(A, x)
        primal = _rows_inf(ax - b)
        scale_e = np.maximum(_rows_inf(ax), _rows_inf(b))[..., None]
        row_e = np.maximum(_mv(_abs(A), np.abs(x)), np.abs(b))
        tol_e = row_tolerance(eps_abs, rel, scale_e, row_e, _row_norms(A, row_e < eps_abs))
        ok = _all(np.abs(ax - b) <= tol_e, -1)
        at_mu = _rmv(A, mu)
        dual += at_mu
        big = np.maximum(big, np.abs(at_mu))
    has_g = problem.G is not None and problem.m > 0
    if has_g:
        G = numpy_matrix(problem, "G")
        gt_nu = _rmv(G, nu)
        dual += gt_nu
        big = np.maximum(big, np.abs(gt_nu))
    tol_d = eps_abs + rel * np.maximum(_max(big, -1), _rows_inf(q))
    dual_inf = _rows_inf(dual)
    dual_ok = dual_inf <= tol_d
    if not np.all(dual_ok):  # within the round-off of its own evaluation? (tolerances.py)
        terms = _mv(_abs(numpy_matrix(problem, "P")), np.abs(x)) + np.abs(q)
        if problem.A is not None and problem.p:
            terms = terms + _rmv(_abs(A), np.abs(mu))
        if has_g:
            terms = terms + _rmv(_abs(G), np.abs(nu))
        allowed = tol_d[..., None] + EVALUATION_ROUNDOFF * terms
        dual_ok = dual_ok | _all(np.abs(dual) <= allowed, -1)
    ok = ok & dual_ok
    if has_g:
        h = problem.h.numpy()  # type: ignore[union-attr]
        gx = _mv(G, x)
        s = h - gx
        p_scale = np.maximum(_rows_inf(gx), _rows_inf(h))
        row = np.maximum(_mv(_abs(G), np.abs(x)), np.abs(h))
        viol = np.maximum(-_min(s, -1), 0.0)  # max_i (g_i^T x - h_i)_+
        primal = np.maximum(primal, viol)
        ok &= _all(-s <= row_tolerance(eps_abs, rel, p_scale[..., None], row, g_inf), -1)
        tol_p = (eps_abs + rel * p_scale)[..., None]  # complementarity: the common scale
        free = ~(nu > 0)  # rows outside daqp's working set (J = nu > 0 on nonzero rows)
        zero = g_inf == 0
        if zero.any():
            ok &= ~((h < -eps_abs) & zero).any(-1)
            free &= ~zero
        roundoff = ROUNDOFF * np.maximum(p_scale, 1e-300)
        if not (viol <= roundoff).all():  # some row violated beyond round-off: is it free?
            ok &= ~((s < -roundoff[..., None]) & free).any(-1)
        both = np.minimum(np.maximum(s, 0.0) / tol_p, nu * g_inf / tol_d[..., None])
        ok &= _max(both, -1) <= 1.0
    # ok and dual_inf are (S,) arrays of their own (px is (S, n)); primal is a scalar only
    # when there are no constraint rows
    primal = primal if isinstance(primal, np.ndarray) else np.zeros(x.shape[0])
    return BatchCertificate(ok, primal, dual_inf)
