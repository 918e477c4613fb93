"""The batched primal-dual interior point of the torch QP solver (the iteration only; the
driver :mod:`dxopt.qp.solvers.torch_driver` polishes and certifies its iterates).

Solves, for every sample of a batch and on the inputs' device and dtype,

.. math::
    \\min_x \\tfrac12 x^\\top P x + q^\\top x \\quad\\text{s.t.}\\quad Ax = b,\\; Gx \\le h .

**Interior point.** Mehrotra's predictor-corrector (Mehrotra, SIAM J. Optim. 2(4), 1992; the
QP form of Vandenberghe's CVXOPT ``coneqp`` notes) on the slack form :math:`Gx + s = h`,
:math:`s, z \\ge 0`. Equality constraints are eliminated first when :math:`A` has full row
rank :math:`p < n`: with a batched complete QR :math:`A^\\top = [Q_1\\ Z][R_1; 0]` the
iterate is :math:`x = x_p + Zw`, so every Newton system is
:math:`(n-p)\\times(n-p)` and has no Schur complement. Otherwise (rank-deficient ``A``,
``p >= n``) each Newton system is reduced to

.. math::
    (P + G^\\top D G + \\delta I)\\,\\Delta x + A^\\top \\Delta y = r_1,\\qquad A\\Delta x = r_2,

with :math:`D = \\mathrm{diag}(z/s)`, factored once per iteration by a batched Cholesky of
:math:`H = P + G^\\top D G + \\delta I` and of the Schur complement
:math:`AH^{-1}A^\\top + \\delta I`. Predictor and corrector share the factors (centering
:math:`\\sigma = (\\mu_{\\rm aff}/\\mu)^3`, step :math:`0.99` of the way to the boundary). The
iteration is fixed-shape with per-sample on-device masks: a converged, certified, stalled or
broken sample takes zero-length steps, and off the CPU the host synchronises once per
``check_every`` iterations (``done.all()``), never per iteration (on the CPU see below).
Outside the loop a solve has a handful of further syncs (the rank test of :math:`A`, the
polish retry test, the early exit of each refinement), none per sample. The small static
shift :math:`\\delta` keeps the Cholesky alive for singular :math:`P` (LPs, unbounded samples);
residuals are always evaluated on the exact problem, so it only makes the Newton step inexact.

**Infeasibility.** At every check, a sample that has not converged is tested for the Farkas
certificates its diverging iterates approach (as in OSQP, arXiv 1711.08013, section 3.4):
primal infeasible if :math:`(\\hat y, \\hat z) = (y, z)/\\|(y, z)\\|_\\infty` has
:math:`\\|A^\\top\\hat y + G^\\top \\hat z\\|_\\infty \\le \\epsilon_{\\rm inf}` and
:math:`b^\\top\\hat y + h^\\top\\hat z < -\\epsilon_{\\rm inf}`; dual infeasible (unbounded) if
:math:`\\hat x = x/\\|x\\|_\\infty` has :math:`\\|P\\hat x\\|_\\infty, \\|A\\hat x\\|_\\infty,
\\max(G\\hat x) \\le \\epsilon_{\\rm inf}` and :math:`q^\\top\\hat x < -\\epsilon_{\\rm inf}`.

**CPU execution.** A host sync is free on the CPU, so there the loop tests completion every
iteration and shrinks the batch to the samples still running (each sample pays its own
iteration count); small batched matrices run at one torch thread
(:func:`dxopt.qp.solvers.torch_kkt.small_threads`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt._core import Status
from dxopt.qp.certify.torch_certify import infeasibility_masks
from dxopt.qp.certify.torch_ops import amax, dot, mv, rmv
from dxopt.qp.solvers.torch_kkt import cho_solve, cholesky_flagged, weighted_gram
from dxopt.qp.solvers.torch_types import code, deprecated_status_enum


@dataclass
class Iterate:
    x: Tensor
    y: Tensor
    z: Tensor
    s: Tensor


class _Newton:
    """One factorization of the reduced Newton matrix, reused for several right-hand sides.

    float32 problems form, factor and solve this system in float64 (mixed precision): near
    the solution :math:`D = z/s` spans many orders of magnitude and a float32 Cholesky of
    :math:`P + G^\\top DG` breaks down (measured: condition number :math:`10^4` in
    :math:`P` already stops the float32 iteration after 4 steps); the iterates stay float32.
    """

    def __init__(self, P: Tensor, A: Tensor, G: Tensor, D: Tensor, delta: Tensor):
        self.dtype = P.dtype
        wide = torch.float64 if P.dtype == torch.float32 else P.dtype
        P, A, G, D, delta = (t.to(wide) for t in (P, A, G, D, delta))
        p = A.shape[-2]
        H = P + weighted_gram(G, D)
        H.diagonal(dim1=-2, dim2=-1).add_(delta[:, None])
        self.L, bad = cholesky_flagged(H)
        self.A, self.p = A, p
        if p:
            X = torch.linalg.solve_triangular(self.L, A.mT, upper=False)  # L^{-1} A^T
            S = X.mT @ X
            S.diagonal(dim1=-2, dim2=-1).add_(delta[:, None])
            self.LS, bad_s = cholesky_flagged(S)
            bad = bad | bad_s
        self.bad = bad

    def solve(self, r1: Tensor, r2: Tensor) -> tuple[Tensor, Tensor]:
        """Solve :math:`H\\,dx + A^\\top dy = r_1`, :math:`A\\,dx = r_2`."""
        r1, r2 = r1.to(self.L.dtype), r2.to(self.L.dtype)
        u = cho_solve(self.L, r1)
        if not self.p:
            return u.to(self.dtype), r2.to(self.dtype)
        dy = cho_solve(self.LS, mv(self.A, u) - r2)
        dx = cho_solve(self.L, r1 - rmv(self.A, dy))
        return dx.to(self.dtype), dy.to(self.dtype)


def _max_step(v: Tensor, dv: Tensor) -> Tensor:
    """Largest :math:`\\alpha \\le 1` with :math:`v + \\alpha\\,dv \\ge 0`, per sample."""
    ratio = torch.where(dv < 0, -v / dv, torch.full_like(v, float("inf")))
    return ratio.amin(-1).clamp(max=1.0) if v.shape[-1] else v.new_ones(v.shape[0])


def _kkt_residuals(
    P: Tensor,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    G: Tensor,
    h: Tensor,
    x: Tensor,
    y: Tensor,
    z: Tensor,
    s: Tensor,
    eps_abs: float,
    eps_rel: float,
    gap_rel: float | None = None,
    gap_abs: float | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Residuals :math:`(r_d, r_e, r_i)` of the KKT system at ``(x, y, z, s)`` and the mask
    of samples within tolerance (primal, dual and mean complementarity, each
    :math:`\\le \\epsilon_{\\rm abs} + \\epsilon_{\\rm rel}\\cdot\\text{scale}`)."""
    Px, Ax, Gx, Ay, Gz = mv(P, x), mv(A, x), mv(G, x), rmv(A, y), rmv(G, z)
    rd, re, ri = Px + q + Ay + Gz, Ax - b, Gx + s - h
    pscale = torch.maximum(torch.maximum(amax(h), amax(b)), torch.maximum(amax(Gx), amax(Ax)))
    dscale = torch.maximum(torch.maximum(amax(q), amax(Px)), torch.maximum(amax(Gz), amax(Ay)))
    obj = (0.5 * dot(x, Px) + dot(q, x)).abs()
    m = max(h.shape[-1], 1)
    ok = torch.maximum(amax(re), amax(ri)) <= eps_abs + eps_rel * pscale
    ok = ok & (amax(rd) <= eps_abs + eps_rel * dscale)
    gap_rel = eps_rel if gap_rel is None else gap_rel
    gap_abs = eps_abs if gap_abs is None else gap_abs
    ok = ok & (dot(s.abs(), z.abs()) / m <= gap_abs + gap_rel * obj)
    return rd, re, ri, ok


def _initial_point(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, G: Tensor, h: Tensor, delta: Tensor
) -> Iterate:
    """CVXOPT's starting point: solve the Newton system with :math:`D = I`, then shift."""
    newton = _Newton(P, A, G, torch.ones_like(h), delta)
    x, y = newton.solve(-q + rmv(G, h), b)
    zh = mv(G, x) - h  # the multiplier of the D = I system; the slack is -zh
    m = h.shape[-1]
    if m:
        ap = zh.amax(-1, keepdim=True)  # = -min(s)
        s = torch.where(ap < 0, -zh, -zh + 1 + ap)
        ad = (-zh).amax(-1, keepdim=True)
        z = torch.where(ad < 0, zh, zh + 1 + ad)
    else:
        s, z = zh, zh
    return Iterate(x=x, y=y, z=z, s=s)


def interior_point(
    P: Tensor,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    G: Tensor,
    h: Tensor,
    *,
    eps_abs: float,
    eps_rel: float,
    eps_inf: float,
    max_iter: int,
    check_every: int,
    gap_rel: float,
    gap_abs: float | None = None,
    start: tuple[Iterate, Tensor, Tensor] | None = None,
) -> tuple[Iterate, Tensor, Tensor]:
    """Mehrotra predictor-corrector; returns the final iterate, status and iteration counts.

    ``SOLVED`` here means the interior-point tolerance was met; :func:`solve_detached`
    re-certifies the returned (polished) point against the user's tolerance. ``start =
    (iterate, frozen, iterations)`` resumes a previous run, moving only the samples not
    ``frozen``, with the complementarity tolerance ``gap_abs`` (default ``eps_abs``).
    """
    B, m = q.shape[0], h.shape[-1]
    dev = q.device
    scale = P.diagonal(dim1=-2, dim2=-1).abs().mean(-1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    f64 = P.dtype == torch.float64
    delta = scale * 1e-10  # the Newton systems are factored in float64 (see _Newton)
    mu_floor = 1e-15 if f64 else 1e-7  # relative: no progress is possible below this
    status = torch.full((B,), code(Status.MAX_ITER), dtype=torch.long, device=dev)
    if start is None:
        it = _initial_point(P, q, A, b, G, h, delta)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        iters = torch.zeros(B, dtype=torch.long, device=dev)
    else:
        it, done, iters = start
    if m == 0:
        return it, status, iters  # equality-only: the polish solves it exactly
    tiny = torch.finfo(q.dtype).tiny ** 0.5
    SOLVED, FAILED = code(Status.SOLVED), code(Status.FAILED)
    # a host sync is free on the CPU: the working set shrinks to the running samples each
    # iteration (each costs its own iterations); elsewhere sync every ``check_every``
    compact = q.device.type == "cpu"
    full = (it, status, iters)
    work: Tensor | None = None  # indices of the working samples in the batch (None: all)
    data = (P, q, A, b, G, h, delta)

    def write_back() -> tuple[Iterate, Tensor, Tensor]:
        if work is None:
            return it, status, iters
        f_it, f_status, f_iters = full
        put = lambda dst, src: dst.index_copy(0, work, src)  # noqa: E731
        return (
            Iterate(
                x=put(f_it.x, it.x), y=put(f_it.y, it.y), z=put(f_it.z, it.z), s=put(f_it.s, it.s)
            ),
            put(f_status, status),
            put(f_iters, iters),
        )

    for k in range(max_iter + 1):
        P, q, A, b, G, h, delta = data
        rd, re, ri, ok = _kkt_residuals(
            P, q, A, b, G, h, it.x, it.y, it.z, it.s, eps_abs, eps_rel, gap_rel, gap_abs
        )
        mu = dot(it.s, it.z) / m
        stalled = mu <= mu_floor * (1.0 + amax(it.x) * amax(q) + amax(it.z) * amax(h))
        status = torch.where(~done & ok, SOLVED, status)
        done = done | ok | stalled
        certify = k % check_every == 0 or k == max_iter
        if certify:
            pinf, dinf = infeasibility_masks(P, q, A, b, G, h, it.x, it.y, it.z, eps_inf)
            pinf, dinf = pinf & ~done, dinf & ~done
            status = torch.where(pinf, code(Status.INFEASIBLE), status)
            status = torch.where(dinf & ~pinf, code(Status.UNBOUNDED), status)
            done = done | pinf | dinf
        if certify or compact:
            if k == max_iter or bool(done.all()):  # the one host sync per chunk
                break
            live = (~done).nonzero().squeeze(-1) if compact else None
            if live is not None and live.numel() <= 0.8 * done.shape[0]:
                full = write_back()
                work = live if work is None else work[live]
                P, q, A, b, G, h, delta = (t[live] for t in data)
                data = (P, q, A, b, G, h, delta)
                it = Iterate(x=it.x[live], y=it.y[live], z=it.z[live], s=it.s[live])
                rd, re, ri, mu = rd[live], re[live], ri[live], mu[live]
                done, status, iters = done[live], status[live], iters[live]
        D = it.z / it.s
        newton = _Newton(P, A, G, D, delta)

        def step(rc: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            t = ri - rc / it.z  # noqa: B023
            dx, dy = newton.solve(-rd - rmv(G, D * t), -re)  # noqa: B023
            dz = D * (mv(G, dx) + t)  # noqa: B023
            ds = -(rc + it.s * dz) / it.z  # noqa: B023
            return dx, dy, dz, ds

        dx, dy, dz, ds = step(it.s * it.z)
        a_aff = torch.minimum(_max_step(it.s, ds), _max_step(it.z, dz))[:, None]
        mu_aff = dot(it.s + a_aff * ds, it.z + a_aff * dz) / m
        sig = (mu_aff / mu.clamp_min(tiny)).clamp(0.0, 1.0) ** 3
        dx, dy, dz, ds = step(it.s * it.z + ds * dz - (sig * mu)[:, None])
        alpha = 0.99 * torch.minimum(_max_step(it.s, ds), _max_step(it.z, dz))
        new = Iterate(
            x=it.x + alpha[:, None] * dx,
            y=it.y + alpha[:, None] * dy,
            z=it.z + alpha[:, None] * dz,
            s=it.s + alpha[:, None] * ds,
        )
        fine = torch.isfinite(torch.cat([new.x, new.y], -1)).all(-1)
        fine = fine & (new.s > 0).all(-1) & (new.z > 0).all(-1) & ~newton.bad
        broken = ~done & ~fine
        status = torch.where(broken, FAILED, status)
        move = (~done & fine)[:, None]
        done = done | broken
        iters = iters + move.squeeze(-1).long()
        it = Iterate(
            x=torch.where(move, new.x, it.x),
            y=torch.where(move, new.y, it.y),
            z=torch.where(move, new.z, it.z),
            s=torch.where(move, new.s, it.s),
        )
    return write_back()


def null_space_basis(A: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """``(Q1, R1, Z, x_p)`` from a complete QR of :math:`A^\\top = [Q_1\\ Z][R_1; 0]`, with
    :math:`x_p = Q_1 R_1^{-\\top} b`, or None when some :math:`R_1` is (nearly) singular."""
    p = A.shape[-2]
    Q, R = torch.linalg.qr(A.mT, mode="complete")
    R1 = R[..., :p, :]
    d = R1.diagonal(dim1=-2, dim2=-1).abs()
    tol = (1e-10 if A.dtype == torch.float64 else 1e-5) * d.amax(-1, keepdim=True)
    if not bool((d > tol).all()):  # rank-deficient or inconsistent A: Schur path
        return None
    Q1, Z = Q[..., :p], Q[..., p:]
    u = torch.linalg.solve_triangular(R1.mT, b.unsqueeze(-1), upper=False)
    return Q1, R1, Z, (Q1 @ u).squeeze(-1)


def interior_point_null_space(
    P: Tensor,
    q: Tensor,
    A: Tensor,
    G: Tensor,
    h: Tensor,
    null: tuple[Tensor, Tensor, Tensor, Tensor],
    ipm: dict,
) -> tuple[Iterate, Tensor, Tensor, Iterate]:
    """The interior point on the equality-free problem in :math:`x = x_p + Zw`.

    With :math:`AZ = 0`, the QP becomes
    :math:`\\min_w \\tfrac12 w^\\top Z^\\top P Z w + (Z^\\top(q + Px_p))^\\top w` s.t.
    :math:`GZw \\le h - Gx_p`: every Newton system shrinks from :math:`n` to :math:`n - p` and
    loses its Schur complement. Farkas certificates of the reduced problem are certificates of
    the original one (:math:`y = -R_1^{-1}Q_1^\\top G^\\top z`). The equality multipliers
    are recovered from stationarity, :math:`y = -R_1^{-1}Q_1^\\top(Px + q + G^\\top z)`.
    Returns the iterate in :math:`x` and, last, the reduced iterate (to resume from).
    """
    Q1, R1, Z, xp = null
    B = q.shape[0]
    Pz = Z.mT @ P @ Z
    qz = rmv(Z, q + mv(P, xp))
    Gz = G @ Z
    hz = h - mv(G, xp)
    e_mat, e_vec = P.new_zeros(B, 0, Z.shape[-1]), q.new_zeros(B, 0)
    it, status, iters = interior_point(Pz, qz, e_mat, e_vec, Gz, hz, **ipm)
    x = xp + mv(Z, it.x)
    grad = mv(P, x) + q + rmv(G, it.z)
    y = -torch.linalg.solve_triangular(R1, rmv(Q1, grad).unsqueeze(-1), upper=True).squeeze(-1)
    return Iterate(x=x, y=y, z=it.z, s=it.s), status, iters, it


def __getattr__(name: str) -> object:
    if name == "TorchQPStatus":  # deprecated: the statuses are dxopt.qp.QPStatus
        return deprecated_status_enum(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
