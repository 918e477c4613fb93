"""The general route of :func:`dxopt.qp.solve` (:mod:`dxopt.qp.api.route`): the canonical
problem, the fallback chain of :func:`dxopt.qp.solvers.forward.solve_forward`, the certificate
and the backward method through :class:`dxopt.qp.autograd.function.QPFunction`. Every input
the other routes do not take comes here, and so does a call a lean route declines at run time;
its state builders (:func:`~dxopt.qp.autograd.state.forward_state`) live in the autograd layer,
where the lean backward calls them too."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from dxopt.qp.api.result import solution
from dxopt.qp.api.route import Route
from dxopt.qp.autograd.function import QPCall, QPFunction
from dxopt.qp.autograd.state import forward_state
from dxopt.qp.backward.kkt import KKTBackward
from dxopt.qp.backward.penalty import PenaltyBackward
from dxopt.qp.certify.certificates import unsolved_message
from dxopt.qp.problem.contracts import BackwardMethod
from dxopt.qp.problem.functorch import functorch_active, sparse_under_func
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPInfo, QPSolution, QPSolveError

__all__ = ["backward_method", "run_general"]

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
