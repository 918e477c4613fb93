r"""Double-loop hypergradient methods: approximate implicit differentiation and unrolling.

Both estimate :math:`\nabla H(x) = \nabla_x f - \nabla^2_{xy} g\,[\nabla^2_{yy} g]^{-1}
\nabla_y f` at an approximate :math:`y \approx y^*(x)` (Ji, Yang, Liang, "Bilevel
Optimization: Convergence Analysis and Enhanced Design", arXiv 2010.07962):

- :class:`AID`: warm-started inner loop, then :math:`v \approx [\nabla^2_{yy} g]^{-1}
  \nabla_y f` by :class:`CG` or :class:`Neumann`, and :math:`d = \nabla_x f -
  \nabla^2_{xy} g\, v`. Cost per outer step: K gradients of g, 1 of f, the solver's HVPs,
  1 JVP.
- :class:`ITD`: reverse mode through the K unrolled inner steps (GD or AGD) using HVP/JVP
  oracles, so the derivative is that of the iterate actually computed. Cost: K gradients
  of g, 1 of f, K HVPs, K JVPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from dxopt._core import check_positive
from dxopt.bilevel.inner import CG, InnerLoop, Neumann
from dxopt.bilevel.oracles import CountingOracle

__all__ = ["AID", "ITD", "AIDState", "ITDState"]


def _check_outer_lr(outer_lr: float) -> None:
    check_positive(
        "outer_lr",
        outer_lr,
        allow_zero=True,
        hint="0 keeps x fixed (or use dxopt.bilevel.hypergradient for a one-shot estimate).",
    )


class AIDState(NamedTuple):
    y: torch.Tensor
    v: torch.Tensor | None
    start: torch.Tensor  # y0, where a cold (warm_start=False) inner loop restarts


@dataclass(frozen=True)
class AID:
    """Approximate implicit differentiation (AID-BiO).

    Args:
        inner: the inner solver (``InnerLoop.gd`` or ``InnerLoop.agd``).
        linear: :class:`CG` or :class:`Neumann` for the adjoint system.
        outer_lr: step size :math:`\\gamma` on ``x``.
        warm_start: start the inner loop and CG from the previous ``y`` and ``v``.
    """

    inner: InnerLoop
    linear: CG | Neumann
    outer_lr: float
    warm_start: bool = True

    def __post_init__(self) -> None:
        _check_outer_lr(self.outer_lr)
        if not isinstance(self.linear, (CG, Neumann)):
            raise TypeError(f"linear: expected CG(...) or Neumann(...), got {self.linear!r}.")

    def init(self, oracle: CountingOracle, x: torch.Tensor, y0: torch.Tensor) -> AIDState:
        return AIDState(y=y0, v=None, start=y0)

    def step(
        self, oracle: CountingOracle, x: torch.Tensor, state: AIDState
    ) -> tuple[torch.Tensor, AIDState]:
        y0 = state.y if self.warm_start else state.start
        y, _ = self.inner.run(lambda w: oracle.grad_g(x, w)[1], y0)
        fx, fy = oracle.grad_f(x, y)
        v0 = state.v if self.warm_start else None
        v = self.linear.solve(lambda u: oracle.hvp_yy(x, y, u), fy, v0)
        return fx - oracle.jvp_xy(x, y, v), AIDState(y=y, v=v, start=state.start)

    def estimate_point(
        self, before: AIDState, after: AIDState
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(y, v)`` of the last step: ``d = grad_x f(x, y) - grad_xy g(x, y) v`` (see
        :func:`dxopt.bilevel.hypergradient`, which checks both solves there)."""
        return after.y, after.v


class ITDState(NamedTuple):
    y: torch.Tensor
    start: torch.Tensor  # y0, where a cold (warm_start=False) unroll restarts
    # the implied adjoint alpha * sum_k a_{k+1}: d = grad_x f - grad_xy g v when the mixed
    # derivative is constant along the unroll (checked by dxopt.bilevel.hypergradient)
    v: torch.Tensor | None = None


@dataclass(frozen=True)
class ITD:
    r"""Iterative differentiation: reverse mode through the unrolled inner loop.

    With :math:`w_k = y_k + \beta(y_k - y_{k-1})` and :math:`y_{k+1} = w_k - \alpha
    \nabla_y g(x, w_k)`, the adjoints run backwards from :math:`a_K = \nabla_y f(x, y_K)`:

    .. math::

        \bar w_k = a_{k+1} - \alpha \nabla^2_{yy} g(x, w_k) a_{k+1},\quad
        d \mathrel{-}= \alpha \nabla^2_{xy} g(x, w_k) a_{k+1},\quad
        a_k \mathrel{+}= (1+\beta)\bar w_k,\quad a_{k-1} \mathrel{-}= \beta \bar w_k,

    starting from :math:`d = \nabla_x f(x, y_K)`; the warm start :math:`y_0` is treated as a
    constant (warm-started ITD).

    Args:
        inner: the unrolled solver (GD or AGD).
        outer_lr: step size on ``x``.
        warm_start: start each unroll from the previous ``y_K``.
    """

    inner: InnerLoop
    outer_lr: float
    warm_start: bool = True

    def __post_init__(self) -> None:
        _check_outer_lr(self.outer_lr)

    def init(self, oracle: CountingOracle, x: torch.Tensor, y0: torch.Tensor) -> ITDState:
        return ITDState(y=y0, start=y0)

    def step(
        self, oracle: CountingOracle, x: torch.Tensor, state: ITDState
    ) -> tuple[torch.Tensor, ITDState]:
        y0 = state.y if self.warm_start else state.start
        y, points = self.inner.run(lambda w: oracle.grad_g(x, w)[1], y0, keep_points=True)
        d, a_next = oracle.grad_f(x, y)
        alpha, beta = self.inner.lr, self.inner.momentum
        carry = torch.zeros_like(a_next)  # the part of a_k already pushed from step k+1
        v = torch.zeros_like(a_next)
        for w in reversed(points):
            w_bar = a_next - alpha * oracle.hvp_yy(x, w, a_next)
            d = d - alpha * oracle.jvp_xy(x, w, a_next)
            v = v + alpha * a_next
            a_next, carry = carry + (1.0 + beta) * w_bar, -beta * w_bar
        return d, ITDState(y=y, start=state.start, v=v)

    def estimate_point(
        self, before: ITDState, after: ITDState
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""``(y_K, v)`` with :math:`v = \alpha\sum_k a_{k+1}` the adjoint the unroll implies
        (:math:`d = \nabla_x f - \nabla^2_{xy} g\, v` when the mixed derivative is constant
        along the unroll; a Neumann series for GD)."""
        return after.y, after.v
