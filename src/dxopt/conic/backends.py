"""The forward backends: Clarabel and SCS run over the samples of a batch.

Each runner returns a :class:`RawPoints` (the backend's claim and point per sample, in dxopt's
row order and triangle convention); nothing here is trusted: :mod:`dxopt.conic.certify`
checks every point and certificate. Both build their data once per call where ``P`` and
``A`` are shared and then only update ``q`` and ``b`` per sample (Clarabel's and SCS's data
updates); a batched ``P`` or ``A`` is written on the union of the batch's sparsity patterns so
that the per-sample update is a values copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from dxopt.conic.problem import ConicProblem
from dxopt.conic.sparse_problem import SparseConicProblem

__all__ = ["RawPoints", "run_clarabel", "run_scs", "scs_available"]


@dataclass(frozen=True)
class RawPoints:
    """A backend's answer for the samples ``index``: ``claims[i]`` is ``"solved"``,
    ``"infeasible"`` (``y`` holds the Farkas certificate), ``"unbounded"`` (``x`` holds the
    direction), ``"max_iter"`` or ``"failed"``."""

    index: list[int]
    claims: list[str]
    x: np.ndarray
    y: np.ndarray
    s: np.ndarray
    iterations: list[int]


class _Pattern:
    """A (batched) dense matrix written on the union of the batch's nonzero pattern (csc);
    ``upper`` keeps the upper triangle only (Clarabel's and SCS's ``P``)."""

    def __init__(self, M: torch.Tensor, *, upper: bool, rows: np.ndarray | None = None):
        arr = M.numpy()
        if rows is not None:
            arr = arr[:, rows, :]
        mask = (arr != 0).any(axis=0)
        if upper:
            mask = np.triu(mask)
        self.shape = arr.shape[1:]
        # column-major order of the csc pattern
        cols, rws = np.nonzero(mask.T)
        self.rows, self.cols = rws, cols
        self.values = arr[:, rws, cols]  # (BM, nnz)
        self.batched = arr.shape[0] > 1
        self.indptr = _indptr(cols, self.shape[1])

    @classmethod
    def of(cls, M: Any, *, upper: bool, rows: np.ndarray | None = None) -> _Pattern:
        """The pattern of a dense ``(BM, r, c)`` tensor or of a shared scipy sparse matrix
        (the sparse route, :mod:`dxopt.conic.sparse_route`: its stored entries, no dense
        copy)."""
        if not sp.issparse(M):
            return cls(M, upper=upper, rows=rows)
        S = sp.csr_matrix(M)
        if rows is not None:
            S = S[rows]
        if upper:
            S = sp.triu(S)
        C = sp.csc_matrix(S)
        C.sort_indices()
        self = cls.__new__(cls)
        self.shape = C.shape
        self.rows = C.indices.astype(np.int64)
        self.cols = np.repeat(np.arange(C.shape[1]), np.diff(C.indptr))
        self.values = C.data[None, :]
        self.batched = False
        self.indptr = C.indptr.astype(np.int64)
        return self

    def matrix(self, i: int) -> sp.csc_matrix:
        # the pattern is in csc order already (sorted rows per column, no duplicates): the
        # compressed constructor, without the triplet conversion
        k = i if self.batched else 0
        return sp.csc_matrix((self.values[k], self.rows, self.indptr), shape=self.shape)

    def data(self, i: int) -> np.ndarray:
        return self.values[i if self.batched else 0]


def _indptr(cols: np.ndarray, ncols: int) -> np.ndarray:
    """The csc column pointers of entries listed column by column (``cols`` sorted)."""
    return np.searchsorted(cols, np.arange(ncols + 1)).astype(np.int64)


def _clarabel_claim(status: Any) -> str:
    name = str(status)
    if name in ("Solved", "AlmostSolved"):
        return "solved"
    if name in ("PrimalInfeasible", "AlmostPrimalInfeasible"):
        return "infeasible"
    if name in ("DualInfeasible", "AlmostDualInfeasible"):
        return "unbounded"
    if name in ("MaxIterations", "MaxTime"):
        return "max_iter"
    return "failed"


def run_clarabel(
    prob: ConicProblem | SparseConicProblem, index: list[int], tol: float, max_iter: int
) -> RawPoints:
    """Clarabel (Goulart & Chen, arXiv 2405.12762) on the samples ``index``."""
    import clarabel

    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.presolve_enable = False  # keeps the rows (and the data updates) as given
    settings.chordal_decomposition_enable = False
    settings.max_iter = max_iter
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = tol
    settings.tol_infeas_abs = settings.tol_infeas_rel = tol
    cones = [cone.clarabel() for cone in prob.cones]
    Pp = _Pattern.of(prob.P, upper=True)
    Ap = _Pattern.of(prob.A, upper=False)
    q, b = prob.q.numpy(), prob.b.numpy()
    k, n, m = len(index), prob.n, prob.m
    X, Y, S = np.full((k, n), np.nan), np.full((k, m), np.nan), np.full((k, m), np.nan)
    claims, iters = [], []
    solver = None
    for j, i in enumerate(index):
        if solver is None or not solver.is_data_update_allowed():
            solver = clarabel.DefaultSolver(Pp.matrix(i), q[i], Ap.matrix(i), b[i], cones, settings)
        else:
            update: dict[str, np.ndarray] = {"q": q[i], "b": b[i]}
            if Pp.batched:
                update["P"] = Pp.data(i)
            if Ap.batched:
                update["A"] = Ap.data(i)
            solver.update(**update)
        sol = solver.solve()
        claims.append(_clarabel_claim(sol.status))
        iters.append(int(sol.iterations))
        X[j], Y[j], S[j] = sol.x, sol.z, sol.s
    return RawPoints(index, claims, X, Y, S, iters)


def scs_available() -> bool:
    """Whether the optional SCS backend can be imported."""
    try:
        import scs  # noqa: F401
    except ImportError:
        return False
    return True


_SCS_ORDER = ("z", "l", "q", "s", "ep", "ed", "p")


def _scs_layout(prob: ConicProblem | SparseConicProblem) -> tuple[np.ndarray, dict[str, Any]]:
    """SCS's row order (cones grouped by kind in SCS's fixed order, PSD triangles in its
    lower-triangle order) as the rows of ours, and its cone dictionary."""
    groups: dict[str, list[np.ndarray]] = {key: [] for key in _SCS_ORDER}
    cone: dict[str, Any] = {}
    for c, sl in zip(prob.cones, prob.slices):
        key, entry = c.scs()
        perm = c.scs_perm()
        rows = np.arange(sl.start, sl.stop)
        groups[key].append(rows if perm is None else rows[np.asarray(perm)])
        if key in ("z", "l", "ep", "ed"):
            cone[key] = cone.get(key, 0) + entry
        else:
            cone.setdefault(key, []).append(entry)
    order = np.concatenate([r for key in _SCS_ORDER for r in groups[key]])
    return order, cone


def _scs_claim(info: dict[str, Any]) -> str:
    val = int(info.get("status_val", 0))
    if val in (1, 2):
        return "solved"
    if val in (-2, -7):
        return "infeasible"
    if val in (-1, -6):
        return "unbounded"
    if val == 3 or "max_iter" in str(info.get("status", "")).lower():
        return "max_iter"
    return "failed"


def run_scs(
    prob: ConicProblem | SparseConicProblem, index: list[int], tol: float, max_iter: int
) -> RawPoints:
    """SCS (O'Donoghue, Chu, Parikh & Boyd, 2016; O'Donoghue 2021) on the samples ``index``
    (``max_iter`` is scaled by 100: SCS's iterations are first-order steps)."""
    import scs

    order, cone = _scs_layout(prob)
    Pp = _Pattern.of(prob.P, upper=True)
    Ap = _Pattern.of(prob.A, upper=False, rows=order)
    q, b = prob.q.numpy(), prob.b.numpy()[:, order]
    k, n, m = len(index), prob.n, prob.m
    X, Y, S = np.full((k, n), np.nan), np.full((k, m), np.nan), np.full((k, m), np.nan)
    claims, iters = [], []
    settings = dict(verbose=False, eps_abs=tol, eps_rel=tol, max_iters=100 * max_iter)
    solver = None
    for j, i in enumerate(index):
        if solver is None or Pp.batched or Ap.batched:
            data = {"P": Pp.matrix(i), "A": Ap.matrix(i), "b": b[i], "c": q[i]}
            solver = scs.SCS(data, cone, **settings)
        else:
            solver.update(b=b[i], c=q[i])
        sol = solver.solve()
        info = sol["info"]
        claims.append(_scs_claim(info))
        iters.append(int(info.get("iter", 0)))
        X[j] = sol["x"]
        Y[j, order] = sol["y"]
        S[j, order] = sol["s"]
    return RawPoints(index, claims, X, Y, S, iters)
