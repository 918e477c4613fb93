"""Maros-Meszaros problems: loading, acceptance check, raw solves and finite-difference data.

Everything here is independent of dxopt (numpy, scipy and :mod:`qpsolvers` only), so the
finite-difference evidence and the reference gradient of a problem can be cached and reused
when the same problem is judged against several versions of dxopt.

Data: ``NAME.npz`` files with keys ``Q, q, G, h, A, b`` (see the README next to them), found
in ``$DXOPT_MAROS_MESZAROS``, ``<repo>/../shared/data/maros_meszaros`` or
``/work/shared/data/maros_meszaros``. Nothing is downloaded.
"""

from __future__ import annotations

import math
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from benchmarks.common import REPO_ROOT

DATA_ENV = "DXOPT_MAROS_MESZAROS"
ZERO_ROW = "+ZEROROW"  # suffix: the problem plus one all-zero row of G with h = -1e-17

#: raw backends timed per problem, at the tolerance dxopt uses by default (``eps_abs=1e-9``)
RAW_SOLVERS = ("daqp", "piqp", "clarabel", "proxqp", "osqp")
RAW_OPTIONS: dict[str, dict[str, Any]] = {
    "daqp": {"primal_tol": 1e-9, "dual_tol": 1e-9},
    "piqp": {"eps_abs": 1e-9, "eps_rel": 0.0},
    "clarabel": {"tol_gap_abs": 1e-9, "tol_gap_rel": 0.0, "tol_feas": 1e-9},
    "proxqp": {"eps_abs": 1e-9, "eps_rel": 0.0},
    "osqp": {"eps_abs": 1e-9, "eps_rel": 0.0, "max_iter": 20000, "polishing": True},
}
#: solvers of the finite-difference re-solves, tried in order (tight tolerances)
FD_SOLVERS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("clarabel", {"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11, "tol_feas": 1e-11,
                  "tol_ktratio": 1e-9, "max_iter": 500}),
    ("piqp", {"eps_abs": 1e-11, "eps_rel": 0.0, "max_iter": 500}),
)  # fmt: skip
STEPS = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7)
DIRECTION_KINDS = ("q", "hb", "shift")


def data_dir() -> Path:
    """The folder of the ``.npz`` files (see the module docstring)."""
    env = os.environ.get(DATA_ENV)
    candidates = [Path(env)] if env else []
    candidates += [
        REPO_ROOT.parent / "shared" / "data" / "maros_meszaros",
        Path("/work/shared/data/maros_meszaros"),
    ]
    for c in candidates:
        if c.is_dir() and any(c.glob("*.npz")):
            return c
    raise FileNotFoundError(
        "Maros-Meszaros data not found: set $DXOPT_MAROS_MESZAROS to the folder of the "
        f"NAME.npz files (looked in: {', '.join(str(c) for c in candidates)})"
    )


@dataclass(frozen=True)
class MMProblem:
    """``min 1/2 x'Px + q'x  s.t.  Gx <= h, Ax = b`` with CSC matrices (``None``: no block)."""

    name: str
    P: sp.csc_matrix
    q: np.ndarray
    G: sp.csc_matrix | None
    h: np.ndarray | None
    A: sp.csc_matrix | None
    b: np.ndarray | None

    @property
    def n(self) -> int:
        return int(self.q.size)

    @property
    def m(self) -> int:
        return 0 if self.G is None else int(self.G.shape[0])

    @property
    def p(self) -> int:
        return 0 if self.A is None else int(self.A.shape[0])


def _block(d: Any, key: str) -> Any:
    v = d[key]
    return v.item() if v.dtype == object else v


def load(name: str, folder: Path | None = None) -> MMProblem:
    """Load ``NAME`` (or ``NAME+ZEROROW``: one all-zero row of ``G`` with ``h = -1e-17``
    appended, the round-off case of the issue)."""
    base, zero_row = (name[: -len(ZERO_ROW)], True) if name.endswith(ZERO_ROW) else (name, False)
    with np.load((folder or data_dir()) / f"{base}.npz", allow_pickle=True) as d:
        Q, q, G, h, A, b = (_block(d, k) for k in ("Q", "q", "G", "h", "A", "b"))
    n = int(np.asarray(q).size)

    def mat(M: Any) -> sp.csc_matrix | None:
        if M is None or M.shape[0] == 0:
            return None
        return sp.csc_matrix(M, dtype=np.float64)

    def vec(v: Any) -> np.ndarray | None:
        return None if v is None or np.asarray(v).size == 0 else np.asarray(v, dtype=np.float64)

    P = sp.csc_matrix(Q, dtype=np.float64) if Q is not None else sp.csc_matrix((n, n))
    P = sp.csc_matrix(0.5 * (P + P.T))
    Gm, hv = mat(G), vec(h)
    if zero_row:
        Gm = sp.vstack([sp.csc_matrix((1, n)), Gm] if Gm is not None else [sp.csc_matrix((1, n))])
        Gm = sp.csc_matrix(Gm)
        hv = np.concatenate([[-1e-17], hv if hv is not None else []])
    Am, bv = mat(A), vec(b)
    return MMProblem(name, P, np.asarray(q, dtype=np.float64).ravel(), Gm, hv, Am, bv)


def problem_names(
    *, max_n: int = 2000, min_n: int = 0, folder: Path | None = None
) -> list[tuple[str, int]]:
    """``(name, n)`` of the problems with ``min_n < n <= max_n``, smallest first."""
    out = []
    for f in sorted((folder or data_dir()).glob("*.npz")):
        with np.load(f, allow_pickle=True) as d:
            n = int(np.asarray(d["q"]).size)
        if min_n < n <= max_n:
            out.append((f.stem, n))
    return sorted(out, key=lambda t: (t[1], t[0]))


# --------------------------------------------------------------------------------- acceptance


def residuals(
    prob: MMProblem, x: np.ndarray, y: np.ndarray | None, z: np.ndarray | None
) -> dict[str, float]:
    """Relative primal, dual and duality-gap residuals of ``(x, y, z)`` (OSQP-style scaling:
    each residual over the largest term it is made of, and at least 1)."""
    Px = prob.P @ x
    prim, pscale = 0.0, 1.0
    dual_terms = [Px, prob.q]
    gap_terms = [float(x @ Px), float(prob.q @ x)]
    if prob.A is not None and prob.b is not None:
        Ax = prob.A @ x
        prim = max(prim, float(np.abs(Ax - prob.b).max()))
        pscale = max(pscale, float(np.abs(Ax).max()), float(np.abs(prob.b).max()))
        if y is not None:
            dual_terms.append(prob.A.T @ y)
            gap_terms.append(float(prob.b @ y))
    if prob.G is not None and prob.h is not None:
        Gx = prob.G @ x
        prim = max(prim, float(np.maximum(Gx - prob.h, 0.0).max()))
        pscale = max(pscale, float(np.abs(Gx).max()), float(np.abs(prob.h).max()))
        if z is not None:
            dual_terms.append(prob.G.T @ z)
            gap_terms.append(float(prob.h @ z))
    missing_duals = (prob.p and y is None) or (prob.m and z is None)
    dual = math.inf if missing_duals else float(np.abs(sum(dual_terms)).max(initial=0.0))
    dscale = max([1.0] + [float(np.abs(t).max(initial=0.0)) for t in dual_terms])
    gap = math.inf if missing_duals else abs(sum(gap_terms))
    gscale = max([1.0] + [abs(t) for t in gap_terms])
    return {"primal": prim / pscale, "dual": dual / dscale, "gap": gap / gscale}


def accepted(res: dict[str, float], tol: float) -> bool:
    """All three relative residuals of :func:`residuals` at most ``tol``."""
    return all(math.isfinite(v) and v <= tol for v in res.values())


# --------------------------------------------------------------------------------- raw solves


def _qp(prob: MMProblem, dq=None, dh=None, db=None, t: float = 0.0, *, dense: bool = False):
    import qpsolvers

    q = prob.q if dq is None else prob.q + t * dq
    h = prob.h if dh is None or prob.h is None else prob.h + t * dh
    b = prob.b if db is None or prob.b is None else prob.b + t * db

    def conv(M: Any) -> Any:
        return None if M is None else (M.toarray() if dense else M)

    return qpsolvers.Problem(conv(prob.P), q, conv(prob.G), h, conv(prob.A), b)


def raw_solve(prob: MMProblem, solver: str, *, accept_tol: float, repeats: int = 3) -> dict:
    """Time one raw qpsolvers backend (best of up to ``repeats`` runs when a run is < 1 s)."""
    import qpsolvers

    if solver not in qpsolvers.available_solvers:
        return {"status": "not installed"}
    problem = _qp(prob, dense=solver == "daqp")  # daqp is a dense solver
    times: list[float] = []
    sol = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        sol = qpsolvers.solve_problem(problem, solver=solver, **RAW_OPTIONS[solver])
        times.append(time.perf_counter() - t0)
        if times[-1] > 1.0:
            break
    assert sol is not None
    found = bool(sol.found) and sol.x is not None and bool(np.isfinite(sol.x).all())
    out: dict[str, Any] = {"status": "ok", "found": found, "time_s": min(times)}
    if found:
        res = residuals(prob, np.asarray(sol.x), sol.y, sol.z)
        out.update(residuals=res, success=accepted(res, accept_tol))
    else:
        out["success"] = False
    return out


# ---------------------------------------------------------------------- finite-difference data


def _seed(name: str, seed: int) -> int:
    return zlib.crc32(name.encode()) + 7919 * seed


def loss_weights(prob: MMProblem, seed: int) -> np.ndarray:
    """The loss ``L = w . x*``: ``w ~ N(0, I)``, fixed by the problem name and ``seed``."""
    return np.random.default_rng(_seed(prob.name, seed)).standard_normal(prob.n)


def directions(prob: MMProblem, seed: int) -> list[dict[str, Any]]:
    """Random directions in ``(q, h, b)``, each entry scaled by ``max(|theta_i|, 1)``.

    ``"q"``: ``q`` only (the feasible set is unchanged); ``"hb"``: ``h`` (zero on all-zero rows
    of ``G``) and ``b`` in the range of ``A`` (``b + t A delta`` stays consistent);
    ``"shift"``: ``(h, b) + t (G delta, A delta)``, a translation of the feasible set, feasible
    on both sides of every step.
    """
    rng = np.random.default_rng(_seed(prob.name, seed) + 1)

    def scaled(v: np.ndarray) -> np.ndarray:
        return rng.standard_normal(v.size) * np.maximum(np.abs(v), 1.0)

    def in_range(M: sp.csc_matrix, target: np.ndarray) -> np.ndarray:
        v = M @ rng.standard_normal(prob.n)
        top = float(np.abs(v).max(initial=0.0))
        return v * (max(float(np.abs(target).max(initial=0.0)), 1.0) / top) if top else v

    out: list[dict[str, Any]] = [{"kind": "q", "q": scaled(prob.q), "h": None, "b": None}]
    dh = None
    if prob.G is not None and prob.h is not None:
        dh = scaled(prob.h)
        dh[np.diff(sp.csr_matrix(prob.G).indptr) == 0] = 0.0
    db = in_range(prob.A, prob.b) if prob.A is not None and prob.b is not None else None
    out.append({"kind": "hb", "q": None, "h": dh, "b": db})
    delta = rng.standard_normal(prob.n)
    shift_h = None if prob.G is None else prob.G @ delta
    shift_b = None if prob.A is None else prob.A @ delta
    out.append({"kind": "shift", "q": None, "h": shift_h, "b": shift_b})
    return out


def fd_solve(prob: MMProblem, d: dict[str, Any] | None, t: float) -> tuple[np.ndarray | None, str]:
    """``x*(theta + t d)`` with the first of :data:`FD_SOLVERS` that succeeds."""
    import qpsolvers

    problem = _qp(prob, *(None, None, None) if d is None else (d["q"], d["h"], d["b"]), t)
    for solver, opts in FD_SOLVERS:
        try:
            sol = qpsolvers.solve_problem(problem, solver=solver, **opts)
        except Exception:  # a backend crash is a failed re-solve, recorded as None
            continue
        if sol.found and sol.x is not None and np.isfinite(sol.x).all():
            res = residuals(prob_at(prob, d, t), np.asarray(sol.x), sol.y, sol.z)
            if accepted(res, 1e-7):
                return np.asarray(sol.x), solver
    return None, ""


def prob_at(prob: MMProblem, d: dict[str, Any] | None, t: float) -> MMProblem:
    """The problem at ``theta + t d``."""
    if d is None or t == 0.0:
        return prob

    def add(v: np.ndarray | None, dv: np.ndarray | None) -> np.ndarray | None:
        return v if v is None or dv is None else v + t * dv

    q = add(prob.q, d["q"])
    assert q is not None
    return MMProblem(prob.name, prob.P, q, prob.G, add(prob.h, d["h"]), prob.A, add(prob.b, d["b"]))


def solver_noise(prob: MMProblem, w: np.ndarray) -> tuple[float, np.ndarray | None]:
    """``|w . (x_a - x_b)|`` between the two FD solvers at ``theta`` (the evaluation error
    bound of the judge), and the first solver's ``x``; ``inf`` if only one of them solves."""
    import qpsolvers

    xs = []
    for solver, opts in FD_SOLVERS:
        try:
            sol = qpsolvers.solve_problem(_qp(prob), solver=solver, **opts)
            ok = sol.found and sol.x is not None and np.isfinite(sol.x).all()
            xs.append(np.asarray(sol.x) if ok else None)
        except Exception:
            xs.append(None)
    if any(x is None for x in xs):
        return math.inf, next((x for x in xs if x is not None), None)
    return float(abs(w @ (xs[0] - xs[1]))), xs[0]


def fd_evidence(prob: MMProblem, seed: int, steps: tuple[float, ...] = STEPS) -> dict[str, Any]:
    """Everything the judge needs that does not depend on dxopt: per direction ``f(0)``,
    ``f(+-t)`` for ``L = w . x*``, the noise bound, and the exact reference gradient on a
    verified active set where one exists (:func:`reference_gradient`)."""
    t0 = time.perf_counter()
    w = loss_weights(prob, seed)
    noise, _ = solver_noise(prob, w)
    x0, base_solver = fd_solve(prob, None, 0.0)
    out: dict[str, Any] = {"noise": noise, "base_solver": base_solver, "x0": x0, "directions": []}
    if x0 is None:
        out["f0"] = None
    else:
        out["f0"] = float(w @ x0)
        if not math.isfinite(noise):  # one FD solver only: a conservative bound
            out["noise"] = 1e-8 * float(np.abs(w) @ np.maximum(np.abs(x0), 1.0))
    for d in directions(prob, seed):
        plus, minus = {}, {}
        if x0 is not None:
            for t in steps:
                xp, _ = fd_solve(prob, d, t)
                xm, _ = fd_solve(prob, d, -t)
                plus[t] = None if xp is None else float(w @ xp)
                minus[t] = None if xm is None else float(w @ xm)
        out["directions"].append({"kind": d["kind"], "plus": plus, "minus": minus})
    out["reference"] = reference_gradient(prob, w)
    out["fd_s"] = time.perf_counter() - t0
    return out


def reference_gradient(prob: MMProblem, w: np.ndarray) -> dict[str, Any]:
    """The exact reduced-KKT gradient of ``w . x*`` (:mod:`benchmarks.qp.reference`), kept only
    on a *verified* active set: LICQ holds, strict complementarity with a margin
    (active multipliers and inactive slacks above ``1e-6`` relative), the polished point is
    feasible and stationary. There the solution map is smooth and its gradient unique."""
    from benchmarks.qp.generators import QPProblem
    from benchmarks.qp.reference import reference_grads

    qp = QPProblem("maros-meszaros", prob.n, prob.P, prob.q, prob.A, prob.b, prob.G, prob.h)
    try:
        grads, ex = reference_grads(qp, w, matrices=False)
    except Exception as exc:  # no reference for this problem
        return {"verified": False, "why": f"{type(exc).__name__}: {str(exc)[:120]}"}
    assert ex is not None
    res = residuals(prob, ex.x, ex.eq_duals, ex.ineq_duals)
    why = []
    if ex.degenerate:
        why.append("active rows dependent")
    if not accepted(res, 1e-8):
        why.append(f"polished point residuals {res}")
    if prob.G is not None and prob.h is not None:
        slack = prob.h - prob.G @ ex.x
        act = np.zeros(prob.m, bool)
        act[ex.active] = True
        zscale = max(1.0, float(np.abs(ex.ineq_duals).max(initial=0.0)))
        if act.any() and ex.ineq_duals[act].min() <= 1e-6 * zscale:
            why.append("weakly active row")
        if (~act).any() and (slack[~act] / (1.0 + np.abs(prob.h[~act]))).min() <= 1e-6:
            why.append("inactive row with (near-)zero slack")
    keys = [k for k in ("q", "h", "b") if k in grads]
    out: dict[str, Any] = {"verified": not why, "why": "; ".join(why)}
    if not why:
        out["grads"] = {k: np.asarray(grads[k], dtype=np.float64) for k in keys}
    return out
