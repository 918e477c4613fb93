"""Forward solve of a batch of QPs: backend, polish, certificate, fallback chain.

Each sample is solved by the chosen :mod:`qpsolvers` backend; sparse matrices are handed over
as scipy CSC, and the requested tolerance is passed to every backend in its own setting names
(daqp included: ``primal_tol``), with the relative part never below
``BACKEND_RELATIVE_FLOOR = 1e-12``: asked for more than double precision can reach on badly
scaled data, a backend stalls until its iteration limit (piqp on Maros-Meszaros CVXQP1_L,
n = 10000: the dual residual stops at 1e-8 on data of size 1e8, and the absolute 1e-9 kept it
iterating for 250 iterations of about 4 s; with the floor it stops after 14). The floor stays
below the certificate's own (``RELATIVE_FLOOR = 1e-10`` in :mod:`dxopt.qp.certify.polish`): at
``eps_rel = 1e-10`` piqp stops at points whose polish fails on a QP scaled by 1e8, at
``1e-12`` it does not. daqp is called through its own Python API on arrays built once
per batch (:mod:`dxopt.qp.solvers.daqp`: same points as through qpsolvers, without its per-call
``inspect.signature`` and problem checks), and its Cholesky of ``P`` stands in for the PSD
check of the validation. daqp's points (an exact working set) are certified all at once by the
vectorised certificate :func:`dxopt.qp.certify.polish.batch_accept_exact`; only the samples it
refuses take the per-sample polish and fallback path, and when it accepts every sample its
residuals are the ones :class:`~dxopt.qp.QPInfo` reports. Missing multipliers are recovered
by least squares on the active rows, :math:`[G_J^\\top\\ A^\\top][\\nu_J; \\mu] = -(Px^\\star + q)`.

Every backend's output is then polished on its active set and certified against the requested
tolerances (componentwise scales, zero rows handled explicitly; :mod:`dxopt.qp.certify.polish`).
A point is polished when it does not certify, is off by more than round-off, or leaves a row's
side unsettled (slack and multiplier both small, as at an interior-point solution); a looser-
tolerance attempt is always polished. A sample is ``SOLVED`` only if the certificate passes.

**Fallback chain** (``fallback=True``, the default; :func:`fallback_chain`): when an attempt
fails, reports infeasible/unbounded, or its polished point does not certify, the next attempt
runs (also when the point certifies only by its duality gap, i.e. its active set is not
settled; such a point is used only if no attempt gives a settled one): the requested backend,
then ``piqp``, ``clarabel``, ``daqp`` (dense, or n <= 3000),
then the requested backend at the looser stopping tolerance :math:`\\max(10^3\\varepsilon_{abs},
10^{-7})` (the polish restores the accuracy; the certificate is still the requested one;
skipped when that backend's strict point already certified, by its duality gap only: the looser
stop is for a backend that stalls short of the tolerance, and cannot settle a point that
reached it).
Why: on the Maros-Meszaros set piqp reports ``failed``/``infeasible`` on some feasible
problems that clarabel solves, and the reverse; an early stop at a looser tolerance followed
by an exact polish rescues problems where the backend stalls near the optimum. Which backend
and stopping tolerance produced each sample is recorded (``QPInfo.sample_solvers``,
``QPInfo.sample_tolerances``). A sample that no attempt certifies is ``INFEASIBLE`` or
``UNBOUNDED`` only with a certificate checked by :mod:`dxopt.qp.certify.certificates` (a Farkas ray,
or a feasible point and a direction of unbounded descent; the backend's own, else one from a
small LP); without one it is ``MAX_ITER`` (an attempt stopped at its iteration limit),
``INACCURATE`` (an attempt's point missed the tolerance) or ``FAILED`` (no point at all), and
``ForwardResult.reasons`` says what to change.

Parallelism: ``max_workers > 1`` solves samples on a thread pool. Measured on the shared
2-core machine (load average about 10 from other jobs; batch 128, n = 50, m = 50, p = 25, daqp
through qpsolvers, median of 7): serial loop 49 ms, 2 threads 48 ms, a warm 2-process pool
53 ms, a fresh 2-process pool per call 160 ms (start-up and pickling). Threads tie with the loop
and processes lose, so the default is the serial loop, threads are offered, processes are not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import qpsolvers
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt.qp.certify.active import row_inf_np
from dxopt.qp.certify.certificates import diagnose, hit_iteration_limit
from dxopt.qp.certify.polish import BatchCertificate, batch_accept_exact, row_inf
from dxopt.qp.certify.polish import polish as polish_solution
from dxopt.qp.problem.canonical import NotPSDError, QPProblem, check_psd
from dxopt.qp.problem.contracts import ForwardResult
from dxopt.qp.problem.types import QPStatus
from dxopt.qp.solvers.daqp import FACTORED_FLAGS, DaqpBatch, DaqpPoint

__all__ = [
    "SPARSE_ONLY",
    "Attempt",
    "backend_kwargs",
    "daqp_certifies_psd",
    "default_solver",
    "fallback_chain",
    "routes_lp_to_piqp",
    "solve_forward",
    "trivial_forward",
]

_EXACT_WORKING_SET = ("daqp",)  # active-set backends: polish only if the point fails
DAQP_ITERATION_LIMIT = -4  # DAQP's exit flag at its iteration limit (dxopt.qp.solvers.daqp)
DAQP_CLAIMS = {-1: "daqp: infeasible", -3: "daqp: unbounded"}  # claims, without a ray

BACKEND_RELATIVE_FLOOR = 1e-12
"""The least relative stopping tolerance passed to a backend (module docstring)."""

_TOLERANCE_KEYS: dict[str, Callable[[float, float], dict[str, float]]] = {
    "daqp": lambda a, r: {"primal_tol": a},
    "piqp": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "osqp": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "proxqp": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "scs": lambda a, r: {"eps_abs": a, "eps_rel": max(r, BACKEND_RELATIVE_FLOOR)},
    "clarabel": lambda a, r: {
        "tol_gap_abs": a,
        "tol_gap_rel": max(r, BACKEND_RELATIVE_FLOOR),
        "tol_feas": a,
        "tol_ktratio": 1e-8,
    },
    "highs": lambda a, r: {"primal_feasibility_tolerance": a, "dual_feasibility_tolerance": a},
}


def default_solver(problem: QPProblem) -> str:
    """``"torch"`` for dense inputs off the CPU, else ``"daqp"`` for dense problems and
    ``"piqp"`` when any matrix is sparse or the problem is a pure LP with ``n >= 65``
    (:func:`routes_lp_to_piqp`).

    Inputs on a GPU (any non-CPU device) get the batched torch interior point
    (:mod:`dxopt.qp.solvers.torch_ipm`): it runs on the device, with no host round trip of the
    data. On the CPU daqp is the fastest in every cell of this measurement (``python -m
    benchmarks.qp_torch.auto_rule``): ``dxopt.qp.solve`` forward+backward, ``solver="daqp"``
    (the lean paths of :mod:`dxopt.qp.api.small` and :mod:`dxopt.qp.api.small_batch`) against
    ``solver="torch"`` back to back in one process, 1 torch thread, dQP's random dense QPs
    (m = n, p = n/2), medians of 3-5 on the 2-core machine at a load average of 1
    (``benchmarks/qp_torch/results/auto_rule.json``); torch/daqp time ratio by batch size B:

    ======  =====================================================================
    n       torch / daqp
    ======  =====================================================================
    10      26.1 (B=1), 11.6 (32), 5.73 (128), 3.12 (512), 2.70 (2048)
    20      25.4 (B=1), 4.94 (128), 3.71 (1024)
    50      24.2 (B=1), 4.12 (32), 2.59 (128)
    100     4.30 (B=1), 2.03 (32)
    ======  =====================================================================

    (Before the lean batch path, torch measured 0.44-0.96 of daqp at B >= 512, n = 10, and
    ``"auto"`` picked it there.) A dense CPU batch, or one dense problem with n > 64, with
    the default options is solved under ``"auto"`` by dxopt's compiled dual active-set solver
    (:mod:`dxopt.qp.solvers.dual_active_set`; :func:`dxopt.qp.solve` routes it there before this
    function is asked): fwd+bwd against the raw qpsolvers daqp loop's forward, 128 x n=50
    1.12x (daqp: 1.58x), 1024 x n=20 0.93x (1.20x) (``dxopt bench qp_speed``); one dense
    problem, n = 1000, 0.64x raw daqp (``python -m benchmarks.qp_speed.dense``; its forward
    alone is 0.57x: the same iterations as daqp, LAPACK/BLAS for the factorization and the
    transformed rows).

    Backends on the CPU, measured through :func:`solve_forward` (eps_abs = 1e-9, 1 thread,
    the shared 2-core machine under a load average of 5-9, medians): dense dQP problems
    (m = n, p = n/2) at n = 100 / 500: daqp 3.4 / 219 ms, piqp 5.5 / 429 ms, proxqp 9.9 /
    308 ms, clarabel 260 ms / 10.9 s; sparse simplex projection at n = 1e4 / 1e5: piqp 30 ms /
    1.18 s, clarabel 177 ms / 4.86 s, osqp hit its iteration limit (FAILED) at 1e4. The same
    ranking as earlier runs on a quiet machine (daqp 0.80 / 44 ms dense; piqp 16.5 / 258 ms
    sparse, the fastest backend at every simplex size up to 1e6).
    """
    if problem.any_sparse:
        return "piqp"
    if problem.device.type != "cpu":
        return "torch"
    if routes_lp_to_piqp(problem.P, problem.q):  # a larger pure LP (routes_lp_to_piqp)
        return "piqp"
    return "daqp"


LP_PIQP_MIN_N = 65
"""Pure LPs (``P = 0``) with at least this many variables go to piqp under ``"auto"``."""


def routes_lp_to_piqp(P: object, q: object) -> bool:
    """Whether ``"auto"`` sends this problem to piqp as a pure LP: a dense CPU ``P`` of zeros
    (not under a torch.func transform) and ``n >= LP_PIQP_MIN_N``.

    DAQP solves an LP by proximal-point iterations on :math:`\\tfrac{\\epsilon}{2}\\|x -
    x_k\\|^2 + q^\\top x`; their number grows with the size. Measured through
    :func:`dxopt.qp.solve` (1 torch thread, warm, medians of 4, the shared 2-core machine at a
    load average of 11; ``"auto"`` = daqp against ``solver="piqp"``, ms per LP): random LPs
    with :math:`1.5n` inequality rows and a box, n = 20: 4.1 / 12.9, 60: 10.0 / 18.9,
    100: 52.6 / 28.0, 150: 170 / 62, n = 200: 537 / 129, batch 8 x n = 100: 38.0 / 20.6; the
    5 x 5 grid shortest path (n = 40, PyEPO's DFL task): 1.0 / 5.5 (one LP), 0.37 / 1.8
    (batch of 32); a 32-item 2-row knapsack: 1.3-2.1 / 2.6-8.6. HiGHS through qpsolvers was
    slower than both (11-16 ms on the shortest path). So small LPs stay with daqp, larger ones
    go to piqp."""
    from dxopt.qp.problem.functorch import functorch_active

    return (
        isinstance(q, Tensor)
        and isinstance(P, Tensor)
        and q.shape[-1] >= LP_PIQP_MIN_N
        and P.layout == torch.strided
        and P.device.type == "cpu"
        and not functorch_active()
        # a nonzero P has a nonzero diagonal entry if it is PSD (O(n)); the full scan only then
        and not bool(P.detach().diagonal(dim1=-2, dim2=-1).any())
        and not bool(P.detach().any())
    )


SPARSE_ONLY = ("clarabel", "osqp", "scs")
"""Backends that take scipy CSC matrices only (dense data is converted for them)."""
_DENSE_ONLY = ("daqp",)
DENSE_FALLBACK_MAX_N = 3000  # daqp joins the chain of sparse problems up to this size


def _numpy_views(problem: QPProblem, solver: str) -> dict[str, Any]:
    """Each parameter once as numpy (dense) or scipy CSC (sparse), shared by all samples."""
    views: dict[str, Any] = {"sparse_only": solver in SPARSE_ONLY}
    if not problem.csr and not views["sparse_only"]:  # all dense, kept dense: numpy views
        for name in ("P", "q", "A", "b", "G", "h"):
            t = getattr(problem, name)
            views[name] = None if t is None else t.numpy()
        return views
    for name in ("P", "q", "A", "b", "G", "h"):
        t = getattr(problem, name)
        if t is None:
            views[name] = None
        elif t.layout == torch.sparse_coo and solver in _DENSE_ONLY:
            views[name] = problem.csr[name][0].toarray()  # daqp takes dense arrays only
        elif t.layout == torch.sparse_coo:
            views[name] = problem.csr[name][0].tocsc()
        elif solver in SPARSE_ONLY and name in ("P", "A", "G") and t.ndim == 2:
            views[name] = sp.csc_matrix(t.numpy())  # what the backend converts to anyway
        else:
            views[name] = t.numpy()
    return views


def _sample(views: dict[str, Any], name: str, i: int) -> Any:
    v = views[name]
    if views["sparse_only"] and v is not None and not sp.issparse(v) and v.ndim == 3:
        return sp.csc_matrix(v[i])  # batched dense matrix for a CSC-only backend
    base = 2 if name in ("P", "A", "G") else 1
    if v is None or sp.issparse(v) or v.ndim == base:
        return v
    return v[i]


def _recover_duals(
    P: Any, q: np.ndarray, A: Any, G: Any, h: Any, x: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    grad = P @ x + q
    rows, slack_scale = [], 1e3 * max(eps, 1e-9) * (1.0 + np.abs(x).max(initial=0.0))
    active = np.zeros(0, dtype=bool)
    if G is not None:
        Gd = G.toarray() if sp.issparse(G) else G
        active = (h - Gd @ x) <= slack_scale
        rows.append(Gd[active])
    if A is not None:
        rows.append(A.toarray() if sp.issparse(A) else A)
    if not rows:
        return np.zeros(0), np.zeros(0)
    C = np.concatenate(rows, axis=0)
    lam = np.linalg.lstsq(C.T, -grad, rcond=None)[0]
    k = int(active.sum())
    nu = np.zeros(0 if G is None else G.shape[0])
    if G is not None:
        nu[active] = np.maximum(lam[:k], 0.0)
    return (lam[k:] if A is not None else np.zeros(0)), nu


def _finite_or_zero(v: np.ndarray) -> np.ndarray:
    return v if np.isfinite(v).all() else np.nan_to_num(v)


def fallback_chain(problem: QPProblem, solver: str, eps_abs: float) -> tuple[Attempt, ...]:
    """The documented fallback chain for ``solver`` at ``eps_abs`` (see the module docstring).

    1. the requested backend at the requested tolerance;
    2. the other backends that suit the problem: ``piqp`` and ``clarabel`` (interior point,
       robust on badly scaled data), and ``daqp`` (an exact working set, which settles the
       degenerate LP-like problems where an interior point's active set is ambiguous) when the
       problem is dense or has at most ``DENSE_FALLBACK_MAX_N`` variables (it is densified);
    3. the requested backend at a looser stopping tolerance ``max(1e3 eps_abs, 1e-7)``: the
       polish then restores the requested accuracy, and the certificate is still checked at
       the requested tolerance.
    """
    chain = [Attempt(solver, eps_abs)]
    dense_ok = not problem.any_sparse or problem.n <= DENSE_FALLBACK_MAX_N
    others = ["piqp", "clarabel"] + (["daqp"] if dense_ok else [])
    chain += [Attempt(s, eps_abs) for s in others if s != solver and s in _available()]
    loose = max(1e3 * eps_abs, 1e-7)
    if loose > eps_abs and solver != "torch":  # torch: a batch solve, first attempt only
        chain.append(Attempt(solver, loose))
    return tuple(chain)


def _available() -> tuple[str, ...]:
    return tuple(qpsolvers.available_solvers)


@dataclass(frozen=True)
class Attempt:
    """One step of the fallback chain: a backend and the stopping tolerance passed to it."""

    solver: str
    eps_abs: float


def backend_kwargs(
    solver: str, eps_abs: float, eps_rel: float, options: dict[str, Any] | None
) -> dict[str, Any]:
    """The keyword arguments for ``solver`` through qpsolvers: its stopping tolerances from
    ``eps_abs``/``eps_rel`` (relative ones at least :data:`BACKEND_RELATIVE_FLOOR`), then the
    user's ``options``."""
    kw: dict[str, Any] = dict(_TOLERANCE_KEYS.get(solver, lambda a, r: {})(eps_abs, eps_rel))
    kw.update(options or {})
    return kw


def trivial_forward(problem: QPProblem, eps_abs: float, solver: str) -> ForwardResult:
    """An empty batch or ``n = 0``: nothing to solve. With no variables the only question is
    feasibility: every ``h_i >= -eps_abs`` and ``|b_j| <= eps_abs`` (all multipliers 0)."""
    S, n, m, p = problem.size, problem.n, problem.m, problem.p
    feasible = torch.ones(S, dtype=torch.bool)
    if m and S:
        feasible &= (problem.dense_vec("h") >= -eps_abs).all(-1)
    if p and S:
        feasible &= (problem.dense_vec("b").abs() <= eps_abs).all(-1)
    status = tuple(QPStatus.SOLVED if bool(f) else QPStatus.INFEASIBLE for f in feasible)
    nan = torch.where(feasible, 0.0, float("nan"))[:, None].to(torch.float64)
    return ForwardResult(
        x=torch.zeros(S, n, dtype=torch.float64) + nan,
        eq_duals=torch.zeros(S, p, dtype=torch.float64) + nan,
        ineq_duals=torch.zeros(S, m, dtype=torch.float64) + nan,
        status=status,
        solver=solver,
        solve_time=0.0,
        active=torch.zeros(S, m, dtype=torch.bool),
        sample_solvers=tuple(solver if s.ok else "" for s in status),
        sample_eps=tuple(eps_abs if s.ok else float("nan") for s in status),
        polished=(False,) * S,
    )


def daqp_certifies_psd(
    problem: QPProblem, solver: str, solver_options: dict[str, Any] | None
) -> bool:
    """Whether daqp's own Cholesky can stand in for the PSD check of ``P``: daqp is the
    requested backend, ``P`` is dense, and the user did not set daqp's ``eps_prox``."""
    return (
        solver == "daqp"
        and problem.P.layout == torch.strided
        and "eps_prox" not in (solver_options or {})
    )


def _accept_exact_batch(
    problem: QPProblem,
    points: list[tuple[Any, ...] | None],
    eps_abs: float,
    eps_rel: float,
    g_inf: np.ndarray | None,
) -> tuple[list[int], BatchCertificate | None, tuple[np.ndarray, ...]]:
    """Certify a batch of exact-working-set points at once (clipping the multipliers and
    zeroing those of zero rows in place); returns the samples that still need the per-sample
    path (no point, or not certified as they are), the batch certificate (``None`` when some
    sample has no point) and the stacked ``(x, mu, nu)``."""
    if any(pt is None for pt in points):  # rare: keep the per-sample path for everyone
        return list(range(len(points))), None, ()
    m = problem.m
    X = np.array([pt[1] for pt in points])  # type: ignore[index]
    MU = np.array([pt[2] for pt in points]).reshape(len(points), problem.p)  # type: ignore[index]
    NU = np.array([pt[3] for pt in points]).reshape(len(points), m)  # type: ignore[index]
    if m:
        gi = g_inf
        if gi is None:  # batched G: computed once, shared with the backward (identify_active)
            G = problem.array("G")
            gi = problem.derived("G_inf", "G", lambda: row_inf_np(G))
        NU = np.maximum(NU, 0.0)
        if not gi.all():
            NU = np.where(gi > 0, NU, 0.0)
    else:
        gi = np.zeros(0)
    cert = batch_accept_exact(problem, X, MU, NU, gi, eps_abs=eps_abs, eps_rel=eps_rel)
    refused = [] if cert.ok.all() else np.flatnonzero(~cert.ok).tolist()
    for i in refused:  # the per-sample path starts from the clipped multipliers
        pt = points[i]
        points[i] = (pt[0], pt[1], pt[2], NU[i])  # type: ignore[index]
    return refused, cert, (X, MU, NU)


def solve_forward(
    problem: QPProblem,
    *,
    solver: str,
    eps_abs: float,
    eps_rel: float,
    warm_start: Tensor | None,
    max_workers: int | None,
    solver_options: dict[str, Any] | None,
    fallback: bool = True,
    polish: bool = True,
    psd_pending: bool = False,
) -> ForwardResult:
    """Solve, polish and certify every sample, walking the fallback chain where an attempt
    fails; failed samples get NaN rows and a non-``SOLVED`` status.

    ``psd_pending=True``: ``P`` has not been checked for positive semidefiniteness yet (only
    with ``solver="daqp"`` on a dense ``P``, see :func:`daqp_certifies_psd`); daqp's own
    Cholesky certifies it (:mod:`dxopt.qp.solvers.daqp`), and a sample whose factorization fails is
    checked by :func:`dxopt.qp.problem.canonical.check_psd` before anything else uses it."""
    batch_points = None
    if solver == "torch":  # the batched torch interior point (dxopt.qp.solvers.torch_ipm): its
        # points are the first attempt's, polished and certified as any backend's
        from dxopt.qp.autograd.torch_entry import torch_points

        batch_points = torch_points(problem, eps_abs=eps_abs, eps_rel=eps_rel,
                                    solver_options=solver_options)  # fmt: skip
    size, n, m, p = problem.size, problem.n, problem.m, problem.p
    chain = fallback_chain(problem, solver, eps_abs) if fallback else (Attempt(solver, eps_abs),)
    views_by_solver: dict[str, dict[str, Any]] = {}

    def views(name: str) -> dict[str, Any]:
        if name not in views_by_solver:
            views_by_solver[name] = _numpy_views(problem, name)
        return views_by_solver[name]

    daqp_arrays: list[DaqpBatch] = []

    def daqp_batch() -> DaqpBatch:
        if not daqp_arrays:
            v = views("daqp")
            daqp_arrays.append(DaqpBatch(v["P"], v["q"], v["A"], v["b"], v["G"], v["h"]))
        return daqp_arrays[0]

    def sample_args(name: str, i: int) -> dict[str, Any]:
        v = views(name)
        return {k: _sample(v, k, i) for k in ("P", "q", "A", "b", "G", "h")}

    warm = None if warm_start is None else warm_start.detach().to("cpu", torch.float64).numpy()
    row_norms: dict[str, np.ndarray | None] = {}  # max-norms of the rows of shared G and A

    def row_norm(name: str) -> np.ndarray | None:
        """Row max-norms of a shared ``G``/``A`` (once per batch, when first needed); ``None``
        for a batched or absent matrix (the per-sample code computes its own)."""
        if name not in row_norms:
            M = getattr(problem, name)
            if M is None or M.ndim != 2:
                row_norms[name] = None
            else:
                pair = problem.csr.get(name)
                row_norms[name] = row_inf(pair[0] if pair is not None else M.numpy())
        return row_norms[name]

    # samples whose P is certified PSD (P shared by the batch: one certificate for all)
    psd_shared = problem.P.ndim == 2
    psd_done: set[int] = set() if psd_pending else set(range(size))

    def psd_certified(i: int) -> None:
        psd_done.update(range(size) if psd_shared else (i,))

    def ensure_psd(i: int) -> None:
        if i not in psd_done:
            check_psd(problem, None if psd_shared else i)  # raises ValueError if not PSD
            psd_certified(i)

    def call_daqp(i: int, kw: dict[str, Any], init: np.ndarray | None) -> DaqpPoint:
        batch = daqp_batch()
        if i in psd_done:
            return batch.solve(i, kw, init)
        # daqp's Cholesky of P (no proximal regularisation) is the PSD certificate
        out = batch.solve(i, {**kw, "eps_prox": 0.0}, init)
        if out.flag in FACTORED_FLAGS:
            psd_certified(i)
            return out
        ensure_psd(i)  # PSD but singular (or an unexpected flag): as before, with daqp's prox
        return batch.solve(i, kw, init)

    def backend(
        i: int, step: Attempt, first: bool, kw: dict[str, Any] | None = None, clean: bool = True
    ) -> tuple[Any, ...] | None:
        """The backend's point ``(args, x, y, z)`` of sample ``i`` (``None``: no point;
        ``args`` is ``None`` for daqp: :func:`sample_args` rebuilds it when needed).
        ``clean=False`` (daqp's first pass) leaves the finiteness checks of
        :func:`clean_point` to the batch certificate, which refuses non-finite points."""
        init = None if warm is None else (warm[i] if warm.ndim == 2 else warm)
        if kw is None:
            opts = solver_options if first else None
            kw = backend_kwargs(step.solver, step.eps_abs, eps_rel, opts)
        args = None
        try:
            if step.solver == "daqp":
                out = call_daqp(i, kw, init)
                if out.flag == DAQP_ITERATION_LIMIT:
                    cap_hit.add(i)
                elif out.flag in DAQP_CLAIMS:  # a claim without a ray: diagnose decides
                    claims.setdefault(i, []).append({"claim": DAQP_CLAIMS[out.flag]})
                if out.x is None:
                    return None
                x, y, z = out.x, out.eq_duals, out.ineq_duals
            else:
                ensure_psd(i)
                args = sample_args(step.solver, i)
                sol = qpsolvers.solve_problem(
                    qpsolvers.Problem(**args), solver=step.solver, initvals=init, **kw
                )
                if hit_iteration_limit(sol):
                    cap_hit.add(i)
                if not sol.found:  # the backend's own rays (OSQP), checked in diagnose
                    extras = sol.extras if isinstance(sol.extras, dict) else {}
                    rays = {k: extras.get(k) for k in ("prim_inf_cert", "dual_inf_cert")}
                    claims.setdefault(i, []).append({"claim": step.solver, **rays})
                if sol.x is None:
                    return None
                x = np.asarray(sol.x, dtype=np.float64)
                y = None if sol.y is None else np.asarray(sol.y, dtype=np.float64).reshape(-1)
                z = None if sol.z is None else np.asarray(sol.z, dtype=np.float64).reshape(-1)
        except (TypeError, AttributeError) as err:
            if first and solver_options:
                raise ValueError(
                    f"solver_options: the backend {step.solver!r} rejected the options "
                    f"{sorted(solver_options)} ({type(err).__name__}: {err}). Use the setting "
                    f"names of {step.solver}'s own documentation."
                ) from err
            return None
        except NotPSDError:  # ensure_psd: P is not PSD, the user's error
            raise
        except Exception:  # a backend crash: try the next one in the chain
            return None
        # a point is judged by its certificate, not by the backend's status: some backends
        # stop with "max iterations"/"failed" at a point that is a solution within tolerance
        if (p and (y is None or y.size != p)) or (m and (z is None or z.size != m)):
            if not np.all(np.isfinite(x)):
                return None
            a = sample_args(step.solver, i) if args is None else args
            y, z = _recover_duals(a["P"], a["q"], a["A"], a["G"], a["h"], x, eps_abs)
        point = (args, x, y, z)
        return clean_point(point) if clean else point

    def clean_point(point: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        """No point if ``x`` is not finite; non-finite multipliers become finite."""
        if point is None or not np.all(np.isfinite(point[1])):
            return None
        args, x, y, z = point
        y = np.zeros(0) if not p else _finite_or_zero(y)
        z = np.zeros(0) if not m else _finite_or_zero(z)
        return args, x, y, z

    candidates: dict[int, tuple[Attempt, Any]] = {}
    gap_certified: dict[int, set[str]] = {}  # backends whose point certified, unsettled
    # what the attempts of an unsolved sample saw (for diagnose): an iteration limit, a point
    # that missed the tolerance, the backends' infeasibility certificates
    cap_hit: set[int] = set()
    missed: set[int] = set()
    claims: dict[int, list[dict[str, Any]]] = {}
    reasons: dict[int, str] = {}

    def finish(
        i: int, step: Attempt, point: tuple[Any, ...], last: bool
    ) -> tuple[bool, QPStatus | None]:
        """Polish and certify the point; store it if it certifies."""
        args, x, y, z = point
        if args is None:
            args = sample_args(step.solver, i)
        pol = polish_solution(
            args["P"],
            args["q"],
            args["A"],
            args["b"],
            args["G"],
            args["h"],
            x,
            y,
            z,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            enabled=polish,
            force=step.eps_abs > eps_abs,
            exact_working_set=step.solver in _EXACT_WORKING_SET,
            g_inf=row_norm("G"),
            a_inf=row_norm("A"),
        )
        if pol.certificate.zero_row_infeasible:  # 0'x <= h_i < 0: the ray e_i, checked
            reasons[i] = "a zero row of G with h_i < 0 (0 <= h_i is false)"
            return False, QPStatus.INFEASIBLE
        if not pol.certificate.ok:
            missed.add(i)
            return False, None
        if not pol.certificate.settled and not last:
            candidates.setdefault(i, (step, pol))  # certified by the gap only: look further
            gap_certified.setdefault(i, set()).add(step.solver)
            return False, None
        store(i, step, pol)
        return True, None

    def store(i: int, step: Attempt, pol: Any) -> None:
        x_out[i] = pol.x
        if p:
            mu_out[i] = pol.mu
        if m:
            nu_out[i] = np.maximum(pol.nu, 0.0)
            active_out[i] = pol.active
        status[i] = QPStatus.SOLVED
        used_solver[i], used_eps[i], polished[i] = step.solver, step.eps_abs, pol.polished
        settled[i] = pol.certificate.settled

    def run(i: int) -> None:
        for k, step in enumerate(chain):
            if step.eps_abs > eps_abs and step.solver in gap_certified.get(i, ()):
                # the looser stop is for a backend that stalls short of the tolerance; this
                # one reached it (its point certified), so a looser stop cannot settle it
                continue
            point = clean_point(first_points[i]) if k == 0 else backend(i, step, False)
            if point is None:
                continue
            done, verdict = finish(i, step, point, k == len(chain) - 1)
            if done:
                return
            if verdict is not None:
                status[i] = verdict
                return
        if i in candidates:  # no settled point anywhere: the first gap-certified one
            store(i, *candidates[i])
            return
        ensure_psd(i)
        diagnosis = diagnose(
            sample_args(solver, i),
            claims=claims.get(i, []),
            hit_cap=i in cap_hit,
            had_point=i in missed,
            eps_abs=eps_abs,
        )
        status[i], reasons[i] = diagnosis.status, diagnosis.reason

    start = time.perf_counter()
    first_points: list[tuple[Any, ...] | None] = [None] * size

    kw_first = backend_kwargs(chain[0].solver, chain[0].eps_abs, eps_rel, solver_options)
    fast = chain[0].solver in _EXACT_WORKING_SET and problem.any_sparse is False

    def first(i: int) -> None:
        first_points[i] = backend(i, chain[0], True, kw_first, clean=not fast)

    def each(fn: Callable[[int], None], indices: list[int]) -> None:
        if max_workers is not None and max_workers > 1 and len(indices) > 1:
            with ThreadPoolExecutor(max_workers=max_workers) as pool:
                list(pool.map(fn, indices))
        else:
            for i in indices:
                fn(i)

    if batch_points is None:
        each(first, list(range(size)))
    else:
        first_points[:] = batch_points
    todo = list(range(size))
    cert = None
    if fast:
        todo, cert, stacked = _accept_exact_batch(
            problem, first_points, eps_abs, eps_rel, row_norm("G")
        )
        if cert is not None and not todo:  # every sample certified as daqp left it: done
            X, MU, NU = stacked
            one = chain[0]
            return ForwardResult(
                x=torch.from_numpy(X),
                eq_duals=torch.from_numpy(MU),
                ineq_duals=torch.from_numpy(NU),
                status=(QPStatus.SOLVED,) * size,
                solver=solver,
                solve_time=time.perf_counter() - start,
                active=torch.from_numpy(NU > 0),
                sample_solvers=(one.solver,) * size,
                sample_eps=(one.eps_abs,) * size,
                polished=(False,) * size,
                settled=(True,) * size,
                residuals=(cert.primal, cert.dual),
            )
    x_out = np.full((size, n), np.nan)
    mu_out, nu_out = np.full((size, p), np.nan), np.full((size, m), np.nan)
    active_out = np.zeros((size, m), dtype=bool)
    status: list[QPStatus] = [QPStatus.FAILED] * size
    used_solver: list[str] = [""] * size
    used_eps: list[float] = [float("nan")] * size
    polished: list[bool] = [False] * size
    settled: list[bool] = [True] * size
    if fast:
        accepted = np.flatnonzero(cert.ok) if cert is not None else np.zeros(0, dtype=int)
        if accepted.size:
            X, MU, NU = stacked
            x_out[accepted] = X[accepted]
            if p:
                mu_out[accepted] = MU[accepted]
            if m:
                nu_out[accepted] = NU[accepted]
                active_out[accepted] = NU[accepted] > 0
            for i in accepted.tolist():
                status[i] = QPStatus.SOLVED
                used_solver[i], used_eps[i] = chain[0].solver, chain[0].eps_abs
    each(run, todo)
    elapsed = time.perf_counter() - start
    return ForwardResult(
        x=torch.from_numpy(x_out),
        eq_duals=torch.from_numpy(mu_out),
        ineq_duals=torch.from_numpy(nu_out),
        status=tuple(status),
        solver=solver,
        solve_time=elapsed,
        active=torch.from_numpy(active_out),
        sample_solvers=tuple(used_solver),
        sample_eps=tuple(used_eps),
        polished=tuple(polished),
        settled=tuple(settled),
        reasons=() if not reasons else tuple(reasons.get(i, "") for i in range(size)),
    )
