r"""The outer loop shared by every method, its typed result and the budget handling.

Every method proposes a hypergradient estimate :math:`d_t \approx \nabla H(x_t)` and the
driver steps :math:`x_{t+1} = x_t - \gamma d_t`, starting from :math:`x_0 = 0` (zero-respecting
runs). After each step it records the oracle calls so far, the wall-clock seconds spent in the
method (evaluation excluded) and, when the oracle can give it, the exact
:math:`\|\nabla H(x_t)\|` and the upper-level value; evaluation is never counted.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from dxopt.bilevel.oracles import BilevelOracle, BudgetExhaustedError, CountingOracle, OracleCounts

__all__ = ["BilevelResult", "HypergradientMethod", "Status", "Trajectory", "minimize_bilevel"]


class Status(enum.Enum):
    """Why a run stopped."""

    CONVERGED = "converged"  # exact ||grad H|| <= tolerance
    BUDGET_EXHAUSTED = "budget_exhausted"  # the next oracle call would exceed the budget
    MAX_ITERATIONS = "max_iterations"


class HypergradientMethod(Protocol):
    """A method: ``init`` builds its state at ``x``; ``step`` returns ``(d, state)``.

    The state must expose ``y``, the method's current lower-level estimate.
    """

    outer_lr: float

    def init(self, oracle: CountingOracle, x: torch.Tensor) -> Any: ...

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
        status: why the run stopped; iterations: outer steps completed.
        counts: oracle calls by kind (exact; a refused call is not counted).
        trajectory: calls, seconds, exact ``||grad H||`` and upper value per iterate.
        first_nonzero_x, first_nonzero_y: call number at which each coordinate first
            appeared nonzero in a query (``-1``: never), when the frontier was tracked.
    """

    x: torch.Tensor
    y: torch.Tensor
    direction: torch.Tensor | None
    status: Status
    iterations: int
    counts: OracleCounts
    trajectory: Trajectory
    first_nonzero_x: torch.Tensor | None = field(default=None, repr=False)
    first_nonzero_y: torch.Tensor | None = field(default=None, repr=False)


def minimize_bilevel(
    method: HypergradientMethod,
    oracle: BilevelOracle,
    *,
    max_iterations: int,
    budget: int | None = None,
    tolerance: float | None = None,
    x0: torch.Tensor | None = None,
    evaluate: bool = True,
    track_frontier: bool = False,
) -> BilevelResult:
    r"""Run ``method`` on ``oracle`` until :math:`\|\nabla H\| \le` ``tolerance``, the
    budget or ``max_iterations``.

    Args:
        method: e.g. :class:`AID`, :class:`ITD`, :class:`StocBiO`, :class:`SOBA`, :class:`F2BA`.
        oracle: the problem's oracle (wrapped here in a fresh :class:`CountingOracle`).
        max_iterations: number of outer steps at most.
        budget: total oracle calls allowed; when the next call would exceed it the run stops
            cleanly with ``Status.BUDGET_EXHAUSTED`` and the last completed iterate.
        tolerance: stop once the exact :math:`\|\nabla H(x_t)\|` is at most this (needs
            ``evaluate``).
        x0: starting point (default zero, the zero-respecting start).
        evaluate: record exact hypergradient norms and upper values (uncounted).
        track_frontier: log when each coordinate first became nonzero.

    Raises:
        ValueError: for a non-positive ``max_iterations``, a ``tolerance`` without
            ``evaluate``, or an ``x0`` whose shape or dtype does not match the oracle.
    """
    if max_iterations < 1:
        raise ValueError(f"max_iterations: expected a positive integer, got {max_iterations}.")
    if tolerance is not None and not evaluate:
        raise ValueError("tolerance: needs evaluate=True (the stop uses the exact ||grad H||).")
    counting = CountingOracle(oracle, budget=budget, track_frontier=track_frontier)
    if x0 is None:
        x = torch.zeros(oracle.dim_x, dtype=oracle.dtype)
    else:
        if not isinstance(x0, torch.Tensor) or tuple(x0.shape) != (oracle.dim_x,):
            shape = tuple(x0.shape) if isinstance(x0, torch.Tensor) else type(x0).__name__
            raise ValueError(
                f"x0: expected a tensor of shape ({oracle.dim_x},) to match the oracle's dim_x, "
                f"got {shape}; flatten it or fix the problem's dimensions."
            )
        if x0.dtype != oracle.dtype:
            raise ValueError(f"x0: expected dtype {oracle.dtype}, got {x0.dtype}; cast it.")
        x = x0.clone()
    calls: list[int] = []
    seconds: list[float] = []
    norms: list[float] = []
    values: list[float] = []
    elapsed = 0.0
    state: Any = None
    direction: torch.Tensor | None = None
    y = torch.zeros(oracle.dim_y, dtype=oracle.dtype)

    def record() -> bool:
        calls.append(counting.total)
        seconds.append(elapsed)
        if not evaluate:
            return False
        norm = float(torch.linalg.vector_norm(counting.exact_hypergradient(x)))
        norms.append(norm)
        values.append(counting.upper_value(x, y))
        return tolerance is not None and norm <= tolerance

    status = Status.MAX_ITERATIONS
    iterations = 0
    if record():
        status = Status.CONVERGED
    else:
        try:
            start = time.perf_counter()
            state = method.init(counting, x)
            elapsed += time.perf_counter() - start
            for iterations in range(1, max_iterations + 1):  # noqa: B007
                start = time.perf_counter()
                direction, state = method.step(counting, x, state)
                x = x - method.outer_lr * direction
                y = state.y
                elapsed += time.perf_counter() - start
                if record():
                    status = Status.CONVERGED
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
        counts=counting.counts,
        trajectory=Trajectory(tuple(calls), tuple(seconds), tuple(norms), tuple(values)),
        first_nonzero_x=counting.first_nonzero_x if track_frontier else None,
        first_nonzero_y=counting.first_nonzero_y if track_frontier else None,
    )
