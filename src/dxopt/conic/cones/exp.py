"""The exponential cone :math:`K = \\operatorname{cl}\\{(r, s, t): s > 0,\\ s e^{r/s} \\le t\\}`
(Clarabel's ``ExponentialConeT``, SCS's ``"ep"``) and its dual
:math:`K^* = \\operatorname{cl}\\{(u, v, w): u < 0,\\ -u e^{v/u} \\le e\\, w\\}` (SCS's ``"ed"``).

Projection (Friberg, "Projection onto the exponential cone: a univariate root-finding
problem", Optim. Methods Softw. 2023; the case analysis and the scalar equation are his, the
bracket below is derived here). With :math:`\\varphi(r, s, t) = s e^{r/s} - t` and the polar
cone :math:`K^\\circ = -K^* = \\{r > 0,\\ r e^{s/r - 1} + t \\le 0\\} \\cup
\\{r = 0, s \\le 0, t \\le 0\\}`:

1. :math:`v \\in K`: :math:`\\Pi_K(v) = v`;
2. :math:`v \\in K^\\circ`: :math:`\\Pi_K(v) = 0`;
3. :math:`r \\le 0,\\ s \\le 0`: :math:`\\Pi_K(v) = (r, 0, \\max(t, 0))` (the face
   :math:`s = 0`; the remainder :math:`(0, s, \\min(t, 0))` lies in :math:`K^\\circ`, orthogonal);
4. otherwise the projection is :math:`p = \\sigma a(\\rho)` on the ray
   :math:`a(\\rho) = (\\rho, 1, e^\\rho)` of the boundary and :math:`v - p = \\mu b(\\rho)` on
   the polar ray :math:`b(\\rho) = \\nabla\\varphi = (e^\\rho, (1 - \\rho) e^\\rho, -1)`,
   :math:`a \\perp b`, :math:`\\sigma, \\mu > 0`. So :math:`v \\in \\operatorname{span}(a, b)`,
   i.e. :math:`\\langle v, a \\times b\\rangle = 0`, which is (divided by :math:`e^\\rho`)

   .. math::

       F(\\rho) = ((\\rho - 1) r + s) e^\\rho - (r - \\rho s) e^{-\\rho}
                  - (\\rho^2 - \\rho + 1)\\, t = 0.

   From :math:`v = \\sigma a + \\mu b`: :math:`r - \\rho s = \\mu e^\\rho (\\rho^2 - \\rho + 1)`
   and :math:`s - (1 - \\rho) r = \\sigma (\\rho^2 - \\rho + 1)`, so every root with
   :math:`\\rho s < r` and :math:`(1 - \\rho) r < s` is *the* projection (Moreau's
   decomposition is unique), and those two half-lines bound it. At their ends
   :math:`F(r/s) = (\\rho^2 - \\rho + 1)(s e^{r/s} - t) > 0` (as :math:`v \\notin K`) and
   :math:`F(1 - s/r) = -(\\rho^2 - \\rho + 1)(r e^{s/r - 1} + t) < 0` (as
   :math:`v \\notin K^\\circ`). Where only one end exists, for :math:`|v| = 1`:
   :math:`r > 0 \\ge s` gives :math:`F(\\rho) e^{-\\rho} \\ge r(\\rho - 1 + s/r) - 0.68 > 0` at
   :math:`\\rho = 1 - s/r + 2/r`, and :math:`r \\le 0 < s` gives
   :math:`F(\\rho) e^{\\rho} \\le -s(r/s - \\rho) + 3.12 < 0` at :math:`\\rho = r/s - 4/s`.
   :func:`~dxopt.conic.cones._surface.safeguarded_root` finds the root on that bracket
   (Newton and bisection, to round-off), evaluating :math:`F e^{-|\\rho|}` so that nothing
   overflows.

Derivative: :math:`I`, :math:`0`, :math:`\\operatorname{diag}(1, 0, [t > 0])` in cases 1-3;
in case 4 the surface formula of :mod:`dxopt.conic.cones._surface` with
:math:`g = b(\\rho)` and :math:`\\mu \\nabla^2\\varphi(p) = (\\mu e^\\rho/\\sigma)\\, w w^\\top`,
:math:`w = (1, -\\rho, 0)` (Ali, Wong, Kolter, "A semismooth Newton method for fast, generic
convex programming", ICML 2017, give the same Jacobian in another form).

Kinks (where :math:`\\Pi_K` is not differentiable): :math:`\\partial K` (the multiplier
:math:`\\mu` vanishes), :math:`\\partial K^\\circ` (:math:`\\sigma` vanishes), the planes
:math:`r = 0` and :math:`s = 0` bounding case 3, and :math:`t = 0` inside it.
:meth:`ExpCone.kink_primal` compares a lower bound of the distance to that set with
``tol |v|``: inside :math:`K`, :math:`\\min(s, |\\varphi(v)| / \\Vert\\nabla\\varphi(v)\\Vert)`
(convexity of :math:`\\varphi`); inside :math:`K^\\circ` the same with
:math:`\\psi = r e^{s/r - 1} + t`; in case 3 :math:`\\min(-r, -s, |t|)`; in case 4
:math:`\\min(|p|, |v - p|, \\operatorname{dist}(v, \\{r \\le 0, s \\le 0\\}))`. The Jacobian at a
kink is the one of the region the point is assigned to (cases 1-4 in that order).

Log-barrier of :math:`K` (the smoothed backward), the standard 3-self-concordant one
(Nesterov, Todd, Ye, "Infeasible-start primal-dual methods and infeasibility detectors for
nonlinear programming problems", Math. Program. 1999; Chares' thesis, 2009): with
:math:`\\psi = s \\log(t/s) - r`,

.. math::

    F(r, s, t) = -\\log \\psi - \\log s - \\log t,\\qquad
    \\nabla F = -\\nabla\\psi / \\psi - (0, 1/s, 1/t),

    \\nabla^2 F = \\nabla\\psi \\nabla\\psi^\\top / \\psi^2 - \\nabla^2\\psi / \\psi
    + \\mathrm{diag}(0, 1/s^2, 1/t^2),

:math:`\\nabla\\psi = (-1, \\log(t/s) - 1, s/t)`, :math:`\\psi_{ss} = -1/s`,
:math:`\\psi_{st} = 1/t`, :math:`\\psi_{tt} = -s/t^2` (the others zero), on the interior
:math:`s, t, \\psi > 0`. The dual cone's rows are solved as primal ones
(:func:`dxopt.conic.api.solve_with`), so only :class:`ExpCone` needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from dxopt.conic.cones._surface import (
    RHO_MAX,
    as_points,
    flat_tol,
    memoized,
    safeguarded_root,
    surface_jacobian,
    unit,
)
from dxopt.conic.cones.base import Cone

__all__ = ["DUAL_TO_PRIMAL", "ExpCone", "ExpDualCone"]

#: ``T`` with ``u in K*  <=>  T u in K``: :math:`(u, v, w) \\mapsto (-v, -u, e\\,w)`; an engine
#: whose backend lacks the dual cone (Clarabel) can state ``T s in K`` instead.
DUAL_TO_PRIMAL = ((0.0, -1.0, 0.0), (-1.0, 0.0, 0.0), (0.0, 0.0, math.e))


def _regions(v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Masks of cases 1-3 for unit rows ``v`` ``(N, 3)`` (case 4 is the rest)."""
    r, s, t = v.unbind(-1)
    pos_s = torch.where(s > 0, s, torch.ones_like(s))
    pos_r = torch.where(r > 0, r, torch.ones_like(r))
    in_k = ((s > 0) & (s * torch.exp(r / pos_s) <= t)) | ((s == 0) & (r <= 0) & (t >= 0))
    polar = ((r > 0) & (pos_r * torch.exp(s / pos_r - 1) <= -t)) | ((r == 0) & (s <= 0) & (t <= 0))
    polar = polar & ~in_k
    face = (r <= 0) & (s <= 0) & ~in_k & ~polar
    return in_k, polar, face


def _f(v: Tensor, rho: Tensor) -> tuple[Tensor, Tensor]:
    """:math:`G(\\rho) = F(\\rho) e^{-|\\rho|}` and :math:`G'(\\rho)` (no overflow)."""
    r, s, t = v.unbind(-1)
    e1 = torch.exp(-rho.abs())
    e2 = e1 * e1
    pos = rho >= 0
    wp = torch.where(pos, torch.ones_like(e1), e2)
    wm = torch.where(pos, e2, torch.ones_like(e1))
    quad = rho * rho - rho + 1
    f = ((rho - 1) * r + s) * wp - (r - rho * s) * wm - quad * t * e1
    df = (rho * r + s) * wp + (r + (1 - rho) * s) * wm - (2 * rho - 1) * t * e1
    # Newton on G = F e^{-|rho|} itself (nearly linear far out), G' = (F' - sign(rho) F) e^{-|rho|}
    return f, df - torch.where(pos, f, -f)


def _rays(rho: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Positive multiples of :math:`a(\\rho)` and :math:`b(\\rho)` without overflow, and the
    factor ``k`` with ``b_scaled = k b`` (``k = e^{-rho}`` for ``rho >= 0``, else 1)."""
    e1 = torch.exp(-rho.abs())
    pos = rho >= 0
    one = torch.ones_like(rho)
    a_pos = torch.stack([rho * e1, e1, one], -1)
    a_neg = torch.stack([rho, one, torch.exp(rho)], -1)
    b_pos = torch.stack([one, 1 - rho, -e1], -1)
    b_neg = torch.stack([torch.exp(rho), (1 - rho) * torch.exp(rho), -one], -1)
    a = torch.where(pos[:, None], a_pos, a_neg)
    b = torch.where(pos[:, None], b_pos, b_neg)
    return a, b, torch.where(pos, e1, one)


def _solve_rho(v: Tensor, x0: Tensor | None = None) -> Tensor:
    """The root :math:`\\rho` of case 4 for unit rows ``v`` (other rows: any finite value);
    ``x0``: a first iterate (clipped to the bracket; the root is the same to round-off)."""
    r, s, _ = v.unbind(-1)
    pos_r = torch.where(r > 0, r, torch.ones_like(r))
    pos_s = torch.where(s > 0, s, torch.ones_like(s))
    lo_r = 1 - s / pos_r
    hi_s = r / pos_s
    lo = torch.where(r > 0, lo_r, hi_s - 4 / pos_s)
    hi = torch.where(s > 0, hi_s, lo_r + 2 / pos_r)
    lo = torch.clamp(torch.nan_to_num(lo, nan=0.0), -RHO_MAX, RHO_MAX)
    hi = torch.clamp(torch.nan_to_num(hi, nan=0.0), -RHO_MAX, RHO_MAX)
    hi = torch.maximum(hi, lo)
    return safeguarded_root(lambda x: _f(v, x), lo, hi, x0=x0)


def _project_unit(v: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
    """:math:`\\Pi_K` of unit rows ``(N, 3)``, the case-4 root, and the case masks (through
    the engine's :class:`~dxopt.conic.cones._surface.ProjectionMemo`)."""
    return memoized("exp", v, _project_unit_fresh)


def _project_unit_fresh(
    v: Tensor, hint: tuple[Tensor, Tensor, tuple[Tensor, Tensor, Tensor]] | None = None
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
    # hint: the result for the same cones at a nearby point; its case-4 roots start Newton
    in_k, polar, face = _regions(v)
    generic = ~(in_k | polar | face)
    rho = torch.zeros_like(v[:, 0])
    idx = torch.nonzero(generic).flatten()
    if idx.numel():
        x0 = None
        if hint is not None:
            prev_rho, (prev_k, prev_p, prev_f) = hint[1], hint[2]
            # only the rows that were in case 4 there too carry a root
            was = (~(prev_k | prev_p | prev_f))[idx]
            x0 = torch.where(was, prev_rho[idx], torch.nan) if bool(was.any()) else None
        rho = rho.index_put((idx,), _solve_rho(v[idx], x0))
    a, _, _ = _rays(rho)
    ah, _ = unit(a)
    p4 = torch.clamp((v * ah).sum(-1, keepdim=True), min=0) * ah
    r, _, t = v.unbind(-1)
    p3 = torch.stack([r, torch.zeros_like(r), torch.clamp(t, min=0)], -1)
    p = torch.where(generic[:, None], p4, v)
    p = torch.where(face[:, None], p3, p)
    p = torch.where(polar[:, None], torch.zeros_like(v), p)
    return p, rho, (in_k, polar, face)


def _normalise(v: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of unit norm (zero rows stay zero) and their norms ``(N, 1)``."""
    u, n = unit(v)
    return u, n[:, None]


@dataclass(frozen=True)
class ExpCone(Cone):
    """One exponential cone ``(r, s, t)``: ``s > 0, s exp(r/s) <= t`` and its closure."""

    name: ClassVar[str] = "exp"

    @property
    def dim(self) -> int:
        return 3

    def project(self, v: Tensor) -> Tensor:
        x, batch, dtype = as_points("ExpCone.project", v)
        u, n = _normalise(x)
        p, _, (in_k, _, face) = _project_unit(u)
        # the closed-form cases exactly, without the round trip through unit rows
        r, _, t = x.unbind(-1)
        p3 = torch.stack([r, torch.zeros_like(r), torch.clamp(t, min=0)], -1)
        p = torch.where(in_k[:, None], x, torch.where(face[:, None], p3, p * n))
        return p.to(dtype).reshape(*batch, 3)

    def dproject(self, v: Tensor) -> Tensor:
        x, batch, dtype = as_points("ExpCone.dproject", v)
        u, _ = _normalise(x)
        p, rho, (in_k, polar, face) = _project_unit(u)
        _, b, _ = _rays(rho)
        d = u - p
        # mu e^rho with v - p = mu b(rho): (d . b_scaled) / |b_scaled|^2 / k * e^rho
        bn2 = (b * b).sum(-1)
        mu_exp = (d * b).sum(-1) / bn2 * torch.where(rho >= 0, torch.ones_like(rho), torch.exp(rho))
        c_inv = p[:, 1] / mu_exp
        c_inv = torch.where(torch.isnan(c_inv), torch.zeros_like(c_inv), c_inv)
        w = torch.stack([torch.ones_like(rho), -rho, torch.zeros_like(rho)], -1)
        jac = surface_jacobian(b, w, c_inv)
        eye = torch.eye(3, dtype=u.dtype, device=u.device).expand_as(jac)
        t = u[:, 2]
        diag3 = torch.diag_embed(
            torch.stack([torch.ones_like(t), torch.zeros_like(t), (t > 0).to(t.dtype)], -1)
        )
        jac = torch.where(in_k[:, None, None], eye, jac)
        jac = torch.where(face[:, None, None], diag3, jac)
        jac = torch.where(polar[:, None, None], torch.zeros_like(jac), jac)
        return jac.to(dtype).reshape(*batch, 3, 3)

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        x, batch, _ = as_points("ExpCone.kink_primal", v)
        u, _ = _normalise(x)
        p, _, (in_k, polar, face) = _project_unit(u)
        r, s, t = u.unbind(-1)
        zero = torch.zeros_like(r)
        # inside K: min(s, |phi| / |grad phi|), phi = s e^{r/s} - t
        ps = torch.where(s > 0, s, torch.ones_like(s))
        e = torch.exp(torch.clamp(r / ps, max=700.0))
        grad = torch.linalg.vector_norm(
            torch.stack([e, e * (1 - r / ps), -torch.ones_like(e)]), dim=0
        )
        m_k = torch.where(s > 0, torch.minimum(s, (t - s * e).abs() / grad), zero)
        # inside the polar cone: min(r, |psi| / |grad psi|), psi = r e^{s/r - 1} + t
        pr = torch.where(r > 0, r, torch.ones_like(r))
        e = torch.exp(torch.clamp(s / pr - 1, max=700.0))
        grad = torch.linalg.vector_norm(
            torch.stack([e * (1 - s / pr), e, torch.ones_like(e)]), dim=0
        )
        m_p = torch.where(r > 0, torch.minimum(r, (r * e + t).abs() / grad), zero)
        m_f = torch.minimum(torch.minimum(-r, -s), t.abs())
        quad = torch.sqrt(torch.clamp(r, min=0) ** 2 + torch.clamp(s, min=0) ** 2)
        pn = torch.linalg.vector_norm(p, dim=-1)
        dn = torch.linalg.vector_norm(u - p, dim=-1)
        m_g = torch.minimum(torch.minimum(pn, dn), quad)
        margin = torch.where(in_k, m_k, torch.where(polar, m_p, torch.where(face, m_f, m_g)))
        # v = 0 (the apex) has unit row 0: margin 0
        margin = torch.where(torch.linalg.vector_norm(u, dim=-1) > 0, margin, zero)
        return (margin <= flat_tol(tol, batch, u)).reshape(batch)

    def barrier(self, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r, s, t = v[..., 0], v[..., 1], v[..., 2]
        pos = (s > 0) & (t > 0)
        s = torch.where(pos, s, torch.ones_like(s))
        t = torch.where(pos, t, torch.ones_like(t))
        log_ts = torch.log(t / s)
        psi = s * log_ts - r
        inside = pos & (psi > 0)
        psi = torch.where(inside, psi, torch.ones_like(psi))
        dpsi = torch.stack([-torch.ones_like(s), log_ts - 1, s / t], dim=-1)
        zero = torch.zeros_like(s)
        hpsi = torch.stack(
            [
                torch.stack([zero, zero, zero], -1),
                torch.stack([zero, -1 / s, 1 / t], -1),
                torch.stack([zero, 1 / t, -s / (t * t)], -1),
            ],
            dim=-2,
        )
        extra = torch.stack([zero, 1 / s, 1 / t], dim=-1)
        grad = -dpsi / psi[..., None] - extra
        hess = dpsi[..., :, None] * dpsi[..., None, :] / (psi * psi)[..., None, None]
        hess = hess - hpsi / psi[..., None, None] + torch.diag_embed(extra * extra)
        return grad, hess, inside

    def barrier_center(self) -> Tensor:
        return torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)

    def clarabel(self) -> object:
        import clarabel

        return clarabel.ExponentialConeT()

    def scs(self) -> tuple[str, float | int]:
        return ("ep", 1)


@dataclass(frozen=True)
class ExpDualCone(Cone):
    """The dual exponential cone ``(u, v, w)``: ``u < 0, -u exp(v/u) <= e w`` and its closure.

    Its projection is :math:`v + \\Pi_K(-v)` (Moreau, with :math:`K` the exponential cone), so
    its own dual side is :math:`\\Pi_K`."""

    name: ClassVar[str] = "exp_dual"

    @property
    def dim(self) -> int:
        return 3

    def project(self, v: Tensor) -> Tensor:
        return ExpCone().project_dual(v)

    def dproject(self, v: Tensor) -> Tensor:
        return ExpCone().dproject_dual(v)

    def kink_primal(self, v: Tensor, tol: float | Tensor) -> Tensor:
        return ExpCone().kink_primal(-v, tol)

    def clarabel(self) -> object:
        raise NotImplementedError(
            "ExpDualCone.clarabel: Clarabel has no dual exponential cone; state "
            "DUAL_TO_PRIMAL @ s in ExpCone() instead (dxopt.conic.cones.exp.DUAL_TO_PRIMAL)"
        )

    def scs(self) -> tuple[str, float | int]:
        return ("ed", 1)
