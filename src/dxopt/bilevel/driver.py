r"""The outer loop shared by every method, its typed result and the budget handling (the
one-shot estimate is :func:`dxopt.bilevel.hypergradient`, in :mod:`dxopt.bilevel.estimate`).

Every method proposes a hypergradient estimate :math:`d_t \approx \nabla H(x_t)` and the
driver steps :math:`x_{t+1} = x_t - \gamma d_t`, starting from :math:`x_0` (default 0, the
zero-respecting start) with the lower level started at :math:`y_0` (default 0). After each
step it records the oracle calls so far, the wall-clock seconds spent in the method
(evaluation excluded) and, when asked (``evaluate=True``), the exact :math:`\|\nabla H(x_t)\|`
and the upper-level value; evaluation is never counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from dxopt._core import Cost, Status, check_int, check_positive, check_tensor, renamed_kwargs
from dxopt.bilevel.oracles import BilevelOracle, BudgetExhaustedError, CountingOracle

__all__ = [
    "BilevelResult",
    "HypergradientMethod",
    "Status",
    "Trajectory",
    "minimize_bilevel",
]


class HypergradientMethod(Protocol):
    """A method: ``init`` builds its state at ``x`` with the lower level started at ``y0``;
    ``step`` returns ``(d, state)``.

    The state must expose ``y``, the method's current lower-level estimate. A method may also
    define ``estimate_point(before, after) -> (y, v)``, the lower-level point and adjoint its
    last estimate used (``d = grad_x f(x, y) - grad_xy g(x, y) v``), so that
    :func:`dxopt.bilevel.hypergradient` can certify it; without it the one-shot estimate is
    reported ``INACCURATE``.
    """

    outer_lr: float

    def init(self, oracle: CountingOracle, x: torch.Tensor, y0: torch.Tensor) -> Any: ...

    def step(
        self, oracle: CountingOracle, x: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, Any]: ...


@dataclass(frozen=True)
class Trajectory:
    """One entry per recorded outer iterate (the first is :math:`x_0`, before any call)."""

    calls: tuple[int, ...]
    seconds: tuple[float, ...]
    hypergradient_norm: tuple[float, ...]
    upper_value: tuple[float, ...]

    def calls_to_reach(self, epsilon: float) -> int | None:
        r"""Calls made when :math:`\|\nabla H\|` first fell to ``epsilon`` (None: never)."""
        for c, g in zip(self.calls, self.hypergradient_norm):
            if g <= epsilon:
                return c
        return None


@dataclass(frozen=True)
class BilevelResult:
    """Outcome of :func:`minimize_bilevel`.

    Attributes:
        x: final upper-level variable; y: the method's final lower-level estimate.
        direction: the last hypergradient estimate (None if no step finished).
        status: why the run stopped: ``SOLVED`` (exact norm at most ``tol``), ``MAX_ITER``,
            ``BUDGET_EXHAUSTED``, or ``DIVERGED`` when a step gave a non-finite ``x`` or ``y``
            (lower ``outer_lr`` or the inner step size; ``x`` and ``y`` are then the last
            finite iterate and ``direction`` the estimate that broke it); iterations: outer
            steps completed.
        cost: oracle calls by kind (``grad_f``, ``grad_g``, ``hvps``, ``jvps``; exact, a refused
            call is not counted) and the method's ``seconds``.
        trajectory: calls, seconds, exact ``||grad H||`` and upper value per iterate.
        first_nonzero_x, first_nonzero_y: call number at which each coordinate first
            appeared nonzero in a query (``-1``: never), when the frontier was tracked.
    """

    x: torch.Tensor
    y: torch.Tensor
    direction: torch.Tensor | None
    status: Status
    iterations: int
    cost: Cost
    trajectory: Trajectory
    first_nonzero_x: torch.Tensor | None = field(default=None, repr=False)
    first_nonzero_y: torch.Tensor | None = field(default=None, repr=False)

    @property
    def counts(self) -> Cost:
        """Deprecated name of :attr:`cost`."""
        return self.cost


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _start(name: str, value: torch.Tensor | None, dim: int, dtype: torch.dtype) -> torch.Tensor:
    if value is None:
        return torch.zeros(dim, dtype=dtype)
    hint = f"pass a flat tensor of length {dim} in {dtype} (the oracle's dim and dtype)."
    check_tensor(name, value, shape=(dim,), dtype=dtype, finite=True, hint=hint)
    return value.detach().clone()


@renamed_kwargs(max_iterations="max_iter", tolerance="tol")
def minimize_bilevel(
    method: HypergradientMethod,
    oracle: BilevelOracle,
    *,
    max_iter: int,
    budget: int | None = None,
    tol: float | None = None,
    x0: torch.Tensor | None = None,
    y0: torch.Tensor | None = None,
    evaluate: bool = True,
    track_frontier: bool = False,
) -> BilevelResult:
    r"""Run ``method`` on ``oracle`` until :math:`\|\nabla H\| \le` ``tol``, the budget,
    ``max_iter`` outer steps or a non-finite iterate (``Status.DIVERGED``).

    Args:
        method: e.g. :class:`AID`, :class:`ITD`, :class:`StocBiO`, :class:`SOBA`, :class:`F2BA`.
        oracle: the problem's oracle (wrapped here in a fresh :class:`CountingOracle`).
        max_iter: number of outer steps at most (``max_iterations`` is its deprecated name).
        budget: total oracle calls allowed; when the next call would exceed it the run stops
            cleanly with ``Status.BUDGET_EXHAUSTED`` and the last completed iterate.
        tol: stop once the exact :math:`\|\nabla H(x_t)\|` is at most this (needs
            ``evaluate``; ``tolerance`` is its deprecated name).
        x0: starting point (default zero, the zero-respecting start).
        y0: the lower-level start (default zero; a nonzero start breaks the symmetry of, e.g.,
            a neural network's weights).
        evaluate: record exact hypergradient norms and upper values (uncounted; what that
            costs depends on the oracle's ``exact_hypergradient``).
        track_frontier: log when each coordinate first became nonzero.

    Raises:
        ValueError: for a non-positive ``max_iter``, a ``tol`` without ``evaluate``, or an
            ``x0`` / ``y0`` whose shape or dtype does not match the oracle.
    """
    check_int("max_iter", max_iter)
    if tol is not None:
        check_positive("tol", tol, allow_zero=True)
        if not evaluate:
            raise ValueError("tol: needs evaluate=True (the stop uses the exact ||grad H||).")
    counting = CountingOracle(oracle, budget=budget, track_frontier=track_frontier)
    x = _start("x0", x0, oracle.dim_x, oracle.dtype)
    y = _start("y0", y0, oracle.dim_y, oracle.dtype)
    calls: list[int] = []
    seconds: list[float] = []
    norms: list[float] = []
    values: list[float] = []
    elapsed = 0.0
    state: Any = None
    direction: torch.Tensor | None = None

    def record() -> bool:
        calls.append(counting.total)
        seconds.append(elapsed)
        if not evaluate:
            return False
        norm = float(torch.linalg.vector_norm(counting.exact_hypergradient(x)))
        norms.append(norm)
        values.append(counting.upper_value(x, y))
        return tol is not None and norm <= tol

    status = Status.MAX_ITER
    iterations = 0
    if record():
        status = Status.SOLVED
    else:
        try:
            start = time.perf_counter()
            state = method.init(counting, x, y)
            elapsed += time.perf_counter() - start
            for iterations in range(1, max_iter + 1):
                start = time.perf_counter()
                direction, state = method.step(counting, x, state)
                x_next = x - method.outer_lr * direction
                elapsed += time.perf_counter() - start
                if not (_finite(x_next) and _finite(state.y)):
                    status = Status.DIVERGED  # keep the last finite iterate
                    iterations -= 1
                    break
                x, y = x_next, state.y
                if record():
                    status = Status.SOLVED
                    break
        except BudgetExhaustedError:
            status = Status.BUDGET_EXHAUSTED
            iterations -= 1  # the step in progress did not finish
            iterations = max(iterations, 0)
    return BilevelResult(
        x=x,
        y=y,
        direction=direction,
        status=status,
        iterations=iterations,
        cost=replace(counting.cost, seconds=elapsed),
        trajectory=Trajectory(tuple(calls), tuple(seconds), tuple(norms), tuple(values)),
        first_nonzero_x=counting.first_nonzero_x if track_frontier else None,
        first_nonzero_y=counting.first_nonzero_y if track_frontier else None,
    )
