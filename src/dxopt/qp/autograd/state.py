"""The general route's state (:class:`~dxopt.qp.problem.contracts.QPState`) from plain tensors:
:func:`forward_state` validates and solves (``QPFunction.forward`` calls it through a
:class:`~dxopt.qp.problem.contracts.QPCall`), :func:`rebuilt_state` does the same for a lean
route's saved numpy copies where the lean backward declines (:mod:`dxopt.qp.lean`), and
:func:`residuals` reads the per-sample residuals of :class:`~dxopt.qp.problem.types.QPInfo` off
a forward result. Below the lean layer, so that the lean backward calls them directly."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.autograd.torch_entry import torch_points
from dxopt.qp.backward.vertex_select import finish_selection
from dxopt.qp.problem.canonical import QPProblem, canonical_problem
from dxopt.qp.problem.canonical import check_psd as check_psd_of
from dxopt.qp.problem.contracts import BackwardMethod, ForwardResult, QPState
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import BackwardDiagnostics
from dxopt.qp.solvers.forward import daqp_certifies_psd, solve_forward, trivial_forward

__all__ = ["check_warm_start", "forward_state", "rebuilt_state", "residuals"]


def check_warm_start(warm_start: object, n: int) -> None:
    """``ValueError`` unless ``warm_start`` is ``None`` or a tensor ending in ``n``."""
    if warm_start is not None and (not isinstance(warm_start, Tensor) or warm_start.shape[-1] != n):
        got = tuple(warm_start.shape) if isinstance(warm_start, Tensor) else type(warm_start)
        raise ValueError(
            f"warm_start: expected a tensor (n,) or (B, n) with n = {n}, got {got}. Pass the "
            "previous solution's x, or None."
        )


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
        result = finish_selection(problem, result)  # the backward's vertex (general dependency)
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
