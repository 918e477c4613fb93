"""The general route of :func:`dxopt.qp.solve` (:mod:`dxopt.qp.api.route`): the canonical
problem, the fallback chain of :func:`dxopt.qp.solvers.forward.solve_forward`, the certificate
and the backward method through :class:`dxopt.qp.autograd.function.QPFunction`. Every input
the other routes do not take comes here, and so does a call a lean route declines at run time;
the lean routes' backward rebuilds its state here (:func:`rebuilt_state`) where the lean
kernel declines."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.api.result import solution
from dxopt.qp.api.route import Route, check_warm_start
from dxopt.qp.autograd.function import QPCall, QPFunction
from dxopt.qp.autograd.torch_entry import torch_points
from dxopt.qp.backward.kkt import KKTBackward
from dxopt.qp.backward.penalty import PenaltyBackward
from dxopt.qp.certify.certificates import unsolved_message
from dxopt.qp.problem.canonical import QPProblem, canonical_problem
from dxopt.qp.problem.canonical import check_psd as check_psd_of
from dxopt.qp.problem.contracts import BackwardMethod, ForwardResult, QPState
from dxopt.qp.problem.functorch import functorch_active, sparse_under_func
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import BackwardDiagnostics, QPInfo, QPSolution, QPSolveError
from dxopt.qp.solvers.forward import daqp_certifies_psd, solve_forward, trivial_forward

__all__ = ["backward_method", "rebuilt_state", "residuals", "run_general"]

_DEFAULT_METHODS: dict[str, BackwardMethod] = {}  # frozen, stateless: built once


def backward_method(backward: str | BackwardMethod) -> BackwardMethod:
    """The method object of a checked ``backward=`` option (:class:`QPOptions`)."""
    if isinstance(backward, str):
        method = _DEFAULT_METHODS.get(backward)
        if method is None:
            method = PenaltyBackward() if backward == "penalty" else KKTBackward()
            _DEFAULT_METHODS[backward] = method
        return method
    return backward


def residuals(problem: QPProblem, r: ForwardResult) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-sample primal and dual residuals of :class:`QPInfo` (NaN for unsolved samples):
    the forward's own when its certificate computed them, else one numpy pass."""
    if r.residuals is not None:
        primal, dual = r.residuals
    else:
        x = np.nan_to_num(r.x.numpy())
        primal = np.zeros(problem.size)
        dual = problem.np_mv("P", x) + problem.np_vec("q")
        if problem.A is not None and problem.p:
            eq = np.abs(problem.np_mv("A", x) - problem.np_vec("b")).max(-1)
            primal = np.maximum(primal, eq)
            dual = dual + problem.np_rmv("A", np.nan_to_num(r.eq_duals.numpy()))
        if problem.G is not None and problem.m:
            viol = np.maximum(problem.np_mv("G", x) - problem.np_vec("h"), 0.0).max(-1)
            primal = np.maximum(primal, viol)
            dual = dual + problem.np_rmv("G", np.nan_to_num(r.ineq_duals.numpy()))
        dual = np.abs(dual).max(-1) if problem.n else np.zeros(problem.size)
    if not all(s.ok for s in r.status):
        ok = np.fromiter((s.ok for s in r.status), dtype=bool, count=len(r.status))
        primal = np.where(ok, primal, np.nan)
        dual = np.where(ok, dual, np.nan)
    return tuple(primal.tolist()), tuple(dual.tolist())


def forward_state(
    P: Tensor,
    q: Tensor,
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    warm_start: Tensor | None,
    *,
    method: BackwardMethod,
    solver: str,
    options: QPOptions,
) -> QPState:
    """Validate and solve with the router's ``solver`` (plain tensors; called by
    ``QPFunction.forward``)."""
    check_psd = options.check_psd
    problem = canonical_problem(P, q, A, b, G, h, check_psd=check_psd, defer_psd=True)
    check_warm_start(warm_start, problem.n)
    solvable = bool(problem.size and problem.n)
    # the PSD check of P: daqp's own Cholesky certifies it for free, else one Cholesky here
    solver_options = options.solver_options
    psd_pending = check_psd and solvable and daqp_certifies_psd(problem, solver, solver_options)
    if check_psd and solvable and not psd_pending:
        check_psd_of(problem)
    if solvable:
        device_points = None
        if solver == "torch":  # the batched torch interior point's points, in one batch
            device_points = torch_points(
                problem, eps_abs=options.eps_abs, eps_rel=options.eps_rel,
                solver_options=solver_options,
            )  # fmt: skip
        result = solve_forward(
            problem, options=options, solver=solver, warm_start=warm_start,
            psd_pending=psd_pending, device_points=device_points,
        )  # fmt: skip
    else:
        result = trivial_forward(problem, options.eps_abs, solver)
    state_residuals = residuals(problem, result)
    return QPState(problem, result, method, BackwardDiagnostics(), solver, state_residuals)


def rebuilt_state(
    arrays: tuple[Any, ...], dtype: torch.dtype, *, method: BackwardMethod, solver: str,
    options: QPOptions,
) -> QPState:  # fmt: skip
    """The general route's state for a lean route's saved copies ``arrays = (P, q, A, b, G, h,
    warm_start)`` (numpy or ``None``) in the inputs' ``dtype``: one more solve, at the same
    points, where the lean backward declines (the default ``max_workers``, no
    ``solver_options``: the lean routes' own)."""
    P, q, A, b, G, h, warm = (None if a is None else torch.from_numpy(a).to(dtype) for a in arrays)
    assert P is not None and q is not None
    return forward_state(P, q, A, b, G, h, warm, method=method, solver=solver, options=options)


def run_general(
    route: Route,
    data: tuple[Any, ...],
    warm_start: Tensor | None,
    options: QPOptions,
    method: BackwardMethod,
    layout: tuple[Any, ...],
) -> QPSolution:
    """Solve ``data = (P, q, A, b, G, h)`` on the general route with ``route.solver``;
    ``layout``: the bound rows' layout for :func:`dxopt.qp.api.result.solution`."""
    if functorch_active():
        for mat_name, mat in zip(("P", "A", "G"), (data[0], data[2], data[4])):
            if isinstance(mat, Tensor) and mat.layout != torch.strided and mat.requires_grad:
                raise sparse_under_func(mat_name, mat.layout)
    run = functools.partial(forward_state, method=method, solver=route.solver, options=options)
    call = QPCall(run)
    x, mu, nu, _ = QPFunction.apply(*data, warm_start, call)
    state = call.state
    assert state is not None
    result, name = state.result, state.solver
    if options.on_failure == "raise" and not all(s.ok for s in result.status):
        failed = tuple(i for i, s in enumerate(result.status) if not s.ok)
        message = unsolved_message(name, result.status, result.reasons)
        raise QPSolveError(message, failed, result.status)
    primal, dual = state.residuals
    info = QPInfo(
        solver=name,
        solve_time=result.solve_time,
        primal_residual=primal,
        dual_residual=dual,
        backward=state.diagnostics,
        sample_solvers=result.sample_solvers,
        sample_tolerances=result.sample_eps,
        polished=result.polished,
        route="general",
    )
    return solution(x, mu, nu, result.status, info, data[2] is not None, *layout)
