"""The optimality map of a cone program and its Jacobian, shared by the polish and the backward.

With :math:`w = y - s` (Moreau: :math:`y = \\Pi_{K^*}(w)`, :math:`s = \\Pi_{K^*}(w) - w`; Busseti,
Moursi & Boyd, "Solution refinement at regular points of conic problems", 2019) the
optimality conditions of :math:`\\min \\tfrac12 x^\\top Px + q^\\top x` s.t.
:math:`Ax + s = b, s \\in K` are :math:`F(x, w) = 0` with

.. math::

    F(x, w) = \\begin{pmatrix} Px + A^\\top \\Pi_{K^*}(w) + q \\\\
    Ax + \\Pi_{K^*}(w) - w - b \\end{pmatrix},\\qquad
    J = \\begin{pmatrix} P & A^\\top D \\\\ A & D - I \\end{pmatrix},

:math:`D = D\\Pi_{K^*}(w)` block diagonal over the cones. :func:`solve_refined` solves
:math:`Jz = r` or :math:`J^\\top z = r` with a batched dense LU (``torch.linalg``) and iterative
refinement against the exact ``J`` until the residual is at round-off (:data:`ROUNDOFF`),
and reports per sample whether it got there; :func:`condition_1` estimates
:math:`\\kappa_1(J)` from the same LU (Hager's method, Higham's *Accuracy and Stability of
Numerical Algorithms*, 2002, sec. 15.3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt._core.memory import host_array
from dxopt.conic.cones.base import Cone

__all__ = [
    "ROUNDOFF",
    "LUSolve",
    "condition_1",
    "cone_dist",
    "cone_jacobian",
    "cone_kink",
    "cone_runs",
    "host_empty",
    "jacobian",
    "lu_factor_finite",
    "lu_storage",
    "project_dual",
    "residual_map",
    "solve_refined",
    "take",
]

EPS = torch.finfo(torch.float64).eps
ROUNDOFF = 1e3 * EPS
"""Accepted relative residual :math:`\\Vert r - Jz\\Vert_\\infty / (\\Vert J\\Vert_\\infty
\\Vert z\\Vert_\\infty + \\Vert r\\Vert_\\infty)` of a refined solve: a few hundred ulps, what a
backward-stable LU with refinement reaches on any nonsingular ``J`` of the sizes used here."""


def _runs(cones: tuple[Cone, ...], slices: tuple[slice, ...]) -> list[tuple[Cone, int, int, int]]:
    """Runs of consecutive equal cones as ``(cone, start, count, dim)``: each run is projected
    in one call on ``(k * count, dim)`` rows (the cones act row-wise), not cone by cone."""
    runs: list[tuple[Cone, int, int, int]] = []
    for c, sl in zip(cones, slices):
        start, stop = sl.start or 0, sl.stop
        d = stop - start
        if runs and runs[-1][0] == c and runs[-1][1] + runs[-1][2] * runs[-1][3] == start:
            cone, s0, cnt, dim = runs[-1]
            runs[-1] = (cone, s0, cnt + 1, dim)
        else:
            runs.append((c, start, 1, d))
    return runs


def cone_runs(
    cones: tuple[Cone, ...], slices: tuple[slice, ...]
) -> list[tuple[Cone, int, int, int]]:
    """The runs of equal consecutive cones, ``(cone, start, count, dim)`` (for the sparse
    route's Jacobian, :mod:`dxopt.conic.sparse_kkt`)."""
    return _runs(cones, slices)


def project_dual(cones: tuple[Cone, ...], slices: tuple[slice, ...], w: Tensor) -> Tensor:
    """:math:`\\Pi_{K^*}(w)` run by run of equal cones (``w``: ``(k, m)``)."""
    k = w.shape[0]
    parts = []
    for c, s0, cnt, d in _runs(cones, slices):
        v = w[:, s0 : s0 + cnt * d].reshape(k * cnt, d)
        parts.append(c.project_dual(v).reshape(k, cnt * d))
    return torch.cat(parts, dim=-1)


def cone_dist(
    cones: tuple[Cone, ...], slices: tuple[slice, ...], v: Tensor, *, dual: bool
) -> Tensor:
    """:math:`\\mathrm{dist}(v, K)` (or to :math:`K^*` with ``dual``) over the product cone,
    ``(k,)``: the 2-norm of the cones' distances, computed run by run of equal cones."""
    k = v.shape[0]
    parts = []
    for c, s0, cnt, d in _runs(cones, slices):
        block = v[:, s0 : s0 + cnt * d].reshape(k * cnt, d)
        dist = c.dist_dual(block) if dual else c.dist(block)
        parts.append(dist.reshape(k, cnt))
    return torch.linalg.vector_norm(torch.cat(parts, dim=-1), dim=-1)


def cone_kink(
    cones: tuple[Cone, ...], slices: tuple[slice, ...], w: Tensor, tol: float, scale: Tensor
) -> Tensor:
    """Per sample ``(k,)``: is any cone of ``w`` within ``tol`` of a kink of
    :math:`\\Pi_{K^*}` (:meth:`Cone.kink`, relative to the per-sample ``scale``)?"""
    k = w.shape[0]
    flag = torch.zeros(k, dtype=torch.bool, device=w.device)
    for c, s0, cnt, d in _runs(cones, slices):
        block = w[:, s0 : s0 + cnt * d].reshape(k * cnt, d)
        hit = c.kink(block, tol, scale=scale.repeat_interleave(cnt))
        flag |= hit.reshape(k, cnt).any(dim=-1)
    return flag


def cone_jacobian(
    cones: tuple[Cone, ...], slices: tuple[slice, ...], w: Tensor, atol: Tensor | None = None
) -> Tensor:
    """Block-diagonal :math:`D\\Pi_{K^*}(w)`, ``(k, m, m)``; with ``atol`` (per sample) the
    cones' one-sided rule at kinks (:meth:`Cone.dproject_dual_snapped`)."""
    k, m = w.shape
    D = host_empty((k, m, m), w).zero_()
    for c, s0, cnt, d in _runs(cones, slices):
        v = w[:, s0 : s0 + cnt * d].reshape(k * cnt, d)
        if atol is None:
            blocks = c.dproject_dual(v)
        else:
            blocks = c.dproject_dual_snapped(v, atol.repeat_interleave(cnt))
        # every block of the run written in one copy, into the view of the run's diagonal
        # blocks (a run of scalar cones: a stretch of D's diagonal)
        s1 = s0 + cnt * d
        if d == 1:
            D.diagonal(dim1=-2, dim2=-1)[:, s0:s1] = blocks.reshape(k, cnt)
        else:
            diag = D[:, s0:s1, s0:s1].view(k, cnt, d, cnt, d).diagonal(dim1=1, dim2=3)
            diag.copy_(blocks.reshape(k, cnt, d, d).permute(0, 2, 3, 1))
    return D


def residual_map(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, y: Tensor, x: Tensor, w: Tensor
) -> Tensor:
    """:math:`F(x, w)` given :math:`y = \\Pi_{K^*}(w)`, ``(k, n + m)``."""
    f1 = (P @ x[..., None])[..., 0] + (A.transpose(-1, -2) @ y[..., None])[..., 0] + q
    f2 = (A @ x[..., None])[..., 0] + y - w - b
    return torch.cat([f1, f2], dim=-1)


def jacobian(
    P: Tensor,
    A: Tensor,
    D: Tensor,
    *,
    cones: tuple[Cone, ...] | None = None,
    slices: tuple[slice, ...] | None = None,
) -> Tensor:
    """:math:`J = [[P, A^\\top D], [A, D - I]]`, ``(k, n + m, n + m)`` (``P``, ``A`` broadcast).

    With ``cones`` and ``slices`` the block :math:`A^\\top D` is formed run by run of equal
    cones (``D`` is block diagonal: a run of ``cnt`` blocks of size ``d`` costs
    :math:`O(k\\, n\\, \\mathrm{cnt}\\, d^2)`, not :math:`O(k\\, n\\, m^2)`)."""
    k, m = D.shape[0], D.shape[-1]
    n = P.shape[-1]
    J = host_empty((k, n + m, n + m), D)
    J[:, :n, :n] = P
    if cones is None or slices is None:
        J[:, :n, n:] = A.transpose(-1, -2) @ D
    else:
        BA = A.shape[0]
        for _c, s0, cnt, d in _runs(cones, slices):
            s1 = s0 + cnt * d
            Ar = A[:, s0:s1, :].reshape(BA, cnt, d, n)
            # the diagonal blocks of the run, (k, cnt, d, d)
            Dr = D[:, s0:s1, s0:s1].reshape(k, cnt, d, cnt, d).diagonal(dim1=1, dim2=3)
            Dr = Dr.permute(0, 3, 1, 2)
            # (k, cnt, n, d); a run of scalar cones is a column scaling
            blk = Ar.transpose(-1, -2) * Dr if d == 1 else Ar.transpose(-1, -2) @ Dr
            J[:, :n, n + s0 : n + s1] = blk.permute(0, 2, 1, 3).reshape(k, n, cnt * d)
    J[:, n:, :n] = A
    J[:, n:, n:] = D - torch.eye(m, dtype=D.dtype)
    return J


def host_empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor of ``shape`` like ``like``; float64 on the CPU from
    :func:`dxopt._core.memory.host_array` (a large one: memory of an earlier call's that is no
    longer referenced, instead of fresh pages that fault on first touch: a batch of 128
    Jacobians of order 205 is 43 MB), else torch's allocator."""
    if like.device.type == "cpu" and like.dtype == torch.float64:
        return torch.from_numpy(host_array(shape))
    return like.new_empty(shape)


def lu_storage(k: int, N: int, like: Tensor) -> Tensor:
    """An uninitialised ``(k, N, N)`` tensor in LAPACK's column-major layout (that of
    ``torch.linalg.lu_factor``): ``lu_solve`` on a row-major LU copies it on every call
    (from :func:`host_empty`)."""
    return host_empty((k, N, N), like).transpose(-1, -2)


def take(t: Tensor, idx: Tensor) -> Tensor:
    """``t[idx]`` without the copy where ``idx`` is ``0, 1, ..., len(t) - 1``."""
    k = t.shape[0]
    if idx.numel() == k and bool((idx == torch.arange(k, device=idx.device)).all()):
        return t
    return t[idx]


@dataclass(frozen=True)
class LUSolve:
    """A refined solve: ``z``, per-sample relative residual and whether it met
    :data:`ROUNDOFF`, and the refinement rounds used."""

    z: Tensor
    residual: Tensor
    ok: Tensor
    steps: int


def _relres(J: Tensor, z: Tensor, r: Tensor, adjoint: bool, norm_j: Tensor) -> Tensor:
    Jz = (J.transpose(-1, -2) if adjoint else J) @ z[..., None]
    res = (r - Jz[..., 0]).abs().amax(dim=-1)
    scale = norm_j * z.abs().amax(dim=-1) + r.abs().amax(dim=-1)
    out = res / torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.where(torch.isfinite(out), out, torch.full_like(out, float("inf")))


def lu_factor_finite(J: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The batched LU of ``J`` ``(k, N, N)`` and a mask of the samples it is valid for.

    A sample whose ``J`` has a non-finite entry is factored as the identity instead and masked
    out (``ok`` False): LAPACK's ``getrf`` on NaN input may return pivots that
    ``torch.linalg.lu_solve`` rejects for the whole batch, so one bad sample would stop the
    others; a sample whose batched factorization returns out-of-range pivots is factored
    alone (masked out if that fails too). A zero pivot (a singular ``J``) is kept: its solves
    are non-finite and the callers' residual checks refuse them."""
    # a finite sum has only finite terms; an overflowing one is checked entry by entry
    ok = torch.isfinite(J.sum(dim=(-2, -1)))
    if not bool(ok.all()):
        ok = torch.isfinite(J).flatten(-2).all(-1)
    if not bool(ok.all()):
        eye = torch.eye(J.shape[-1], dtype=J.dtype, device=J.device)
        J = torch.where(ok[:, None, None], J, eye)
    LU, piv, _info = torch.linalg.lu_factor_ex(J)
    N = J.shape[-1]
    bad = ((piv < 1) | (piv > N)).any(-1)
    for i in torch.nonzero(bad).flatten().tolist():
        # torch 2.13's batched CPU LU can return out-of-range pivots (MKL: "Parameter 6 was
        # incorrect on entry to DLASWP") for some samples of a batch; factor them alone
        LU_i, piv_i, _ = torch.linalg.lu_factor_ex(J[i].contiguous())
        if bool(((piv_i < 1) | (piv_i > N)).any()):
            ok[i] = False
            LU_i = torch.eye(N, dtype=J.dtype, device=J.device)
            piv_i = torch.arange(1, N + 1, dtype=piv.dtype, device=piv.device)
        LU[i], piv[i] = LU_i, piv_i
    return LU, piv, ok


def solve_refined(
    J: Tensor,
    r: Tensor,
    *,
    adjoint: bool,
    factor: tuple[Tensor, Tensor] | None = None,
    max_refine: int = 4,
    target: float = ROUNDOFF,
) -> tuple[LUSolve, tuple[Tensor, Tensor]]:
    """Solve :math:`Jz = r` (or :math:`J^\\top z = r`) for a batch, refined against ``J``.

    Refinement rounds run while a sample's relative residual exceeds ``target`` and the last
    round lowered one; ``ok`` is the residual at :data:`ROUNDOFF` or below (a ``factor`` of a
    nearby matrix is refined to ``target = EPS``, what a fresh LU gives in one solve)."""
    LU, piv = lu_factor_finite(J)[:2] if factor is None else factor
    z = torch.linalg.lu_solve(LU, piv, r[..., None], adjoint=adjoint)[..., 0]
    norm_j = torch.linalg.vector_norm(J, 1, dim=-2 if adjoint else -1).amax(dim=-1)
    res = _relres(J, z, r, adjoint, norm_j)
    steps = 0
    while steps < max_refine and bool((res > target).any()):
        Jz = (J.transpose(-1, -2) if adjoint else J) @ z[..., None]
        dz = torch.linalg.lu_solve(LU, piv, r[..., None] - Jz, adjoint=adjoint)[..., 0]
        z_new = z + dz
        res_new = _relres(J, z_new, r, adjoint, norm_j)
        better = res_new < res
        progress = bool((better & (res > target)).any())
        z = torch.where(better[:, None], z_new, z)
        res = torch.where(better, res_new, res)
        steps += 1
        if not progress:
            break
    return LUSolve(z, res, res <= ROUNDOFF, steps), (LU, piv)


def condition_1(J: Tensor, factor: tuple[Tensor, Tensor], rounds: int = 5) -> Tensor:
    """Hager's lower estimate of :math:`\\Vert J\\Vert_1 \\Vert J^{-1}\\Vert_1` per sample
    (``inf`` where the LU has a zero pivot or produced non-finite values)."""
    LU, piv = factor
    k, N = J.shape[0], J.shape[-1]
    v = J.new_full((k, N), 1.0 / N)
    est = J.new_zeros(k)
    j_prev: Tensor | None = None
    for _ in range(rounds):
        y = torch.linalg.lu_solve(LU, piv, v[..., None])[..., 0]
        est = torch.maximum(est, y.abs().sum(dim=-1))
        xi = torch.where(y >= 0, 1.0, -1.0).to(J.dtype)
        z = torch.linalg.lu_solve(LU, piv, xi[..., None], adjoint=True)[..., 0]
        j = z.abs().argmax(dim=-1)
        if j_prev is not None and bool((j == j_prev).all()):
            break  # the next rounds would repeat this one exactly
        j_prev = j
        v = torch.nn.functional.one_hot(j, N).to(J.dtype)
    norm_1 = torch.linalg.vector_norm(J, 1, dim=-2).amax(dim=-1)
    cond = norm_1 * est
    pivots = torch.diagonal(LU, dim1=-2, dim2=-1).abs().amin(dim=-1)
    bad = ~torch.isfinite(cond) | (pivots == 0)
    return torch.where(bad, torch.full_like(cond, float("inf")), cond)
