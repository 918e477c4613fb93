"""The lean routes' runners (:mod:`dxopt.qp.api.route`): ``"lean_single"`` through
:mod:`dxopt.qp.lean.small` and ``"lean_batch"`` through :mod:`dxopt.qp.lean.small_batch`. Each
returns the solution, or calls the general runner where the lean forward declines;
the lean backward gets the general route's state builders as plain functions bound to the
call's options (:func:`dxopt.qp.api.general.rebuilt_state`, :func:`_batch_state`)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.api.general import rebuilt_state, residuals, run_general
from dxopt.qp.api.result import solution
from dxopt.qp.api.route import Route, general_solver
from dxopt.qp.lean.records import SmallBatch, SmallPoint
from dxopt.qp.lean.small import small_forward
from dxopt.qp.lean.small_batch import small_batch_forward
from dxopt.qp.lean.small_function import apply_small
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.contracts import BackwardMethod, ForwardFactors, ForwardResult, QPState
from dxopt.qp.problem.options import COMPILED_SOLVER, QPOptions
from dxopt.qp.problem.types import BackwardDiagnostics, QPInfo, QPSolution, QPStatus

__all__ = ["run_lean_batch", "run_lean_single"]


def declined(route: Route, options: QPOptions, data: tuple[Any, ...]) -> Route:
    """The general route a declined lean ``route`` hands its call to: the requested solver as
    the general route takes it, daqp for the batch route (the compiled solver's fallback, the
    same method)."""
    solver = "daqp" if route.name == "lean_batch" else general_solver(options.solver, data)
    return Route("general", solver, f"{route.name} declined")


def _point_state(point: SmallPoint, *, method: BackwardMethod, solver: str,
                 options: QPOptions) -> QPState:  # fmt: skip
    """The general route's state at a lean single point (one more solve, same point)."""
    arrays = (point.P, point.q, point.A, point.b, point.G, point.h, point.warm_start)
    return rebuilt_state(arrays, point.dtype, method=method, solver=solver, options=options)


_POINT_RUNNERS: dict[tuple[int, str, int], tuple[Any, ...]] = {}


def _point_runner(method: BackwardMethod, solver: str, options: QPOptions) -> Any:
    """:func:`_point_state` bound to the call's method, solver and options: one per option
    set (the options are shared, :meth:`QPOptions.of`), kept with the objects whose ids key
    it (a partial per call costs the lean route 0.3 us)."""
    key = (id(method), solver, id(options))
    hit = _POINT_RUNNERS.get(key)
    if hit is not None and hit[0] is method and hit[1] is options:
        return hit[2]
    runner = functools.partial(_point_state, method=method, solver=solver, options=options)
    if len(_POINT_RUNNERS) >= 64:
        _POINT_RUNNERS.clear()
    _POINT_RUNNERS[key] = (method, options, runner)
    return runner


def run_lean_single(
    route: Route,
    data: tuple[Tensor | None, ...],
    warm_start: Tensor | None,
    options: QPOptions,
    method: BackwardMethod,
    layout: tuple[Any, ...],
) -> QPSolution:
    """One small dense QP through :mod:`dxopt.qp.lean.small` (a certified point), else the
    general route."""
    solver = route.solver
    point = small_forward(
        data,
        options,
        solver=solver,
        general=_point_runner(method, solver, options),
        warm_start=warm_start,
    )
    if point is None:
        general = declined(route, options, data)
        return run_general(general, data, warm_start, options, method, layout)
    out = _lean_outputs(data, point, method, solver, 1, options.eps_abs, (point.primal,),
                        (point.dual,), (point.polished,), route.name)  # fmt: skip
    return solution(*out, data[2] is not None, *layout)


def _lean_outputs(
    data: tuple[Tensor | None, ...],
    solved: SmallPoint | SmallBatch,
    method: BackwardMethod,
    solver: str,
    size: int,
    eps_abs: float,
    primal: tuple[float, ...],
    dual: tuple[float, ...],
    polished: tuple[bool, ...],
    route: str,
    sample_solvers: tuple[str, ...] = (),
) -> tuple[Tensor, Tensor, Tensor, tuple[QPStatus, ...], QPInfo]:
    """``(x, eq_duals, ineq_duals, status, info)`` of ``size`` problems solved by a lean route
    (every one certified; ``sample_solvers``: each one's solver, ``solver`` for all when
    empty): the outputs through :class:`dxopt.qp.lean.small_function.SmallQPFunction`."""
    x, mu, nu = apply_small(*data, solved, method)  # outside torch.func (the router checks)
    info = QPInfo._every_field(
        solver, solved.solve_time, primal, dual, solved.diagnostics,
        sample_solvers or (solver,) * size, (eps_abs,) * size, polished, route,
    )  # fmt: skip
    return x, mu, nu, (QPStatus.SOLVED,) * size, info


def _sample_factors(sb: SmallBatch, samples: np.ndarray) -> ForwardFactors | None:
    """The compiled solver's factors of ``samples`` when it solved all of them (views when
    they are the whole batch), else ``None``."""
    if not sb.given[samples].all():
        return None
    factors = ForwardFactors(sb.L_given, sb.Y_given, sb.order_given, sb.LW_given)
    if samples.size == sb.given.size:  # every sample, in order
        return factors
    return factors.take(samples)


def _batch_state(sb: SmallBatch, samples: np.ndarray, *, method: BackwardMethod,
                 eps_abs: float) -> QPState:  # fmt: skip
    """The general route's state for ``samples`` at the lean forward's certified points: what
    its forward returns on the same data when every daqp point certifies (daqp is
    deterministic; the active set is the working set, nu > 0), without solving again (for the
    compiled solver's points: the same state at its certified point)."""
    P, q, A, b, G, h = (
        None if a is None else torch.from_numpy(a).to(sb.dtype) for a in sb.arrays(samples)
    )
    assert P is not None and q is not None
    # validated by the lean forward (finite, symmetric as the general route demands, P
    # certified positive definite by the solver's Cholesky): no second symmetry pass
    problem = canonical_problem(P, q, A, b, G, h, check_psd=False)
    X, duals = sb.X[samples], sb.duals[samples]
    NU = np.maximum(duals[:, : sb.m], 0.0)
    size = samples.size
    solvers = tuple(sb.solvers[i] for i in samples.tolist())
    result = ForwardResult(
        x=torch.from_numpy(X),
        eq_duals=torch.from_numpy(np.ascontiguousarray(duals[:, sb.m :])),
        ineq_duals=torch.from_numpy(NU),
        status=(QPStatus.SOLVED,) * size,
        solver=solvers[0],
        solve_time=0.0,
        active=torch.from_numpy(NU > 0),
        sample_solvers=solvers,
        sample_eps=(eps_abs,) * size,
        polished=(False,) * size,
        settled=(True,) * size,
        residuals=(np.array(sb.primal)[samples], np.array(sb.dual)[samples]),
        factors=_sample_factors(sb, samples),
    )
    return QPState(problem, result, method, BackwardDiagnostics(), solvers[0],
                   residuals(problem, result))  # fmt: skip


def run_lean_batch(
    route: Route,
    data: tuple[Tensor | None, ...],
    warm_start: Tensor | None,
    options: QPOptions,
    method: BackwardMethod,
    layout: tuple[Any, ...],
) -> QPSolution:
    """A batch of dense QPs through :mod:`dxopt.qp.lean.small_batch` (every point certified;
    ``route.compiled``: its compiled solver first; ``route.single``: one problem as a batch of
    one), else the general route."""
    batch, eps_abs = route.batch, options.eps_abs
    lean_data = data
    if route.single:
        lean_data = tuple(None if t is None else t.unsqueeze(0) for t in data)
    for_backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in data)
    sb = small_batch_forward(
        lean_data, batch, eps_abs=eps_abs, eps_rel=options.eps_rel,
        general=functools.partial(_batch_state, method=method, eps_abs=eps_abs),
        warm_start=warm_start, compiled=route.compiled, for_backward=for_backward,
    )  # fmt: skip
    if sb is None:
        general = declined(route, options, data)
        return run_general(general, data, warm_start, options, method, layout)
    solver = COMPILED_SOLVER if sb.given.any() else "daqp"
    x, mu, nu, status, info = _lean_outputs(
        lean_data, sb, method, solver, batch, eps_abs, sb.primal, sb.dual, (False,) * batch,
        route.name, sb.solvers,
    )  # fmt: skip
    if route.single:
        x, mu, nu = x[0], mu[0], nu[0]
    return solution(x, mu, nu, status, info, data[2] is not None, *layout)
