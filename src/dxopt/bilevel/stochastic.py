r"""Methods designed for stochastic oracles: stocBiO and SOBA.

With a stochastic oracle every call draws a fresh sample; a minibatch of size B is the mean
of B calls (each counted).

- :class:`StocBiO` (Ji, Yang, Liang, arXiv 2010.07962): warm-started (stochastic) inner
  gradient steps, then the Neumann estimate
  :math:`v = \eta\sum_{k<K}(I - \eta\nabla^2_{yy} g)^k \nabla_y f` and
  :math:`d = \nabla_x f - \nabla^2_{xy} g\,v`, every oracle averaged over a minibatch.
- :class:`SOBA` (Dagréou, Ablin, Vaiter, Moreau, arXiv 2201.13409): one single loop that
  moves :math:`y`, :math:`v` and :math:`x` together,

  .. math::

      d_t = \nabla_x f(x_t, y_t) + \nabla^2_{xy} g(x_t, y_t) v_t,\quad
      y_{t+1} = y_t - \rho \nabla_y g(x_t, y_t),\quad
      v_{t+1} = v_t - \rho(\nabla^2_{yy} g(x_t, y_t) v_t + \nabla_y f(x_t, y_t)),

  so :math:`v \to -[\nabla^2_{yy} g]^{-1}\nabla_y f` and :math:`d \to \nabla H`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from dxopt.bilevel.inner import InnerLoop, Neumann
from dxopt.bilevel.methods import _check_outer_lr
from dxopt.bilevel.oracles import CountingOracle

__all__ = ["SOBA", "SOBAState", "StocBiO", "StocBiOState"]


def _mean(batch: int, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    total = fn()
    for _ in range(batch - 1):
        total = total + fn()
    return total / batch if batch > 1 else total


def _check_batch(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}.")


class StocBiOState(NamedTuple):
    y: torch.Tensor
    v: torch.Tensor | None = None  # the last Neumann estimate of [grad_yy g]^{-1} grad_y f


@dataclass(frozen=True)
class StocBiO:
    """stocBiO: minibatch inner SGD plus a minibatch Neumann-series hypergradient.

    Args:
        inner: inner loop (its ``momentum`` must be 0: SGD).
        neumann: the series (``max_iter`` terms, ``lr`` = :math:`\\eta`).
        outer_lr: step size on ``x``.
        batch_size: oracle calls averaged per gradient, HVP and JVP.
    """

    inner: InnerLoop
    neumann: Neumann
    outer_lr: float
    batch_size: int = 1

    def __post_init__(self) -> None:
        _check_outer_lr(self.outer_lr)
        _check_batch(self.batch_size)
        if self.inner.momentum != 0.0:
            raise ValueError("inner: stocBiO uses plain SGD inner steps; pass momentum=0.")

    def init(self, oracle: CountingOracle, x: torch.Tensor, y0: torch.Tensor) -> StocBiOState:
        return StocBiOState(y=y0)

    def step(
        self, oracle: CountingOracle, x: torch.Tensor, state: StocBiOState
    ) -> tuple[torch.Tensor, StocBiOState]:
        b = self.batch_size
        y, _ = self.inner.run(lambda w: _mean(b, lambda: oracle.grad_g(x, w)[1]), state.y)
        fx = torch.zeros(oracle.dim_x, dtype=oracle.dtype)
        fy = torch.zeros(oracle.dim_y, dtype=oracle.dtype)
        for _ in range(b):
            gx, gy = oracle.grad_f(x, y)
            fx, fy = fx + gx / b, fy + gy / b
        v = self.neumann.solve(lambda u: _mean(b, lambda: oracle.hvp_yy(x, y, u)), fy)
        return fx - _mean(b, lambda: oracle.jvp_xy(x, y, v)), StocBiOState(y=y, v=v)

    def estimate_point(
        self, before: StocBiOState, after: StocBiOState
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(y, v)`` of the last step: ``d = grad_x f(x, y) - grad_xy g(x, y) v``."""
        return after.y, after.v


class SOBAState(NamedTuple):
    y: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True)
class SOBA:
    """SOBA: single-loop joint updates of ``y``, ``v`` and ``x`` (4 calls per step).

    Args:
        inner_lr: :math:`\\rho` for ``y`` and ``v`` (at most :math:`1/L_g`).
        outer_lr: :math:`\\gamma` for ``x``.
    """

    inner_lr: float
    outer_lr: float

    def __post_init__(self) -> None:
        _check_outer_lr(self.outer_lr)
        if not (math.isfinite(self.inner_lr) and self.inner_lr > 0):
            raise ValueError(f"inner_lr: expected a positive step (<= 1/L_g), got {self.inner_lr}.")

    def init(self, oracle: CountingOracle, x: torch.Tensor, y0: torch.Tensor) -> SOBAState:
        return SOBAState(y=y0, v=torch.zeros(oracle.dim_y, dtype=oracle.dtype))

    def step(
        self, oracle: CountingOracle, x: torch.Tensor, state: SOBAState
    ) -> tuple[torch.Tensor, SOBAState]:
        y, v = state
        fx, fy = oracle.grad_f(x, y)
        d = fx + oracle.jvp_xy(x, y, v)
        y_new = y - self.inner_lr * oracle.grad_g(x, y)[1]
        v_new = v - self.inner_lr * (oracle.hvp_yy(x, y, v) + fy)
        return d, SOBAState(y=y_new, v=v_new)

    def estimate_point(
        self, before: SOBAState, after: SOBAState
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's estimate uses the state it started from: ``d = grad_x f(x, y) -
        grad_xy g(x, y) (-v)`` at ``before`` (SOBA's ``v`` tends to ``-[grad_yy g]^{-1}
        grad_y f``)."""
        return before.y, -before.v
