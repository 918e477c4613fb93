"""The oracle contract of :mod:`dxopt.dfl`: :class:`Oracle` (what the losses and metrics
need), :class:`OracleBase` (validation, conversion, cost and per-sample status, shared by every
oracle) and :class:`OracleError`."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from dxopt._core import Cost, DxoptError, Status, check_choice, check_int
from dxopt.dfl._checks import check_cost_vectors
from dxopt.dfl._cost import CostMeter, Metered

__all__ = ["Oracle", "OracleBase", "OracleError", "Sense"]

Sense = str


class OracleError(DxoptError):
    """An oracle could not solve an instance (infeasible, unbounded, solver failure)."""


@runtime_checkable
class Oracle(Protocol):
    """What the losses and metrics of :mod:`dxopt.dfl` need from an oracle."""

    sense: str
    dim: int

    @property
    def cost(self) -> Cost: ...

    def __call__(self, c: Tensor) -> Tensor: ...

    def objective(self, c: Tensor, x: Tensor) -> Tensor: ...


class OracleBase(Metered):
    """Shared validation, conversion, cost accounting (:class:`~dxopt.dfl._cost.Metered`:
    ``cost``, ``calls``, ``reset_cost()``) and per-sample status; subclasses write
    :meth:`_solve` ``(B, d) float64 ndarray -> (B, d) ndarray`` in their own sense, and set
    ``self._status`` (one :class:`dxopt.Status` per row) where an answer may not be optimal.

    After each call, :attr:`last_status` holds one status per cost vector solved:
    ``Status.SOLVED`` for a certified optimum; ``Status.INACCURATE`` for an answer without
    a certificate (a heuristic's tour, a MILP stopped at its relative gap);
    ``Status.BUDGET_EXHAUSTED`` for the best answer found before a time or node limit. The
    metrics of :mod:`dxopt.dfl.metrics` refuse to call the gap of an uncertified answer a
    regret. :attr:`exact` says whether every answer is certified by construction.
    """

    #: True when every answer is an optimum by construction (False: heuristics, limits).
    exact: bool = True

    def __init__(self, *, dim: int, sense: Sense = "min") -> None:
        self.dim = check_int("dim", dim)
        self.sense = check_choice("sense", sense, ("min", "max"))
        self._meter = CostMeter()
        self._status: tuple[Status, ...] | None = None
        self._last_status: tuple[Status, ...] = ()

    @property
    def last_status(self) -> tuple[Status, ...]:
        """One :class:`dxopt.Status` per cost vector of the last call (``()`` before any)."""
        return self._last_status

    @property
    def sign(self) -> float:
        """``+1`` for ``"min"``, ``-1`` for ``"max"``: ``sign * c`` is the cost minimized."""
        return 1.0 if self.sense == "min" else -1.0

    def _solve(self, c: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_costs(self, c: Any, name: str = "c") -> Tensor:
        """Require a floating ``(d,)`` or ``(B, d)`` tensor of finite costs."""
        return check_cost_vectors(name, c, self.dim)

    def __call__(self, c: Tensor) -> Tensor:
        """Solve for every cost vector: ``(d,)`` or ``(B, d)`` in, same shape out."""
        c = self.check_costs(c)
        flat = c.detach().reshape(-1, self.dim).to("cpu", torch.float64).numpy()
        self._status = None
        with self._meter.timed(flat.shape[0]):
            x = self._solve(np.ascontiguousarray(flat))
        status, self._status = self._status, None
        self._last_status = (Status.SOLVED,) * flat.shape[0] if status is None else status
        return torch.as_tensor(x).to(c.device, c.dtype).reshape(c.shape)

    def objective(self, c: Tensor, x: Tensor) -> Tensor:
        """:math:`c^\\top x` over the last dimension."""
        return (c * x).sum(-1)
