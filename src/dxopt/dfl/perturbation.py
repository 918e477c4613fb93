"""Perturbation-gradient (PG) losses (Huang & Gupta, "Decision-focused learning with
directional gradients", NeurIPS 2024, arXiv 2402.03256).

For ``sense="min"`` let :math:`V(c) = \\min_{x \\in S} c^\\top x = c^\\top x(c)`, concave, with
supergradient :math:`x(c)` (Danskin). The decision cost of a prediction is a directional
derivative, :math:`c^\\top x(\\hat c) = V'(\\hat c; c)`, so it is approximated by a finite
difference of :math:`V` along the true cost :math:`c` with step :math:`h > 0`:

.. math::
    \\ell_{PGB} = \\frac{V(\\hat c) - V(\\hat c - h c)}{h}, \\qquad
    \\ell_{PGC} = \\frac{V(\\hat c + h c) - V(\\hat c - h c)}{2h}, \\qquad
    \\ell_{PGF} = \\frac{V(\\hat c + h c) - V(\\hat c)}{h}

(backward, central, forward). Each is Lipschitz in :math:`\\hat c`, its gradient a difference of
two oracle answers, e.g. :math:`\\nabla \\ell_{PGB} = (x(\\hat c) - x(\\hat c - hc))/h`; as
:math:`h \\to 0` it tends to :math:`c^\\top x(\\hat c)` wherever :math:`x` is locally constant
along :math:`c` (for a concave :math:`V`, :math:`\\ell_{PGB} \\ge c^\\top x(\\hat c) \\ge
\\ell_{PGF}`). For ``sense="max"`` :math:`V` is the maximum (convex) and every loss is multiplied
by :math:`s = -1`, so that minimising the loss maximises the decision value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dxopt._core import check_choice, check_positive
from dxopt.dfl.base import OracleLoss

__all__ = ["PG"]


class PG(OracleLoss):
    """Perturbation-gradient loss (Huang & Gupta 2024), see :mod:`dxopt.dfl.perturbation`:

    .. math:: \\ell = s\\,\\frac{\\hat V(\\hat c + a h c) - \\hat V(\\hat c - b h c)}{(a + b) h},

    with :math:`(a, b) = (0, 1)` (``difference="backward"``, default), :math:`(1, 1)`
    (``"central"``; PyEPO's ``two_sides=True``) or :math:`(1, 0)` (``"forward"``), and
    :math:`\\hat V(c') = c'^\\top x(c')` evaluated with the oracle's answers held fixed, so
    autograd gives the exact gradient :math:`s(a\\text{-answer} - b\\text{-answer}) / ((a+b)h)`.
    The two cost vectors of every sample are one batched oracle call ``(2B, d)``.

    Args:
        oracle: the solution oracle.
        sigma: the step :math:`h > 0` (PyEPO's name; default 0.1, PyEPO's default; the paper
            lets :math:`h \\to 0` as the sample grows).
        difference: ``"backward"``, ``"central"`` or ``"forward"``.
        **kwargs: ``pool``, ``solve_ratio``, ``reduction``, ``seed`` of
            :class:`~dxopt.dfl.OracleLoss`.

    Call: ``loss(c_hat, c)`` with ``(B, d)`` predictions and true costs (no optimal solutions
    needed). PyEPO's ``perturbationGradient`` divides by :math:`h + 10^{-8}`; here by :math:`h`.
    """

    def __init__(
        self, oracle: Any, *, sigma: float = 0.1, difference: str = "backward", **kwargs: Any
    ) -> None:
        super().__init__(oracle, **kwargs)
        self.sigma = check_positive("sigma", sigma, hint="the finite-difference step must be > 0")
        self.difference = check_choice("difference", difference, ("backward", "central", "forward"))

    def forward(self, c_hat: Tensor, c: Tensor) -> Tensor:
        self.check_costs(c_hat)
        self.check_costs(c, "c")
        if c.shape != c_hat.shape:
            raise ValueError(
                f"c: expected the shape of c_hat {tuple(c_hat.shape)}, got {tuple(c.shape)}."
            )
        c = c.detach().to(c_hat.dtype)
        a, b = {"backward": (0.0, 1.0), "central": (1.0, 1.0), "forward": (1.0, 0.0)}[
            self.difference
        ]
        h = self.sigma
        upper = c_hat + (a * h) * c
        lower = c_hat - (b * h) * c
        d = c_hat.shape[-1]
        both = torch.cat([upper.detach().reshape(-1, d), lower.detach().reshape(-1, d)])
        x = self.solve(both)
        n = x.shape[0] // 2
        x_up, x_low = x[:n].reshape(c_hat.shape), x[n:].reshape(c_hat.shape)
        value = ((upper * x_up).sum(-1) - (lower * x_low).sum(-1)) / ((a + b) * h)
        return self.reduce(self.sign * value)
