"""Forward solve of a batch of QPs: the entry point :func:`solve_forward` and its batch fast
path.

Each sample is solved by the chosen :mod:`qpsolvers` backend (which one and on which arrays:
:mod:`dxopt.qp.solvers.routing`; how it is called, with which settings:
:mod:`dxopt.qp.solvers.backends`), then polished and certified, walking the
fallback chain where an attempt fails (:mod:`dxopt.qp.solvers.chain`: the attempts, the one
place that certifies, the statuses of unsolved samples). This module owns the order of the
work: the first attempt on every sample, then the batch certificate of exact-working-set
points, then the chain for the samples still open. daqp is called through its own Python API
on arrays built once per batch (:mod:`dxopt.qp.solvers.daqp`: same points as through
qpsolvers, without its per-call ``inspect.signature`` and problem checks), and its Cholesky of
``P`` stands in for the PSD check of the validation. daqp's points (an exact working set) are
certified all at once by the vectorised certificate
:func:`dxopt.qp.certify.polish.batch_accept_exact`; only the samples it refuses take the
per-sample polish and fallback path, and when it accepts every sample its residuals are the
ones :class:`~dxopt.qp.QPInfo` reports.

Parallelism: ``max_workers > 1`` solves samples on a thread pool. Threads tie with the serial
loop and processes lose (start-up and pickling), so the default is the serial loop, threads are
offered, processes are not (the figures: ``benchmarks/qp_speed/results/routing_measurements.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.certify.active import row_inf_np
from dxopt.qp.certify.multipliers import select_forward
from dxopt.qp.certify.polish import BatchCertificate, batch_accept_exact
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import ForwardResult
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPStatus
from dxopt.qp.solvers.backends import BACKEND_RELATIVE_FLOOR, backend_kwargs
from dxopt.qp.solvers.chain import Attempt, FallbackChain, fallback_chain
from dxopt.qp.solvers.routing import (
    LP_PIQP_MIN_N,
    daqp_certifies_psd,
    default_solver,
    routes_lp_to_piqp,
)

__all__ = [
    "BACKEND_RELATIVE_FLOOR",
    "LP_PIQP_MIN_N",
    "Attempt",
    "backend_kwargs",
    "daqp_certifies_psd",
    "default_solver",
    "fallback_chain",
    "routes_lp_to_piqp",
    "solve_forward",
    "trivial_forward",
]


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
    options: QPOptions,
    solver: str,
    warm_start: Tensor | None,
    psd_pending: bool = False,
    device_points: list[Any] | None = None,
) -> ForwardResult:
    """Solve, polish and certify every sample with ``solver`` (``"auto"`` resolved) at the
    tolerances, ``max_workers``, ``solver_options``, ``fallback`` and ``polish`` of
    ``options``, walking the fallback chain where an attempt fails; failed samples get NaN
    rows and a non-``SOLVED`` status.

    ``device_points``: the first attempt's points ``(None, x, y, z)`` per sample when the
    router computed them in one batch (``solver="torch"`` on the general route,
    :func:`dxopt.qp.autograd.torch_entry.torch_points`), polished and certified here as any
    backend's; ``None``: the first attempt runs per sample.

    ``psd_pending=True``: ``P`` has not been checked for positive semidefiniteness yet (only
    with ``solver="daqp"`` on a dense ``P``, see :func:`daqp_certifies_psd`); daqp's own
    Cholesky certifies it (:mod:`dxopt.qp.solvers.daqp`), and a sample whose factorization
    fails is checked by :func:`dxopt.qp.problem.canonical.check_psd` before anything else
    uses it."""
    eps_abs, eps_rel, max_workers = options.eps_abs, options.eps_rel, options.max_workers
    solver_options, fallback, polish = options.solver_options, options.fallback, options.polish
    size = problem.size
    attempts = fallback_chain(problem, solver, eps_abs, solver_options, fallback=fallback)
    warm = None if warm_start is None else warm_start.detach().to("cpu", torch.float64).numpy()
    chain = FallbackChain(
        problem,
        attempts,
        eps_abs=eps_abs,
        eps_rel=eps_rel,
        polish=polish,
        warm_start=warm,
        psd_pending=psd_pending,
    )
    start = time.perf_counter()
    fast = chain.backends[0].exact_working_set and problem.any_sparse is False

    def each(fn: Callable[[int], None], indices: list[int]) -> None:
        if max_workers is not None and max_workers > 1 and len(indices) > 1:
            with ThreadPoolExecutor(max_workers=max_workers) as pool:
                list(pool.map(fn, indices))
        else:
            for i in indices:
                fn(i)

    first_points: list[Any] = [None] * size
    if device_points is None:

        def first(i: int) -> None:
            first_points[i] = chain.point(i, 0, clean=not fast)

        each(first, list(range(size)))
    else:
        first_points[:] = device_points
    todo = list(range(size))
    cert = None
    if fast:
        todo, cert, stacked = _accept_exact_batch(
            problem, first_points, eps_abs, eps_rel, chain.row_norm("G")
        )
        if cert is not None and not todo:  # every sample certified as daqp left it: done
            X, MU, NU = stacked
            one = attempts[0]
            fast_result = ForwardResult(
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
            return select_forward(problem, fast_result, eps_abs=eps_abs, eps_rel=eps_rel,
                                  exact_working_set=True)  # fmt: skip
    chain.prepare_outputs()
    if cert is not None:
        X, MU, NU = stacked
        for i in np.flatnonzero(cert.ok).tolist():
            chain.accept(i, X[i], MU[i], NU[i])
    each(lambda i: chain.run(i, first_points[i]), todo)
    # one multiplier selection at degenerate points, whatever the backend (the polished
    # points' multipliers are not an exact working set's)
    return select_forward(problem, chain.result(solver, time.perf_counter() - start),
                          eps_abs=eps_abs, eps_rel=eps_rel, exact_working_set=False)  # fmt: skip
