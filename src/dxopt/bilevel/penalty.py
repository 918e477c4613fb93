r"""F2BA: the fully first-order penalty method (gradients only, no HVP or JVP).

The penalty Lagrangian (Kwon et al., arXiv 2301.10945; Chen, Ma, Zhang, arXiv 2306.14853)

.. math::

    \mathcal L_\lambda(x, y, z) = f(x, y) + \lambda\,(g(x, y) - g(x, z))

has :math:`\nabla \mathcal L^*_\lambda(x) = \nabla_x f(x, y_\lambda) + \lambda(\nabla_x g(x,
y_\lambda) - \nabla_x g(x, z^*))` with :math:`y_\lambda = \arg\min_y f/\lambda + g` and
:math:`z^* = y^*(x)`, and :math:`\|\nabla\mathcal L^*_\lambda - \nabla H\| = O(\kappa^3/
\lambda)`. Each outer step runs the inner loop on :math:`g(x, \cdot)` for ``z`` and on
:math:`f/\lambda + g` for ``y`` (one call of each gradient per step), warm-started; with
an AGD inner loop this is the accelerated variant (AccF2BA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from dxopt.bilevel.inner import InnerLoop
from dxopt.bilevel.methods import _check_outer_lr
from dxopt.bilevel.oracles import CountingOracle

__all__ = ["F2BA", "F2BAState"]


class F2BAState(NamedTuple):
    y: torch.Tensor  # the lower-level estimate z ~ y*(x), reported as the method's y
    y_penalized: torch.Tensor


@dataclass(frozen=True)
class F2BA:
    """Fully first-order bilevel approximation with a fixed penalty ``penalty`` = lambda.

    Args:
        inner: inner loop used for both ``z`` and the penalized ``y`` (GD or AGD).
        penalty: :math:`\\lambda`; larger is more accurate and needs more inner steps.
        outer_lr: step size on ``x``.
    """

    inner: InnerLoop
    penalty: float
    outer_lr: float

    def __post_init__(self) -> None:
        _check_outer_lr(self.outer_lr)
        if not (math.isfinite(self.penalty) and self.penalty > 0):
            raise ValueError(
                f"penalty: expected lambda > 0 (e.g. 10 * L_f * kappa / epsilon), got "
                f"{self.penalty!r}."
            )

    def init(self, oracle: CountingOracle, x: torch.Tensor, y0: torch.Tensor) -> F2BAState:
        return F2BAState(y=y0, y_penalized=y0)

    def step(
        self, oracle: CountingOracle, x: torch.Tensor, state: F2BAState
    ) -> tuple[torch.Tensor, F2BAState]:
        lam = self.penalty

        def penalized_grad(w: torch.Tensor) -> torch.Tensor:
            return oracle.grad_f(x, w)[1] / lam + oracle.grad_g(x, w)[1]

        z, _ = self.inner.run(lambda w: oracle.grad_g(x, w)[1], state.y)
        y, _ = self.inner.run(penalized_grad, state.y_penalized)
        fx = oracle.grad_f(x, y)[0]
        d = fx + lam * (oracle.grad_g(x, y)[0] - oracle.grad_g(x, z)[0])
        return d, F2BAState(y=z, y_penalized=y)

    def estimate_point(
        self, before: F2BAState, after: F2BAState
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""``(z, v)`` with :math:`v = \lambda(z - y_\lambda)`: to first order
        :math:`d = \nabla_x f - \nabla^2_{xy} g\, v`, and :math:`v \to [\nabla^2_{yy}
        g]^{-1}\nabla_y f` as :math:`\lambda \to \infty` (the penalty's bias shows as
        the adjoint residual)."""
        return after.y, self.penalty * (after.y - after.y_penalized)
