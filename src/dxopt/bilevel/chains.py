r"""Single-level zero-chain functions used by the lower-bound constructions.

- **Nesterov's quadratic chain** (strongly convex; Nesterov, *Lectures on Convex
  Optimization*, 2nd ed., sec. 2.1.4):
  :math:`q(x) = \tfrac{L-\mu}{8}(x^\top A x - 2x_1) + \tfrac{\mu}{2}\|x\|^2` with
  :math:`A = \mathrm{tridiag}(-1, 2, -1)`. Each gradient call reveals at most one new
  coordinate, so :math:`\Omega(\sqrt{\kappa}\log(1/\epsilon))` calls are needed.
- **Carmon's zero-chain** (nonconvex; Carmon, Duchi, Hinder, Sidford, arXiv 1710.11606):

  .. math::

      \bar f_T(u) = \sum_{i=1}^{T} \big[\Psi(-u_{i-1})\Phi(-u_i) - \Psi(u_{i-1})\Phi(u_i)
      \big],\quad u_0 = 1,

  with :math:`\Psi(t) = e^{1 - 1/(2t-1)^2}` for :math:`t > 1/2` (else 0) and
  :math:`\Phi(t) = \sqrt{e}\int_{-\infty}^t e^{-s^2/2}ds`. While :math:`u_T = 0`,
  :math:`\|\nabla \bar f_T(u)\| > 1`.

:func:`run_single_level` runs GD or AGD on either from zero and counts gradient calls until
:math:`\|\nabla\| \le \epsilon`: the single-level reference points of the separation panel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dxopt._core import renamed_kwargs

__all__ = [
    "CarmonChain",
    "NesterovChain",
    "SingleLevelRun",
    "phi",
    "phi_prime",
    "psi",
    "psi_prime",
    "run_single_level",
]

_SQRT_E = math.sqrt(math.e)


def psi(t: torch.Tensor) -> torch.Tensor:
    r""":math:`\Psi(t) = \exp(1 - 1/(2t-1)^2)` for :math:`t > 1/2`, else 0 (autograd-safe)."""
    active = t > 0.5
    s = torch.where(active, 2.0 * t - 1.0, torch.ones_like(t))
    return torch.where(active, torch.exp(1.0 - 1.0 / s**2), torch.zeros_like(t))


def psi_prime(t: torch.Tensor) -> torch.Tensor:
    r""":math:`\Psi'(t) = \Psi(t)\cdot 4/(2t-1)^3`."""
    active = t > 0.5
    s = torch.where(active, 2.0 * t - 1.0, torch.ones_like(t))
    return torch.where(active, torch.exp(1.0 - 1.0 / s**2) * 4.0 / s**3, torch.zeros_like(t))


def phi(t: torch.Tensor) -> torch.Tensor:
    r""":math:`\Phi(t) = \sqrt{e}\int_{-\infty}^t e^{-s^2/2} ds = \sqrt{2\pi e}\,
    \mathrm{N}(t)`."""
    return math.sqrt(2.0 * math.pi * math.e) * 0.5 * (1.0 + torch.erf(t / math.sqrt(2.0)))


def phi_prime(t: torch.Tensor) -> torch.Tensor:
    r""":math:`\Phi'(t) = \sqrt{e}\,e^{-t^2/2}`."""
    return _SQRT_E * torch.exp(-0.5 * t**2)


def _chain_pairs(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    prev = torch.cat([torch.ones(1, dtype=u.dtype), u[:-1]])
    return prev, u


@dataclass(frozen=True)
class CarmonChain:
    """Carmon's zero-chain :math:`\\bar f_T` on :math:`\\mathbb R^T` (``length`` = T)."""

    length: int

    def __post_init__(self) -> None:
        if self.length < 1:
            raise ValueError(f"length: expected T >= 1 links, got {self.length}.")

    def value(self, u: torch.Tensor) -> torch.Tensor:
        a, b = _chain_pairs(u)
        return torch.sum(psi(-a) * phi(-b) - psi(a) * phi(b))

    def grad(self, u: torch.Tensor) -> torch.Tensor:
        a, b = _chain_pairs(u)
        d_b = -psi(-a) * phi_prime(-b) - psi(a) * phi_prime(b)
        d_a = -psi_prime(-a) * phi(-b) - psi_prime(a) * phi(b)
        out = d_b.clone()
        out[:-1] += d_a[1:]
        return out


@dataclass(frozen=True)
class NesterovChain:
    """Nesterov's strongly convex quadratic chain on :math:`\\mathbb R^d` (``dim`` = d)."""

    dim: int
    smoothness: float
    strong_convexity: float

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim: expected a positive dimension, got {self.dim}.")
        if not 0 < self.strong_convexity < self.smoothness:
            raise ValueError(
                "strong_convexity, smoothness: expected 0 < mu < L, got "
                f"mu={self.strong_convexity}, L={self.smoothness}."
            )

    def _tridiag(self, x: torch.Tensor) -> torch.Tensor:
        Ax = 2.0 * x
        Ax[1:] -= x[:-1]
        Ax[:-1] -= x[1:]
        return Ax

    def value(self, x: torch.Tensor) -> torch.Tensor:
        c = (self.smoothness - self.strong_convexity) / 8.0
        return c * (x @ self._tridiag(x) - 2.0 * x[0]) + 0.5 * self.strong_convexity * x @ x

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        c = (self.smoothness - self.strong_convexity) / 4.0
        g = c * self._tridiag(x) + self.strong_convexity * x
        g[0] -= c
        return g


@dataclass(frozen=True)
class SingleLevelRun:
    """Calls used (None if the tolerance was not met), final point and frontier log."""

    calls: int | None
    x: torch.Tensor
    first_nonzero: torch.Tensor


@renamed_kwargs(tolerance="tol")
def run_single_level(
    grad: Callable[[torch.Tensor], torch.Tensor],
    dim: int,
    *,
    lr: float,
    momentum: float = 0.0,
    tol: float,
    max_calls: int,
    dtype: torch.dtype = torch.float64,
) -> SingleLevelRun:
    """GD (``momentum = 0``) or Nesterov AGD from zero, one gradient call per step.

    The gradient at each query point is also the stopping test (no extra calls): the run
    stops at the first query whose gradient norm is at most ``tol`` (``tolerance`` is its
    deprecated name).
    """
    y_prev = y = torch.zeros(dim, dtype=dtype)
    first = torch.full((dim,), -1, dtype=torch.long)
    for call in range(1, max_calls + 1):
        w = y + momentum * (y - y_prev) if momentum else y
        new = (w != 0) & (first < 0)
        first[new] = call
        g = grad(w)
        if float(torch.linalg.vector_norm(g)) <= tol:
            return SingleLevelRun(calls=call, x=w, first_nonzero=first)
        y_prev, y = y, w - lr * g
    return SingleLevelRun(calls=None, x=y, first_nonzero=first)
