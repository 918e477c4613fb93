"""The lean routes' runners (:mod:`dxopt.qp.api.route`): ``"lean_single"`` through
:mod:`dxopt.qp.lean.small` and ``"lean_batch"`` through :mod:`dxopt.qp.lean.small_batch`. Each
returns the solution, or calls the general runner where the lean forward declines (where the
lean backward declines, the lean layer builds the general route's state itself)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dxopt.qp.api.general import run_general
from dxopt.qp.api.result import solution
from dxopt.qp.api.route import Route, general_solver
from dxopt.qp.lean.records import SmallBatch, SmallPoint
from dxopt.qp.lean.small import small_forward
from dxopt.qp.lean.small_batch import small_batch_forward
from dxopt.qp.lean.small_function import apply_small
from dxopt.qp.problem.contracts import BackwardMethod
from dxopt.qp.problem.options import COMPILED_SOLVER, QPOptions
from dxopt.qp.problem.types import QPInfo, QPSolution, QPStatus

__all__ = ["run_lean_batch", "run_lean_single"]


def declined(route: Route, options: QPOptions, data: tuple[Any, ...]) -> Route:
    """The general route a declined lean ``route`` hands its call to: the requested solver as
    the general route takes it, daqp for the batch route (the compiled solver's fallback, the
    same method)."""
    solver = "daqp" if route.name == "lean_batch" else general_solver(options.solver, data)
    return Route("general", solver, f"{route.name} declined")


def run_lean_single(
    route: Route,
    data: tuple[Tensor | None, ...],
    warm_start: Tensor | None,
    options: QPOptions,
    method: BackwardMethod,
    layout: tuple[Any, ...],
    warm_duals: Tensor | None = None,
) -> QPSolution:
    """One small dense QP through :mod:`dxopt.qp.lean.small` (a certified point), else the
    general route. ``warm_duals``: a previous solution's multipliers of the rows of ``G``
    (:func:`dxopt.qp.api.solve.warm_duals`), whose working set daqp starts from."""
    solver = route.solver
    point = small_forward(
        data, options, solver=solver, warm_start=warm_start, warm_duals=warm_duals
    )
    if point is None:
        general = declined(route, options, data)
        return run_general(general, data, warm_start, options, method, layout)
    out = _lean_outputs(data, point, method, solver, 1, options.eps_abs, (point.primal,),
                        (point.dual,), (point.polished,), route.name, (),
                        (point.iterations,), (point.warm_used,))  # fmt: skip
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
    iterations: tuple[int, ...] = (),
    warm_started: tuple[bool, ...] = (),
) -> tuple[Tensor, Tensor, Tensor, tuple[QPStatus, ...], QPInfo]:
    """``(x, eq_duals, ineq_duals, status, info)`` of ``size`` problems solved by a lean route
    (every one certified; ``sample_solvers``: each one's solver, ``solver`` for all when
    empty): the outputs through :class:`dxopt.qp.lean.small_function.SmallQPFunction`."""
    x, mu, nu = apply_small(*data, solved, method)  # outside torch.func (the router checks)
    info = QPInfo.from_every_field(
        solver, solved.solve_time, primal, dual, solved.diagnostics,
        sample_solvers or (solver,) * size, (eps_abs,) * size, polished, route, (), iterations,
        warm_started,
    )  # fmt: skip
    return x, mu, nu, (QPStatus.SOLVED,) * size, info


def run_lean_batch(
    route: Route,
    data: tuple[Tensor | None, ...],
    warm_start: Tensor | None,
    options: QPOptions,
    method: BackwardMethod,
    layout: tuple[Any, ...],
    warm_duals: Tensor | None = None,
) -> QPSolution:
    """A batch of dense QPs through :mod:`dxopt.qp.lean.small_batch` (every point certified;
    ``route.compiled``: its compiled solver first; ``route.single``: one problem as a batch of
    one; ``warm_duals``: a previous solution's multipliers of the rows of ``G``, whose working
    sets the compiled solver and daqp start from), else the general route."""
    batch, eps_abs = route.batch, options.eps_abs
    lean_data = data
    if route.single:
        lean_data = tuple(None if t is None else t.unsqueeze(0) for t in data)
    for_backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in data)
    sb = small_batch_forward(
        lean_data, batch, eps_abs=eps_abs, eps_rel=options.eps_rel,
        warm_start=warm_start, warm_duals=warm_duals, compiled=route.compiled,
        for_backward=for_backward,
    )  # fmt: skip
    if sb is None:
        general = declined(route, options, data)
        return run_general(general, data, warm_start, options, method, layout)
    solver = COMPILED_SOLVER if sb.given.any() else "daqp"
    x, mu, nu, status, info = _lean_outputs(
        lean_data, sb, method, solver, batch, eps_abs, sb.primal, sb.dual, (False,) * batch,
        route.name, sb.solvers, sb.iterations, sb.warm_used,
    )  # fmt: skip
    if route.single:
        x, mu, nu = x[0], mu[0], nu[0]
    return solution(x, mu, nu, status, info, data[2] is not None, *layout)
