"""Smoothed LP layers that dxopt differentiates exactly: the quadratically regularised LP
(QPTL, Wilder, Dilkina & Tambe, AAAI 2019),

.. math:: x_\\epsilon(\\hat c) = \\arg\\min_x\\ s\\,\\hat c^\\top x + \\tfrac{\\epsilon}{2}
    \\|x\\|^2 \\quad \\text{s.t.}\\quad Ax = b,\\ Gx \\le h,\\ lb \\le x \\le ub,

solved and differentiated through :func:`dxopt.qp.solve` (``P = \\epsilon I``, batched): the
derivative is the implicit one of the KKT conditions on the active set, exact (no sampling, no
finite differences), and :math:`x_\\epsilon \\to x(\\hat c)` as :math:`\\epsilon \\to 0`.

The log-barrier layer of Mandi & Guns (NeurIPS 2020) is :class:`dxopt.dfl.LogBarrierLP`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dxopt._core import check_choice, check_positive
from dxopt.dfl._checks import check_cost_vectors
from dxopt.dfl._cost import CostMeter, Metered
from dxopt.dfl.lp import LP_KEYWORDS, lp_keywords, split_lp

__all__ = ["QPTL"]


class QPTL(Metered, nn.Module):
    """Quadratic-regularised LP layer: ``x = qptl(c_hat)`` returns :math:`x_\\epsilon(\\hat c)`
    ``(B, d)`` (or ``(d,)``) with exact gradients; train with :meth:`regret_loss` (Wilder et
    al.'s decision loss :math:`s\\,(c^\\top x_\\epsilon(\\hat c) - z^*)`) or any loss of ``x``.

    Args:
        A, b, G, h, lb, ub: the LP's constraints (parsed once into :attr:`data`, an
            :class:`~dxopt.dfl.lp.LPData`).
        eps: the weight :math:`\\epsilon > 0` of :math:`\\tfrac{\\epsilon}{2}\\|x\\|^2`; scale it
            with the costs (larger is smoother, smaller is closer to the LP).
        sense: ``"min"`` or ``"max"`` (then :math:`\\max \\hat c^\\top x -
            \\tfrac\\epsilon2\\|x\\|^2`).
        **qp_options: the options of :func:`dxopt.qp.solve` (``backward``, ``solver``, ...),
            held by a :class:`dxopt.qp.QPLayer` (:attr:`layer`) and so checked here, at
            construction (a ``TypeError`` / ``ValueError`` naming the option).
    """

    @lp_keywords(rest="qp_options")
    def __init__(self, *, eps: float = 0.1, sense: str = "min", **options: Any) -> None:
        super().__init__()
        self.eps = check_positive("eps", eps)
        self.sense = check_choice("sense", sense, ("min", "max"))
        self.sign = 1.0 if sense == "min" else -1.0
        self.data, qp_options = split_lp("QPTL", options)
        self.dim = self.data.dim
        from dxopt.qp import QPLayer  # lazily: importing dxopt.dfl does not load dxopt.qp
        from dxopt.qp.problem.options import QPOptions

        unknown = sorted(set(qp_options) - set(QPOptions.names()))
        if unknown:
            raise TypeError(
                f"QPTL: unknown option(s) {unknown}; the options of dxopt.qp.solve are "
                f"{list(QPOptions.names())} (the LP data are {', '.join(LP_KEYWORDS)}; eps, sense)."
            )
        self.layer = QPLayer(**qp_options)
        self._tensors: dict[tuple[torch.dtype, torch.device], dict[str, Tensor | None]] = {}
        self._meter = CostMeter()

    @property
    def qp_options(self) -> dict[str, Any]:
        """The options of :func:`dxopt.qp.solve` this layer solves with (all of them)."""
        return self.layer.options

    def _constraints(self, like: Tensor) -> dict[str, Tensor | None]:
        key = (like.dtype, like.device)
        if key not in self._tensors:
            self._tensors[key] = self.data.tensors(like.dtype, like.device)
        return self._tensors[key]

    def forward(self, c_hat: Tensor) -> Tensor:
        check_cost_vectors("c_hat", c_hat, self.dim)
        P = self.eps * torch.eye(self.dim, dtype=c_hat.dtype, device=c_hat.device)
        with self._meter.timed(1 if c_hat.ndim == 1 else int(c_hat.shape[0])):
            sol = self.layer(P, self.sign * c_hat, **self._constraints(c_hat))
        x: Tensor = sol.x
        return x

    def regret_loss(self, c_hat: Tensor, c: Tensor, z_true: Tensor | None = None) -> Tensor:
        """Mean decision loss :math:`s\\,(c^\\top x_\\epsilon(\\hat c) - z^*)` over the batch
        (``z_true`` only shifts the value)."""
        x = self(c_hat)
        value = (c * x).sum(-1)
        if z_true is not None:
            value = value - z_true.reshape(value.shape).to(value.dtype)
        return (self.sign * value).mean()
