"""The contracts between the layers of :mod:`dxopt.qp`: the typed records one layer hands
the next.

- :class:`ForwardFactors`: the compiled solver's factorizations of every sample, which the
  backward reuses instead of factoring again.
- :class:`ForwardResult`: what the forward (:func:`dxopt.qp.solvers.forward.solve_forward`, the
  lean paths of :mod:`dxopt.qp.lean.small`/:mod:`dxopt.qp.lean.small_batch`) returns: the float64
  solution, the statuses, the certified active set and the reusable factors.
- :class:`ActiveSet`: the backward's row classification
  (:func:`dxopt.qp.certify.active.identify_active` builds it).
- :class:`QPCall`: one call's solve, run inside the autograd Function, and the state it stores.
- :class:`QPState`: the non-tensor context the autograd Function
  (:class:`dxopt.qp.autograd.function.QPFunction`) keeps between forward and backward.
- :class:`AdjointInput` and :class:`AdjointSolution`: what a backward method receives and
  returns (the reduced-KKT adjoint system of :mod:`dxopt.qp.backward.adjoint`).
- :class:`BackwardMethod`: the protocol of a backward method (the ``backward=`` extension
  point of :func:`dxopt.qp.solve`; :class:`dxopt.qp.BackwardBase` implements it).

Every layer imports them from here, so no layer imports another one's implementation to get
a type. May import: the rest of :mod:`dxopt.qp.problem`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from torch import Tensor

from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.types import BackwardDiagnostics, QPStatus

__all__ = [
    "ActiveSet",
    "AdjointInput",
    "AdjointSolution",
    "BackwardMethod",
    "ForwardFactors",
    "ForwardResult",
    "QPCall",
    "QPState",
]


@dataclass(frozen=True)
class ForwardFactors:
    """The factorizations the compiled dual active-set solver
    (:mod:`dxopt.qp.solvers.dual_active_set`) ends with, one row per sample, float64 numpy,
    for the backward to reuse (:func:`dxopt.qp.backward.dense_large.reused_dense_adjoint`).

    ``chol_P`` (S, n, n): the Cholesky factor :math:`L` of :math:`P = LL^\top`;
    ``rows`` (S, m + p, n): the rows :math:`L^{-1}c_r` of every constraint row :math:`c_r`
    of :math:`[G; A]`; ``working_set`` (S, w): the solver's final working set (row indices,
    padded); ``schur_chol`` (S, w, w): the Cholesky factor of that set's Schur complement
    :math:`C_W P^{-1} C_W^\top`.
    """

    chol_P: np.ndarray
    rows: np.ndarray
    working_set: np.ndarray
    schur_chol: np.ndarray

    def take(self, samples: np.ndarray) -> ForwardFactors:
        """The factors of ``samples`` (an index array or a boolean mask over the rows)."""
        return ForwardFactors(
            self.chol_P[samples],
            self.rows[samples],
            self.working_set[samples],
            self.schur_chol[samples],
        )


@dataclass(frozen=True)
class ForwardResult:
    """Float64 CPU solution of every sample (NaN rows for failed samples).

    ``active`` (S, m) is the certified active set of each sample (the polished one), and
    ``sample_solvers``/``sample_eps``/``polished`` record which attempt of the fallback chain
    produced each sample (``""``/NaN for failed samples); ``settled`` is False where the point
    was certified only by the duality gap (its active set is a guess). ``residuals`` are the
    per-sample primal and dual residuals of :class:`~dxopt.qp.QPInfo` when the forward already
    computed them (the batch certificate), else ``None``. ``factors``: the compiled solver's
    factorizations of every sample (:class:`ForwardFactors`) when it solved them all, for the
    backward to reuse, else ``None``. ``reasons``: per sample, why it was not solved
    and what to change (``""`` for solved samples; empty when every sample is solved).
    """

    x: Tensor
    eq_duals: Tensor
    ineq_duals: Tensor
    status: tuple[QPStatus, ...]
    solver: str
    solve_time: float
    active: Tensor | None = None
    sample_solvers: tuple[str, ...] = ()
    sample_eps: tuple[float, ...] = ()
    polished: tuple[bool, ...] = ()
    settled: tuple[bool, ...] = ()
    residuals: tuple[np.ndarray, np.ndarray] | None = None
    factors: ForwardFactors | None = None
    reasons: tuple[str, ...] = ()
    vertex_pending: tuple[tuple[int, np.ndarray], ...] = ()
    """Samples ``(index, zero-slack rows T)`` with a general dependency among their active rows,
    whose multipliers :func:`dxopt.qp.backward.vertex_select.finish_selection` replaces by the
    backward's vertex (the forward below the backward layer leaves that step to its caller)."""


@dataclass(frozen=True)
class ActiveSet:
    """Per-sample row classification (masks are (S, m)), accuracy (S,), and the normalised
    slack :math:`\\hat s` (S, m) and signed equality residual :math:`(Ax - b)/\\|a_j\\|` (S, p);
    ``adopted`` (S, m) the weak rows the backward added to ``used`` (in the span of the others)."""

    active: Tensor
    weak: Tensor
    used: Tensor
    accuracy: Tensor
    g_norm: Tensor | None
    a_norm: Tensor | None
    slack: Tensor | None = None
    eq_residual: Tensor | None = None
    #: weak rows that joined ``used`` because they lie in the span of the active rows (the
    #: backward's rule, :mod:`dxopt.qp.backward.base`), or None
    adopted: Tensor | None = None

    @property
    def n_active(self) -> tuple[int, ...]:
        return tuple(self.used.numpy().sum(-1).tolist())

    @property
    def n_weak(self) -> tuple[int, ...]:
        return tuple(self.weak.numpy().sum(-1).tolist())


@dataclass(frozen=True)
class AdjointInput:
    """Everything a backward method needs, float64 CPU, one row per sample.

    Failed samples (``ok`` False) carry zero cotangents and a zero ``x``. ``active`` (S, m)
    is the forward's certified active set (``None``: identify it from the point); ``settled``
    (S,) is False where that set is only a guess (see :mod:`dxopt.qp.certify.polish`);
    ``factors`` the forward's factorizations of these samples (:class:`ForwardFactors`), or
    ``None``. ``needs_rows`` is False when no gradient of ``A, b, G, h`` is wanted (then the
    degenerate rule's choice of rows cannot change the result,
    :mod:`dxopt.qp.backward.degenerate_rule`); ``needs_matrices`` is False when no gradient
    of ``A`` or ``G`` is wanted (then the rule's multipliers, which enter only those, are not
    computed); ``rule_fixed`` says that ``active`` already holds the degenerate rule's final
    rows (the tangent solve's second pass).
    """

    problem: QPProblem
    x: Tensor
    eq_duals: Tensor
    ineq_duals: Tensor
    grad_x: Tensor
    grad_eq: Tensor
    grad_ineq: Tensor
    ok: Tensor
    active: Tensor | None = None
    settled: Tensor | None = None
    factors: ForwardFactors | None = None
    needs_rows: bool = True
    needs_matrices: bool = True
    rule_fixed: bool = False


@dataclass(frozen=True)
class AdjointSolution:
    """:math:`(u, w_J, w_E)` with :math:`w_J` zero off the rows in ``active.used``;
    ``ineq_duals``/``eq_duals`` the multipliers the gradient formulas use where the degenerate
    rule chose them (``None``: the forward's); ``x`` likewise the point (``None``: the
    forward's)."""

    u: Tensor
    w_ineq: Tensor
    w_eq: Tensor
    active: ActiveSet
    residual: Tensor
    ineq_duals: Tensor | None = None
    eq_duals: Tensor | None = None
    #: the point the gradient formulas use (``None``: the forward's ``x``); the smoothed
    #: backward's barrier solution (:mod:`dxopt.qp.backward.smoothed`)
    x: Tensor | None = None


@runtime_checkable
class BackwardMethod(Protocol):
    """A backward method: computes the adjoint from the saved solution.

    The extension point of :func:`dxopt.qp.solve`: any object with these two members can be
    passed as ``backward=``; :class:`dxopt.qp.BackwardBase` provides the shared options, the
    active set and the degenerate-problem policy.
    """

    @property
    def name(self) -> str: ...

    def solve_adjoint(
        self, data: AdjointInput, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution: ...


@dataclass(frozen=True)
class QPState:
    """Non-tensor context of one call: the canonical problem, its solution, the backward
    method and its diagnostics, the backend's name and the per-sample (primal, dual)
    residuals of the solution."""

    problem: QPProblem
    result: ForwardResult
    method: BackwardMethod
    diagnostics: BackwardDiagnostics
    solver: str = ""
    residuals: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())


@dataclass
class QPCall:
    """One call of :func:`dxopt.qp.solve`: ``solve(P, q, A, b, G, h, warm_start)`` returns the
    :class:`QPState` (validation and forward solve on plain tensors); ``QPFunction.forward``
    stores it in ``state``, where the caller and the backward read it."""

    solve: Callable[..., QPState]
    state: QPState | None = None
