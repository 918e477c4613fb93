r"""Zero-respecting building blocks: inner solvers and the adjoint linear solves.

Everything here only forms linear combinations of oracle outputs, so an iterate can be
nonzero only where some earlier oracle answer was (the zero-respecting property used by the
lower bounds of Carmon et al., arXiv 1710.11606, and Ji, arXiv 2511.19656).

- :class:`InnerLoop`: ``max_iter`` iterations of gradient descent, or of Nesterov's accelerated
  gradient when ``momentum > 0``,

  .. math::

      w_k = y_k + \beta (y_k - y_{k-1}), \qquad y_{k+1} = w_k - \alpha \nabla_y g(x, w_k).

- :class:`CG`: conjugate gradients (:func:`dxopt.linalg.conjugate_gradient`) on
  :math:`\nabla^2_{yy} g\, v = \nabla_y f` with a fixed number of Hessian-vector products
  (:math:`\approx \sqrt{\kappa}\log(1/\epsilon)` suffice).
- :class:`Neumann`: :math:`v = \eta \sum_{k<K} (I - \eta \nabla^2_{yy} g)^k \nabla_y f`
  (:math:`\approx \kappa \log(1/\epsilon)` terms), as in stocBiO (Ji, Yang, Liang,
  arXiv 2010.07962).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dxopt._core import check_int, check_positive, check_range, renamed_kwargs
from dxopt.linalg import conjugate_gradient

__all__ = ["CG", "InnerLoop", "Neumann"]

Map = Callable[[torch.Tensor], torch.Tensor]


def _check_positive(name: str, value: float, hint: str) -> None:
    check_positive(name, value, hint=hint)


def _check_iters(name: str, value: int) -> None:
    check_int(name, value, hint="pass the number of iterations (oracle calls) to run.")


@renamed_kwargs(steps="max_iter")
@dataclass(frozen=True)
class InnerLoop:
    r"""Gradient descent (``momentum == 0``) or Nesterov AGD on :math:`g(x, \cdot)`.

    Args:
        max_iter: iterations per run, one gradient call each (no early stop; ``steps`` is
            its deprecated name).
        lr: step size :math:`\alpha`, typically :math:`1/L_g`.
        momentum: :math:`\beta \in [0, 1)`; :math:`(\sqrt\kappa-1)/(\sqrt\kappa+1)` is AGD.
    """

    max_iter: int
    lr: float
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _check_iters("max_iter", self.max_iter)
        _check_positive("lr", self.lr, "use 1/L_g, the lower level's smoothness constant.")
        check_range("momentum", self.momentum, 0, 1, hint="0 is gradient descent.")

    @property
    def steps(self) -> int:
        """Deprecated name of :attr:`max_iter`."""
        return self.max_iter

    @classmethod
    @renamed_kwargs(steps="max_iter")
    def gd(cls, *, smoothness: float, max_iter: int) -> InnerLoop:
        """Gradient descent with step ``1 / smoothness``."""
        _check_positive("smoothness", smoothness, "pass L_g > 0.")
        return cls(max_iter=max_iter, lr=1.0 / smoothness)

    @classmethod
    @renamed_kwargs(steps="max_iter")
    def agd(cls, *, smoothness: float, strong_convexity: float, max_iter: int) -> InnerLoop:
        r"""Nesterov AGD: step :math:`1/L`, momentum :math:`(\sqrt\kappa-1)/(\sqrt\kappa+1)`."""
        _check_positive("smoothness", smoothness, "pass L_g > 0.")
        _check_positive("strong_convexity", strong_convexity, "pass mu > 0.")
        root = math.sqrt(smoothness / strong_convexity)
        return cls(max_iter=max_iter, lr=1.0 / smoothness, momentum=(root - 1.0) / (root + 1.0))

    def run(self, grad_y: Map, y0: torch.Tensor, *, keep_points: bool = False):
        """Run from ``y0``; returns ``(y, points)`` with the gradient query points if asked."""
        y_prev, y = y0, y0
        points: list[torch.Tensor] = []
        for _ in range(self.max_iter):
            w = y + self.momentum * (y - y_prev) if self.momentum else y
            if keep_points:
                points.append(w)
            y_prev, y = y, w - self.lr * grad_y(w)
        return y, points


@renamed_kwargs(steps="max_iter")
@dataclass(frozen=True)
class CG:
    """Conjugate gradients with at most ``max_iter`` Hessian-vector products (plus one for a
    warm-start residual); stops early only on an exactly zero residual or non-positive
    curvature. Runs :func:`dxopt.linalg.conjugate_gradient` with ``check_residual=False``, so
    every product it makes is a counted oracle call. ``steps`` is the deprecated name of
    ``max_iter``."""

    max_iter: int

    def __post_init__(self) -> None:
        _check_iters("max_iter", self.max_iter)

    @property
    def steps(self) -> int:
        """Deprecated name of :attr:`max_iter`."""
        return self.max_iter

    def solve(self, hvp: Map, b: torch.Tensor, v0: torch.Tensor | None) -> torch.Tensor:
        result = conjugate_gradient(
            hvp, b, x0=v0, rtol=0.0, atol=0.0, max_iter=self.max_iter, check_residual=False
        )
        return result.x


@renamed_kwargs(steps="max_iter")
@dataclass(frozen=True)
class Neumann:
    r"""Truncated Neumann series :math:`\eta\sum_{k<K}(I-\eta A)^k b` with ``max_iter`` = K
    terms (K - 1 Hessian-vector products; ``steps`` is its deprecated name);
    ``lr`` = :math:`\eta \le 1/L_g`."""

    max_iter: int
    lr: float

    def __post_init__(self) -> None:
        _check_iters("max_iter", self.max_iter)
        _check_positive("lr", self.lr, "use 1/L_g, the lower level's smoothness constant.")

    def solve(self, hvp: Map, b: torch.Tensor, v0: torch.Tensor | None = None) -> torch.Tensor:
        del v0  # the series restarts each time (no warm start)
        term, total = b, b
        for _ in range(self.max_iter - 1):
            term = term - self.lr * hvp(term)
            total = total + term
        return self.lr * total

    @property
    def steps(self) -> int:
        """Deprecated name of :attr:`max_iter`."""
        return self.max_iter
