"""The second-order cone :math:`K = \\{(t, x) \\in \\mathbb R \\times \\mathbb R^{n-1}:
\\Vert x\\Vert \\le t\\}` (self-dual).

Projection (e.g. Bauschke's thesis; Parikh & Boyd, *Proximal algorithms*, 2014, sec. 6.3.2),
with :math:`r = \\Vert x\\Vert`:

.. math::

    \\Pi_K(t, x) = \\begin{cases} (t, x) & r \\le t \\\\ 0 & r \\le -t \\\\
    \\tfrac12 (1 + t/r)\\,(r, x) & \\text{otherwise,} \\end{cases}

and in the third region, with :math:`\\bar x = x / r`,

.. math::

    D\\Pi_K = \\tfrac12 \\begin{pmatrix} 1 & \\bar x^\\top \\\\
    \\bar x & (1 + t/r) I - (t/r) \\bar x \\bar x^\\top \\end{pmatrix},

:math:`I` in the first and :math:`0` in the second. The kinks are the surfaces :math:`r = t`
and :math:`r = -t` (the apex included). One-sided rule
(:meth:`SecondOrderCone.dproject_dual_snapped`): the adjoining piece of smaller rank, i.e. near
:math:`r = t > 0` the third formula (with :math:`t/r` clipped to :math:`[-1, 1]`), near
:math:`r = -t` and at the apex :math:`0` (the multiplier kept on the smaller face).

Log-barrier (the smoothed backward): with :math:`J = \\mathrm{diag}(1, -I)`, :math:`v = (t, x)`
and :math:`d = t^2 - \\Vert x\\Vert^2 = v^\\top J v`, :math:`F(v) = -\\log d`,
:math:`\\nabla F = -2 Jv / d` and :math:`\\nabla^2 F = -2J/d + 4 (Jv)(Jv)^\\top / d^2`, on the
interior :math:`t > \\Vert x\\Vert`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.zero import _check_dim

__all__ = ["SecondOrderCone"]


@dataclass(frozen=True)
class SecondOrderCone(Cone):
    """One second-order cone of dimension ``n`` (``t`` first, then ``x`` of length ``n - 1``)."""

    n: int
    name: ClassVar[str] = "soc"
    self_dual: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_dim("SecondOrderCone", "n", self.n)

    @property
    def dim(self) -> int:
        return self.n

    def project(self, v: Tensor) -> Tensor:
        t, x = v[..., 0], v[..., 1:]
        r = torch.linalg.vector_norm(x, dim=-1)
        inside = r <= t
        polar = r <= -t
        safe = torch.where(inside | polar, torch.ones_like(r), r)
        a = 0.5 * (1 + t / safe)
        middle = torch.cat([(a * r)[..., None], a[..., None] * x], dim=-1)
        out = torch.where(inside[..., None], v, middle)
        return torch.where(polar[..., None], torch.zeros_like(v), out)

    def _middle(self, t: Tensor, x: Tensor, r: Tensor, ok: Tensor) -> Tensor:
        """The third-region Jacobian (``t/r`` clipped to ``[-1, 1]``; ``ok`` marks r > 0)."""
        safe = torch.where(ok, r, torch.ones_like(r))
        xbar = x / safe[..., None]
        ratio = torch.clamp(t / safe, -1.0, 1.0)
        n = self.n
        D = t.new_zeros((*t.shape, n, n))
        D[..., 0, 0] = 0.5
        D[..., 0, 1:] = 0.5 * xbar
        D[..., 1:, 0] = 0.5 * xbar
        eye = torch.eye(n - 1, dtype=t.dtype, device=t.device)
        outer = xbar[..., :, None] * xbar[..., None, :]
        D[..., 1:, 1:] = 0.5 * ((1 + ratio)[..., None, None] * eye - ratio[..., None, None] * outer)
        return D

    def _jacobian(self, v: Tensor, identity: Tensor, zero: Tensor) -> Tensor:
        t, x = v[..., 0], v[..., 1:]
        r = torch.linalg.vector_norm(x, dim=-1)
        ok = ~(identity | zero) & (r > 0)
        D = self._middle(t, x, r, ok)
        eye = torch.eye(self.n, dtype=v.dtype, device=v.device).expand_as(D)
        D = torch.where(identity[..., None, None], eye, D)
        return torch.where(zero[..., None, None], torch.zeros_like(D), D)

    def dproject(self, v: Tensor) -> Tensor:
        t, x = v[..., 0], v[..., 1:]
        r = torch.linalg.vector_norm(x, dim=-1)
        return self._jacobian(v, r <= t, r <= -t)

    def dproject_dual_snapped(self, v: Tensor, atol: Tensor) -> Tensor:
        t, x = v[..., 0], v[..., 1:]
        r = torch.linalg.vector_norm(x, dim=-1)
        return self._jacobian(v, r < t - atol, r <= -t + atol)

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        t, x = v[..., 0], v[..., 1:]
        r = torch.linalg.vector_norm(x, dim=-1)
        bound = torch.as_tensor(tol, dtype=v.dtype, device=v.device) * torch.linalg.vector_norm(
            v, dim=-1
        )
        return ((r - t).abs() <= bound) | ((r + t).abs() <= bound)

    def barrier(self, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        t, x = v[..., 0], v[..., 1:]
        d = t * t - (x * x).sum(-1)
        inside = (t > 0) & (d > 0)
        d = torch.where(inside, d, torch.ones_like(d))
        Jv = torch.cat([t[..., None], -x], dim=-1)
        sign = torch.ones(self.n, dtype=v.dtype, device=v.device)
        sign[1:] = -1.0
        grad = -2 * Jv / d[..., None]
        hess = -2 * torch.diag_embed(sign.expand_as(v)) / d[..., None, None]
        hess = hess + 4 * Jv[..., :, None] * Jv[..., None, :] / (d * d)[..., None, None]
        return grad, hess, inside

    def barrier_center(self) -> Tensor:
        e = torch.zeros(self.n, dtype=torch.float64)
        e[0] = 1.0
        return e

    def clarabel(self) -> object:
        import clarabel

        return clarabel.SecondOrderConeT(self.n)

    def scs(self) -> tuple[str, float | int]:
        return ("q", self.n)
