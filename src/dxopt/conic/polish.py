"""The Newton polish of a backend's point: safeguarded Newton, chord and regularised steps on
:math:`F(x, w) = 0` (:mod:`dxopt.conic.kkt`), the first step of
:mod:`dxopt.conic.certify`'s certificate.

Each round builds the Jacobian ``J`` of the samples not yet at round-off and takes the
plain Newton step, the minimum-norm step through the reduced system where ``J`` is singular
through decoupled variables only (:mod:`dxopt.conic.reduce`), or the regularised step of
:math:`J + \\delta I` where the plain one fails; from the second round on, a sample first
tries chord steps with the factor its last round kept (plain, reduced or regularised), which
near a regular solution contract as fast as a Newton step without a new Jacobian or LU.
Every step is kept only where it lowers :math:`\\Vert F\\Vert_\\infty`
(:func:`polish`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt.conic.kkt import (
    EPS,
    cone_jacobian,
    jacobian,
    lu_factor_finite,
    lu_storage,
    project_dual,
    residual_map,
    take,
)
from dxopt.conic.problem import ConicProblem
from dxopt.conic.reduce import Reduction, reduce_jacobian, reduced_solve, zero_lines

__all__ = [
    "CHORD_GAIN",
    "CHORD_STEPS",
    "POLISH_ROUNDOFF",
    "POLISH_SHIFT",
    "POLISH_STEPS",
    "PolishFactor",
    "matvec",
    "max_abs",
    "polish",
    "structurally_singular",
    "zero_rows_singular",
]

POLISH_STEPS = 3
"""Most Newton steps of the polish (each one batched LU of ``J``, on the samples not yet at
round-off; a regular point gets there in one step from an interior-point solution)."""
POLISH_ROUNDOFF = 1e2 * EPS
"""A sample's polish stops once :math:`\\Vert F\\Vert_\\infty` is below this times the
largest of :math:`\\Vert Px\\Vert_\\infty, \\Vert A^\\top y\\Vert_\\infty,
\\Vert q\\Vert_\\infty, \\Vert Ax\\Vert_\\infty, \\Vert s\\Vert_\\infty,
\\Vert b\\Vert_\\infty`."""
CHORD_GAIN = 1e-3
"""A chord step (the previous round's LU, no new Jacobian) is kept where it brings
:math:`\\Vert F\\Vert_\\infty` to round-off or lowers it by this factor at least (what a
Newton step achieves from an interior-point point); elsewhere the round takes a Newton
step."""
CHORD_STEPS = 3
"""Most chord steps per polish round."""
POLISH_SHIFT = 1e-10
"""The regularised polish step's :math:`\\delta / \\Vert J\\Vert_\\infty`."""


def matvec(M: Tensor, v: Tensor) -> Tensor:
    """``M v`` over batches (``M`` ``(k, r, c)`` broadcast, ``v`` ``(k, c)``)."""
    return (M @ v[..., None])[..., 0]


def max_abs(v: Tensor) -> Tensor:
    """:math:`\\Vert v\\Vert_\\infty` over the last axis (0 for an empty one)."""
    return v.abs().amax(dim=-1) if v.shape[-1] else v.new_zeros(v.shape[:-1])


@dataclass(frozen=True)
class PolishFactor:
    """The LU of the polish's last plain (unshifted) Jacobian per sample, kept for the
    backward (:mod:`dxopt.conic.backward` uses it as the factor of its refined solve where
    it is close enough to the Jacobian at the returned point, and refactors otherwise).

    ``has[i]`` is False where sample ``i`` got no such LU (no polish step, a non-finite or
    rejected plain step); ``D`` is the cone Jacobian the factored ``J`` was built from."""

    has: Tensor
    LU: Tensor
    piv: Tensor
    D: Tensor


def structurally_singular(J: Tensor) -> Tensor:
    """Per sample: does ``J`` have an all-zero row or column (so no LU of it is usable)?"""
    return zero_rows_singular(J)[1]


def zero_rows_singular(J: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`~dxopt.conic.reduce.zero_lines` of ``J`` over its rows ``(k, N)`` (what
    :func:`~dxopt.conic.reduce.reduce_jacobian` starts from) and
    :func:`structurally_singular`."""
    rows = zero_lines(J, dim=-1)
    return rows, rows.any(dim=-1) | zero_lines(J, dim=-2).any(dim=-1)


def _step(
    J: Tensor, F: Tensor, active: Tensor, *, shift: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Newton step :math:`-(J + \\delta I)^{-1} F` of the ``active`` samples (NaN where
    the LU is invalid or the sample is inactive); ``shift`` is :math:`\\delta` per sample.
    Also returns the active indices and their LU (``(LU, piv)``, of :math:`J + \\delta I`)."""
    dz = torch.full_like(F, torch.nan)
    idx = torch.nonzero(active).flatten()
    if not idx.numel():
        return dz, idx, J.new_zeros((0,)), torch.zeros(0, dtype=torch.int32)
    J = take(J, idx)
    if shift is not None:
        eye = torch.eye(J.shape[-1], dtype=J.dtype, device=J.device)
        J = J + shift[idx, None, None] * eye
    LU, piv, valid = lu_factor_finite(J)
    step = torch.linalg.lu_solve(LU, piv, -F[idx, :, None])[..., 0]
    dz[idx] = torch.where(valid[:, None], step, torch.nan)
    return dz, idx, LU, piv


def _trial(
    prob: ConicProblem,
    data: tuple[Tensor, ...],
    x: Tensor,
    w: Tensor,
    fnorm: Tensor,
    dz: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The point after the step ``dz``, its ``y``, ``F`` and :math:`\\Vert F\\Vert_\\infty`
    (``inf`` where the step is non-finite or does not lower ``fnorm``)."""
    P, q, A, b = data
    n = prob.n
    finite = torch.isfinite(dz).all(dim=-1)
    dz = torch.where(finite[:, None], dz, torch.zeros_like(dz))  # no NaN into eigh & co.
    x_new, w_new = x + dz[:, :n], w + dz[:, n:]
    y_new = project_dual(prob.cones, prob.slices, w_new)
    F_new = residual_map(P, q, A, b, y_new, x_new, w_new)
    f_new = max_abs(F_new)
    ok = torch.isfinite(f_new) & (f_new < fnorm) & finite
    return x_new, w_new, y_new, F_new, torch.where(ok, f_new, torch.inf)


def _keep(mask: Tensor, new: Tensor, old: Tensor) -> Tensor:
    return torch.where(mask.reshape(-1, *([1] * (new.ndim - 1))), new, old)


def polish(prob: ConicProblem, data: tuple[Tensor, ...], x: Tensor, w: Tensor):
    """Up to :data:`POLISH_STEPS` rounds of safeguarded Newton steps on :math:`F(x, w) = 0`.

    A sample stops once :math:`\\Vert F\\Vert_\\infty` is at round-off of its scale. Where the
    plain step fails (a singular ``J``: redundant equality rows, non-unique solutions, whose
    ``F`` still lies in the range of ``J``), the step of :math:`J + \\delta I` with
    :math:`\\delta =` :data:`POLISH_SHIFT` :math:`\\Vert J\\Vert_\\infty` is tried (a
    Levenberg-Marquardt-like regularisation: it solves the range part to a relative error
    :math:`\\delta / \\sigma_{\\min}` per step). A sample whose ``J`` has a zero row or
    column (a plain LU of it must fail) takes the exact minimum-norm step
    :math:`-J^+ F` through its reduced system where that singularity is decoupled variables
    only (:mod:`dxopt.conic.reduce`), the regularised step otherwise; a sample whose plain
    (or reduced) step failed once goes to the regularised step directly. Every step is kept
    only where it lowers :math:`\\Vert F\\Vert_\\infty`. From the second round on, a sample
    with a plain LU (or a reduced system's LU, or the regularised LU where the plain step
    failed) first tries the chord step with it
    (:data:`CHORD_GAIN`): near a regular solution it contracts as fast as a Newton step,
    without a new Jacobian, reduction or LU.

    Returns ``x, w, y`` (:math:`y = \\Pi_{K^*}(w)`), the mask of polished samples and the
    :class:`PolishFactor` of the last plain LU per sample."""
    P, q, A, b = data
    y = project_dual(prob.cones, prob.slices, w)
    F = residual_map(P, q, A, b, y, x, w)
    fnorm = max_abs(F)
    parts = [matvec(P, x), matvec(A.transpose(-1, -2), y), q, matvec(A, x), y - w, b]
    scale = torch.stack([max_abs(t) for t in parts]).amax(0)
    polished = torch.zeros_like(fnorm, dtype=torch.bool)
    needs_shift = torch.zeros_like(polished)
    decoupled = torch.zeros_like(polished)
    factor: PolishFactor | None = None
    rfactor: _ReducedFactor | None = None
    sfactor: _ShiftedFactor | None = None
    for rnd in range(POLISH_STEPS):
        active = torch.isfinite(fnorm) & (fnorm > POLISH_ROUNDOFF * scale)
        chords: list[tuple[Tensor, Callable[[Tensor, Tensor], Tensor]]] = []
        if sfactor is not None:  # a sample whose plain step failed: the regularised LU
            chords.append((sfactor.mask, sfactor.solve))
        if factor is not None:
            plain_has = factor.has if sfactor is None else factor.has & ~sfactor.mask
            chords.append((plain_has, _plain_solver(factor)))
        if rfactor is not None:
            chords.append((rfactor.mask, rfactor.solve))
        for has, solver in chords:
            cand = active & has
            if bool(cand.any()):
                x, w, y, F, fnorm, moved = _chord(
                    prob, data, solver, x, w, y, F, fnorm, scale, cand
                )
                polished |= moved
                active &= ~moved
        if not bool(active.any()):
            break
        D = cone_jacobian(prob.cones, prob.slices, w)
        J = jacobian(P, A, D, cones=prob.cones, slices=prob.slices)
        known: tuple[Reduction, Tensor] | None = None
        if rnd == 0:  # later rounds: needs_shift remembers the failed plain steps
            zrows, singular = zero_rows_singular(J)
            dead = active & singular
            found, known = _decoupled(J, D, A, prob.n, dead, zrows)
            decoupled = dead & found
            needs_shift |= dead & ~decoupled
        plain = active & ~needs_shift & ~decoupled
        dz, pidx, LU, piv = _step(J, F, plain)
        reduced = active & decoupled & ~needs_shift
        if bool(reduced.any()):
            # round 0's reduction serves its step where it was built for exactly these samples
            reuse = known if known is not None and bool((reduced == dead).all()) else None
            dz, rfactor = _reduced_step(J, D, A, prob.n, F, reduced, dz, known=reuse)
        if pidx.numel() or bool(reduced.any()):
            x_new, w_new, y_new, F_new, f_new = _trial(prob, data, x, w, fnorm, dz)
        else:  # every active sample takes the regularised step
            x_new, w_new, y_new, F_new = x, w, y, F
            f_new = torch.full_like(fnorm, torch.inf)
        retry = active & ~torch.isfinite(f_new)
        # a failed plain (or reduced) step: the regularised one from now on
        needs_shift |= (plain | reduced) & retry
        if bool(retry.any()):
            shift = POLISH_SHIFT * torch.linalg.vector_norm(J, 1, dim=-1).amax(-1)
            dz_r, sidx, LU_r, piv_r = _step(J, F, retry, shift=shift)
            x_r, w_r, y_r, F_r, f_r = _trial(prob, data, x, w, fnorm, dz_r)
            use = retry & (f_r < f_new)
            sfactor = _ShiftedFactor.of(use, sidx, LU_r, piv_r) if bool(use.any()) else None
            x_new, w_new, y_new = (
                _keep(use, x_r, x_new),
                _keep(use, w_r, w_new),
                _keep(use, y_r, y_new),
            )
            F_new, f_new = _keep(use, F_r, F_new), _keep(use, f_r, f_new)
        if pidx.numel():
            good = torch.nonzero(torch.isfinite(f_new[pidx])).flatten()
            factor = _record_factor(factor, J, D, pidx[good], take(LU, good), take(piv, good))
        better = torch.isfinite(f_new)
        if not bool(better.any()):
            break
        x, w, y = _keep(better, x_new, x), _keep(better, w_new, w), _keep(better, y_new, y)
        F = _keep(better, F_new, F)
        fnorm = torch.where(better, f_new, fnorm)
        polished |= better
    return x, w, y, polished, factor


def _decoupled(
    J: Tensor, D: Tensor, A: Tensor, n: int, sel: Tensor, zero_rows: Tensor
) -> tuple[Tensor, tuple[Reduction, Tensor] | None]:
    """Per sample (``sel`` only): is ``J`` singular only through decoupled variables, its
    reduced system (:mod:`dxopt.conic.reduce`) free of zero rows and columns? Also the
    reduction of the samples ``sel`` and their :math:`J_R` (``None`` where ``sel`` is empty);
    ``zero_rows``: the zero rows of ``J``."""
    out = torch.zeros_like(sel)
    idx = torch.nonzero(sel).flatten()
    if not idx.numel():
        return out, None
    As = A if A.shape[0] == 1 else A[idx]
    red, Jr, _ = reduce_jacobian(take(J, idx), take(D, idx), As, n, zero_rows=take(zero_rows, idx))
    out[idx] = red.has_z & ~structurally_singular(Jr)
    return out, (red, Jr)


def _reduced_step(
    J: Tensor,
    D: Tensor,
    A: Tensor,
    n: int,
    F: Tensor,
    sel: Tensor,
    dz: Tensor,
    *,
    known: tuple[Reduction, Tensor] | None = None,
) -> tuple[Tensor, _ReducedFactor]:
    """``dz`` with the rows ``sel`` set to the minimum-norm Newton step :math:`-J^+ F`
    through the reduced system (NaN where its LU is invalid), and that system's factor;
    ``known``: the reduction of this ``J`` on the samples ``sel`` and its :math:`J_R`,
    where already built."""
    idx = torch.nonzero(sel).flatten()
    As = A if A.shape[0] == 1 else A[idx]
    red, Jr = reduce_jacobian(J[idx], D[idx], As, n)[:2] if known is None else known
    LU, piv, valid = lu_factor_finite(Jr)
    rf = _ReducedFactor(sel.clone(), idx, red, As, LU, piv, valid)
    dz = dz.clone()
    dz[idx] = rf.steps(F)
    return dz, rf


@dataclass(frozen=True)
class _ReducedFactor:
    """The reduction and LU of :math:`J_R` of the samples ``idx`` (``mask``), for the
    minimum-norm step :math:`-J^+ F` of the round that built them and the later chord steps."""

    mask: Tensor
    idx: Tensor
    red: Reduction
    A: Tensor
    LU: Tensor
    piv: Tensor
    valid: Tensor

    def steps(self, F: Tensor) -> Tensor:
        """:math:`-J^+ F` of the samples ``idx`` (rows of ``F``; NaN where the LU is invalid)."""

        def solve_r(r: Tensor) -> Tensor:
            return torch.linalg.lu_solve(self.LU, self.piv, r[..., None])[..., 0]

        step = reduced_solve(self.red, self.A, -F[self.idx], solve_r, adjoint=False)
        return torch.where(self.valid[:, None], step, torch.nan)

    def solve(self, sel: Tensor, F: Tensor) -> Tensor:
        """The steps of the samples ``sel`` (indices within ``mask``), from all of ``idx``
        (the reduction is of that set)."""
        full = torch.full_like(F, torch.nan)
        full[self.idx] = self.steps(F)
        return full[sel]


@dataclass(frozen=True)
class _ShiftedFactor:
    """The LU of :math:`J + \\delta I` of the samples ``idx`` (``mask``) whose regularised
    step was kept, for chord steps in the next round (their plain ``J`` is singular)."""

    mask: Tensor
    idx: Tensor
    LU: Tensor
    piv: Tensor

    @classmethod
    def of(cls, use: Tensor, sidx: Tensor, LU: Tensor, piv: Tensor) -> _ShiftedFactor:
        """The factor of the samples ``use`` from the LUs of the samples ``sidx``."""
        keep = torch.nonzero(use[sidx]).flatten()
        return cls(use.clone(), sidx[keep], take(LU, keep), take(piv, keep))

    def solve(self, sel: Tensor, F: Tensor) -> Tensor:
        """The chord steps of the samples ``sel`` (indices within ``mask``)."""
        pos = torch.full((self.mask.shape[0],), -1, dtype=torch.long)
        pos[self.idx] = torch.arange(self.idx.numel())
        at = pos[sel]
        LU, piv = take(self.LU, at), take(self.piv, at)
        return torch.linalg.lu_solve(LU, piv, -take(F, sel)[..., None])[..., 0]


def _plain_solver(factor: PolishFactor) -> Callable[[Tensor, Tensor], Tensor]:
    def solve(sel: Tensor, F: Tensor) -> Tensor:
        LU, piv = take(factor.LU, sel), take(factor.piv, sel)
        return torch.linalg.lu_solve(LU, piv, -take(F, sel)[..., None])[..., 0]

    return solve


def _chord(
    prob: ConicProblem,
    data: tuple[Tensor, ...],
    solve: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    w: Tensor,
    y: Tensor,
    F: Tensor,
    fnorm: Tensor,
    scale: Tensor,
    cand: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Chord steps :math:`-J_0^{-1} F` (``solve(sel, F)``: the steps of the samples ``sel``
    with the last plain LU, or :math:`-J_0^+ F` with the last reduced one) on the samples
    ``cand``: the first is kept where it
    meets :data:`CHORD_GAIN`, then up to :data:`CHORD_STEPS` - 1 more where each at least
    halves :math:`\\Vert F\\Vert_\\infty`, on the samples not yet at the round-off floor of
    :data:`POLISH_ROUNDOFF` (where the polish stops too). Returns the updated point and the
    mask of samples it moved."""
    moved = torch.zeros_like(cand)
    target = torch.maximum(POLISH_ROUNDOFF * scale, CHORD_GAIN * fnorm)
    for step in range(CHORD_STEPS):
        sel = torch.nonzero(cand).flatten()
        if not sel.numel():
            break
        dz = torch.full_like(F, torch.nan)
        dz[sel] = solve(sel, F)
        x_new, w_new, y_new, F_new, f_new = _trial(prob, data, x, w, fnorm, dz)
        bound = target if step == 0 else 0.5 * fnorm
        ok = cand & torch.isfinite(f_new) & (f_new <= bound)
        x, w, y = _keep(ok, x_new, x), _keep(ok, w_new, w), _keep(ok, y_new, y)
        F, fnorm = _keep(ok, F_new, F), torch.where(ok, f_new, fnorm)
        moved |= ok
        # another step only where this one did not reach the round-off floor
        cand = ok & (f_new > POLISH_ROUNDOFF * scale)
    return x, w, y, F, fnorm, moved


def _record_factor(
    factor: PolishFactor | None, J: Tensor, D: Tensor, idx: Tensor, LU: Tensor, piv: Tensor
) -> PolishFactor | None:
    """``factor`` with the rows ``idx`` replaced by the new LU (allocated on first use)."""
    if not idx.numel():
        return factor
    k, N = J.shape[0], J.shape[-1]
    if factor is None and idx.numel() == k:  # every sample: the LU itself, no copy
        ones = torch.ones(k, dtype=torch.bool)
        return PolishFactor(has=ones, LU=take(LU, idx), piv=piv, D=take(D, idx))
    if factor is None:
        factor = PolishFactor(
            has=torch.zeros(k, dtype=torch.bool),
            LU=lu_storage(k, N, J),
            piv=torch.ones(k, N, dtype=piv.dtype),
            D=D.new_zeros(D.shape),
        )
    factor.has[idx] = True
    factor.LU[idx], factor.piv[idx], factor.D[idx] = LU, piv, D[idx]
    return factor
