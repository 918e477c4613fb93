"""Result types, statuses and errors of :mod:`dxopt.qp`."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from dxopt._core import DxoptError, DxoptWarning, Status

__all__ = [
    "BackwardDiagnostics",
    "QPBackwardError",
    "QPDegenerateWarning",
    "QPInfo",
    "QPSolution",
    "QPSolveError",
    "QPStatus",
]


QPStatus = Status
"""Outcome of the forward solve of one sample: the library-wide :class:`dxopt.Status` (qp uses
``SOLVED``; ``INFEASIBLE`` and ``UNBOUNDED`` only with a checked certificate,
:mod:`dxopt.qp.certify.certificates`; else ``MAX_ITER``, ``INACCURATE`` or ``FAILED``); the name is
kept
for 0.1 code."""


class QPSolveError(DxoptError):
    """Some samples of the batch were not solved (``on_failure="raise"``).

    Attributes:
        failed_indices: batch indices of the failed samples (``(0,)`` for an unbatched call).
        status: the per-sample status of the whole batch.
    """

    def __init__(self, message: str, failed_indices: tuple[int, ...], status: tuple[QPStatus, ...]):
        super().__init__(message, status=status)
        self.failed_indices = failed_indices

    def __reduce__(self):  # picklable across processes (DDP, process pools)
        return (QPSolveError, (str(self), self.failed_indices, self.status))


class QPBackwardError(DxoptError):
    """The backward linear system could not be solved to the required accuracy.

    Raised instead of returning a gradient that may be wrong; the message names the batch
    indices, the achieved relative residual and what to try.
    """


class QPDegenerateWarning(DxoptWarning, UserWarning):
    """The active constraint rows of some samples are linearly dependent (LICQ fails).

    The gradient is still returned: :math:`\\partial L/\\partial q` and
    :math:`\\partial L/\\partial P` are exact, and the gradients for ``b, h, A, G`` follow the
    documented rule (a vertex of the multiplier set, or the minimum-norm multiplier adjoint;
    :mod:`dxopt.qp.backward.degenerate_rule`). The message text is the same for every call, so
    Python's default filter shows it once per call site; the per-sample facts are in
    ``sol.info.backward`` (``dependent_rows``, ``vertex_dropped``) and ``sol.info.degenerate``.
    Silence it with ``warnings.filterwarnings("ignore", category=dxopt.qp.QPDegenerateWarning)``.
    """


@dataclass
class BackwardDiagnostics:
    """What the last backward pass did (filled in when ``backward()`` runs).

    Attributes:
        method: ``"penalty"`` or ``"kkt"``.
        linear_solver: the factorisation that ran (``"cholesky"``, ``"lu"``, ``"splu"``, ...).
        residual: max over the batch of the relative residual of the reduced-KKT adjoint
            system :math:`K[u; w] = [\\bar x; \\bar\\nu_J; \\bar\\mu]` at the returned adjoint.
        refinement_steps: refinement steps used by the penalty backward (0 for ``"kkt"``).
        beta: per-sample smoothing :math:`\\beta` used by the penalty backward.
        n_active: per-sample number of inequality rows treated as active.
        n_weak: per-sample number of weakly active rows (zero slack and zero multiplier).
        jitter: diagonal shift added to make a factorisation succeed (0.0 if none).
        dependent_rows: per-sample number of active rows linearly dependent on the others
            (0 everywhere when LICQ holds); such samples use the minimum-norm multiplier
            adjoint, identical for both methods.
        licq: False if any sample had dependent active rows.
        pseudo_inverse: per sample, True if the reduced KKT matrix was singular beyond
            dependent rows (P singular on the null space of the active rows) and the
            Moore-Penrose adjoint was returned (``degenerate="min_norm"``).
        weak_kept: True if the weakly active rows had to be kept as equalities because P is
            singular on the null space of the strongly active rows.
        unsettled: per sample, True if the forward point was certified only by its duality gap
            (the active set is a guess; a ``QPDegenerateWarning`` is issued).
        vertex_dropped: per sample, the dependent inequality rows the vertex rule dropped
            (``degenerate="auto"``/``"vertex"``; 0 where the minimum-norm adjoint was used).
        dropped_rows: per sample, the indices (rows of ``G``) of those dropped rows.
    """

    method: str = ""
    linear_solver: str = ""
    residual: float = float("nan")
    refinement_steps: int = 0
    beta: tuple[float, ...] = ()
    n_active: tuple[int, ...] = ()
    n_weak: tuple[int, ...] = ()
    jitter: float = 0.0
    dependent_rows: tuple[int, ...] = ()
    licq: bool = True
    pseudo_inverse: tuple[bool, ...] = ()
    weak_kept: bool = False
    unsettled: tuple[bool, ...] = ()
    vertex_dropped: tuple[int, ...] = ()
    dropped_rows: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class QPInfo:
    """Per-call information.

    Attributes:
        solver: the backend used for the forward solve (a qpsolvers name, ``"torch"``, or
            ``"dual_active_set"``: the compiled solver of :mod:`dxopt.qp.solvers.dual_active_set`).
        solve_time: wall-clock seconds of the forward solve (whole batch).
        primal_residual: per-sample max violation of ``Ax = b``, ``Gx <= h``.
        dual_residual: per-sample :math:`\\|Px + q + A^\\top\\mu + G^\\top\\nu\\|_\\infty`.
        backward: diagnostics of the last backward pass through this solution (empty until
            ``backward()`` has run).
        sample_solvers: per sample, the backend of the fallback chain whose (polished) point
            was certified (``""`` for an unsolved sample).
        sample_tolerances: per sample, the stopping tolerance ``eps_abs`` passed to that
            backend (the certificate always uses the requested one).
        polished: per sample, whether the returned point is the polished one.
        route: the path that produced the answer (:mod:`dxopt.qp.api.route`): ``"lean_single"``,
            ``"lean_batch"``, ``"device"``, ``"general"`` or ``"executor"`` (a lean route that
            declines at run time hands the call to the general one, recorded as ``"general"``).
        relax_shift: per sample, :math:`\\|s^\\star\\|_2`, the norm of the least-squares
            smallest constraint shift of a sample solved as its closest feasible problem
            (status ``RELAXED``, ``infeasible="relax"``; :mod:`dxopt.qp.api.relax`), ``0.0``
            for the other samples; empty when no sample was relaxed.
        iterations: per sample, the active-set solver's working-set changes on the lean
            routes (daqp's iteration count, or the compiled solver's; a warm start that failed
            and was solved again cold: both attempts'); empty on the other routes.
        warm_started: per sample, whether the answer is a warm start's (``warm_start=``
            given and its attempt solved and certified; else it was solved cold); empty on
            the routes that do not record it (the general and device routes).
    """

    solver: str
    solve_time: float
    primal_residual: tuple[float, ...]
    dual_residual: tuple[float, ...]
    backward: BackwardDiagnostics = field(default_factory=BackwardDiagnostics)
    sample_solvers: tuple[str, ...] = ()
    sample_tolerances: tuple[float, ...] = ()
    polished: tuple[bool, ...] = ()
    route: str = "general"
    relax_shift: tuple[float, ...] = ()
    iterations: tuple[int, ...] = ()
    warm_started: tuple[bool, ...] = ()

    @property
    def degenerate(self) -> tuple[bool, ...]:
        """Per sample, True where the last backward found linearly dependent active rows
        (LICQ fails; counts in ``backward.dependent_rows``); empty before a backward."""
        return tuple(c > 0 for c in self.backward.dependent_rows)

    @classmethod
    def from_every_field(
        cls,
        solver: str,
        solve_time: float,
        primal_residual: tuple[float, ...],
        dual_residual: tuple[float, ...],
        backward: BackwardDiagnostics,
        sample_solvers: tuple[str, ...],
        sample_tolerances: tuple[float, ...],
        polished: tuple[bool, ...],
        route: str,
        relax_shift: tuple[float, ...] = (),
        iterations: tuple[int, ...] = (),
        warm_started: tuple[bool, ...] = (),
    ) -> QPInfo:
        """What ``QPInfo(...)`` makes of every field, without the frozen dataclass's
        ``object.__setattr__`` per field (1.8 against 0.4 us: the lean paths' per-call cost;
        ``tests/qp/test_types.py`` holds the two equal)."""
        info = object.__new__(cls)
        info.__dict__.update(
            solver=solver, solve_time=solve_time, primal_residual=primal_residual,
            dual_residual=dual_residual, backward=backward, sample_solvers=sample_solvers,
            sample_tolerances=sample_tolerances, polished=polished, route=route,
            relax_shift=relax_shift, iterations=iterations, warm_started=warm_started,
        )  # fmt: skip
        return info


@dataclass(frozen=True)
class QPSolution:
    """Solution of a (batch of) QP(s).

    Attributes:
        x: primal solution, ``(B, n)`` if any input is batched, else ``(n,)``; differentiable.
        eq_duals: multipliers :math:`\\mu` of :math:`Ax = b` (``(B, p)``/``(p,)``) or ``None``.
        ineq_duals: multipliers :math:`\\nu \\ge 0` of :math:`Gx \\le h` or ``None``.
        status: one :class:`QPStatus` per sample.
        info: solver name, timings, residuals and backward diagnostics.
        lb_duals: multipliers of the finite entries of ``lb`` (``x >= lb``), or ``None``.
        ub_duals: multipliers of the finite entries of ``ub`` (``x <= ub``), or ``None``.
    """

    x: Tensor
    eq_duals: Tensor | None
    ineq_duals: Tensor | None
    status: tuple[QPStatus, ...]
    info: QPInfo
    lb_duals: Tensor | None = None
    ub_duals: Tensor | None = None

    @classmethod
    def from_every_field(
        cls,
        x: Tensor,
        eq_duals: Tensor | None,
        ineq_duals: Tensor | None,
        status: tuple[QPStatus, ...],
        info: QPInfo,
        lb_duals: Tensor | None,
        ub_duals: Tensor | None,
    ) -> QPSolution:
        """What ``QPSolution(...)`` makes of every field, as :meth:`QPInfo.from_every_field`."""
        solution = object.__new__(cls)
        solution.__dict__.update(
            x=x, eq_duals=eq_duals, ineq_duals=ineq_duals, status=status, info=info,
            lb_duals=lb_duals, ub_duals=ub_duals,
        )  # fmt: skip
        return solution
