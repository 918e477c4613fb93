"""The nonnegative orthant :math:`K = \\mathbb R^n_+` (self-dual; inequality rows).

:math:`\\Pi_K(v) = \\max(v, 0)`, :math:`D\\Pi_K(v) = \\mathrm{diag}(1[v > 0])`. The projection
has a kink where some :math:`v_i = 0` (for :math:`v = y - s` at a solution: a row with zero slack
*and* zero multiplier). One-sided rule (:meth:`NonnegCone.dproject_dual_snapped`): such a row
is taken as **inactive**, :math:`D_{ii} = 0` (its multiplier held at zero), the derivative of the
problem with that row dropped, which is the one-sided derivative for perturbations that make
the row slack.

Log-barrier (the smoothed backward): :math:`F(s) = -\\sum_i \\log s_i`,
:math:`\\nabla F = -1/s`, :math:`\\nabla^2 F = \\mathrm{diag}(1/s^2)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.zero import _check_dim

__all__ = ["NonnegCone"]


@dataclass(frozen=True)
class NonnegCone(Cone):
    """``n`` inequality rows ``s >= 0``."""

    n: int
    name: ClassVar[str] = "nonneg"
    self_dual: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_dim("NonnegCone", "n", self.n)

    @property
    def dim(self) -> int:
        return self.n

    def project(self, v: Tensor) -> Tensor:
        return torch.clamp(v, min=0)

    def dproject(self, v: Tensor) -> Tensor:
        return torch.diag_embed((v > 0).to(v.dtype))

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        bound = torch.as_tensor(tol, dtype=v.dtype, device=v.device) * torch.linalg.vector_norm(
            v, dim=-1
        )
        return (v.abs() <= bound[..., None]).any(dim=-1)

    def dproject_dual_snapped(self, v: Tensor, atol: Tensor) -> Tensor:
        return torch.diag_embed((v > atol[..., None]).to(v.dtype))

    def barrier(self, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        inside = (v > 0).all(dim=-1)
        safe = torch.where(v > 0, v, torch.ones_like(v))
        return -1 / safe, torch.diag_embed(safe**-2), inside

    def barrier_center(self) -> Tensor:
        return torch.ones(self.n, dtype=torch.float64)

    def clarabel(self) -> object:
        import clarabel

        return clarabel.NonnegativeConeT(self.n)

    def scs(self) -> tuple[str, float | int]:
        return ("l", self.n)
