"""The router of :func:`dxopt.qp.solve`: one :func:`plan` decides which path solves a call.

The routes, in the order :func:`plan` tries them:

- ``"executor"``: an ``executor=`` spreads the batch over workers
  (:class:`dxopt.qp.problem.executor.QPExecutor`); reverse-mode autograd only.
- ``"lean_single"``: one small unbatched dense CPU problem (``n <= 64``) with a lean backend
  (its ``lean`` field in :data:`dxopt.qp.solvers.backends.BACKENDS`), the default solver
  options and a backward method the lean kernels compute
  (:func:`dxopt.qp.lean.lean_check.lean_method`): :mod:`dxopt.qp.lean.small`.
- ``"lean_batch"``: a dense CPU batch (or one dense problem with ``n > 64``, or any with
  ``solver="dual_active_set"``, as a batch of one) with daqp, ``"auto"`` or the compiled solver
  and the default options: :mod:`dxopt.qp.lean.small_batch`.
- ``"device"``: dense inputs with ``solver="torch"``, or ``"auto"`` off the CPU, and a named
  backward: the torch interior point on the inputs' device (:mod:`dxopt.qp.api.device`).
- ``"general"``: everything else (sparse inputs, options the lean paths do not take,
  torch.func transforms): :mod:`dxopt.qp.api.general`, with the fallback chain.

A lean route may still decline at run time (a point that does not certify, an ambiguous
active set); its runner then calls the general runner, and ``QPInfo.route`` records the route
that produced the answer. The :class:`Route` names the route, the solver it starts with
(``"auto"`` resolved by the one rule :func:`dxopt.qp.solvers.routing.auto_choice`, which
:func:`dxopt.qp.solvers.forward.default_solver` applies to the canonical problem) and why, as
lineax's ``AutoLinearSolver.select_solver`` names its choice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import dxopt.qp.solvers.backends as backends
from dxopt.qp.autograd.state import check_warm_start
from dxopt.qp.lean.lean_check import SMALL_MAX_N, lean_method, small_inputs
from dxopt.qp.lean.small_batch import small_batch_inputs
from dxopt.qp.problem.canonical import QPProblem, canonical_problem
from dxopt.qp.problem.contracts import BackwardMethod
from dxopt.qp.problem.functorch import BASES, forward_ad_dual, functorch_active
from dxopt.qp.problem.options import COMPILED_SOLVER, QPOptions
from dxopt.qp.solvers.forward import default_solver, routes_lp_to_piqp
from dxopt.qp.solvers.routing import AUTO, auto_choice

__all__ = ["ROUTES", "Route", "auto_solver", "check_warm_start", "general_solver", "plan"]

ROUTES = ("executor", "lean_single", "lean_batch", "device", "general")
"""Every route name :func:`plan` returns (and ``QPInfo.route`` records)."""


@dataclass(frozen=True)
class Route:
    """The router's decision for one call: ``name`` (one of :data:`ROUTES`), the ``solver``
    the route starts with, and ``reason``, why. For ``"lean_batch"``: the ``batch`` size, the
    compiled solver first (``compiled``) and one problem run as a batch of one (``single``);
    for ``"device"`` outside torch.func: the validated ``problem`` (kept on its device)."""

    name: str
    solver: str
    reason: str
    batch: int = 0
    compiled: bool = False
    single: bool = False
    problem: QPProblem | None = field(default=None, compare=False, repr=False)


@functools.lru_cache(maxsize=64)
def _route(name: str, solver: str, reason: str) -> Route:
    """One shared :class:`Route` per decision without data (the lean path's per-call cost)."""
    return Route(name, solver, reason)


@functools.lru_cache(maxsize=256)
def _batch_route(batch: int, compiled: bool, single: bool) -> Route:
    """The shared lean-batch :class:`Route` of one batch size and mode."""
    name = COMPILED_SOLVER if compiled else "daqp"
    return Route("lean_batch", name, "a dense CPU batch", batch, compiled, single)


def _refuse_executor_under_func(executor: object, data: tuple[Any, ...]) -> None:
    """[func] the chunks' graphs live on the workers: no torch.func, no forward mode."""
    if functorch_active() or any(forward_ad_dual(t) for t in data):
        raise ValueError(
            f"executor: expected None inside torch.func transforms (grad, vjp, jvp, jacrev, "
            f"jacfwd, vmap) and forward-mode AD, got {type(executor).__name__}: the "
            "distributed path has reverse-mode autograd only. Call solve without executor= "
            "there (one local batched solve), or differentiate the executor call with "
            "plain autograd (loss.backward(), torch.autograd.grad)."
        )


def _torch_requested(solver: str, backward: object, data: tuple[Any, ...]) -> bool:
    """Whether the device route may apply: dense tensors, a named backward, and the torch
    solver requested or picked by ``"auto"`` (inputs off the CPU:
    :func:`dxopt.qp.solvers.forward.default_solver`)."""
    if solver != "auto" and solver != "torch":  # a named CPU backend: the common case, decided
        return False
    q = data[1]
    if not isinstance(q, Tensor) or not isinstance(backward, str):
        return False
    if not all(t is None or (isinstance(t, Tensor) and t.layout == torch.strided) for t in data):
        return False
    if solver != "auto":
        return solver == "torch"
    return q.device.type != "cpu"


def auto_solver(data: tuple[Any, ...]) -> str:
    """What ``"auto"`` names on the general route: the rule of
    :func:`dxopt.qp.solvers.routing.auto_choice` read off the raw inputs (sparse when ``P``,
    ``A`` or ``G`` is; off the CPU by ``q``'s device; invalid inputs: whatever, the general
    path's validation refuses them)."""
    P, q, A, _, G, _ = data
    sparse = any(isinstance(t, Tensor) and t.layout != torch.strided for t in (P, A, G))
    on_cpu = not (isinstance(q, Tensor) and q.device.type != "cpu")
    return auto_choice(sparse=sparse, on_cpu=on_cpu, P=P, q=q)


def plan(
    data: tuple[Any, ...],
    options: QPOptions,
    method: BackwardMethod,
    *,
    warm_start: Tensor | None,
    warm_set: bool = False,
) -> Route:
    """The route of one :func:`dxopt.qp.solve` call on ``data = (P, q, A, b, G, h)`` (the box
    bounds already rows of ``G``; with an ``executor=``, which takes the bounds as they came:
    ``(P, q, A, b, G, h, lb, ub)``), its checked ``options`` and its backward
    ``method`` (module docstring). Raises the errors of the checks a route needs
    (``executor=`` under torch.func; a bad ``warm_start`` or invalid inputs on the device
    route, which validates the problem to decide). ``warm_set``: the warm start carries a
    working set (a previous solution's multipliers), which the compiled solver takes."""
    solver = options.solver
    if options.executor is not None:
        _refuse_executor_under_func(options.executor, data)
        return _route("executor", solver, "executor= given")
    P, q = data[0], data[1]
    if solver == "auto" and routes_lp_to_piqp(P, q):  # a larger pure LP (auto_choice's rule)
        solver = AUTO["lp"]
    under_func = functorch_active()
    lean = not options.solver_options and options.check_psd and not under_func
    lean = lean and lean_method(method)
    if lean:  # "auto" on small dense CPU inputs (small_inputs): auto_choice's dense pick
        entry = backends.BACKENDS.get(AUTO["dense"] if solver == "auto" else solver)
        if entry is not None and entry.lean and small_inputs(*data):
            return _route("lean_single", entry.name, "one small dense")
    if (
        lean
        and options.max_workers is None
        and (solver == "auto" or solver == "daqp" or solver == COMPILED_SOLVER)
    ):
        # the compiled solver takes a warm working set, not a primal point; one problem runs
        # on it as a batch of one
        compiled = solver != "daqp" and (warm_start is None or warm_set)
        batch = small_batch_inputs(*data, max_n=None if compiled else SMALL_MAX_N)
        single = (
            not batch
            and compiled
            and type(q) is Tensor
            and q.ndim == 1
            and (q.shape[0] > SMALL_MAX_N or solver == COMPILED_SOLVER)
            and all(type(t) is Tensor and t.layout is torch.strided for t in data if t is not None)
        )
        if single:
            one = tuple(None if t is None else t.unsqueeze(0) for t in data)
            batch = small_batch_inputs(*one, max_n=None, min_batch=1)
        if batch:
            return _batch_route(batch, compiled, single)
    if _torch_requested(solver, options.backward, data):
        device = _device_route(data, options, warm_start, under_func)
        if device is not None:
            return device
    return _route("general", general_solver(solver, data), "the general route")


def general_solver(solver: str, data: tuple[Any, ...]) -> str:
    """The solver the general route starts with for the requested ``solver``: ``"auto"``
    resolved (:func:`auto_solver`), ``"dual_active_set"`` as daqp (the same method, for what
    its compiled route does not take: a primal warm start, options, sparse or non-CPU
    inputs)."""
    if solver == "auto":
        return auto_solver(data)
    if solver == COMPILED_SOLVER:
        return "daqp"
    return solver


def _device_route(
    data: tuple[Any, ...], options: QPOptions, warm_start: Tensor | None, under_func: bool
) -> Route | None:
    """The device route when it applies (dense, named backward, torch requested or picked),
    else ``None``."""
    q = data[1]
    if under_func:  # the Function validates the plain inputs
        check_warm_start(warm_start, q.shape[-1])
        shapes = [t.shape[0] for t, k in zip(data, BASES) if t is not None and t.ndim > k]
        if q.shape[-1] and all(shapes):
            return _route("device", "torch", "torch under torch.func")
        return None
    problem = canonical_problem(*data, check_psd=options.check_psd, keep_device=True)
    check_warm_start(warm_start, problem.n)
    name = default_solver(problem) if options.solver == "auto" else options.solver
    if name == "torch" and problem.size and problem.n:
        return Route("device", "torch", "dense inputs, torch solver", problem=problem)
    return None
