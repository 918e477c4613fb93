"""Cone algebra of the batched interior point (:mod:`dxopt.conic.ipm`): the nonnegative orthant
and second-order cones, every cone of one kind and size handled in one tensor operation.

**Layout.** :func:`ipm_layout` sorts the rows of a cone program into the equality rows (zero
cones), the inequality rows (nonnegative cones) and, per second-order cone size ``d``, a
``(count, d)`` table of row indices. The cone part of the iterate is one vector
``(B, m_K)``: the nonnegative rows first, then each size's cones flattened in order.

**Jordan algebra** (Vandenberghe, "The CVXOPT linear and quadratic cone program solvers",
2010, sec. 2): on the orthant :math:`u \\circ v = (u_i v_i)` with identity
:math:`e = \\mathbf 1`; on a second-order cone, with :math:`u = (u_0, u_1)`,

.. math:: u \\circ v = (u^\\top v,\\; u_0 v_1 + v_0 u_1),\\qquad e = (1, 0),

and :math:`\\lambda \\circ x = r` is solved by
:math:`x_0 = (\\lambda_0 r_0 - \\lambda_1^\\top r_1)/(\\lambda^\\top J\\lambda)`,
:math:`x_1 = (r_1 - x_0\\lambda_1)/\\lambda_0`, :math:`J = \\mathrm{diag}(1, -I)`.
The degree of the cone (the number of ``e``'s blocks) is :math:`m_l + \\#\\text{SOC}`.

**Nesterov-Todd scaling** (ibid., sec. 4.1): the symmetric :math:`W` with
:math:`Wz = W^{-1}s = \\lambda`. On the orthant :math:`W = \\mathrm{diag}(\\sqrt{s/z})`; on a
second-order cone, with :math:`\\bar s = s/\\sqrt{s^\\top Js}`, :math:`\\bar z =
z/\\sqrt{z^\\top Jz}`, :math:`\\gamma = \\sqrt{(1 + \\bar z^\\top \\bar s)/2}`,
:math:`\\bar w = (\\bar s + J\\bar z)/(2\\gamma)` (the normalised scaling point),
:math:`v = (\\bar w + e)/\\sqrt{2(\\bar w_0 + 1)}` (its square root in the Jordan algebra)
and :math:`\\beta = (s^\\top Js / z^\\top Jz)^{1/4}`,

.. math:: W = \\beta(2vv^\\top - J),\\qquad W^{-1} = \\beta^{-1}(2Jvv^\\top J - J),

applied matrix-free (a rank-one update of :math:`J`), to vectors and to the rows of ``A``.
:math:`v^\\top Jv` is formed as :math:`(v_0 - \\Vert v_1\\Vert)(v_0 + \\Vert v_1\\Vert)`, which
keeps its relative accuracy near the boundary.

**Step to the boundary.** :math:`W` maps the cone onto itself, so the largest step of
:math:`s + \\alpha\\Delta s` and of :math:`z + \\alpha\\Delta z` is that of
:math:`\\lambda + \\alpha d` with :math:`d = W^{-1}\\Delta s` or :math:`W\\Delta z`. For a
second-order cone it is :math:`1/\\max(0, -\\rho)` with :math:`\\rho` the smallest eigenvalue
of :math:`P(\\hat\\lambda^{-1/2})\\hat d` (:math:`\\hat\\lambda = \\lambda/\\sqrt{\\lambda^\\top
J\\lambda}`, :math:`\\hat d` scaled alike): :math:`\\rho = \\hat\\lambda^\\top J\\hat d -
\\Vert \\hat d_1 - c\\,\\hat\\lambda_1\\Vert`, :math:`c = (\\hat\\lambda^\\top J \\hat d +
\\hat d_0)/(\\hat\\lambda_0 + 1)` (ibid., sec. 4.3 / CVXOPT's ``max_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.nonneg import NonnegCone
from dxopt.conic.cones.soc import SecondOrderCone
from dxopt.conic.cones.zero import ZeroCone

__all__ = ["IPMLayout", "Scaling", "ipm_layout", "supported"]


def supported(cones: tuple[Cone, ...]) -> bool:
    """Whether every cone is one the interior point handles (zero, nonnegative, SOC)."""
    return all(isinstance(c, (ZeroCone, NonnegCone, SecondOrderCone)) for c in cones)


@dataclass(frozen=True)
class IPMLayout:
    """Row groups of a cone program (module doc). ``eq``: the zero-cone rows; ``cone``: the
    other rows in the iterate's order (``nl`` nonnegative rows, then the SOC tables);
    ``soc``: per size, ``(d, count, offset)`` with ``offset`` into the cone vector."""

    eq: Tensor
    cone: Tensor
    nl: int
    soc: tuple[tuple[int, int, int], ...]

    @property
    def m_cone(self) -> int:
        return int(self.cone.numel())

    @property
    def degree(self) -> int:
        return self.nl + sum(cnt for _, cnt, _ in self.soc)

    def socs(self, v: Tensor) -> list[Tensor]:
        """The SOC blocks of a cone vector ``(B, m_K, ...)`` as views ``(B, count, d, ...)``."""
        B, tail = v.shape[0], v.shape[2:]
        return [v[:, o : o + d * c].reshape(B, c, d, *tail) for d, c, o in self.soc]

    def join(self, lin: Tensor, socs: list[Tensor]) -> Tensor:
        B = lin.shape[0]
        tail = lin.shape[2:]
        parts = [lin] + [s.reshape(B, -1, *tail) for s in socs]
        return torch.cat(parts, dim=1)

    def identity(self, B: int, dtype: torch.dtype) -> Tensor:
        """The identity element :math:`e`, ``(B, m_K)``."""
        lin = torch.ones(B, self.nl, dtype=dtype)
        socs = []
        for d, c, _ in self.soc:
            e = torch.zeros(B, c, d, dtype=dtype)
            e[..., 0] = 1.0
            socs.append(e)
        return self.join(lin, socs)

    def jordan(self, u: Tensor, v: Tensor) -> Tensor:
        """:math:`u \\circ v`."""
        lin = u[:, : self.nl] * v[:, : self.nl]
        socs = []
        for a, b in zip(self.socs(u), self.socs(v)):
            head = (a * b).sum(-1, keepdim=True)
            socs.append(torch.cat([head, a[..., :1] * b[..., 1:] + b[..., :1] * a[..., 1:]], -1))
        return self.join(lin, socs)

    def jordan_solve(self, lam: Tensor, r: Tensor) -> Tensor:
        """``x`` with :math:`\\lambda \\circ x = r` (``lam`` interior)."""
        lin = r[:, : self.nl] / lam[:, : self.nl]
        socs = []
        for a, b in zip(self.socs(lam), self.socs(r)):
            a0, a1, b0, b1 = a[..., :1], a[..., 1:], b[..., :1], b[..., 1:]
            x0 = (a0 * b0 - (a1 * b1).sum(-1, keepdim=True)) / _jnorm2(a)
            socs.append(torch.cat([x0, (b1 - x0 * a1) / a0], -1))
        return self.join(lin, socs)

    def min_eig(self, v: Tensor) -> Tensor:
        """Smallest eigenvalue of ``v`` over all cones, per sample (``(B,)``)."""
        parts = [v[:, : self.nl]]
        for blk in self.socs(v):
            parts.append(blk[..., 0] - torch.linalg.vector_norm(blk[..., 1:], dim=-1))
        return torch.cat(parts, dim=1).amin(dim=1)

    def max_step(self, lam: Tensor, d: Tensor) -> Tensor:
        """Largest :math:`\\alpha` (``inf`` if unbounded) with :math:`\\lambda + \\alpha d \\in K`,
        per sample (``lam`` interior)."""
        parts = [-d[:, : self.nl] / lam[:, : self.nl]]  # -rho of the orthant rows
        for a, b in zip(self.socs(lam), self.socs(d)):
            nrm = _jnorm2(a).sqrt()
            a, b = a / nrm, b / nrm
            rho0 = a[..., :1] * b[..., :1] - (a[..., 1:] * b[..., 1:]).sum(-1, keepdim=True)
            c = (rho0 + b[..., :1]) / (a[..., :1] + 1.0)
            rho1 = torch.linalg.vector_norm(b[..., 1:] - c * a[..., 1:], dim=-1)
            parts.append(-(rho0[..., 0] - rho1))
        worst = torch.cat(parts, dim=1).amax(dim=1)
        return torch.where(worst > 0, 1.0 / worst, torch.full_like(worst, float("inf")))


def _jnorm2(v: Tensor) -> Tensor:
    """:math:`v^\\top Jv` of SOC blocks ``(..., d)`` as ``(..., 1)``, in the accurate form."""
    t = v[..., :1]
    r = torch.linalg.vector_norm(v[..., 1:], dim=-1, keepdim=True)
    return (t - r) * (t + r)


def _jmul(v: Tensor) -> Tensor:
    """:math:`Jv` on SOC blocks ``(..., d, ...)`` along dim 2 (the cone axis)."""
    out = -v
    out[:, :, 0] = v[:, :, 0]
    return out


class Scaling:
    """The Nesterov-Todd scaling at an interior pair ``(s, z)`` (module doc)."""

    def __init__(self, lay: IPMLayout, s: Tensor, z: Tensor):
        self.lay = lay
        nl = lay.nl
        self.d = (s[:, :nl] / z[:, :nl]).sqrt()  # orthant: W = diag(d)
        self.beta, self.w = [], []
        for sb, zb in zip(lay.socs(s), lay.socs(z)):
            ns, nz = _jnorm2(sb).sqrt(), _jnorm2(zb).sqrt()
            sbar, zbar = sb / ns, zb / nz
            gamma = (0.5 * (1.0 + (sbar * zbar).sum(-1, keepdim=True))).sqrt()
            jz = -zbar
            jz[..., 0] = zbar[..., 0]
            wbar = (sbar + jz) / (2.0 * gamma)
            v = wbar.clone()
            v[..., 0] += 1.0
            self.w.append(v / (2.0 * (wbar[..., :1] + 1.0)).sqrt())
            self.beta.append((ns / nz).sqrt())
        self.lam = self.inv(s)

    def _apply(self, v: Tensor, inverse: bool) -> Tensor:
        lay = self.lay
        d = self.d if v.ndim == 2 else self.d[..., None]
        lin = v[:, : lay.nl] / d if inverse else v[:, : lay.nl] * d
        socs = []
        for blk, w, beta in zip(lay.socs(v), self.w, self.beta):
            if v.ndim == 3:  # (B, c, d, n): the cone axis is 2
                w, beta = w[..., None], beta[..., None]
            if inverse:  # W^{-1} v = (2 Jw (w'Jv) - Jv) / beta
                jv, jw = _jmul(blk), _jmul(w)
                socs.append((2.0 * jw * (w * jv).sum(2, keepdim=True) - jv) / beta)
            else:  # W v = beta (2 w (w'v) - Jv)
                socs.append(beta * (2.0 * w * (w * blk).sum(2, keepdim=True) - _jmul(blk)))
        return lay.join(lin, socs)

    def fwd(self, v: Tensor) -> Tensor:
        """:math:`Wv` for ``v`` of shape ``(B, m_K)`` or ``(B, m_K, n)``."""
        return self._apply(v, inverse=False)

    def inv(self, v: Tensor) -> Tensor:
        """:math:`W^{-1}v` for ``v`` of shape ``(B, m_K)`` or ``(B, m_K, n)``."""
        return self._apply(v, inverse=True)


def ipm_layout(cones: tuple[Cone, ...], slices: tuple[slice, ...]) -> IPMLayout:
    """Group the rows of ``cones`` (all :func:`supported`) as in the module doc."""
    eq: list[int] = []
    lin: list[int] = []
    soc: dict[int, list[list[int]]] = {}
    for c, sl in zip(cones, slices):
        rows = list(range(sl.start or 0, sl.stop))
        if isinstance(c, ZeroCone):
            eq += rows
        elif isinstance(c, NonnegCone):
            lin += rows
        else:
            soc.setdefault(len(rows), []).append(rows)
    order = list(lin)
    tables = []
    for d in sorted(soc):
        tables.append((d, len(soc[d]), len(order)))
        order += [r for rows in soc[d] for r in rows]
    as_long = lambda v: torch.as_tensor(v, dtype=torch.long)  # noqa: E731
    return IPMLayout(eq=as_long(eq), cone=as_long(order), nl=len(lin), soc=tuple(tables))
