"""dxopt's own certificate of a backend's point (after the Newton polish of
:mod:`dxopt.conic.polish`) and the checked infeasibility / unboundedness certificates.

**A solution** :math:`(x, y, s)` from a backend is first *cleaned*: :math:`w = y - s`,
:math:`y \\leftarrow \\Pi_{K^*}(w)`, :math:`s \\leftarrow \\Pi_{K^*}(w) - w` (so that
:math:`y \\in K^*`, :math:`s \\in K` and :math:`s \\perp y` hold to round-off, Moreau's
decomposition), then optionally *polished* by Newton (and chord) steps on :math:`F(x, w) = 0`
(:mod:`dxopt.conic.kkt`, :mod:`dxopt.conic.polish`; a step is kept only where it lowers
:math:`\\Vert F\\Vert_\\infty`).
The returned point is accepted when each residual is at most ``atol + rtol * scale`` with its
own scale:

- primal :math:`\\Vert Ax + s - b\\Vert_\\infty`, scale
  :math:`\\max(\\Vert Ax\\Vert_\\infty, \\Vert s\\Vert_\\infty, \\Vert b\\Vert_\\infty)`;
- dual :math:`\\Vert Px + A^\\top y + q\\Vert_\\infty`, scale
  :math:`\\max(\\Vert Px\\Vert_\\infty, \\Vert A^\\top y\\Vert_\\infty, \\Vert q\\Vert_\\infty)`;
- membership :math:`\\mathrm{dist}(s, K)` and :math:`\\mathrm{dist}(y, K^*)`, scales
  :math:`\\Vert s\\Vert_2`, :math:`\\Vert y\\Vert_2`;
- complementarity :math:`|s^\\top y|`, scale :math:`\\Vert s\\Vert_2 \\Vert y\\Vert_2`;
- gap :math:`|x^\\top Px + q^\\top x + b^\\top y|`, scale
  :math:`\\max(|x^\\top Px|, |q^\\top x|, |b^\\top y|)`.

**Infeasible** (primal): a :math:`y` is projected onto :math:`K^*` and normalised to
:math:`b^\\top \\hat y = -1`; it certifies when :math:`b^\\top y < 0` beyond round-off and
:math:`\\Vert A^\\top \\hat y\\Vert_\\infty \\Vert b\\Vert_\\infty \\le \\epsilon
\\max_{ij}|A_{ij}|` (no feasible :math:`x` with :math:`\\Vert x\\Vert_1 <
1/\\Vert A^\\top\\hat y\\Vert_\\infty`, i.e. none within :math:`1/\\epsilon` times the scale
:math:`\\Vert b\\Vert_\\infty / \\max|A_{ij}|`). **Unbounded** (dual infeasible): a direction
normalised to :math:`q^\\top \\hat d = -1` with :math:`\\Vert P\\hat d\\Vert_\\infty
\\Vert q\\Vert_\\infty \\le \\epsilon \\max|P_{ij}|` and
:math:`\\mathrm{dist}(-A\\hat d, K)\\, \\Vert q\\Vert_\\infty \\le \\epsilon \\max|A_{ij}|`;
``epsilon`` is ``infeas_tol``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt.conic.cones.base import Cone
from dxopt.conic.kkt import EPS, cone_dist, project_dual
from dxopt.conic.polish import (
    POLISH_ROUNDOFF,
    POLISH_SHIFT,
    POLISH_STEPS,
    PolishFactor,
    matvec,
    max_abs,
    polish,
    structurally_singular,
)
from dxopt.conic.problem import ConicProblem
from dxopt.conic.types import ConicOptions

__all__ = [
    "POLISH_ROUNDOFF",
    "POLISH_SHIFT",
    "POLISH_STEPS",
    "Certified",
    "PolishFactor",
    "certify_infeasible",
    "certify_points",
    "certify_unbounded",
    "clean",
    "farkas_check",
    "point_checks",
    "ray_check",
    "structurally_singular",
    "subset",
]

ROUNDOFF_SIGN = 100 * EPS
"""A certificate's :math:`b^\\top y` (or :math:`q^\\top d`) must exceed this times
:math:`\\Vert b\\Vert_\\infty \\Vert y\\Vert_1` to count as negative (not round-off)."""


def subset(prob: ConicProblem, idx: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``P, q, A, b`` of the samples ``idx`` (shared ``P``/``A`` keep their batch axis of 1)."""
    ix = torch.as_tensor(idx, dtype=torch.long)
    P = prob.P if prob.P.shape[0] == 1 else prob.P[ix]
    A = prob.A if prob.A.shape[0] == 1 else prob.A[ix]
    return P, prob.q[ix], A, prob.b[ix]


@dataclass(frozen=True)
class Certified:
    """The cleaned (and polished) points of a set of samples and their certificate."""

    ok: Tensor
    x: Tensor
    y: Tensor
    s: Tensor
    w: Tensor
    primal: Tensor
    dual: Tensor
    gap: Tensor
    polished: Tensor
    reasons: list[str]
    factor: PolishFactor | None = None


def clean(x: Tensor, y: Tensor, s: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(finite, x, y, s)``: the mask of finite points and the points with the non-finite
    ones zeroed (no NaN into the projections)."""
    finite = torch.isfinite(x).all(-1) & torch.isfinite(y).all(-1) & torch.isfinite(s).all(-1)
    zero = torch.zeros_like
    x, y, s = (torch.where(finite[:, None], t, zero(t)) for t in (x, y, s))
    return finite, x, y, s


def point_checks(
    cones: tuple[Cone, ...],
    slices: tuple[slice, ...],
    point: tuple[Tensor, Tensor, Tensor],
    data: tuple[Tensor, Tensor],
    products: tuple[Tensor, Tensor, Tensor],
    finite: Tensor,
    options: ConicOptions,
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[str]]:
    """The certificate of the module doc for the points ``(x, y, s)`` given ``(q, b)`` and the
    products ``(Ax, Px, A'y)`` (dense batched or sparse matvecs: the same checks either way).

    Returns ``(ok, primal, dual, gap, reasons)``."""
    x, y, s = point
    q, b = data
    Ax, Px, Aty = products
    primal = max_abs(Ax + s - b)
    dual = max_abs(Px + Aty + q)
    xPx, qx, by = (x * Px).sum(-1), (q * x).sum(-1), (b * y).sum(-1)
    gap = (xPx + qx + by).abs()
    comp = (s * y).sum(-1).abs()
    dist_s = cone_dist(cones, slices, s, dual=False)
    dist_y = cone_dist(cones, slices, y, dual=True)
    ns, ny = torch.linalg.vector_norm(s, dim=-1), torch.linalg.vector_norm(y, dim=-1)
    at, rt = options.atol, options.rtol
    checks = {
        "primal residual": (primal, torch.stack([max_abs(Ax), max_abs(s), max_abs(b)]).amax(0)),
        "dual residual": (dual, torch.stack([max_abs(Px), max_abs(Aty), max_abs(q)]).amax(0)),
        "dist(s, K)": (dist_s, ns),
        "dist(y, K*)": (dist_y, ny),
        "complementarity |s'y|": (comp, ns * ny),
        "duality gap": (gap, torch.stack([xPx.abs(), qx.abs(), by.abs()]).amax(0)),
    }
    ok = finite.clone()
    reasons = ["" if f else "non-finite point" for f in finite.tolist()]
    for name, (value, scale) in checks.items():
        bad = ~(value <= at + rt * scale)
        ok &= ~bad
        if bool(bad.any()):
            bound = at + rt * scale
            for i in torch.nonzero(bad).flatten().tolist():
                if not reasons[i]:
                    reasons[i] = f"{name} {float(value[i]):.2e} > {float(bound[i]):.2e}"
    return ok, primal, dual, gap, reasons


def certify_points(
    prob: ConicProblem, idx: list[int], x: Tensor, y: Tensor, s: Tensor, options: ConicOptions
) -> Certified:
    """Clean, polish and certify the points ``(x, y, s)`` of the samples ``idx``."""
    data = subset(prob, idx)
    P, q, A, b = data
    finite, x, y, s = clean(x, y, s)
    w = y - s
    polished = torch.zeros_like(finite)
    factor = None
    if options.polish:
        x, w, y, polished, factor = polish(prob, data, x, w)
    else:
        y = project_dual(prob.cones, prob.slices, w)
    s = y - w
    products = (matvec(A, x), matvec(P, x), matvec(A.transpose(-1, -2), y))
    ok, primal, dual, gap, reasons = point_checks(
        prob.cones, prob.slices, (x, y, s), (q, b), products, finite, options
    )
    return Certified(ok, x, y, s, w, primal, dual, gap, polished, reasons, factor)


def farkas_check(
    cones: tuple[Cone, ...],
    slices: tuple[slice, ...],
    y: Tensor,
    b: Tensor,
    at: Callable[[Tensor], Tensor],
    a_max: Tensor,
    tol: float,
) -> Tensor:
    """The infeasibility certificate of the module doc for ``y`` given ``b``, the product
    ``at(v)`` :math:`= A^\\top v` and :math:`\\max_{ij}|A_{ij}|` per sample."""
    y = torch.where(torch.isfinite(y), y, torch.zeros_like(y))
    yp = project_dual(cones, slices, y)
    by = (b * yp).sum(-1)
    y1 = yp.abs().sum(-1)
    negative = -by > ROUNDOFF_SIGN * max_abs(b) * y1
    safe = torch.where(negative, -by, torch.ones_like(by))
    aty = max_abs(at(yp / safe[:, None]))
    return negative & (aty * max_abs(b) <= tol * a_max.expand_as(by))


def ray_check(
    cones: tuple[Cone, ...],
    slices: tuple[slice, ...],
    d: Tensor,
    q: Tensor,
    products: tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]],
    maxima: tuple[Tensor, Tensor],
    tol: float,
) -> Tensor:
    """The unboundedness certificate of the module doc for ``d`` given ``q``, the products
    ``(Pv, Av)`` and :math:`(\\max|P_{ij}|, \\max|A_{ij}|)` per sample."""
    pmv, amv = products
    d = torch.where(torch.isfinite(d), d, torch.zeros_like(d))
    qd = (q * d).sum(-1)
    negative = -qd > ROUNDOFF_SIGN * max_abs(q) * d.abs().sum(-1)
    safe = torch.where(negative, -qd, torch.ones_like(qd))
    dh = d / safe[:, None]
    pd = max_abs(pmv(dh))
    dist = cone_dist(cones, slices, -amv(dh), dual=False)
    p_max, a_max = (t.expand_as(qd) for t in maxima)
    qn = max_abs(q)
    return negative & (pd * qn <= tol * p_max) & (dist * qn <= tol * a_max)


def certify_infeasible(prob: ConicProblem, idx: list[int], y: Tensor, tol: float) -> Tensor:
    """Per sample: does ``y`` certify primal infeasibility (module doc)?"""
    _, _, A, b = subset(prob, idx)
    a_max = A.abs().amax(dim=(-2, -1))
    return farkas_check(
        prob.cones, prob.slices, y, b, lambda v: matvec(A.transpose(-1, -2), v), a_max, tol
    )


def certify_unbounded(prob: ConicProblem, idx: list[int], d: Tensor, tol: float) -> Tensor:
    """Per sample: does ``d`` certify dual infeasibility, an improving direction (module doc)?"""
    P, q, A, _ = subset(prob, idx)
    maxima = (P.abs().amax(dim=(-2, -1)), A.abs().amax(dim=(-2, -1)))
    products = (lambda v: matvec(P, v), lambda v: matvec(A, v))
    return ray_check(prob.cones, prob.slices, d, q, products, maxima, tol)
