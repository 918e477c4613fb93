"""Maros-Meszaros problems: loading, the acceptance check, raw solves, the loss and the
perturbation directions of the judge.

Everything here is independent of dxopt (numpy, scipy and :mod:`qpsolvers` only); the
finite-difference evidence built on it is :mod:`benchmarks.qp.mm_evidence`.

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

    ``"q"``: ``q`` only (the feasible set is unchanged); ``"hb"``: ``(h, b) + t (G delta +
    rho, A delta)`` with a random ``rho`` that is zero on the rows of :func:`fixed_rows` (so the
    equalities stay consistent and implicit equalities are moved, not broken);
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
    delta2 = rng.standard_normal(prob.n)
    dh = db = None
    if prob.G is not None and prob.h is not None:
        rho = scaled(prob.h)
        rho[fixed_rows(prob.G, prob.h)] = 0.0
        dh = prob.G @ delta2 + rho
    if prob.A is not None:
        db = prob.A @ delta2
    out.append({"kind": "hb", "q": None, "h": dh, "b": db})
    delta = rng.standard_normal(prob.n)
    shift_h = None if prob.G is None else prob.G @ delta
    shift_b = None if prob.A is None else prob.A @ delta
    out.append({"kind": "shift", "q": None, "h": shift_h, "b": shift_b})
    return out


def fixed_pairs(G: sp.csc_matrix, h: np.ndarray | None) -> np.ndarray:
    """``partner[i] = j`` for pairs of rows ``g'x <= c, -g'x <= -c`` (a variable or a row fixed
    by two opposite inequalities, as bounds ``l = u`` become when folded into ``G``), else -1."""
    R = sp.csr_matrix(G)
    R.sort_indices()
    partner = np.full(R.shape[0], -1)
    if h is None:
        return partner
    keys: dict[tuple, int] = {}
    for i in range(R.shape[0]):
        lo, hi = R.indptr[i], R.indptr[i + 1]
        if lo == hi:
            continue
        idx = tuple(R.indices[lo:hi].tolist())
        val = R.data[lo:hi]
        j = keys.get((idx, tuple(np.round(-val, 12).tolist())))
        if j is not None and partner[j] < 0 and abs(h[i] + h[j]) <= 1e-12 * (1.0 + abs(h[i])):
            partner[i], partner[j] = j, i
        keys.setdefault((idx, tuple(np.round(val, 12).tolist())), i)
    return partner


def fixed_rows(G: sp.csc_matrix, h: np.ndarray) -> np.ndarray:
    """Rows that must not be perturbed on their own: all-zero rows and :func:`fixed_pairs`."""
    return (np.diff(sp.csr_matrix(G).indptr) == 0) | (fixed_pairs(G, h) >= 0)
