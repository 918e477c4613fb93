"""The zero cone :math:`K = \\{0\\}^n` (equality rows); its dual is :math:`K^* = \\mathbb R^n`.

:math:`\\Pi_K(v) = 0`, :math:`\\Pi_{K^*}(v) = v` (Moreau: :math:`v = \\Pi_{K^*}(v) - \\Pi_K(-v)`),
so :math:`D\\Pi_{K^*} = I` everywhere: the zero cone has no kinks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone

__all__ = ["ZeroCone"]


@dataclass(frozen=True)
class ZeroCone(Cone):
    """``n`` equality rows: ``s = 0`` on this slice, the dual ``y`` is free."""

    n: int
    name: ClassVar[str] = "zero"

    def __post_init__(self) -> None:
        _check_dim("ZeroCone", "n", self.n)

    @property
    def dim(self) -> int:
        return self.n

    def project(self, v: Tensor) -> Tensor:
        return torch.zeros_like(v)

    def dproject(self, v: Tensor) -> Tensor:
        return v.new_zeros((*v.shape, self.n))

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        return torch.zeros(v.shape[:-1], dtype=torch.bool, device=v.device)

    def project_dual(self, v: Tensor) -> Tensor:
        return v.clone()

    def clarabel(self) -> object:
        import clarabel

        return clarabel.ZeroConeT(self.n)

    def scs(self) -> tuple[str, float | int]:
        return ("z", self.n)


def _check_dim(cls: str, arg: str, value: object, minimum: int = 1) -> None:
    """A cone dimension must be an int >= ``minimum`` (shared by the cones of this package)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{cls}: {arg} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{cls}: {arg} must be >= {minimum}, got {value}")
