"""The power cone
:math:`K_\\alpha = \\{(x, y, z): x^\\alpha y^{1-\\alpha} \\ge |z|,\\ x, y \\ge 0\\}`,
:math:`0 < \\alpha < 1` (Clarabel's ``PowerConeT(alpha)``, SCS's ``"p"`` with a positive
entry), with dual :math:`K_\\alpha^* = \\{(u, v, w): (u/\\alpha)^\\alpha (v/(1-\\alpha))^{1-\\alpha}
\\ge |w|,\\ u, v \\ge 0\\}`.

Projection (Hien, "Differential properties of Euclidean projection onto power cone", Math.
Methods Oper. Res. 2015): with the polar cone :math:`K^\\circ = -K^*`,

1. :math:`v \\in K`: :math:`\\Pi(v) = v`; 2. :math:`v \\in K^\\circ`: :math:`\\Pi(v) = 0`;
3. :math:`z = 0` otherwise: :math:`\\Pi(v) = (x_+, y_+, 0)`;
4. otherwise :math:`\\Pi(v) = (x_\\rho, y_\\rho, \\operatorname{sign}(z) \\rho)` with

   .. math::

       x_\\rho = \\tfrac12\\big(x + \\sqrt{x^2 + 4\\alpha\\rho(|z| - \\rho)}\\big), \\quad
       y_\\rho = \\tfrac12\\big(y + \\sqrt{y^2 + 4(1-\\alpha)\\rho(|z| - \\rho)}\\big),

   and :math:`\\rho \\in (0, |z|)` the root of :math:`G(\\rho) = \\rho - x_\\rho^\\alpha
   y_\\rho^{1-\\alpha}`. These are the optimality conditions of the projection onto
   :math:`\\{\\varphi \\le 0\\}`, :math:`\\varphi = |z| - x^\\alpha y^{1-\\alpha}`, with multiplier
   :math:`\\mu = |z| - \\rho`; any root in :math:`(0, |z|)` is a KKT point, hence the
   projection. :math:`G(|z|) = |z| - x_+^\\alpha y_+^{1-\\alpha} > 0` as :math:`v \\notin K`, and
   :math:`G < 0` just right of 0 as :math:`v \\notin K^\\circ`. The root can be tiny (about
   :math:`(x^\\alpha (|z|/|y|)^{1-\\alpha})^{1/\\alpha}` for :math:`x > 0 > y`), so
   :func:`~dxopt.conic.cones._surface.safeguarded_root` solves
   :math:`H(\\sigma) = \\log\\rho - \\log(x_\\rho^\\alpha y_\\rho^{1-\\alpha}) = 0` in
   :math:`\\sigma = \\log(\\rho/\\mu) \\in [-600, 600]`, :math:`\\rho = |z|/(1 + e^{-\\sigma})`,
   :math:`\\mu = |z|/(1 + e^{\\sigma})` (same sign as :math:`G`, linear in :math:`\\sigma` at both
   ends, where :math:`x_\\rho, y_\\rho` follow powers of :math:`\\rho` or of :math:`\\mu`),
   with :math:`\\log x_\\rho = \\log(2\\alpha q) - \\log(\\sqrt{x^2 + 4\\alpha q} - x)` for
   :math:`x < 0`,
   :math:`q = \\rho(|z| - \\rho)`: no cancellation, no underflow.

Derivative: :math:`I`, :math:`0`, :math:`\\operatorname{diag}([x > 0], [y > 0], 0)` in cases
1-3 (case 3 is a kink: the slope in :math:`z` is infinite for :math:`\\alpha < 1/2`); in case 4
the surface formula of :mod:`dxopt.conic.cones._surface` with :math:`g = \\nabla\\varphi(p)
= (-\\alpha\\rho/x_\\rho, -(1-\\alpha)\\rho/y_\\rho, \\operatorname{sign} z)`
and :math:`\\mu\\nabla^2\\varphi(p) = \\mu\\alpha(1-\\alpha)\\rho\\, w w^\\top`,
:math:`w = (1/x_\\rho, -1/y_\\rho, 0)`.

Kinks: :math:`\\partial K` (:math:`\\mu = 0`), :math:`\\partial K^\\circ`, and the plane
:math:`z = 0` outside :math:`K \\cup K^\\circ`. :meth:`PowerCone.kink_primal` compares a lower
bound of the distance to them with ``tol |v|``: inside :math:`K`,
:math:`\\min(x, y, |\\varphi(v)| / \\Vert\\partial\\varphi(v)\\Vert)` (convexity of
:math:`\\varphi`), inside :math:`K^\\circ` the same for the dual cone at :math:`-v`, elsewhere
:math:`\\min(|p|, |v - p|, |z|)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from dxopt.conic.cones._surface import (
    as_points,
    flat_tol,
    memoized,
    safeguarded_root,
    surface_jacobian,
    unit,
)
from dxopt.conic.cones.base import Cone

__all__ = ["PowerCone"]


def _geo(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    """:math:`x^\\alpha y^{1-\\alpha}` for ``x, y >= 0`` (0 where either is 0)."""
    pos = (x > 0) & (y > 0)
    one = torch.ones_like(x)
    val = torch.exp(
        alpha * torch.log(torch.where(pos, x, one))
        + (1 - alpha) * torch.log(torch.where(pos, y, one))
    )
    return torch.where(pos, val, torch.zeros_like(x))


def _log_half_root(x: Tensor, c: float, log_q: Tensor) -> tuple[Tensor, Tensor]:
    """:math:`\\log x_\\rho` for :math:`x_\\rho = (x + S)/2`, :math:`S = \\sqrt{x^2 + 4cq}`,
    from :math:`\\log q` (no underflow), and :math:`\\kappa = d\\log x_\\rho / d\\log q
    = (S - x) / (2S)`."""
    q = torch.exp(log_q)
    root = torch.sqrt(x * x + 4 * c * q)
    pos = x > 0
    zero = x == 0
    one = torch.ones_like(x)
    safe_root = torch.where(zero, one, root)
    log_pos = torch.log(0.5 * (x + root))
    log_neg = math.log(2 * c) + log_q - torch.log(torch.where(zero, one, root - x))
    log_zero = 0.5 * (math.log(c) + log_q)
    lx = torch.where(pos, log_pos, torch.where(zero, log_zero, log_neg))
    k_pos = 2 * c * q / (safe_root * (safe_root + x))
    k_neg = (safe_root - x) / (2 * safe_root)
    kx = torch.where(pos, k_pos, torch.where(zero, 0.5 * one, k_neg))
    return lx, kx


#: The root-find in :math:`\\sigma = \\log(\\rho/\\mu)` is bracketed by :math:`\\pm` this (a
#: root beyond it moves the projection by less than :math:`e^{-600} |v|`).
_SIG_MAX = 600.0


@dataclass(frozen=True)
class PowerCone(Cone):
    """One power cone ``(x, y, z)``: ``x^alpha y^(1-alpha) >= |z|``, ``x, y >= 0``."""

    alpha: float
    name: ClassVar[str] = "power"

    def __post_init__(self) -> None:
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 < float(a) < 1.0:
            raise ValueError(
                f"PowerCone: alpha must be a number in the open interval (0, 1), got {a!r}; "
                "alpha = 1/2 is the rotated second-order cone"
            )
        object.__setattr__(self, "alpha", float(a))

    @property
    def dim(self) -> int:
        return 3

    # -- the case analysis on unit rows ---------------------------------------------------
    def _regions(self, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self.alpha
        x, y, z = v.unbind(-1)
        in_k = (x >= 0) & (y >= 0) & (_geo(x, y, a) >= z.abs())
        polar = (x <= 0) & (y <= 0) & (_geo(-x / a, -y / (1 - a), a) >= z.abs()) & ~in_k
        flat = (z == 0) & ~in_k & ~polar
        return in_k, polar, flat

    def _h(self, v: Tensor, sig: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:math:`H(\\sigma) = \\log\\rho - \\log(x_\\rho^\\alpha y_\\rho^{1-\\alpha})` at
        :math:`\\rho = |z| / (1 + e^{-\\sigma})`, :math:`dH/d\\sigma`, and
        :math:`\\log x_\\rho, \\log y_\\rho`, on unit rows, in logarithms throughout."""
        a = self.alpha
        x, y, z = v.unbind(-1)
        logz = torch.log(z.abs())
        ls_p = torch.nn.functional.logsigmoid(sig)  # log(rho / |z|)
        ls_m = torch.nn.functional.logsigmoid(-sig)  # log(mu / |z|)
        log_q = 2 * logz + ls_p + ls_m
        s_p, s_m = torch.sigmoid(sig), torch.sigmoid(-sig)
        lx, kx = _log_half_root(x, a, log_q)
        ly, ky = _log_half_root(y, 1 - a, log_q)
        h = logz + ls_p - a * lx - (1 - a) * ly
        return h, s_m - (s_m - s_p) * (a * kx + (1 - a) * ky), lx, ly

    def _project_unit(
        self, v: Tensor
    ) -> tuple[Tensor, tuple[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]:
        """:math:`\\Pi` of unit rows, :math:`(\\rho, \\mu)` of case 4, and the case masks
        (through the engine's :class:`~dxopt.conic.cones._surface.ProjectionMemo`)."""
        return memoized(("power", self.alpha), v, self._project_unit_fresh)

    def _project_unit_fresh(
        self, v: Tensor, hint: object = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]:
        # hint (the memo's warm start) is not used: the root starts at sigma = 0
        in_k, polar, flat = self._regions(v)
        generic = ~(in_k | polar | flat)
        x, y, z = v.unbind(-1)
        rho, mu = torch.zeros_like(x), torch.zeros_like(x)
        xr, yr = torch.zeros_like(x), torch.zeros_like(x)
        idx = torch.nonzero(generic).flatten()
        if idx.numel():
            vg = v[idx]
            az = vg[:, 2].abs()
            sig = safeguarded_root(
                lambda t: self._h(vg, t)[:2],
                torch.full_like(az, -_SIG_MAX),
                torch.full_like(az, _SIG_MAX),
                x0=torch.zeros_like(az),
            )
            _, _, lx, ly = self._h(vg, sig)
            rho = rho.index_put((idx,), az * torch.sigmoid(sig))
            mu = mu.index_put((idx,), az * torch.sigmoid(-sig))
            xr = xr.index_put((idx,), torch.exp(lx))
            yr = yr.index_put((idx,), torch.exp(ly))
        p4 = torch.stack([xr, yr, torch.sign(z) * rho], -1)
        p3 = torch.stack([torch.clamp(x, min=0), torch.clamp(y, min=0), torch.zeros_like(z)], -1)
        p = torch.where(generic[:, None], p4, v)
        p = torch.where(flat[:, None], p3, p)
        p = torch.where(polar[:, None], torch.zeros_like(v), p)
        return p, (rho, mu), (in_k, polar, flat)

    # -- the protocol ---------------------------------------------------------------------
    def project(self, v: Tensor) -> Tensor:
        xv, batch, dtype = as_points("PowerCone.project", v)
        u, n = unit(xv)
        p, _, (in_k, _, flat) = self._project_unit(u)
        # the closed-form cases exactly, without the round trip through unit rows
        x, y, z = xv.unbind(-1)
        p3 = torch.stack([torch.clamp(x, min=0), torch.clamp(y, min=0), torch.zeros_like(z)], -1)
        p = torch.where(in_k[:, None], xv, torch.where(flat[:, None], p3, p * n[:, None]))
        return p.to(dtype).reshape(*batch, 3)

    def dproject(self, v: Tensor) -> Tensor:
        a = self.alpha
        xv, batch, dtype = as_points("PowerCone.dproject", v)
        u, _ = unit(xv)
        p, (rho, mu), (in_k, polar, flat) = self._project_unit(u)
        xr, yr = p[:, 0], p[:, 1]
        pos = (xr > 0) & (yr > 0)
        one = torch.ones_like(xr)
        sx, sy = torch.where(pos, xr, one), torch.where(pos, yr, one)
        sign = torch.sign(u[:, 2])
        normal = torch.stack([-a * rho / sx, -(1 - a) * rho / sy, sign], -1)
        # w scaled by x_rho y_rho: (y_rho, -x_rho, 0); then 1/c = (x y)^2 / (mu a (1-a) rho)
        w = torch.stack([yr, -xr, torch.zeros_like(xr)], -1)
        c_inv = (xr * yr) ** 2 / (mu * a * (1 - a) * rho)
        c_inv = torch.where(torch.isnan(c_inv), torch.zeros_like(c_inv), c_inv)
        jac = surface_jacobian(normal, w, c_inv)
        eye = torch.eye(3, dtype=u.dtype, device=u.device).expand_as(jac)
        x, y = u[:, 0], u[:, 1]
        diag3 = torch.diag_embed(torch.stack([(x > 0).to(x.dtype), (y > 0).to(x.dtype), 0 * x], -1))
        jac = torch.where(in_k[:, None, None], eye, jac)
        jac = torch.where(flat[:, None, None], diag3, jac)
        jac = torch.where(polar[:, None, None], torch.zeros_like(jac), jac)
        return jac.to(dtype).reshape(*batch, 3, 3)

    def _margin_in(self, x: Tensor, y: Tensor, z: Tensor, ax: float, ay: float) -> Tensor:
        """``min(x, y, |phi| / |grad phi|)`` with ``phi = |z| - (x/ax)^a (y/ay)^(1-a)``."""
        a = self.alpha
        pos = (x > 0) & (y > 0)
        one = torch.ones_like(x)
        sx, sy = torch.where(pos, x, one), torch.where(pos, y, one)
        f = _geo(sx / ax, sy / ay, a)
        grad = torch.linalg.vector_norm(
            torch.stack([a * f / sx, (1 - a) * f / sy, torch.sign(z)]), dim=0
        )
        m = torch.minimum(torch.minimum(x, y), (f - z.abs()).abs() / grad)
        return torch.where(pos, m, torch.zeros_like(x))

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        a = self.alpha
        xv, batch, _ = as_points("PowerCone.kink_primal", v)
        u, nrm = unit(xv)
        p, _, (in_k, polar, _) = self._project_unit(u)
        x, y, z = u.unbind(-1)
        m_k = self._margin_in(x, y, z, 1.0, 1.0)
        m_p = self._margin_in(-x, -y, -z, a, 1 - a)
        pn = torch.linalg.vector_norm(p, dim=-1)
        dn = torch.linalg.vector_norm(u - p, dim=-1)
        m_g = torch.minimum(torch.minimum(pn, dn), z.abs())
        margin = torch.where(in_k, m_k, torch.where(polar, m_p, m_g))
        margin = torch.where(nrm > 0, margin, torch.zeros_like(margin))
        return (margin <= flat_tol(tol, batch, u)).reshape(batch)

    def clarabel(self) -> object:
        import clarabel

        return clarabel.PowerConeT(self.alpha)

    def scs(self) -> tuple[str, float | int]:
        return ("p", self.alpha)
