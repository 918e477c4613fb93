"""The CPU path's certificate and active-set rules, batched in torch on the solver's device.

The torch solver (:mod:`dxopt.qp.solvers.torch_ipm`) keeps its data on the device, so the numpy
certificate of :mod:`dxopt.qp.certify.polish` and the active-set classification of
:mod:`dxopt.qp.certify.active` cannot run on it as they are; this module evaluates **the same
rules**, row for row, on ``(B, ...)`` tensors (float32 data in float64: the rules judge the
point the user gets, not the rounding of evaluating them).

**Certificate** (:func:`certify`, the rule of :func:`dxopt.qp.certify.polish.batch_accept_exact`):
with :math:`r = \\max(\\varepsilon_{rel}, 10^{-10})`,
:math:`t_p = \\varepsilon_{abs} + r\\max(\\|Gx\\|_\\infty, \\|h\\|_\\infty)`, :math:`t_e` likewise
for :math:`Ax = b` and :math:`t_d = \\varepsilon_{abs} + r\\max(\\|Px\\|_\\infty,
\\|q\\|_\\infty, \\|A^\\top\\mu\\|_\\infty, \\|G^\\top\\nu\\|_\\infty)`, a point passes when
:math:`\\|(Gx - h)_+\\|_\\infty \\le t_p`, :math:`\\|Ax - b\\|_\\infty \\le t_e`, the dual
residual is at most :math:`t_d`, :math:`(-\\nu_i)_+\\|g_i\\|_\\infty \\le t_d` and every row is
*settled*: :math:`\\min((h_i - g_i^\\top x)_+/t_p,\\ (\\nu_i)_+\\|g_i\\|_\\infty/t_d) \\le 1`.
Zero rows are never active (multiplier 0) and make the sample infeasible only when
:math:`h_i < -\\varepsilon_{abs}` (:math:`|b_j| > \\varepsilon_{abs}` for a zero row of ``A``).
The CPU path also accepts, as a last resort, a point certified by its duality gap alone (an
unsettled point); the device path does not: such a sample goes to the CPU fallback chain.

**Regular samples** (:func:`regular`): the device's exact active-set backward
(:mod:`dxopt.qp.autograd.torch_function`) is the derivative only where the solution map is smooth
and
its KKT matrix nonsingular. A sample is regular when its polished active set :math:`J`
has no weakly active row (the classification of :func:`dxopt.qp.certify.active.identify_active`
with the forward's active set: a row of :math:`J` whose multiplier is at round-off,
:math:`\\nu_i\\|g_i\\|_\\infty \\le 10^{-10}\\sigma^d`, or a row outside :math:`J` with relative
slack below :math:`\\tau = \\max(10^3\\varepsilon, 10^{-9})`), the rows :math:`[A; G_J]` are
linearly independent (LICQ, by :func:`dxopt.qp.certify.dependence.count_dependent_dense`, the CPU
path's own test) and ``P`` is positive definite (its Cholesky succeeds). Every other sample
(weakly active rows, opposite or duplicated rows, a degenerate vertex, a singular ``P``) is
differentiated by the CPU path's degenerate rules (:mod:`dxopt.qp.api.device` sends it
there), so the device path and the CPU path give the same gradient on every sample.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dxopt.qp.certify.dependence import count_dependent_dense
from dxopt.qp.certify.tolerances import (
    EVALUATION_ROUNDOFF,
    ROUNDOFF,
    STRONG_MULTIPLIER,
    WEAK_FACTOR,
    WEAK_FLOOR,
    relative_tolerance,
    row_floor,
    row_tolerance,
)
from dxopt.qp.certify.torch_ops import amax, dot, mv, rmv, wide

__all__ = ["certify", "infeasibility_masks", "polish_update", "regular"]


def certify(
    P: Tensor,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    G: Tensor,
    h: Tensor,
    x: Tensor,
    y: Tensor,
    z: Tensor,
    eps_abs: float,
    eps_rel: float,
    *,
    settled_only: bool = True,
) -> Tensor:
    """``(B,)`` mask of the samples whose ``(x, y, z)`` pass the CPU path's certificate and
    are settled (module docstring); ``z`` must be zero on the zero rows of ``G``.
    ``settled_only=False`` (``polish=False``) also accepts, as the CPU path does for an
    unpolished point, the duality-gap form :math:`\\sum_i (h_i - g_i^\\top x)_+\\nu_i \\le
    \\varepsilon_{abs} + r\\max(|x^\\top Px|, |q^\\top x|, |h^\\top\\nu|)` in place of the
    row-by-row complementarity."""
    P, q, A, b, G, h, x, y, z = wide(P, q, A, b, G, h, x, y, z)
    rel = relative_tolerance(eps_rel)
    px = mv(P, x)
    dual = px + q
    big = px.abs()
    fin = torch.isfinite(torch.cat([x, y, z], -1)).all(-1)
    ok = fin
    if A.shape[-2]:
        ax = mv(A, x)
        scale_e = torch.maximum(amax(ax), amax(b))[:, None]
        a_inf = A.abs().amax(-1)
        row_e = torch.maximum(mv(A.abs(), x.abs()), b.abs())
        tol_e = row_tolerance(eps_abs, rel, scale_e, row_e, a_inf)
        ok = ok & ((ax - b).abs() <= tol_e).all(-1)
        zero_a = a_inf == 0
        ok = ok & ~(zero_a & (b.abs() > eps_abs)).any(-1)
        at_mu = rmv(A, y)
        dual = dual + at_mu
        big = torch.maximum(big, at_mu.abs())
    if G.shape[-2]:
        gt_nu = rmv(G, z)
        dual = dual + gt_nu
        big = torch.maximum(big, gt_nu.abs())
    tol_d = eps_abs + rel * torch.maximum(amax(big), amax(q))
    # componentwise, with the round-off of the residual's own evaluation (tolerances.py)
    terms = mv(P.abs(), x.abs()) + q.abs()
    if A.shape[-2]:
        terms = terms + rmv(A.abs(), y.abs())
    if G.shape[-2]:
        terms = terms + rmv(G.abs(), z.abs())
    allowed = tol_d[..., None] + EVALUATION_ROUNDOFF * terms
    ok = ok & (dual.abs() <= allowed).all(-1)
    if G.shape[-2]:
        gx = mv(G, x)
        s = h - gx
        p_scale = torch.maximum(amax(gx), amax(h))[:, None]
        g_inf = G.abs().amax(-1)
        row = torch.maximum(mv(G.abs(), x.abs()), h.abs())
        tol_rows = row_tolerance(eps_abs, rel, p_scale, row, g_inf)
        ok = ok & ((-s).clamp_min(0.0) <= tol_rows).all(-1)
        tol_p = eps_abs + rel * p_scale + 1e-300  # complementarity: the common scale
        ok = ok & ~((g_inf == 0) & (h < -eps_abs)).any(-1)
        nu_g = z * g_inf
        ok = ok & ((-nu_g).clamp_min(0.0).amax(-1) <= tol_d)
        s_ratio = s.clamp_min(0.0) / tol_p
        settled = torch.minimum(s_ratio, nu_g.clamp_min(0.0) / tol_d[:, None]).amax(-1) <= 1.0
        if not settled_only:
            obj = torch.maximum((x * px).sum(-1).abs(), (q * x).sum(-1).abs())
            obj = torch.maximum(obj, (h * z).sum(-1).abs())
            gap = (s.clamp_min(0.0) * z.clamp_min(0.0)).sum(-1)
            settled = settled | (gap <= eps_abs + rel * obj)
        ok = ok & settled
    return ok


def polish_update(
    P: Tensor,
    q: Tensor,
    G: Tensor,
    h: Tensor,
    x: Tensor,
    z: Tensor,
    active: Tensor,
    *,
    eps_abs: float | None = None,
    eps_rel: float = 0.0,
) -> Tensor:
    """The next active set of the CPU polish's rule (:func:`~dxopt.qp.certify.polish.polish`, 3):
    drop the rows of ``active`` whose multiplier is negative beyond round-off, add the rows
    violated beyond round-off (``ROUNDOFF`` times the norm scales, independent of the
    requested tolerance), for the polished float64 point ``(x, z)``; with ``eps_abs``, also
    the tiny rows (:mod:`dxopt.qp.certify.tolerances`) violated beyond their own tolerance."""
    P, q, G, h, x, z = wide(P, q, G, h, x, z)
    gx = mv(G, x)
    s = h - gx
    g_inf = G.abs().amax(-1)
    p_scale = torch.maximum(amax(gx), amax(h)).clamp_min(1e-300)
    violated = (s < -ROUNDOFF * p_scale[:, None]) & ~active & (g_inf > 0)
    if eps_abs is not None:
        row = torch.maximum(mv(G.abs(), x.abs()), h.abs())
        tiny = row_floor(eps_abs, row, g_inf) < eps_abs
        if bool(tiny.any()):
            tol = row_tolerance(eps_abs, relative_tolerance(eps_rel), p_scale[:, None], row, g_inf)
            violated = violated | ((-s > tol) & tiny & ~active)
    nu_g = z * g_inf
    dual_scale = torch.maximum(torch.maximum(amax(mv(P, x)), amax(q)), amax(rmv(G, z)))
    dual_scale = torch.maximum(dual_scale, amax(nu_g)).clamp_min(1e-300)
    negative = active & (nu_g < -ROUNDOFF * dual_scale[:, None])
    return (active & ~negative) | violated


def regular(
    P: Tensor,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    G: Tensor,
    h: Tensor,
    x: Tensor,
    z: Tensor,
    active: Tensor,
) -> Tensor:
    """``(B,)`` mask of the samples whose polished active set ``active`` (B, m) is strictly
    complementary, satisfies LICQ with the equality rows, and whose ``P`` is positive
    definite (module docstring): where the device's exact active-set derivative is the
    derivative, the one the CPU path's rules give too."""
    P, q, A, b, G, h, x, z = wide(P, q, A, b, G, h, x, z)
    B = q.shape[0]
    tiny = torch.finfo(torch.float64).tiny
    ok = torch.linalg.cholesky_ex(P)[1] == 0
    eps = x.new_zeros(B)
    if A.shape[-2]:
        a_norm = torch.linalg.vector_norm(A, dim=-1).clamp_min(tiny)
        eps = torch.maximum(eps, amax((mv(A, x) - b) / a_norm))
    m = G.shape[-2]
    if m:
        ax = x.abs()
        g_inf = G.abs().amax(-1)
        nonzero = torch.linalg.vector_norm(G, dim=-1) > tiny
        x_inf = amax(x)[:, None]
        sigma_p = h.abs() + mv(G.abs(), ax) + g_inf * (1.0 + x_inf)
        rel_slack = (h - mv(G, x)) / sigma_p.clamp_min(tiny)
        nu_inf = z.clamp_min(0.0) * g_inf * nonzero
        dual_scale = (mv(P.abs(), ax) + q.abs()).amax(-1)
        dual_scale = torch.maximum(dual_scale, nu_inf.amax(-1)).clamp_min(tiny)
        comp = (rel_slack.clamp_min(0.0) * nu_inf).amax(-1) / dual_scale
        viol = torch.where(nonzero, (-rel_slack).clamp_min(0.0), 0.0).amax(-1)
        eps = torch.maximum(eps, torch.maximum(viol, comp))
        base = torch.clamp_min(WEAK_FACTOR * eps, WEAK_FLOOR)
        candidate = (rel_slack <= base[:, None]) & nonzero
        J = active & nonzero
        strong = J & (nu_inf > STRONG_MULTIPLIER * dual_scale[:, None])
        weak = (J | candidate) & ~strong & (nu_inf <= (base * dual_scale)[:, None])
        ok = ok & ~weak.any(-1)
        # the active rows first (zero rows pad samples with fewer): the Gram matrix of the
        # p + max|J| rows, not of all p + m
        k = int(J.sum(-1).amax()) if J.numel() else 0
        order = torch.argsort((~J).to(torch.int8), dim=-1, stable=True)[:, :k]
        rows = G.gather(1, order.unsqueeze(-1).expand(-1, -1, G.shape[-1]))
        C = torch.cat([A, rows * J.gather(1, order).unsqueeze(-1).to(G.dtype)], -2)
    else:
        C = A
    if C.shape[-2]:
        ok = ok & (count_dependent_dense(C) == 0)
    return ok


def infeasibility_masks(
    P: Tensor,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    G: Tensor,
    h: Tensor,
    x: Tensor,
    y: Tensor,
    z: Tensor,
    eps: float,
) -> tuple[Tensor, Tensor]:
    """Masks ``(B,)`` of the samples whose interior-point iterates ``(x, y, z)`` are primal /
    dual infeasibility certificates: scaled multipliers :math:`(\\hat y, \\hat z)` with
    :math:`\\|A^\top\\hat y + G^\top\\hat z\\|_\\infty \\le \\epsilon` and
    :math:`b^\top\\hat y + h^\top\\hat z < -\\epsilon` (primal), or a scaled direction
    :math:`\\hat x` with :math:`\\|P\\hat x\\|_\\infty, \\|A\\hat x\\|_\\infty,
    \\max_i (G\\hat x)_i \\le \\epsilon` and :math:`q^\top\\hat x < -\\epsilon` (dual)."""
    tiny = torch.finfo(q.dtype).tiny ** 0.5
    t = torch.maximum(amax(y), amax(z)).clamp_min(tiny)
    yh, zh = y / t[:, None], z / t[:, None]
    pinf = (amax(rmv(A, yh) + rmv(G, zh)) <= eps) & (dot(b, yh) + dot(h, zh) < -eps)
    xh = x / amax(x).clamp_min(tiny)[:, None]
    gx = mv(G, xh)
    gmax = gx.amax(-1) if gx.shape[-1] else torch.zeros_like(t)
    dinf = (amax(mv(P, xh)) <= eps) & (amax(mv(A, xh)) <= eps) & (gmax <= eps)
    return pinf, dinf & (dot(q, xh) < -eps)
