r"""Zero-respecting building blocks: inner solvers and the adjoint linear solves.

Everything here only forms linear combinations of oracle outputs, so an iterate can be
nonzero only where some earlier oracle answer was (the zero-respecting property used by the
lower bounds of Carmon et al., arXiv 1710.11606, and Ji, arXiv 2511.19656).

- :class:`InnerLoop`: ``steps`` iterations of gradient descent, or of Nesterov's accelerated
  gradient when ``momentum > 0``,

  .. math::

      w_k = y_k + \beta (y_k - y_{k-1}), \qquad y_{k+1} = w_k - \alpha \nabla_y g(x, w_k).

- :class:`CG`: conjugate gradients on :math:`\nabla^2_{yy} g\, v = \nabla_y f` with a fixed
  number of Hessian-vector products (:math:`\approx \sqrt{\kappa}\log(1/\epsilon)` suffice).
- :class:`Neumann`: :math:`v = \eta \sum_{k<K} (I - \eta \nabla^2_{yy} g)^k \nabla_y f`
  (:math:`\approx \kappa \log(1/\epsilon)` terms), as in stocBiO (Ji, Yang, Liang,
  arXiv 2010.07962).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["CG", "InnerLoop", "Neumann"]

Map = Callable[[torch.Tensor], torch.Tensor]


def _check_positive(name: str, value: float, hint: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}; {hint}")


def _check_steps(name: str, steps: int) -> None:
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"{name}: expected a positive integer number of steps, got {steps!r}.")


@dataclass(frozen=True)
class InnerLoop:
    r"""Gradient descent (``momentum == 0``) or Nesterov AGD on :math:`g(x, \cdot)`.

    Args:
        steps: oracle calls per run (one gradient per step).
        lr: step size :math:`\alpha`, typically :math:`1/L_g`.
        momentum: :math:`\beta \in [0, 1)`; :math:`(\sqrt\kappa-1)/(\sqrt\kappa+1)` is AGD.
    """

    steps: int
    lr: float
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _check_steps("steps", self.steps)
        _check_positive("lr", self.lr, "use 1/L_g, the lower level's smoothness constant.")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum: expected a value in [0, 1), got {self.momentum!r}.")

    @classmethod
    def gd(cls, *, smoothness: float, steps: int) -> InnerLoop:
        """Gradient descent with step ``1 / smoothness``."""
        _check_positive("smoothness", smoothness, "pass L_g > 0.")
        return cls(steps=steps, lr=1.0 / smoothness)

    @classmethod
    def agd(cls, *, smoothness: float, strong_convexity: float, steps: int) -> InnerLoop:
        r"""Nesterov AGD: step :math:`1/L`, momentum :math:`(\sqrt\kappa-1)/(\sqrt\kappa+1)`."""
        _check_positive("smoothness", smoothness, "pass L_g > 0.")
        _check_positive("strong_convexity", strong_convexity, "pass mu > 0.")
        root = math.sqrt(smoothness / strong_convexity)
        return cls(steps=steps, lr=1.0 / smoothness, momentum=(root - 1.0) / (root + 1.0))

    def run(self, grad_y: Map, y0: torch.Tensor, *, keep_points: bool = False):
        """Run from ``y0``; returns ``(y, points)`` with the gradient query points if asked."""
        y_prev, y = y0, y0
        points: list[torch.Tensor] = []
        for _ in range(self.steps):
            w = y + self.momentum * (y - y_prev) if self.momentum else y
            if keep_points:
                points.append(w)
            y_prev, y = y, w - self.lr * grad_y(w)
        return y, points


@dataclass(frozen=True)
class CG:
    """Conjugate gradients with at most ``steps`` Hessian-vector products (plus one for a
    warm-start residual); stops early only on an exactly zero residual."""

    steps: int

    def __post_init__(self) -> None:
        _check_steps("steps", self.steps)

    def solve(self, hvp: Map, b: torch.Tensor, v0: torch.Tensor | None) -> torch.Tensor:
        v = torch.zeros_like(b) if v0 is None else v0
        r = b if v0 is None else b - hvp(v0)
        p = r
        rr = torch.dot(r, r)
        for _ in range(self.steps):
            if float(rr) == 0.0:
                break
            Hp = hvp(p)
            pHp = torch.dot(p, Hp)
            if float(pHp) <= 0.0:
                break
            alpha = rr / pHp
            v = v + alpha * p
            r = r - alpha * Hp
            rr_new = torch.dot(r, r)
            p = r + (rr_new / rr) * p
            rr = rr_new
        return v


@dataclass(frozen=True)
class Neumann:
    r"""Truncated Neumann series :math:`\eta\sum_{k<K}(I-\eta A)^k b` with ``steps`` = K terms
    (K - 1 Hessian-vector products); ``lr`` = :math:`\eta \le 1/L_g`."""

    steps: int
    lr: float

    def __post_init__(self) -> None:
        _check_steps("steps", self.steps)
        _check_positive("lr", self.lr, "use 1/L_g, the lower level's smoothness constant.")

    def solve(self, hvp: Map, b: torch.Tensor, v0: torch.Tensor | None = None) -> torch.Tensor:
        del v0  # the series restarts each time (no warm start)
        term, total = b, b
        for _ in range(self.steps - 1):
            term = term - self.lr * hvp(term)
            total = total + term
        return self.lr * total
