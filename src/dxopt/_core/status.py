"""One status enum and one failure policy for every dxopt solver."""

from __future__ import annotations

import enum
import warnings
from typing import Literal

from dxopt._core.errors import DxoptError, DxoptWarning

__all__ = ["FailurePolicy", "Status", "check_on_failure", "handle_failure"]

FailurePolicy = Literal["raise", "warn", "ignore", "nan"]
_POLICIES: tuple[str, ...] = ("raise", "warn", "ignore", "nan")

_MESSAGES = {
    "solved": "solved to the requested tolerance",
    "max_iter": "stopped at max_iter before meeting the tolerance; raise max_iter or loosen tol",
    "budget_exhausted": "stopped because the next oracle call would exceed the call budget",
    "infeasible": "the problem is infeasible (no point satisfies the constraints)",
    "unbounded": "the problem is unbounded below",
    "inaccurate": "finished, but the final residual misses the tolerance",
    "degenerate": "solved, but the solution is degenerate (e.g. LICQ fails); derivatives may "
    "not be unique",
    "fallback": "solved only through a fallback (jitter or pseudo-inverse); increase damping "
    "or regularization",
    "failed": "the solver failed (non-finite values or a breakdown)",
    "diverged": "the iteration diverged (its residual grew past the starting one or became "
    "non-finite); lower the step size (lr)",
    "relaxed": "certified infeasible, so the closest feasible problem (the constraints shifted "
    "by the least-squares smallest violation) was solved instead, as asked",
}


class Status(enum.Enum):
    """Why a solver stopped; ``status.message`` says it in words, ``status.ok`` whether the
    answer can be trusted as is.

    ``CONVERGED`` and ``MAX_ITERATIONS`` are aliases of ``SOLVED`` and ``MAX_ITER`` kept for
    one release (the names of :class:`dxopt.bilevel.Status` before 0.2).
    """

    SOLVED = "solved"
    MAX_ITER = "max_iter"
    BUDGET_EXHAUSTED = "budget_exhausted"
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    INACCURATE = "inaccurate"
    DEGENERATE = "degenerate"
    FALLBACK = "fallback"
    FAILED = "failed"
    DIVERGED = "diverged"
    RELAXED = "relaxed"
    """Opt-in (``infeasible="relax"`` of :func:`dxopt.qp.solve` and :func:`dxopt.conic.solve`):
    the sample was certified infeasible and the returned point solves the closest feasible
    problem, whose constraints are shifted by the least-squares smallest violation
    (:mod:`dxopt.qp.api.relax`, :mod:`dxopt.conic.relax`). ``ok``:
    that point and its derivative are valid for the relaxed problem."""
    # deprecated aliases (same value, so ``Status.CONVERGED is Status.SOLVED``)
    CONVERGED = "solved"
    MAX_ITERATIONS = "max_iter"

    @property
    def message(self) -> str:
        return _MESSAGES[self.value]

    @property
    def ok(self) -> bool:
        """True for SOLVED, DEGENERATE and RELAXED (a valid solution: for RELAXED, of the
        closest feasible problem the caller opted into), False otherwise."""
        return self in (Status.SOLVED, Status.DEGENERATE, Status.RELAXED)


def check_on_failure(
    on_failure: object, allowed: tuple[str, ...] = ("raise", "warn", "ignore")
) -> str:
    """Validate an ``on_failure`` keyword against the subset a function supports."""
    if on_failure not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(
            f"on_failure: expected one of {choices}, got {on_failure!r}. "
            "'raise' raises, 'warn' warns and returns the result with its status, "
            "'ignore' only reports the status"
            + (", 'nan' fills failed parts with NaN" if "nan" in allowed else "")
            + "."
        )
    return str(on_failure)


def handle_failure(
    on_failure: str,
    message: str,
    *,
    error: type[DxoptError] = DxoptError,
    status: Status | None = None,
    stacklevel: int = 3,
) -> None:
    """Apply the failure policy: raise ``error(message)``, warn, or do nothing.

    ``"ignore"`` and ``"nan"`` do nothing here; the caller reports the status (and, for
    ``"nan"``, writes the NaNs).
    """
    if on_failure == "raise":
        raise error(message, status=status)
    if on_failure == "warn":
        warnings.warn(message, DxoptWarning, stacklevel=stacklevel)
