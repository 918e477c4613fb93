"""Checked certificates of infeasibility and unboundedness: the status of a sample that no
attempt of the fallback chain solved.

A QP :math:`\\min \\tfrac12 x^\\top Px + q^\\top x` s.t. :math:`Gx \\le h`, :math:`Ax = b` is
claimed ``INFEASIBLE`` or ``UNBOUNDED`` only with a certificate that dxopt checks itself
(Boyd & Vandenberghe, *Convex Optimization*, §5.8; the OSQP paper, Stellato et al. 2020, §3.4):

- **primal infeasibility** (Farkas): :math:`y \\ge 0`, :math:`z` with
  :math:`G^\\top y + A^\\top z = 0` and :math:`h^\\top y + b^\\top z < 0`; for any feasible
  :math:`x`, :math:`0 \\le y^\\top(h - Gx) + z^\\top(b - Ax) = h^\\top y + b^\\top z`, a
  contradiction;
- **unboundedness**: a feasible point and a direction :math:`d` with :math:`Pd = 0`,
  :math:`q^\\top d < 0`, :math:`Gd \\le 0`, :math:`Ad = 0`: the objective decreases without
  bound along :math:`x + td`. A strictly convex ``P`` (its Cholesky factorization succeeds)
  is never unbounded, and no direction is searched for.

The check (:func:`check_farkas`, :func:`check_descent`) is relative to the certificate's own
terms: the ray is scaled to :math:`\\|(y, z)\\|_\\infty = 1` (:math:`\\|d\\|_\\infty = 1`),
each residual must be at most ``CERT_TOL`` times the largest magnitude of the terms it sums
(:math:`|G|^\\top|y| + |A|^\\top|z|` for :math:`G^\\top y + A^\\top z`), and the gap
:math:`h^\\top y + b^\\top z` (the slope :math:`q^\\top d`) must be below ``-CERT_TOL`` times
:math:`|h|^\\top|y| + |b|^\\top|z|` (:math:`|q|^\\top|d|`). A certificate comes from the
backend where it gives one (OSQP's ``prim_inf_cert``/``dual_inf_cert``), else from a small
LP solved by clarabel (the Farkas LP :math:`\\min h^\\top y + b^\\top z` s.t.
:math:`G^\\top y + A^\\top z = 0`, :math:`0 \\le y \\le 1`, :math:`|z| \\le 1`; the direction
LP :math:`\\min q^\\top d` s.t. :math:`Pd = 0`, :math:`Gd \\le 0`, :math:`Ad = 0`,
:math:`|d| \\le 1`), sparse where the data are; either way it is checked here.

Without a certificate the status says what happened: ``INACCURATE`` first when some attempt's
point missed the tolerance by at most ``NEAR_MISS`` (the worst residual over its tolerance):
no attempt of the chain got closer, typically because the residuals stopped at the round-off
of the data's scale, where more iterations do not help; the reason names the factor to loosen
the tolerance by (Maros-Meszaros
LISWET7: multipliers up to 2e6 on rows :math:`(1, -2, 1)`, the float64 sum
:math:`G^\\top\\nu` carries round-off up to :math:`u\\,|G|^\\top|\\nu| \\approx 2\\cdot10^{-9}`
while the dual tolerance at ``eps_abs = 1e-9`` is :math:`1.1\\cdot10^{-9}`; piqp's point misses
it by a factor 1.02, the polish by 1.24); else ``MAX_ITER`` when an attempt stopped at
its iteration limit (raise ``max_iter`` in ``solver_options``, or loosen ``eps_abs``),
``INACCURATE`` when an attempt returned a point that does not meet the tolerance (loosen
``eps_abs``/``eps_rel`` or rescale the data), ``FAILED`` when no attempt returned a point.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dxopt.qp.certify.tolerances import CERT_TOL, NEAR_MISS
from dxopt.qp.problem.types import QPStatus

__all__ = [
    "Diagnosis",
    "check_descent",
    "check_farkas",
    "diagnose",
    "hit_iteration_limit",
]


_LP_SOLVER = "clarabel"  # a core dependency: interior point, sparse, LPs with P = 0


@dataclass(frozen=True)
class Diagnosis:
    """The status of an unsolved sample and one sentence on why and what to change."""

    status: QPStatus
    reason: str


def _dense(M: Any) -> Any:
    return M if M is None or sp.issparse(M) else np.asarray(M, dtype=np.float64)


def _abs(M: Any) -> Any:
    return abs(M) if sp.issparse(M) else np.abs(M)


def check_farkas(
    G: Any, h: Any, A: Any, b: Any, y: np.ndarray, z: np.ndarray, *, tol: float = CERT_TOL
) -> bool:
    """Whether ``(y, z)`` proves that :math:`Gx \\le h, Ax = b` has no solution (module
    docstring): ``y >= 0`` (entries below ``-tol`` refuse it, smaller ones are clipped),
    :math:`G^\\top y + A^\\top z = 0` and :math:`h^\\top y + b^\\top z < 0`, relative to the
    ray's own terms."""
    y = np.zeros(0) if G is None else np.asarray(y, dtype=np.float64).reshape(-1)
    z = np.zeros(0) if A is None else np.asarray(z, dtype=np.float64).reshape(-1)
    size = float(np.abs(np.concatenate([y, z])).max(initial=0.0))
    if not np.isfinite(size) or size == 0.0:
        return False
    y, z = y / size, z / size
    if y.size and y.min() < -tol:
        return False
    y = np.maximum(y, 0.0)
    residual, terms = 0.0, 0.0
    gap, gap_terms = 0.0, 0.0
    if G is not None and y.size:
        residual = residual + G.T @ y
        terms = terms + _abs(G).T @ y
        gap += float(h @ y)
        gap_terms += float(np.abs(h) @ y)
    if A is not None and z.size:
        residual = residual + A.T @ z
        terms = terms + _abs(A).T @ np.abs(z)
        gap += float(b @ z)
        gap_terms += float(np.abs(b) @ np.abs(z))
    r = float(np.abs(residual).max(initial=0.0))
    scale = float(np.abs(terms).max(initial=0.0))
    return bool(r <= tol * scale and gap < -tol * gap_terms and gap < 0.0)


def check_descent(
    P: Any, q: np.ndarray, G: Any, A: Any, d: np.ndarray, *, tol: float = CERT_TOL
) -> bool:
    """Whether ``d`` is a direction of unbounded descent (module docstring): :math:`Pd = 0`,
    :math:`q^\\top d < 0`, :math:`Gd \\le 0`, :math:`Ad = 0`; with :math:`\\|d\\|_\\infty = 1`,
    each row's residual at most ``tol`` times the row's 1-norm (the slope: ``-tol``
    :math:`\\|q\\|_1`)."""
    d = np.asarray(d, dtype=np.float64).reshape(-1)
    size = float(np.abs(d).max(initial=0.0))
    if not np.isfinite(size) or size == 0.0:
        return False
    d = d / size
    slope = float(q @ d)
    if not (slope < 0.0 and slope < -tol * float(np.abs(q).sum())):
        return False
    for M, one_sided in ((P, False), (G, True), (A, False)):
        if M is None or M.shape[0] == 0:
            continue
        v = np.asarray(M @ d).reshape(-1)
        v = np.maximum(v, 0.0) if one_sided else np.abs(v)
        row_norms = np.asarray(_abs(M).sum(axis=1)).reshape(-1)  # ||M_i||_1, ||d||_inf = 1
        if bool((v > tol * row_norms).any()):
            return False
    return True


def hit_iteration_limit(solution: Any) -> bool:
    """Whether a :mod:`qpsolvers` ``Solution`` stopped at its iteration limit (the status text
    of OSQP, PIQP, Clarabel, ProxQP, SCS: it names "max" and "iter")."""
    extras = getattr(solution, "extras", None) or {}
    texts = [extras.get("status"), getattr(extras.get("info"), "status", None)]
    for t in texts:
        s = str(t).lower()
        if "max" in s and "iter" in s:
            return True
    return False


def _lp(c: np.ndarray, A_eq: Any, G_in: Any, lb: np.ndarray, ub: np.ndarray) -> Any:
    """``argmin c'v`` s.t. ``A_eq v = 0``, ``G_in v <= 0``, ``lb <= v <= ub`` by clarabel
    (``None`` when it finds no point)."""
    import qpsolvers

    k = c.size
    kw: dict[str, Any] = {"P": sp.csc_matrix((k, k)), "q": c, "lb": lb, "ub": ub}
    if A_eq is not None and A_eq.shape[0]:
        kw["A"], kw["b"] = sp.csc_matrix(A_eq), np.zeros(A_eq.shape[0])
    if G_in is not None and G_in.shape[0]:
        kw["G"], kw["h"] = sp.csc_matrix(G_in), np.zeros(G_in.shape[0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sol = qpsolvers.solve_problem(qpsolvers.Problem(**kw), solver=_LP_SOLVER)
    except Exception:  # a crash of the LP solver: no certificate
        return None
    if sol.x is None or not np.all(np.isfinite(sol.x)):
        return None
    return np.asarray(sol.x, dtype=np.float64)


def _stack_cols(*mats: Any) -> Any:
    present = [M for M in mats if M is not None]
    if any(sp.issparse(M) for M in present):
        return sp.hstack([sp.csc_matrix(M) for M in present], format="csc")
    return np.hstack(present)


def refine_ray(G: Any, A: Any, y: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least change of ``(y, z)`` on the support of ``y`` (its entries above ``1e-9`` of
    the largest; ``z`` everywhere) that makes :math:`G^\\top y + A^\\top z = 0`, then
    :math:`y \\ge 0`: a backend's or the LP's approximate ray made exact up to round-off
    (OSQP stops at a relative residual of about 1e-7, above ``CERT_TOL``)."""
    y = np.zeros(0) if G is None else np.asarray(y, dtype=np.float64).reshape(-1)
    z = np.zeros(0) if A is None else np.asarray(z, dtype=np.float64).reshape(-1)
    size = float(np.abs(np.concatenate([y, z])).max(initial=0.0))
    if size == 0.0 or not np.isfinite(size):
        return y, z
    y, z = np.maximum(y / size, 0.0), z / size
    support = np.flatnonzero(y > 1e-9)
    cols, residual = [], 0.0
    if G is not None and y.size:
        cols.append(G[support].T)
        residual = residual + G.T @ y
    if A is not None and z.size:
        cols.append(A.T)
        residual = residual + A.T @ z
    if not cols:
        return y, z
    C = _stack_cols(*cols)
    if sp.issparse(C):
        import scipy.sparse.linalg as spla

        step = spla.lsqr(C, -np.asarray(residual).reshape(-1), atol=1e-15, btol=1e-15)[0]
    else:
        step = np.linalg.lstsq(C, -np.asarray(residual).reshape(-1), rcond=None)[0]
    y = y.copy()
    y[support] += step[: support.size]
    z = z + step[support.size :]
    return np.maximum(y, 0.0), z


def farkas_ray(G: Any, h: Any, A: Any, b: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """A candidate Farkas ray from the bounded LP of the module docstring (unchecked)."""
    m = 0 if G is None else G.shape[0]
    p = 0 if A is None else A.shape[0]
    if m + p == 0:
        return None
    c = np.concatenate([h if m else np.zeros(0), b if p else np.zeros(0)])
    M = _stack_cols(G.T if m else None, A.T if p else None)
    lb = np.concatenate([np.zeros(m), -np.ones(p)])
    v = _lp(c, M, None, lb, np.ones(m + p))
    if v is None:
        return None
    return v[:m], v[m:]


def descent_direction(P: Any, q: np.ndarray, G: Any, A: Any) -> np.ndarray | None:
    """A candidate direction of unbounded descent from the bounded LP (unchecked)."""
    n = q.size
    rows = [M for M in (P, A) if M is not None and M.shape[0]]
    A_eq = (
        (sp.vstack(rows) if any(sp.issparse(M) for M in rows) else np.vstack(rows))
        if rows
        else None
    )
    return _lp(q, A_eq, G, -np.ones(n), np.ones(n))


def strictly_convex(P: Any) -> bool:
    """Whether ``P`` is positive definite (its Cholesky factorization succeeds; sparse ``P``:
    a sparse LU without pivoting whose pivots are all positive, the same test)."""
    if sp.issparse(P):
        from dxopt.qp.problem.canonical import sparse_positive_definite

        return sparse_positive_definite(sp.csc_matrix(P))
    try:
        np.linalg.cholesky(np.asarray(P, dtype=np.float64))
    except np.linalg.LinAlgError:
        return False
    return True


def _feasible(G: Any, h: Any, A: Any, b: Any, n: int, tol: float) -> bool:
    """Whether the projection of the origin onto the feasible set (clarabel) is feasible to
    ``tol`` relative to the rows' terms."""
    import qpsolvers

    sparse = any(sp.issparse(M) for M in (G, A) if M is not None)
    kw: dict[str, Any] = {"P": sp.identity(n, format="csc") if sparse else np.eye(n)}
    kw.update(q=np.zeros(n), G=G, h=h, A=A, b=b)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sol = qpsolvers.solve_problem(qpsolvers.Problem(**kw), solver=_LP_SOLVER)
    except Exception:
        return False
    if sol.x is None or not np.all(np.isfinite(sol.x)):
        return False
    x = np.asarray(sol.x, dtype=np.float64)
    for M, v, one_sided in ((G, h, True), (A, b, False)):
        if M is None or not M.shape[0]:
            continue
        r = M @ x - v
        r = np.maximum(r, 0.0) if one_sided else np.abs(r)
        scale = np.asarray(_abs(M) @ np.abs(x)).reshape(-1) + np.abs(v) + 1.0
        if bool((r > tol * scale).any()):
            return False
    return True


def diagnose(
    args: dict[str, Any],
    *,
    claims: list[dict[str, Any]],
    hit_cap: bool,
    had_point: bool,
    eps_abs: float,
    convex_known: bool | None = None,
    best_miss: float = float("inf"),
    best_from: str = "",
) -> Diagnosis:
    """The status of a sample that no attempt solved (module docstring).

    ``args``: the sample's ``P, q, A, b, G, h`` (numpy or scipy); ``claims``: per attempt that
    stopped without a solution, ``{"claim": who, "prim_inf_cert": ..., "dual_inf_cert": ...}``
    (the rays where the backend gives them, OSQP's layout: the rows of ``[G; A]``);
    ``hit_cap``: some attempt stopped at its iteration limit; ``had_point``: some attempt
    returned a point that did not certify; ``convex_known``: whether ``P`` is already known to
    be positive definite (``None``: test it here); ``best_miss``: the least worst-residual /
    tolerance ratio of those points, ``best_from`` the attempt that gave it."""
    P, q, A, b, G, h = (_dense(args[k]) for k in ("P", "q", "A", "b", "G", "h"))
    m = 0 if G is None else G.shape[0]
    # 1. infeasible: the backends' rays first, then the Farkas LP; each one checked
    rays = [c["prim_inf_cert"] for c in claims if c.get("prim_inf_cert") is not None]
    for ray in rays:
        ray = np.asarray(ray, dtype=np.float64).reshape(-1)
        if ray.size == m + (0 if A is None else A.shape[0]) and check_farkas(
            G, h, A, b, *refine_ray(G, A, ray[:m], ray[m:])
        ):
            return Diagnosis(QPStatus.INFEASIBLE, "a Farkas ray from the backend, checked")
    pair = farkas_ray(G, h, A, b)
    if pair is not None and check_farkas(G, h, A, b, *refine_ray(G, A, *pair)):
        return Diagnosis(
            QPStatus.INFEASIBLE, "a Farkas ray (y >= 0, G'y + A'z = 0, h'y + b'z < 0), checked"
        )
    # 2. unbounded: a checked direction of descent and a feasible point (never for P > 0)
    convex = strictly_convex(P) if convex_known is None else convex_known
    if not convex:
        directions = [c["dual_inf_cert"] for c in claims if c.get("dual_inf_cert") is not None]
        found = [d for d in directions if np.size(d) == q.size and check_descent(P, q, G, A, d)]
        if not found:
            d = descent_direction(P, q, G, A)
            found = [d] if d is not None and check_descent(P, q, G, A, d) else []
        if found and _feasible(G, h, A, b, q.size, max(1e3 * eps_abs, 1e-7)):
            return Diagnosis(
                QPStatus.UNBOUNDED,
                "a feasible point and a direction d with Pd = 0, q'd < 0, Gd <= 0, Ad = 0, checked",
            )
    # 3. no certificate: say what stopped the solve and what to change
    if best_miss <= NEAR_MISS:  # round-off of the data's scale, not an iteration limit
        return Diagnosis(
            QPStatus.INACCURATE,
            f"the best point ({best_from or 'a backend'}) misses the requested tolerance by a "
            f"factor {best_miss:.3g} only, and no attempt of the chain got closer (typical of "
            "residuals at the round-off of badly scaled data, where more iterations do not "
            f"help); loosen eps_abs (and eps_rel) by a factor of at least {best_miss:.3g}",
        )
    if hit_cap:
        return Diagnosis(
            QPStatus.MAX_ITER,
            "the backend stopped at its iteration limit and no certificate of infeasibility or "
            "unboundedness exists; raise max_iter in solver_options, loosen eps_abs, or leave "
            "fallback=True",
        )
    claimed = [str(c["claim"]) for c in claims if c.get("claim")]
    if claimed:
        return Diagnosis(
            QPStatus.INACCURATE,
            f"the backend stopped without a solution ({claimed[0]}), but no certificate of "
            "infeasibility or unboundedness checks: the data are likely badly scaled or nearly "
            "infeasible; rescale P, q and the constraint rows, or try another solver",
        )
    if had_point:
        return Diagnosis(
            QPStatus.INACCURATE,
            "the backend's point misses the requested tolerance and no certificate of "
            "infeasibility or unboundedness exists; loosen eps_abs/eps_rel or rescale P, q and "
            "the constraint rows (badly scaled data)",
        )
    return Diagnosis(
        QPStatus.FAILED,
        "no backend returned a point and no certificate of infeasibility or unboundedness "
        "exists; try another solver, rescale the data, or leave fallback=True",
    )


_ADVICE = {
    QPStatus.INFEASIBLE: "fix the data (no point satisfies the constraints)",
    QPStatus.UNBOUNDED: "fix the data (the objective decreases without bound)",
    QPStatus.MAX_ITER: "raise max_iter in solver_options or loosen eps_abs",
    QPStatus.INACCURATE: "loosen eps_abs/eps_rel or rescale the data",
    QPStatus.FAILED: "try another solver or rescale the data",
}


def unsolved_message(
    solver: str, status: tuple[QPStatus, ...], reasons: tuple[str, ...] = ()
) -> str:
    """The message of :class:`~dxopt.qp.QPSolveError`: the failed samples with their status,
    then per status why (the first such sample's reason) and what to change."""
    failed = [i for i, s in enumerate(status) if not s.ok]
    kinds = {i: status[i].value for i in failed}
    parts = [f"{len(failed)} of {len(status)} QPs not solved by {solver!r}"]
    parts[0] += f" (batch index: status) {kinds}."
    seen: set[QPStatus] = set()
    for i in failed:
        s = status[i]
        if s in seen:
            continue
        seen.add(s)
        why = reasons[i] if i < len(reasons) and reasons[i] else s.message
        parts.append(f"{s.value} (e.g. sample {i}): {why}; {_ADVICE.get(s, 'check the data')}.")
    parts.append("Or pass on_failure='nan' to get NaN for those samples.")
    return " ".join(parts)
