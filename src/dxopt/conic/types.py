"""Options, results, errors and warnings of :mod:`dxopt.conic`."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from dxopt._core import (
    Cost,
    DxoptError,
    DxoptWarning,
    Status,
    check_choice,
    check_int,
    check_on_failure,
    check_positive,
)

__all__ = [
    "ConicBackwardError",
    "ConicBackwardInfo",
    "ConicDegenerateWarning",
    "ConicInfo",
    "ConicOptions",
    "ConicSolution",
    "ConicSolveError",
    "Smoothed",
]

SOLVERS = ("clarabel", "scs", "torch")
"""Backends of the forward chain, in their default order (SCS only where importable; the
batched torch interior point, :mod:`dxopt.conic.ipm`, only first and only for programs with
zero, nonnegative and second-order cones)."""
ROUTES = ("auto", "dense", "sparse")
"""What ``route=`` takes (:mod:`dxopt.conic.sparse_route`)."""
INFEASIBLE = ("fail", "relax")
"""What ``infeasible=`` takes: a certified infeasible sample fails, or is relaxed."""


@dataclass(frozen=True, kw_only=True)
class Smoothed:
    """Smoothed backward for cone programs: the exact derivative of the barrier solution.

    Pass as ``backward=Smoothed(mu=1e-3)`` to :func:`dxopt.conic.solve`,
    :class:`dxopt.conic.ConicLayer` or :class:`dxopt.frontend.CvxpyLayer` (``solver_args``).
    The forward is unchanged (the certified solution); the backward differentiates the
    central-path point :math:`(x, y, s)(\\mu)` of
    :math:`\\min \\tfrac12 x^\\top Px + q^\\top x + \\mu F(b - Ax)` (``F`` the sum of the cones'
    log-barriers, zero-cone rows kept as equalities), found by Newton from the certified point;
    math in :mod:`dxopt.conic.smoothed`. The power cone has no barrier here and is refused.

    Prefer it where the exact derivative is piecewise constant or jumps (decision-focused
    learning with LP-like decisions, active sets that keep switching); it is biased by
    :math:`O(\\mu)` at a nondegenerate point.

    Attributes:
        mu: the barrier parameter (finite, > 0), in the units of the objective.
        max_iter: Newton steps before the backward is refused.
    """

    mu: float = 1e-3
    max_iter: int = 100

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "mu", check_positive("mu", self.mu, hint="pass e.g. Smoothed(mu=1e-3)")
        )
        check_int("max_iter", self.max_iter)


@dataclass(frozen=True, kw_only=True)
class ConicOptions:
    """Every option of :func:`dxopt.conic.solve` (keyword-only, checked at construction).

    Attributes:
        atol, rtol: the acceptance tolerances of dxopt's own certificate: each residual
            (primal, dual, complementarity, gap) must be at most ``atol + rtol * scale`` with
            its own scale (:mod:`dxopt.conic.certify`). The backends are asked for ``atol``
            first and 100x tighter on a retry.
        infeas_tol: relative tolerance of the infeasibility / unboundedness certificates.
        max_iter: iteration limit of each backend attempt.
        solver: the first backend, ``"clarabel"``, ``"scs"`` or ``"torch"`` (the batched
            interior point of :mod:`dxopt.conic.ipm`, for zero, nonnegative and second-order
            cones only; other programs start with Clarabel; its points are certified like the
            others' and the samples it does not solve go on to Clarabel).
        fallback: after a point fails the certificate, try the other attempts of the chain
            (Clarabel tighter, then SCS where importable).
        on_failure: ``"raise"`` (:class:`ConicSolveError` naming the failed samples),
            ``"warn"``, ``"ignore"`` or ``"nan"``; for all but ``"raise"`` the failed samples
            come back as NaN with their status (infeasible and unbounded samples too) and give
            zero gradient.
        kink_tol: a sample whose ``w = y - s`` lies within ``kink_tol`` (relative to the scale
            of ``(y, s)``) of a cone's kink is reported ``DEGENERATE`` and differentiated by
            the cones' one-sided rule (:mod:`dxopt.conic.backward`).
        polish: a few Newton steps on the optimality map :math:`F(x, w) = 0` (the backward's
            Jacobian) after the backend, kept only where they reduce the residual.
        check_psd: check that ``P`` is symmetric positive semidefinite (one eigenvalue sweep).
        infeasible: ``"fail"`` (a certified infeasible sample is a failure for ``on_failure``)
            or ``"relax"``: it is replaced by its closest feasible problem
            (:mod:`dxopt.conic.relax`), status ``RELAXED``; dense ``A`` only.
        backward: ``"kkt"`` (the exact implicit derivative) or a :class:`Smoothed` (the
            derivative of the barrier solution, :mod:`dxopt.conic.smoothed`).
        route: ``"auto"`` (the sparse route for sparse shared ``P``, ``A`` from
            :math:`n + m \\ge` :data:`dxopt.conic.sparse_problem.SPARSE_MIN`), ``"dense"``
            or ``"sparse"`` (:mod:`dxopt.conic.sparse_route`: CSC data to the backends,
            sparse certificate, sparse LU of the Jacobian; never a dense matrix).
    """

    atol: float = 1e-8
    rtol: float = 1e-8
    infeas_tol: float = 1e-8
    max_iter: int = 200
    solver: str = "clarabel"
    fallback: bool = True
    on_failure: str = "raise"
    kink_tol: float = 1e-7
    polish: bool = True
    check_psd: bool = True
    infeasible: str = "fail"
    backward: str | Smoothed = "kkt"
    route: str = "auto"

    def __post_init__(self) -> None:
        check_positive("atol", self.atol)
        check_positive("rtol", self.rtol, allow_zero=True)
        check_positive("infeas_tol", self.infeas_tol)
        check_positive("kink_tol", self.kink_tol, allow_zero=True)
        check_int("max_iter", self.max_iter)
        check_choice("solver", self.solver, SOLVERS)
        check_on_failure(self.on_failure, ("raise", "warn", "ignore", "nan"))
        check_choice("infeasible", self.infeasible, INFEASIBLE)
        check_choice("route", self.route, ROUTES)
        if not (self.backward == "kkt" or isinstance(self.backward, Smoothed)):
            raise ValueError(
                f"backward: expected 'kkt' or a dxopt.conic.Smoothed, got {self.backward!r}; "
                "pass e.g. backward=Smoothed(mu=1e-3)"
            )
        for name in ("fallback", "polish", "check_psd"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool, got {getattr(self, name)!r}")


@dataclass
class ConicBackwardInfo:
    """What the last backward pass did (filled in when it runs).

    Attributes:
        linear_solver: ``"lu"`` (dense batched), ``"splu"`` (sparse) or ``"lu (smoothed)"``
            (the barrier system of ``backward=Smoothed(...)``; no condition estimate).
        residual: per sample, the relative residual of the adjoint system at the returned
            adjoint (round-off where the system was regular).
        refinement_steps: refinement rounds used (the most over the batch).
        singular: per sample, ``True`` where the Jacobian was singular or too ill-conditioned
            for the direct solve and the minimum-norm least-squares adjoint was used.
        condition: per sample, an estimate of the 1-norm condition number of the Jacobian.
    """

    linear_solver: str = ""
    residual: tuple[float, ...] = ()
    refinement_steps: int = 0
    singular: tuple[bool, ...] = ()
    condition: tuple[float, ...] = ()


@dataclass(frozen=True)
class ConicInfo:
    """Per-sample facts of the forward solve.

    Attributes:
        solvers: per sample, the attempt whose point was certified (``""`` if none).
        iterations: per sample, that attempt's iteration count.
        primal_residual, dual_residual, gap: per sample, :math:`\\Vert Ax + s - b\\Vert_\\infty`,
            :math:`\\Vert Px + A^\\top y + q\\Vert_\\infty` and
            :math:`|x^\\top P x + q^\\top x + b^\\top y|` of the returned point.
        kink: per sample, ``True`` where ``w = y - s`` is at a cone's kink (status
            ``DEGENERATE``).
        polished: per sample, whether the Newton polish was kept.
        failures: per sample, why the attempts that were rejected failed (empty if none).
        cost: the forward's :class:`dxopt.Cost` (``forwards`` = backend calls, ``seconds``).
        backward: diagnostics of the last backward pass (empty until one runs).
        relax_shift: with ``infeasible="relax"``, per sample :math:`\\Vert d^\\star\\Vert_2`, the
            norm of the shift of a ``RELAXED`` sample (0.0 for the others); ``()`` otherwise.
        warm: per sample, whether the warm start certified and the backends were skipped
            (``()`` without a warm start).
    """

    solvers: tuple[str, ...]
    iterations: tuple[int, ...]
    primal_residual: tuple[float, ...]
    dual_residual: tuple[float, ...]
    gap: tuple[float, ...]
    kink: tuple[bool, ...]
    polished: tuple[bool, ...]
    failures: tuple[tuple[str, ...], ...]
    cost: Cost
    backward: ConicBackwardInfo = field(default_factory=ConicBackwardInfo)
    relax_shift: tuple[float, ...] = ()
    warm: tuple[bool, ...] = ()


@dataclass(frozen=True)
class ConicSolution:
    """A differentiable solution of a batch of cone programs.

    Attributes:
        x: primal solution ``(B, n)`` (``(n,)`` for an unbatched call).
        y: dual solution (multipliers of ``Ax + s = b``), ``(B, m)`` / ``(m,)``, in ``K*``.
        s: slacks ``b - Ax`` in ``K``, ``(B, m)`` / ``(m,)``.
        status: per sample :class:`dxopt.Status` (``SOLVED``, ``DEGENERATE``,
            ``INFEASIBLE``, ``UNBOUNDED``, ``INACCURATE``, ``MAX_ITER``, ``FAILED``).
        info: :class:`ConicInfo`.
    """

    x: Tensor
    y: Tensor
    s: Tensor
    status: tuple[Status, ...]
    info: ConicInfo

    @property
    def ok(self) -> bool:
        """Whether every sample has a valid (certified) solution."""
        return all(st.ok for st in self.status)


class ConicSolveError(DxoptError):
    """Some samples were not solved (``on_failure="raise"``).

    Attributes:
        failed_indices: batch indices of the failed samples.
        status: the per-sample status of the whole batch.
    """

    def __init__(self, message: str, failed_indices: tuple[int, ...], status: tuple[Status, ...]):
        super().__init__(message, status=status)
        self.failed_indices = failed_indices

    def __reduce__(self):  # picklable
        return (ConicSolveError, (str(self), self.failed_indices, self.status))


class ConicBackwardError(DxoptError):
    """The adjoint system could not be solved to round-off; no gradient is returned."""


class ConicDegenerateWarning(DxoptWarning, UserWarning):
    """Some samples sit at a cone's kink or have a singular Jacobian: their gradient follows
    the documented one-sided rule (:mod:`dxopt.conic.backward`); the per-sample facts are in
    ``sol.info.kink`` and ``sol.info.backward``."""
