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

import time
from typing import Any

import torch
from torch import Tensor, nn

from dxopt._core import Cost, check_choice, check_positive, check_tensor
from dxopt.dfl._checks import check_cost_vectors, lp_dimension

__all__ = ["QPTL"]


def _as_tensor(name: str, value: Any) -> Tensor | None:
    if value is None:
        return None
    t = value if isinstance(value, Tensor) else torch.as_tensor(value)
    check_tensor(name, t)
    return t.detach()


class QPTL(nn.Module):
    """Quadratic-regularised LP layer: ``x = qptl(c_hat)`` returns :math:`x_\\epsilon(\\hat c)`
    ``(B, d)`` (or ``(d,)``) with exact gradients; train with :meth:`regret_loss` (Wilder et
    al.'s decision loss :math:`s\\,(c^\\top x_\\epsilon(\\hat c) - z^*)`) or any loss of ``x``.

    Args:
        A, b, G, h, lb, ub: the LP's constraints (as in :func:`dxopt.qp.solve`).
        eps: the weight :math:`\\epsilon > 0` of :math:`\\tfrac{\\epsilon}{2}\\|x\\|^2`; scale it
            with the costs (larger is smoother, smaller is closer to the LP).
        sense: ``"min"`` or ``"max"`` (then :math:`\\max \\hat c^\\top x -
            \\tfrac\\epsilon2\\|x\\|^2`).
        **qp_options: passed to :func:`dxopt.qp.solve` (``backward``, ``solver``, ...).
    """

    def __init__(
        self,
        *,
        A: Any = None,
        b: Any = None,
        G: Any = None,
        h: Any = None,
        lb: Any = None,
        ub: Any = None,
        eps: float = 0.1,
        sense: str = "min",
        **qp_options: Any,
    ) -> None:
        super().__init__()
        self.eps = check_positive("eps", eps)
        self.sense = check_choice("sense", sense, ("min", "max"))
        self.sign = 1.0 if sense == "min" else -1.0
        self.constraints = {
            name: _as_tensor(name, value)
            for name, value in (("A", A), ("b", b), ("G", G), ("h", h), ("lb", lb), ("ub", ub))
        }
        self.dim = lp_dimension("QPTL", **self.constraints)
        for name in ("lb", "ub"):  # a number bounds every entry
            bound = self.constraints[name]
            if bound is not None and bound.ndim == 0:
                self.constraints[name] = bound.expand(self.dim).clone()
        self.qp_options = qp_options
        self.cost = Cost()

    def forward(self, c_hat: Tensor) -> Tensor:
        from dxopt.qp import solve

        check_cost_vectors("c_hat", c_hat, self.dim)
        kw: dict[str, Any] = {
            k: (None if v is None else v.to(c_hat.device, c_hat.dtype))
            for k, v in self.constraints.items()
        }
        P = self.eps * torch.eye(self.dim, dtype=c_hat.dtype, device=c_hat.device)
        start = time.perf_counter()
        sol = solve(P, self.sign * c_hat, **kw, **self.qp_options)
        n = 1 if c_hat.ndim == 1 else int(c_hat.shape[0])
        self.cost = self.cost + Cost(forwards=n, seconds=time.perf_counter() - start)
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
