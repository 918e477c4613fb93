"""Implicit differentiation of a certified cone program (the reverse and the forward mode).

At a certified point :math:`F(x, w; P, q, A, b) = 0` (:mod:`dxopt.conic.kkt`), so
:math:`d(x, w) = -J^{-1}\\, \\partial F`, with

.. math::

    \\partial F = \\begin{pmatrix} dP\\, x + dA^\\top y + dq \\\\ dA\\, x - db \\end{pmatrix},
    \\qquad dy = D\\, dw,\\quad ds = (D - I)\\, dw .

**Reverse mode**: the cotangents :math:`(\\bar x, \\bar y, \\bar s)` give
:math:`g = (\\bar x,\\ D^\\top(\\bar y + \\bar s) - \\bar s)`; solve :math:`J^\\top u = g`,
:math:`u = (u_x, u_w)`; then :math:`\\bar q = -u_x`, :math:`\\bar b = u_w`,
:math:`\\bar P = -\\tfrac12(u_x x^\\top + x u_x^\\top)` (``P`` enters symmetrised) and
:math:`\\bar A = -(y u_x^\\top + u_w x^\\top)`; shared inputs sum over the batch.

**Kinks** (a sample the forward reported ``DEGENERATE``): ``D`` is built by each cone's
one-sided rule (:meth:`dxopt.conic.cones.base.Cone.dproject_dual_snapped`, the adjoining piece
of smaller rank: a weakly active row or face is taken as inactive), the derivative for
perturbations that move the point off the kink onto that side; a
:class:`~dxopt.conic.types.ConicDegenerateWarning` says so.

**The linear solve**: a batched float64 LU of ``J`` (the polish's LU of a nearby Jacobian
where :data:`REUSE_RHO` allows) with refinement against the exact ``J`` to round-off
(:func:`dxopt.conic.kkt.solve_refined`), checked per sample, and Hager's estimate of
:math:`\\kappa_1(J)`. Where the refined residual misses round-off or
:math:`\\kappa_1(J) >` :data:`COND_MAX` (a singular Jacobian: non-unique solutions, a kink the
rule could not resolve) the adjoint is the minimum-norm least-squares solution
:math:`u = (J^\\top)^+ g` (LAPACK's SVD-based ``gelsd``, singular values below
:data:`PINV_RTOL` times the largest dropped), the sample is flagged ``singular`` in
:class:`~dxopt.conic.types.ConicBackwardInfo` and a
:class:`~dxopt.conic.types.ConicDegenerateWarning` is issued. A ``J`` singular only through
decoupled variables (a zero row and column once the inactive rows are eliminated, as the
free epigraph variable of an inactive ``abs`` bound) gets the same minimum-norm solution
exactly from one LU of its reduced system (:mod:`dxopt.conic.reduce`), where that system's
:math:`\\kappa_1 \\le` :data:`COND_MAX` and its refined residual is at round-off; it is flagged
``singular`` (condition ``inf``) the same way. Failed samples give zero
gradient.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
from torch import Tensor

from dxopt.conic.certify import PolishFactor, structurally_singular, subset
from dxopt.conic.cones._surface import ProjectionMemo, memo_scope
from dxopt.conic.forward import ForwardState, kink_scale
from dxopt.conic.kkt import (
    EPS,
    ROUNDOFF,
    LUSolve,
    condition_1,
    cone_jacobian,
    jacobian,
    lu_factor_finite,
    lu_storage,
    solve_refined,
    take,
)
from dxopt.conic.polish import zero_rows_singular
from dxopt.conic.reduce import Reduction, reduce_jacobian, reduced_solve
from dxopt.conic.types import ConicBackwardInfo, ConicDegenerateWarning

__all__ = ["COND_MAX", "PINV_RTOL", "REUSE_RHO", "adjoint_gradients", "tangents"]

COND_MAX = 1e-4 / EPS
"""Above this estimated :math:`\\kappa_1(J)` (about 4.5e11) the LU solution's forward error
bound :math:`\\kappa\\,\\epsilon` exceeds 1e-4: the Jacobian counts as singular."""
PINV_RTOL = 1e-10
"""Relative cut-off of the singular values in the minimum-norm adjoint."""


REUSE_RHO = 0.1
"""The polish's LU of :math:`J_0` serves as the backward's factor of :math:`J` only where
:math:`\\rho = \\Vert J_0^{-1}\\Vert_1 \\Vert J - J_0\\Vert_1 \\le` this (estimated from
Hager's :math:`\\Vert J_0^{-1}\\Vert_1` and the bound
:math:`\\Vert J - J_0\\Vert_1 \\le (\\Vert A\\Vert_\\infty + 1) \\Vert D - D_0\\Vert_1`):
then the refinement contracts by about :math:`\\rho` per round and
:math:`\\kappa_1(J)` is within a factor :math:`(1 \\pm \\rho)` of the estimate."""


class _System:
    """``J``, ``D`` and the LU of the certified samples, built once per forward state.

    The LU is the polish's last one (:class:`dxopt.conic.certify.PolishFactor`) where it is
    close enough to ``J`` (:data:`REUSE_RHO`; the refined solve is checked against the exact
    ``J`` either way) and a fresh one otherwise; a ``J`` with a zero row or column is not
    factored (condition ``inf``: the minimum-norm adjoint)."""

    def __init__(self, state: ForwardState):
        prob = state.prob
        self.idx = torch.nonzero(state.ok).flatten().tolist()
        P, _, A, _ = subset(prob, self.idx)
        self.A = A
        ix = torch.as_tensor(self.idx, dtype=torch.long)
        w = state.w[ix]
        scale = state.cache.get("kink_scale")
        if scale is None:
            scale = kink_scale(prob, state.x, state.w, y=state.y)
        atol = state.options.kink_tol * scale[ix]
        self.D = cone_jacobian(prob.cones, prob.slices, w, atol)
        self.J = jacobian(P, A, self.D, cones=prob.cones, slices=prob.slices)
        k, N = self.J.shape[0], self.J.shape[-1]
        old: PolishFactor | None = state.cache.get("polish_factor")
        reuse = take(old.has, ix) if old is not None else torch.zeros(k, dtype=torch.bool)
        # a J with a zero row or column is not factored (reused LUs: checked by REUSE_RHO)
        dead = torch.zeros_like(reuse)
        zrows: Tensor | None = None  # J's zero rows where every sample's were tested
        if not bool(reuse.any()):
            zrows, dead = zero_rows_singular(self.J)
        elif not bool(reuse.all()):
            dead[~reuse] = structurally_singular(self.J[~reuse])
        if old is not None and bool(reuse.all()):
            LU, piv = take(old.LU, ix), take(old.piv, ix)
        else:
            LU = lu_storage(k, N, self.J)
            LU[:] = torch.eye(N, dtype=self.J.dtype)
            piv = torch.arange(1, N + 1, dtype=torch.int32).repeat(k, 1)
            self._factor(LU, piv, ~reuse & ~dead)
            if old is not None and bool(reuse.any()):
                LU[reuse], piv[reuse] = old.LU[ix[reuse]], old.piv[ix[reuse]].to(piv.dtype)
        self.factor = (LU, piv)
        # a J with a zero row or column has condition inf (set below): no estimate where
        # every sample's is one
        cond = condition_1(self.J, self.factor) if not bool(dead.all()) else None
        if cond is None:
            cond = self.J.new_full((k,), float("inf"))
        if old is not None and bool(reuse.any()):
            # rho = ||J0^-1||_1 ||J - J0||_1 (module constant REUSE_RHO)
            norm_j = torch.linalg.vector_norm(self.J, 1, dim=-2).amax(dim=-1)
            inv_norm = cond / torch.where(norm_j > 0, norm_j, torch.ones_like(norm_j))
            a_inf = A.abs().sum(dim=-1).amax(dim=-1)
            dD = torch.linalg.vector_norm(self.D - old.D[ix], 1, dim=-2).amax(-1)
            rho = inv_norm * (a_inf + 1) * dD
            redo = reuse & ~(rho <= REUSE_RHO)
            if bool(redo.any()):
                self._factor(LU, piv, redo)
                cond[redo] = condition_1(self.J[redo], (LU[redo], piv[redo]))
            self.reused = reuse & ~redo
        else:
            self.reused = torch.zeros(k, dtype=torch.bool)
        cond[dead] = float("inf")
        self.cond = cond
        self._structural(A, prob.n, dead, zrows)
        self.kink = torch.tensor([state.info.kink[i] for i in self.idx], dtype=torch.bool)

    def _structural(self, A: Tensor, n: int, dead: Tensor, zrows: Tensor | None) -> None:
        """The samples whose ``J`` is singular only through decoupled variables
        (:mod:`dxopt.conic.reduce`): their reduced system's LU and condition estimate
        (``zrows``: ``J``'s zero rows, where known)."""
        self.zsel: Tensor | None = None
        cand = torch.nonzero(dead).flatten()
        if not cand.numel():
            return

        def rows(sel: Tensor) -> Tensor:
            return A if A.shape[0] == 1 else A[sel]

        def reduction(sel: Tensor) -> tuple[Reduction, Tensor, Tensor]:
            zr = None if zrows is None else take(zrows, sel)
            return reduce_jacobian(take(self.J, sel), take(self.D, sel), rows(sel), n, zero_rows=zr)

        red, Jr, _ = reduction(cand)
        keep = red.has_z & ~structurally_singular(Jr)
        if not bool(keep.any()):
            return
        if not bool(keep.all()):
            cand = cand[keep]
            red, Jr, _ = reduction(cand)
            keep = torch.ones(cand.numel(), dtype=torch.bool)
        self.zsel, self.zred, self.zJ = cand[keep], red, Jr
        LU, piv, _ = lu_factor_finite(Jr)
        self.zfactor = (LU, piv)
        self.zcond = condition_1(Jr, self.zfactor)

    def refactor(self, sel: Tensor) -> None:
        """A fresh LU (and condition estimate) for the samples ``sel`` (indices)."""
        mask = torch.zeros_like(self.reused)
        mask[sel] = True
        LU, piv = self.factor
        self._factor(LU, piv, mask)
        self.cond[sel] = condition_1(self.J[sel], (LU[sel], piv[sel]))
        self.reused[sel] = False

    def _factor(self, LU: Tensor, piv: Tensor, sel: Tensor) -> None:
        if bool(sel.any()):
            LU_s, piv_s, _ = lu_factor_finite(self.J[sel])
            LU[sel], piv[sel] = LU_s, piv_s.to(piv.dtype)


def _refined(sys: _System, sel: Tensor, rhs: Tensor, adjoint: bool) -> LUSolve:
    LU, piv = sys.factor
    factor = (take(LU, sel), take(piv, sel))
    target = EPS if bool(sys.reused[sel].any()) else ROUNDOFF
    J, r = take(sys.J, sel), take(rhs, sel)
    return solve_refined(J, r, adjoint=adjoint, factor=factor, target=target)[0]


def _system(state: ForwardState) -> _System:
    sys = state.cache.get("system")
    if sys is None:
        # the forward's projections (its last point's, from the kink test) serve D
        memo = state.cache.get("projection_memo")
        with memo_scope(ProjectionMemo() if memo is None else memo):
            sys = _System(state)
        state.cache["system"] = sys
    return sys


def _solve(state: ForwardState, sys: _System, rhs: Tensor, *, adjoint: bool) -> Tensor:
    """The refined LU solve where :math:`\\kappa_1(J) \\le` :data:`COND_MAX`, the
    minimum-norm least-squares solution (``gelsd``, the SVD cut at :data:`PINV_RTOL`) where
    it is not or the refinement misses round-off."""
    k = rhs.shape[0]
    z = torch.zeros_like(rhs)
    residual = rhs.new_full((k,), float("inf"))
    singular = ~(sys.cond <= COND_MAX)
    steps = 0
    regular = torch.nonzero(~singular).flatten()
    if regular.numel():
        sol = _refined(sys, regular, rhs, adjoint)
        z[regular], residual[regular], steps = sol.z, sol.residual, sol.steps
        was_reused = sys.reused[regular].clone()
        singular[regular] = ~sol.ok & ~was_reused
        miss = regular[~sol.ok & was_reused]
        if miss.numel():
            # the reused LU did not get there: a fresh LU of the exact J before giving up
            sys.refactor(miss)
            again = miss[sys.cond[miss] <= COND_MAX]
            if again.numel():
                sol2 = _refined(sys, again, rhs, adjoint)
                z[again], residual[again] = sol2.z, sol2.residual
                steps = max(steps, sol2.steps)
                singular[again] = ~sol2.ok
            singular[miss[~(sys.cond[miss] <= COND_MAX)]] = True
    if sys.zsel is not None and bool(singular.any()):
        done = _structural_solve(sys, rhs, adjoint, z, residual, singular)
        singular[sys.zsel] = True
        todo = singular.clone()
        todo[done] = False
    else:
        todo = singular
    if bool(todo.any()):
        sel = torch.nonzero(todo).flatten()
        M = sys.J[sel].transpose(-1, -2) if adjoint else sys.J[sel]
        z[sel] = torch.linalg.lstsq(
            M, rhs[sel][..., None], rcond=PINV_RTOL, driver="gelsd"
        ).solution[..., 0]
        Mz = (M @ z[sel][..., None])[..., 0]
        scale = torch.linalg.vector_norm(M, 1, dim=-1).amax(-1) * z[sel].abs().amax(-1) + rhs[
            sel
        ].abs().amax(-1)
        residual[sel] = (rhs[sel] - Mz).abs().amax(-1) / torch.clamp(scale, min=EPS)
    _record(state, sys, residual, singular, steps)
    return z


def _structural_solve(
    sys: _System, rhs: Tensor, adjoint: bool, z: Tensor, residual: Tensor, singular: Tensor
) -> Tensor:
    """The minimum-norm least-squares solution of the samples ``sys.zsel`` through their
    reduced system (:mod:`dxopt.conic.reduce`; exact where :math:`\\kappa_1(J_R) \\le`
    :data:`COND_MAX` and the refined solve of :math:`J_R` is at round-off), written into
    ``z`` and ``residual``; returns the indices it solved."""
    assert sys.zsel is not None
    zs = sys.zsel
    good = (sys.zcond <= COND_MAX) & singular[zs]
    if not bool(good.any()):
        return zs[:0]
    gi = torch.nonzero(good).flatten()
    red = _subset_reduction(sys.zred, gi)
    Jr, LU, piv = sys.zJ[gi], sys.zfactor[0][gi], sys.zfactor[1][gi]
    ok = torch.ones(gi.numel(), dtype=torch.bool)

    def solve_r(r: Tensor) -> Tensor:
        sol = solve_refined(Jr, r, adjoint=adjoint, factor=(LU, piv))[0]
        ok.copy_(sol.ok)
        return sol.z

    idx = zs[gi]
    A = sys.A if sys.A.shape[0] == 1 else sys.A[idx]
    zz = reduced_solve(red, A, rhs[idx], solve_r, adjoint=adjoint)
    M = sys.J[idx].transpose(-1, -2) if adjoint else sys.J[idx]
    Mz = (M @ zz[..., None])[..., 0]
    scale = torch.linalg.vector_norm(M, 1, dim=-1).amax(-1) * zz.abs().amax(-1) + rhs[
        idx
    ].abs().amax(-1)
    res = (rhs[idx] - Mz).abs().amax(-1) / torch.clamp(scale, min=EPS)
    done = idx[ok]
    z[done], residual[done] = zz[ok], res[ok]
    return done


def _subset_reduction(red: Reduction, sel: Tensor) -> Reduction:
    if sel.numel() == red.perm.shape[0]:
        return red
    pick = [None if t is None else t[sel] for t in (red.zidx, red.C, red.G_chol)]
    return dataclasses.replace(
        red,
        perm=red.perm[sel],
        count=red.count[sel],
        idx=red.idx[sel],
        pad=red.pad[sel],
        E=red.E[sel],
        Z=red.Z[sel],
        zidx=pick[0],
        C=pick[1],
        G_chol=pick[2],
    )


def _record(state: ForwardState, sys: _System, residual: Tensor, singular: Tensor, steps: int):
    B = state.prob.batch
    res, sing, cond = [0.0] * B, [False] * B, [float("nan")] * B
    rl, sl, cl = residual.tolist(), singular.tolist(), sys.cond.tolist()
    for j, i in enumerate(sys.idx):
        res[i], sing[i], cond[i] = rl[j], sl[j], cl[j]
    bi: ConicBackwardInfo = state.info.backward
    bi.linear_solver, bi.residual, bi.refinement_steps = "lu", tuple(res), steps
    bi.singular, bi.condition = tuple(sing), tuple(cond)
    bad = (singular | sys.kink).tolist()
    warn_flagged([i for j, i in enumerate(sys.idx) if bad[j]], stacklevel=4)


def warn_flagged(flagged: list[int], *, stacklevel: int) -> None:
    """The one :class:`ConicDegenerateWarning` of both routes for the samples ``flagged``
    (a one-sided derivative at a kink, or the minimum-norm one of a singular Jacobian)."""
    if flagged:
        warnings.warn(
            "dxopt.conic: the derivative of samples "
            f"{flagged[:10]}{'...' if len(flagged) > 10 else ''} is one-sided (a cone kink: "
            "a weakly active face taken as inactive) or, where the Jacobian is singular, the "
            "minimum-norm solution; see sol.info.kink and sol.info.backward",
            ConicDegenerateWarning,
            stacklevel=stacklevel + 1,
        )


def adjoint_gradients(
    state: ForwardState, gx: Tensor, gy: Tensor, gs: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(gP, gq, gA, gb)`` per sample, float64, shapes ``(B, n, n), (B, n), (B, m, n),
    (B, m)`` (the caller sums shared inputs); failed samples get zeros."""
    prob = state.prob
    B, n, m = prob.batch, prob.n, prob.m
    f64 = torch.float64
    gP, gq = torch.zeros(B, n, n, dtype=f64), torch.zeros(B, n, dtype=f64)
    gA, gb = torch.zeros(B, m, n, dtype=f64), torch.zeros(B, m, dtype=f64)
    sys = _system(state)
    if not sys.idx:
        return gP, gq, gA, gb
    ix = torch.as_tensor(sys.idx, dtype=torch.long)
    gx, gy, gs = gx[ix], gy[ix], gs[ix]
    gw = (sys.D.transpose(-1, -2) @ (gy + gs)[..., None])[..., 0] - gs
    u = _solve(state, sys, torch.cat([gx, gw], dim=-1), adjoint=True)
    ux, uw = u[:, :n], u[:, n:]
    x, y = state.x[ix], state.y[ix]
    outer = ux[:, :, None] * x[:, None, :]
    gP[ix] = -0.5 * (outer + outer.transpose(-1, -2))
    gq[ix] = -ux
    gA[ix] = -(y[:, :, None] * ux[:, None, :] + uw[:, :, None] * x[:, None, :])
    gb[ix] = uw
    return gP, gq, gA, gb


def tangents(
    state: ForwardState, dP: Tensor, dq: Tensor, dA: Tensor, db: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Forward mode: ``(dx, dy, ds)`` for the tangents ``dP (BP, n, n), dq (B, n), dA (BA, m,
    n), db (B, m)`` (float64; zeros for failed samples)."""
    prob = state.prob
    B, n, m = prob.batch, prob.n, prob.m
    f64 = torch.float64
    dx, dy, ds = (
        torch.zeros(B, n, dtype=f64),
        torch.zeros(B, m, dtype=f64),
        torch.zeros(B, m, dtype=f64),
    )
    sys = _system(state)
    if not sys.idx:
        return dx, dy, ds
    ix = torch.as_tensor(sys.idx, dtype=torch.long)
    x, y = state.x[ix], state.y[ix]
    dPs = dP if dP.shape[0] == 1 else dP[ix]
    dAs = dA if dA.shape[0] == 1 else dA[ix]
    dPs = 0.5 * (dPs + dPs.transpose(-1, -2))
    f1 = (dPs @ x[..., None])[..., 0] + (dAs.transpose(-1, -2) @ y[..., None])[..., 0] + dq[ix]
    f2 = (dAs @ x[..., None])[..., 0] - db[ix]
    z = -_solve(state, sys, torch.cat([f1, f2], dim=-1), adjoint=False)
    dw = z[:, n:]
    Ddw = (sys.D @ dw[..., None])[..., 0]
    dx[ix], dy[ix], ds[ix] = z[:, :n], Ddw, Ddw - dw
    return dx, dy, ds
