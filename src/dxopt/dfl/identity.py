"""Negative identity with projection, NID (Sahoo, Paulus, Vlastelica, Musil, Kuleshov &
Martius, "Backpropagation through combinatorial algorithms: identity with projection works",
ICLR 2023).

The solver's Jacobian is replaced by :math:`-s I` (``sense="min"``: :math:`-I`, since raising a
cost lowers its solution entry; ``"max"``: :math:`+I`), and the cost is first mapped by a
projection :math:`P` that removes directions the solver is invariant to, differentiated
exactly by autograd:

.. math:: y = x(P(\\hat c)), \\qquad \\nabla_{\\hat c} = -s\\,J_P(\\hat c)^\\top \\bar y

for an incoming gradient :math:`\\bar y`. The projections (their Section 4):

- ``"none"``: :math:`P(c) = c` (PyEPO's ``negativeIdentity``);
- ``"norm"`` (default): :math:`P(c) = c / \\|c\\|`, exact for every linear oracle (the answer
  is invariant to positive scaling), so the forward is :math:`x(\\hat c)`; the backward
  removes the radial part, :math:`-s(I - uu^\\top)\\bar y / \\|\\hat c\\|`,
  :math:`u = \\hat c/\\|\\hat c\\|`;
- ``"mean"``: :math:`P(c) = c - \\bar c\\,\\mathbf 1`, exact when every feasible solution has
  the same entry sum (k-subsets, assignments, permutations), otherwise it changes the answer;
- ``"standardize"``: mean then norm.

A zero (``"norm"``) or constant (``"standardize"``) cost row has no projection: it is refused
with a ``ValueError`` naming the row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dxopt._core import check_choice
from dxopt.dfl.base import OracleLoss

__all__ = ["NID"]


class _NegativeIdentity(torch.autograd.Function):
    @staticmethod
    def forward(cost: Tensor, layer: Any) -> Tensor:
        return layer.solve(cost.detach())

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.sign = inputs[1].sign

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return -ctx.sign * grad, None


class NID(OracleLoss):
    """The negative-identity layer with projection (Sahoo et al. 2023), see
    :mod:`dxopt.dfl.identity`: ``y = nid(c_hat)`` is :math:`x(P(\\hat c))` (one batched oracle
    call, none in the backward), then any loss of ``y``.

    Args:
        oracle: the solution oracle.
        projection: ``"norm"`` (default), ``"none"``, ``"mean"`` or ``"standardize"``.
        **kwargs: ``pool``, ``solve_ratio``, ``seed`` of :class:`~dxopt.dfl.OracleLoss`
            (``reduction`` unused).
    """

    def __init__(self, oracle: Any, *, projection: str = "norm", **kwargs: Any) -> None:
        super().__init__(oracle, **kwargs)
        self.projection = check_choice(
            "projection", projection, ("norm", "none", "mean", "standardize")
        )

    def project(self, c_hat: Tensor) -> Tensor:
        """:math:`P(\\hat c)` (differentiable)."""
        c = c_hat
        if self.projection in ("mean", "standardize"):
            c = c - c.mean(-1, keepdim=True)
        if self.projection in ("norm", "standardize"):
            norm = c.norm(dim=-1, keepdim=True)
            zero = (norm == 0).reshape(-1)
            if bool(zero.any()):
                row = int(torch.nonzero(zero)[0])
                what = "zero" if self.projection == "norm" else "constant"
                raise ValueError(
                    f"c_hat: row {row} is {what}, which the {self.projection!r} projection "
                    "cannot normalise; use projection='none' or check the model's output."
                )
            c = c / norm
        return c

    def forward(self, c_hat: Tensor) -> Tensor:
        self.check_costs(c_hat)
        out: Tensor = _NegativeIdentity.apply(self.project(c_hat), self)
        return out
