"""A batched primal-dual interior point in torch for cone programs with zero, nonnegative and
second-order cones: the ``"torch"`` attempt of the forward chain (:mod:`dxopt.conic.forward`).

It solves, for every sample of a batch at once (float64, CPU),

.. math:: \\min_x \\tfrac12 x^\\top Px + q^\\top x \\quad\\text{s.t.}\\quad
    A_E x = b_E,\\quad Gx + s = h,\\quad s \\in K,

where the zero-cone rows of :math:`Ax + s = b` are the equalities :math:`A_E x = b_E` and the
other rows :math:`(G, h)` meet a product :math:`K` of orthants and second-order cones (row
groups and cone algebra: :mod:`dxopt.conic.ipm_cones`). Nothing it returns is trusted: its
points go through :func:`dxopt.conic.certify.certify_points` (clean, polish, certify) like
Clarabel's, and the samples it does not solve go on to the next attempt.

**Method.** An infeasible-start primal-dual method with Nesterov-Todd scaling and Mehrotra's
predictor-corrector, in the form of Vandenberghe's "The CVXOPT linear and quadratic cone
program solvers" (2010), sec. 3 and 5. With the residuals
:math:`r_x = Px + q + A_E^\\top y + G^\\top z`, :math:`r_y = A_E x - b_E`,
:math:`r_z = Gx + s - h`, the scaled point :math:`\\lambda = Wz = W^{-1}s` and a
complementarity target :math:`r_c`, the Newton step solves
:math:`P\\Delta x + A_E^\\top\\Delta y + G^\\top\\Delta z = -r_x`, :math:`A_E\\Delta x = -r_y`,
:math:`G\\Delta x + \\Delta s = -r_z`, :math:`\\lambda\\circ(W\\Delta z + W^{-1}\\Delta s) = r_c`.
Eliminating :math:`\\Delta s` and :math:`\\Delta z` with :math:`\\tilde G = W^{-1}G` leaves

.. math:: \\begin{pmatrix} P + \\tilde G^\\top\\tilde G + \\Delta & A_E^\\top \\\\ A_E & 0
    \\end{pmatrix}\\begin{pmatrix}\\Delta x \\\\ \\Delta y\\end{pmatrix} =
    \\begin{pmatrix} -r_x - \\tilde G^\\top(W^{-1}r_z + \\lambda\\backslash r_c) \\\\ -r_y
    \\end{pmatrix},

factored once per iteration by the batched block elimination :func:`dxopt.linalg.schur_factor`
(Cholesky of the (1,1) block and of its Schur complement) and solved for the predictor
(:math:`r_c = -\\lambda\\circ\\lambda`) and the corrector
(:math:`r_c = -\\lambda\\circ\\lambda - \\Delta\\tilde s_a\\circ\\Delta\\tilde z_a + \\sigma\\mu e`,
:math:`\\sigma = (\\mu_a/\\mu)^3`); then :math:`W\\Delta z = \\tilde G\\Delta x + W^{-1}r_z +
\\lambda\\backslash r_c` and :math:`W^{-1}\\Delta s = \\lambda\\backslash r_c - W\\Delta z`.
The step is 0.99 of the way to the boundary (capped at 1), the same for primal and dual. The
shift (each diagonal entry times :math:`1 + 10^{-12}`, plus :math:`\\delta = 10^{-12}` times
the largest diagonal entry of the starting point's matrix: relative to each direction's own
scale, so that the growing entries of the scaled rows do not swamp the small ones) keeps the
Cholesky alive where
:math:`P + \\tilde G^\\top\\tilde G` is singular; the residuals are always those of the exact
problem, so it only makes a Newton step inexact. The starting point is CVXOPT's: the
solution of the Newton system with :math:`W = I`, shifted into the cone's interior.

**Stopping, per sample** (the batch shrinks to the running samples each iteration):
``"solved"`` when :math:`\\Vert (r_y, r_z)\\Vert_\\infty \\le \\epsilon(1 + \\text{primal scale})`,
:math:`\\Vert r_x\\Vert_\\infty \\le \\epsilon(1 + \\text{dual scale})` and
:math:`s^\\top z \\le \\epsilon(1 + |q^\\top x + \\tfrac12 x^\\top Px|)`; ``"infeasible"`` when
the full dual vector, normalised, :math:`\\hat y = y/\\Vert y\\Vert_\\infty`, has
:math:`\\Vert A^\\top\\hat y\\Vert_\\infty \\le \\epsilon` and :math:`b^\\top\\hat y < -\\epsilon`
(a Farkas certificate, re-checked by :func:`dxopt.conic.certify.certify_infeasible`);
``"failed"`` on a step shorter than :math:`10^{-10}`, a non-finite iterate or a failed
factorization; ``"max_iter"`` otherwise. Unboundedness is not detected here: such samples
run out of iterations and go on to Clarabel.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dxopt._core import DxoptError
from dxopt.conic.backends import RawPoints
from dxopt.conic.ipm_cones import IPMLayout, Scaling, ipm_layout, supported
from dxopt.conic.problem import ConicProblem
from dxopt.linalg import schur_factor

__all__ = ["MAX_ITER", "run_torch", "supported"]

MAX_ITER = 100
"""Iteration cap of the torch attempt (below the options' ``max_iter`` where that is larger):
these problems converge in tens of iterations; a sample still running here goes on to
Clarabel."""


REFINE = 1
"""Rounds of iterative refinement of the corrector's Newton solve against the unshifted
reduced matrix (near the solution :math:`\\tilde G^\\top\\tilde G` is ill-conditioned and
one unrefined solve leaves a dual residual well above round-off)."""


def _mv(M: Tensor, v: Tensor) -> Tensor:
    """:math:`Mv` per sample; a shared ``M`` (batch 1) is one matrix product, a batched one a
    broadcast multiply-and-sum (faster than ``bmm`` at these sizes on the CPU)."""
    if M.shape[0] == 1:
        return v @ M[0].mT
    return (M * v[:, None, :]).sum(-1)


def _rmv(M: Tensor, v: Tensor) -> Tensor:
    """:math:`M^\\top v` per sample (as :func:`_mv`)."""
    if M.shape[0] == 1:
        return v @ M[0]
    return (M * v[..., None]).sum(-2)


def _amax(v: Tensor) -> Tensor:
    return v.abs().amax(-1) if v.shape[-1] else v.new_zeros(v.shape[:-1])


class _Data:
    """The problem data of the running samples (``P``, ``A_E``, ``G`` keep a batch of 1 when
    shared)."""

    def __init__(self, P: Tensor, q: Tensor, AE: Tensor, bE: Tensor, G: Tensor, h: Tensor):
        self.P, self.q, self.AE, self.bE, self.G, self.h = P, q, AE, bE, G, h

    def take(self, keep: Tensor) -> _Data:
        pick = lambda M: M if M.shape[0] == 1 else M[keep]  # noqa: E731
        return _Data(pick(self.P), self.q[keep], pick(self.AE), self.bE[keep], pick(self.G),
                     self.h[keep])  # fmt: skip


def _factor(H: Tensor, AE: Tensor) -> tuple[object, Tensor]:
    """:func:`schur_factor` of ``[[H, AE'], [AE, 0]]`` and the mask of samples whose ``H`` did
    not factor (their ``H`` replaced by ``I`` so the others go on; their steps are dropped)."""
    B = H.shape[0]
    AE = AE.expand(B, -1, -1)
    f = schur_factor(H, AE)
    bad = torch.zeros(B, dtype=torch.bool)
    if f is None:
        bad = torch.linalg.cholesky_ex(H).info != 0
        H = torch.where(bad[:, None, None], torch.eye(H.shape[-1], dtype=H.dtype), H)
        f = schur_factor(H, AE)
        if f is None:
            return None, torch.ones(B, dtype=torch.bool)
    return f, bad


SHIFT = 1e-12
"""Relative shift of the Newton matrix (module doc)."""


def _newton_matrix(P: Tensor, Gt: Tensor, floor: Tensor) -> Tensor:
    """:math:`P + \\tilde G^\\top\\tilde G` with its diagonal times :math:`1 + 10^{-12}` plus
    ``floor`` (per sample)."""
    H = P + Gt.mT @ Gt
    diag = H.diagonal(dim1=-2, dim2=-1)
    diag.mul_(1.0 + SHIFT).add_(floor[:, None])
    return H


def _initial_point(lay: IPMLayout, d: _Data) -> tuple[Tensor, ...]:
    """CVXOPT's start: the ``W = I`` Newton system, then both cone parts shifted inside."""
    B = d.q.shape[0]
    H = d.P.expand(B, -1, -1) + (d.G.mT @ d.G).expand(B, -1, -1)
    big = H.diagonal(dim1=-2, dim2=-1).amax(-1)
    floor = SHIFT * torch.where(big > 0, big, torch.ones_like(big))
    H.diagonal(dim1=-2, dim2=-1).mul_(1.0 + SHIFT).add_(floor[:, None])
    f, bad = _factor(H, d.AE)
    if f is None:
        raise _NoFactor
    x, y = f.solve(-d.q + _rmv(d.G, d.h), d.bE)  # type: ignore[attr-defined]
    zt = _mv(d.G, x) - d.h
    e = lay.identity(B, x.dtype)

    def inside(v: Tensor) -> Tensor:
        a = -lay.min_eig(v)
        return torch.where((a < 0)[:, None], v, v + (1.0 + a)[:, None] * e)

    return x, y, inside(-zt), inside(zt), bad, floor


class _NoFactor(DxoptError):
    """The reduced Newton system of some sample could not be factored (caught inside
    :func:`run_torch`: those samples are handed on to the next attempt)."""


def _step_both(lay: IPMLayout, lam2: Tensor, ds: Tensor, dz: Tensor) -> Tensor:
    """The common largest step of ``ds`` and ``dz`` from ``lam`` (``lam2`` = ``lam`` twice:
    one batched call)."""
    a = lay.max_step(lam2, torch.cat([ds, dz]))
    B = ds.shape[0]
    return torch.minimum(a[:B], a[B:])


def interior_point(
    lay: IPMLayout, d: _Data, *, tol: float, max_iter: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[str], list[int]]:
    """The iteration of the module doc on every sample; returns ``x``, the equality
    multipliers, ``z``, ``s`` (cone rows in the layout's order), claims and iterations."""
    B, n = d.q.shape
    mE, mK = d.bE.shape[1], lay.m_cone
    f64 = d.q.dtype
    out_x, out_y = (
        torch.full((B, n), float("nan"), dtype=f64),
        torch.full((B, mE), float("nan"), dtype=f64),
    )
    out_z, out_s = (torch.full((B, mK), float("nan"), dtype=f64) for _ in range(2))
    claims, iters = ["max_iter"] * B, [0] * B
    try:
        x, y, s, z, bad, floor = _initial_point(lay, d)
    except _NoFactor:
        return out_x, out_y, out_z, out_s, ["failed"] * B, iters
    live = torch.arange(B)
    deg = max(lay.degree, 1)
    e = lay.identity(B, f64)
    bscale = torch.maximum(_amax(d.h), _amax(d.bE))
    qscale = _amax(d.q)

    def finish(mask: Tensor, claim: str, k: int) -> None:
        idx = live[mask]
        out_x[idx], out_y[idx], out_z[idx], out_s[idx] = x[mask], y[mask], z[mask], s[mask]
        for i in idx.tolist():
            claims[i], iters[i] = claim, k

    fail_now = bad
    for k in range(max_iter + 1):
        Px, Gx, AEx = _mv(d.P, x), _mv(d.G, x), _mv(d.AE, x)
        Gz, AEy = _rmv(d.G, z), _rmv(d.AE, y)
        rx, ry, rz = Px + d.q + AEy + Gz, AEx - d.bE, Gx + s - d.h
        pres = torch.maximum(_amax(ry), _amax(rz))
        pscale = torch.stack([bscale, _amax(Gx), _amax(AEx), _amax(s)]).amax(0)
        dscale = torch.stack([qscale, _amax(Px), _amax(Gz), _amax(AEy)]).amax(0)
        gap = (s * z).sum(-1)
        obj = (d.q * x).sum(-1) + 0.5 * (x * Px).sum(-1)
        solved = (pres <= tol * (1 + pscale)) & (_amax(rx) <= tol * (1 + dscale))
        solved &= gap <= tol * (1 + obj.abs())
        # Farkas: y_full = (y, z) normalised, A'y_hat ~ 0 and b'y_hat < 0
        ynorm = torch.maximum(_amax(y), _amax(z)).clamp_min(1e-300)
        aty = _amax(AEy + Gz) / ynorm
        bty = ((d.bE * y).sum(-1) + (d.h * z).sum(-1)) / ynorm
        infeas = ~solved & (aty <= tol) & (bty < -tol)
        finite = torch.isfinite(torch.cat([x, y, z, s], -1)).all(-1)
        failed = ~solved & ~infeas & (fail_now | ~finite)
        stop = solved | infeas | failed
        if k == max_iter:
            break
        if bool(stop.any()):
            for mask, claim in ((solved, "solved"), (infeas, "infeasible"), (failed, "failed")):
                if bool(mask.any()):
                    finish(mask, claim, k)
            keep = ~stop
            if not bool(keep.any()):
                return out_x, out_y, out_z, out_s, claims, iters
            live, d = live[keep], d.take(keep)
            x, y, z, s, rx, ry, rz = (t[keep] for t in (x, y, z, s, rx, ry, rz))
            e, bscale, qscale, gap = e[keep], bscale[keep], qscale[keep], gap[keep]
            floor = floor[keep]
        W = Scaling(lay, s, z)
        lam = W.lam
        Gt = W.inv(d.G.expand(x.shape[0], -1, -1))
        f, bad = _factor(_newton_matrix(d.P, Gt, floor), d.AE)
        if f is None:
            fail_now = torch.ones(x.shape[0], dtype=torch.bool)
            continue
        Wrz = W.inv(rz)

        def step(lr: Tensor, refine: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            # lr = lambda \ r_c
            r1, r2 = -rx - _rmv(Gt, Wrz + lr), -ry  # noqa: B023
            dx, dy = f.solve(r1, r2)  # type: ignore[attr-defined]  # noqa: B023
            for _ in range(refine):  # against the unshifted matrix P + Gt'Gt
                e1 = r1 - _mv(d.P, dx) - _rmv(Gt, _mv(Gt, dx)) - _rmv(d.AE, dy)  # noqa: B023
                cx, cy = f.solve(e1, r2 - _mv(d.AE, dx))  # type: ignore[attr-defined]  # noqa: B023
                dx, dy = dx + cx, dy + cy
            dzt = _mv(Gt, dx) + Wrz + lr  # noqa: B023
            return dx, dy, dzt, lr - dzt

        mu = gap / deg
        lam2 = torch.cat([lam, lam])
        dx, dy, dzt, dst = step(-lam, 0)
        a_aff = _step_both(lay, lam2, dst, dzt).clamp(max=1.0)
        mu_aff = ((lam + a_aff[:, None] * dst) * (lam + a_aff[:, None] * dzt)).sum(-1) / deg
        sigma = (mu_aff / mu.clamp_min(1e-300)).clamp(0.0, 1.0) ** 3
        corr = (sigma * mu)[:, None] * e - lay.jordan(dst, dzt)
        dx, dy, dzt, dst = step(-lam + lay.jordan_solve(lam, corr), REFINE)
        alpha = (0.99 * _step_both(lay, lam2, dst, dzt)).clamp(max=1.0)
        a = alpha[:, None]
        nx, ny = x + a * dx, y + a * dy
        ns, nz = s + a * W.fwd(dst), z + a * W.inv(dzt)
        fine = torch.isfinite(torch.cat([nx, ny, ns, nz], -1)).all(-1) & ~bad
        fine &= (lay.min_eig(ns) > 0) & (lay.min_eig(nz) > 0) & (alpha >= 1e-10)
        move = fine[:, None]
        x, y = torch.where(move, nx, x), torch.where(move, ny, y)
        s, z = torch.where(move, ns, s), torch.where(move, nz, z)
        fail_now = ~fine
    for mask, claim in ((solved, "solved"), (infeas, "infeasible"), (failed, "failed")):
        if bool(mask.any()):
            finish(mask, claim, k)
    rest = ~stop
    if bool(rest.any()):
        finish(rest, "max_iter", k)
    return out_x, out_y, out_z, out_s, claims, iters


def run_torch(prob: ConicProblem, index: list[int], tol: float, max_iter: int) -> RawPoints:
    """The interior point of the module doc on the samples ``index`` (all cones
    :func:`supported`; otherwise every sample is claimed ``"failed"`` without work)."""
    k, n, m = len(index), prob.n, prob.m
    if not supported(prob.cones):
        nan = np.full
        return RawPoints(index, ["failed"] * k, nan((k, n), np.nan), nan((k, m), np.nan),
                         nan((k, m), np.nan), [0] * k)  # fmt: skip
    lay = ipm_layout(prob.cones, prob.slices)
    idx = torch.as_tensor(index, dtype=torch.long)
    pick = lambda M: M if M.shape[0] == 1 else M[idx]  # noqa: E731
    P, A = pick(prob.P), pick(prob.A)
    q, b = prob.q[idx], prob.b[idx]
    data = _Data(P, q, A[:, lay.eq], b[:, lay.eq], A[:, lay.cone], b[:, lay.cone])
    x, yE, z, s, claims, iters = interior_point(
        lay, data, tol=tol, max_iter=min(max_iter, MAX_ITER)
    )
    Y = torch.zeros(k, m, dtype=torch.float64)
    S = torch.zeros(k, m, dtype=torch.float64)
    Y[:, lay.eq], Y[:, lay.cone] = yE, z
    S[:, lay.cone] = s
    bad = torch.isnan(x).any(-1)
    Y[bad], S[bad] = float("nan"), float("nan")
    return RawPoints(index, claims, x.numpy(), Y.numpy(), S.numpy(), iters)
