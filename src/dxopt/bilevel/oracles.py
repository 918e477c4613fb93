r"""First-order oracles for bilevel problems and their exact accounting.

A bilevel problem is

.. math::

    \min_x H(x) = f(x, y^*(x)), \qquad y^*(x) = \arg\min_y g(x, y),

with :math:`g(x, \cdot)` :math:`\mu`-strongly convex and :math:`L_g`-smooth. The methods only
touch the problem through four oracles, each counted as one call:

- ``grad_f(x, y)`` returns :math:`(\nabla_x f, \nabla_y f)`;
- ``grad_g(x, y)`` returns :math:`(\nabla_x g, \nabla_y g)`;
- ``hvp_yy(x, y, v)`` returns :math:`\nabla^2_{yy} g\, v` (Hessian-vector product);
- ``jvp_xy(x, y, v)`` returns :math:`\nabla^2_{xy} g\, v` (mixed product, y-space to x-space).

``exact_hypergradient(x)`` gives :math:`\nabla H(x) = \nabla_x f - \nabla^2_{xy} g
[\nabla^2_{yy} g]^{-1} \nabla_y f` at :math:`y^*(x)`; it exists for evaluation only and is
never counted. :class:`CountingOracle` wraps any oracle, counts the four kinds of calls (in a
:class:`dxopt._core.Cost`: ``grad_f``, ``grad_g``, ``hvps``, ``jvps``),
enforces a budget and can log when each coordinate first became nonzero (the frontier of a
zero-chain, Carmon et al., arXiv 1710.11606; Ji, arXiv 2511.19656).
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol, runtime_checkable

import torch

from dxopt._core import Cost, DxoptError, Status

__all__ = ["BilevelOracle", "BudgetExhaustedError", "CountingOracle", "OracleCounts"]


@runtime_checkable
class BilevelOracle(Protocol):
    """The oracle interface every method uses (flat 1-D tensors ``x`` and ``y``)."""

    dim_x: int
    dim_y: int
    dtype: torch.dtype

    def grad_f(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def grad_g(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def hvp_yy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def jvp_xy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def upper_value(self, x: torch.Tensor, y: torch.Tensor) -> float: ...

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor: ...


def OracleCounts(**counts: Any) -> Cost:
    """Deprecated: bilevel counts are a :class:`dxopt._core.Cost` (``hvp``/``jvp`` are now
    ``hvps``/``jvps``). Kept for one release."""
    warnings.warn(
        "dxopt.bilevel.OracleCounts is deprecated; counts are a dxopt.Cost "
        "(fields grad_f, grad_g, hvps, jvps).",
        DeprecationWarning,
        stacklevel=2,
    )
    renames = {"hvp": "hvps", "jvp": "jvps"}
    return Cost(**{renames.get(k, k): v for k, v in counts.items()})


class BudgetExhaustedError(DxoptError):
    """Raised by :class:`CountingOracle` before a call that would exceed its budget.

    The methods' driver (:func:`dxopt.bilevel.minimize_bilevel`) catches it and returns a
    result whose status is ``BUDGET_EXHAUSTED``; users never see it from a method run.
    """


class CountingOracle:
    """Count the calls made to ``oracle``, stop at ``budget``, optionally log the frontier.

    Args:
        oracle: the wrapped oracle.
        budget: maximum total number of calls (``None`` for no limit). The call that would be
            number ``budget + 1`` raises :class:`BudgetExhaustedError` without running. A
            call is counted once it returns (one refused by a wrapped oracle is not).
        track_frontier: when true, record for every coordinate of ``x`` and ``y`` the number
            of the first call whose query (``x``, ``y`` or ``v``) had it nonzero, in
            :attr:`first_nonzero_x` / :attr:`first_nonzero_y` (``-1``: never).

    Raises:
        TypeError: if ``oracle`` lacks the oracle methods.
        ValueError: for a negative budget.
    """

    def __init__(
        self, oracle: BilevelOracle, *, budget: int | None = None, track_frontier: bool = False
    ) -> None:
        if not isinstance(oracle, BilevelOracle):
            raise TypeError(
                "oracle: expected an object with dim_x, dim_y, dtype, grad_f, grad_g, hvp_yy, "
                f"jvp_xy, upper_value and exact_hypergradient, got {type(oracle).__name__}; "
                "wrap plain functions with dxopt.bilevel.AutogradOracle(upper, lower, ...)."
            )
        if budget is not None and budget < 0:
            raise ValueError(f"budget: expected a non-negative call count or None, got {budget}.")
        self.oracle = oracle
        self.budget = budget
        self.dim_x, self.dim_y, self.dtype = oracle.dim_x, oracle.dim_y, oracle.dtype
        self._counts = {"grad_f": 0, "grad_g": 0, "hvps": 0, "jvps": 0}
        self._total = 0
        self.track_frontier = track_frontier
        self.first_nonzero_x = torch.full((oracle.dim_x,), -1, dtype=torch.long)
        self.first_nonzero_y = torch.full((oracle.dim_y,), -1, dtype=torch.long)

    @property
    def cost(self) -> Cost:
        """Calls so far by kind (``grad_f``, ``grad_g``, ``hvps``, ``jvps``)."""
        return Cost(**self._counts)

    @property
    def counts(self) -> Cost:
        """Deprecated name of :attr:`cost`."""
        return self.cost

    @property
    def total(self) -> int:
        return self._total

    def _call(self, kind: str, fn: Any, x: torch.Tensor, *args: torch.Tensor) -> Any:
        """Run ``fn(x, *args)`` as call number ``total + 1`` of ``kind`` within the budget.

        A call counts once it has returned: one refused here, or refused inside ``fn`` (a
        wrapped :class:`CountingOracle` whose own budget ran out), is not counted, so this
        oracle's counts never exceed those of an oracle it wraps."""
        if self.budget is not None and self._total >= self.budget:
            raise BudgetExhaustedError(
                f"oracle budget of {self.budget} calls exhausted", status=Status.BUDGET_EXHAUSTED
            )
        out = fn(x, *args)
        self._total += 1
        self._counts[kind] += 1
        if self.track_frontier:
            self._log_support(self.first_nonzero_x, x)
            for y in args:
                self._log_support(self.first_nonzero_y, y)
        return out

    def _log_support(self, first: torch.Tensor, z: torch.Tensor) -> None:
        new = (z != 0) & (first < 0)
        if bool(new.any()):
            first[new] = self._total

    def grad_f(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._call("grad_f", self.oracle.grad_f, x, y)

    def grad_g(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._call("grad_g", self.oracle.grad_g, x, y)

    def hvp_yy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._call("hvps", self.oracle.hvp_yy, x, y, v)

    def jvp_xy(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._call("jvps", self.oracle.jvp_xy, x, y, v)

    def upper_value(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Not counted: for evaluation only."""
        return self.oracle.upper_value(x, y)

    def exact_hypergradient(self, x: torch.Tensor) -> torch.Tensor:
        """Not counted: for evaluation only."""
        return self.oracle.exact_hypergradient(x)
