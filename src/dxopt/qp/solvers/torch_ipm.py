"""A batched dense QP solver written in torch: primal-dual interior point plus active-set polish.

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

**Polish.** The active set is read off the final iterate (row :math:`i` active iff
:math:`z_i > s_i`) and the reduced KKT system
:math:`K = [[P, C^\\top], [C, 0]]`, :math:`C = [A; G_{\\mathcal A}]`, is solved exactly by
OSQP's polish (Stellato et al., arXiv 1711.08013, section 4): factor the penalty matrix
:math:`P + \\sigma I + C^\\top W C` (the quasi-definite :math:`K_\\delta` with
:math:`\\delta = W^{-1}` after eliminating the multipliers) and refine against :math:`K`. The
polished point replaces the interior-point iterate only when it passes the CPU path's
certificate (:func:`dxopt.qp.certify.torch_certify.certify`: norm-scaled residuals, signs and the
row-by-row complementarity); where it does not, the CPU polish's rule corrects the active set
(rows with negative multipliers leave, violated rows join, judged at round-off;
:data:`POLISH_ROUNDS` active sets in all), and where that fails too (an ambiguous, nearly
weakly active row) the sample's interior point resumes with a 1000x tighter complementarity
and is polished again (at most twice). A sample whose polish never certifies keeps its
interior-point iterate, gets ``MAX_ITER`` unless that iterate certifies, and is refused by this
module's backward (:func:`dxopt.qp.solve` sends it to the CPU fallback chain). That penalty
factorization is kept in :class:`TorchQPResult.factor` and is the one the backward reuses:
one batched Cholesky serves the polish and every adjoint solve.

**float32.** Iterates, residuals and certificates are float32 (``eps_abs`` and ``eps_rel``
raised to at least ``1e-5``); every factorization is float64 (mixed precision): the Newton
systems, whose :math:`D = z/s` spans many orders of magnitude near the solution (a float32
Cholesky of them stopped the iteration after 4 steps at cond(P) = 1e4), and the polish's
penalty matrix, whose refinement residuals and solution are accumulated in float64 and then
rounded; the backward reuses that factor. The polished point is certified in float64 at the
user's tolerance before it is rounded (what the CPU path does with float32 data: it certifies
its float64 solution and returns its rounding); the interior point alone stops at ``eps_abs``
and ``eps_rel`` raised to at least ``1e-5``. Measured against daqp
in float64 on the same float32-rounded data (``tests/qp/test_float32_device.py``): relative
errors 2e-8 to 7e-8 for ``x``, the multipliers and every gradient, cond(P) from 1 to 1e6. This
is the choice made here in place of qpax's relaxed interior point (which differentiates a
smoothed point instead). On a GPU the float64 factorizations cost the device's float64 rate.

**CPU execution.** A host sync is free on the CPU, so there the loop tests completion every
iteration and shrinks the batch to the samples still running (each sample pays its own
iteration count); small batched matrices run at one torch thread (:func:`small_threads`).
Matrix-vector products use the row-vector form ``v[..., None, :] @ M.mT`` (torch's batched
``M @ v[..., None]`` is about 3x slower on the CPU).
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dxopt.linalg.threads import small_work
from dxopt.qp.certify.torch_certify import _amax, _mv, _rmv
from dxopt.qp.certify.torch_certify import certify as _certify
from dxopt.qp.certify.torch_certify import polish_update as _polish_update
from dxopt.qp.certify.torch_certify import regular as _regular

__all__ = [
    "PenaltyFactor",
    "TorchQPResult",
    "TorchQPStatus",
    "kkt_solve",
    "penalty_factor",
    "small_threads",
]


class TorchQPStatus(enum.IntEnum):
    """Per-sample outcome codes of :func:`~dxopt.qp.autograd.torch_entry.torch_qp_solve`
    (stored as an int tensor)."""

    SOLVED = 0
    MAX_ITER = 1
    PRIMAL_INFEASIBLE = 2
    DUAL_INFEASIBLE = 3
    NUMERICAL_ERROR = 4


@dataclass(frozen=True)
class PenaltyFactor:
    """Cholesky factor of :math:`P + \\sigma I + G^\\top W_G G + A^\\top W_A A` per sample.

    Attributes:
        L: lower Cholesky factor, ``(B, n, n)``.
        w_ineq: weights :math:`W_G`, ``(B, m)``; zero on inactive rows.
        w_eq: weights :math:`W_A`, ``(B, p)``.
        active: active inequality rows, ``(B, m)`` bool.
        steps: refinement steps each solve takes.
    """

    L: Tensor
    w_ineq: Tensor
    w_eq: Tensor
    active: Tensor
    steps: int


@dataclass(frozen=True)
class TorchQPResult:
    """Solution of a batch of QPs by :func:`~dxopt.qp.autograd.torch_entry.torch_qp_solve`
    (all tensors on the input device).

    Attributes:
        x: primal solutions ``(B, n)`` (differentiable when an input requires grad).
        eq_duals: multipliers :math:`y` of :math:`Ax = b`, ``(B, p)``.
        ineq_duals: multipliers :math:`z \\ge 0` of :math:`Gx \\le h`, ``(B, m)``.
        slacks: :math:`s = h - Gx`, ``(B, m)``.
        status: :class:`TorchQPStatus` codes, int64 ``(B,)``.
        iterations: interior-point iterations per sample, int64 ``(B,)``.
        primal_residual: :math:`\\max(\\|Ax-b\\|_\\infty, \\max(Gx-h)_+)` per sample.
        dual_residual: :math:`\\|Px + q + A^\\top y + G^\\top z\\|_\\infty` per sample.
        polished: whether the active-set polish was accepted, ``(B,)`` bool.
        factor: the penalty factorization of the polish, reused by the backward.
        regular: ``(B,)`` bool, solved samples whose polished active set is strictly
            complementary and independent with ``P`` positive definite
            (:func:`dxopt.qp.certify.torch_certify.regular`): the exact active-set backward is the
            derivative there; :func:`dxopt.qp.solve` sends the others to the CPU path.
    """

    x: Tensor
    eq_duals: Tensor
    ineq_duals: Tensor
    slacks: Tensor
    status: Tensor
    iterations: Tensor
    primal_residual: Tensor
    dual_residual: Tensor
    polished: Tensor
    factor: PenaltyFactor
    regular: Tensor

    @property
    def solved(self) -> Tensor:
        """``(B,)`` bool: status is :attr:`TorchQPStatus.SOLVED`."""
        return self.status == TorchQPStatus.SOLVED


# ----------------------------------------------------------------------------------------
# small batched helpers: matrices are (B, r, n), vectors (B, r)


def _dot(u: Tensor, v: Tensor) -> Tensor:
    return (u * v).sum(-1)


def _gram(G: Tensor, d: Tensor) -> Tensor:
    """:math:`G^\\top \\mathrm{diag}(d) G` per sample."""
    return (G.mT * d.unsqueeze(-2)) @ G


def _eye_like(B: int, n: int, ref: Tensor) -> Tensor:
    return torch.eye(n, dtype=ref.dtype, device=ref.device).expand(B, n, n)


def _chol(H: Tensor) -> tuple[Tensor, Tensor]:
    """Batched Cholesky without a host sync, and the ``(B,)`` mask of failed samples.

    A failed sample's factor is garbage (solves with it give non-finite values); callers mask
    it out with the returned flag.
    """
    L, info = torch.linalg.cholesky_ex(H)
    return L, info != 0


def _cho_solve(L: Tensor, r: Tensor) -> Tensor:
    """:math:`(LL^\\top)^{-1} r` by two triangular solves (faster than ``cholesky_solve``)."""
    t = torch.linalg.solve_triangular(L, r.unsqueeze(-1), upper=False)
    return torch.linalg.solve_triangular(L.mT, t, upper=True).squeeze(-1)


SMALL_THREADS_MAX_DIM = 256
ROUNDOFF_KKT = 1e-10
"""The relative residual of the polish's float64 KKT solve up to which the active set's KKT
matrix is taken as numerically nonsingular (a regular sample; else the CPU path): the float64
backward's own acceptance threshold (:mod:`dxopt.qp.autograd.torch_function`)."""
REFINE_STEPS = 16
"""Default cap on the refinement passes of a KKT solve (polish and backward). Each pass after
the first runs only while some sample is above round-off and still halving its residual, so a
well-conditioned batch takes one or two; measured: an active set of 20 rows in R^20 with a
normalised smallest singular value of 4e-3 needs 5-8 passes to reach 1e-14 (4 left the
adjoint residual at 1.4e-10)."""
POLISH_ROUNDS = 4
"""Active sets each polish tries: the interior point's, then the CPU polish's corrections
(:func:`dxopt.qp.certify.torch_certify.polish_update`) for the samples that do not certify."""
IPM_EPS_FLOOR = 1e-6
"""The interior point stops at ``max(eps_abs, IPM_EPS_FLOOR)``: the polish solves the identified
active set exactly and certifies it at the user's ``eps_abs``; a sample whose polish fails
resumes with a 1000x tighter complementarity. Measured on dQP's random QPs (128 x n=50,
256 x n=20, 64 x n=100, seed 1): 16% fewer iterations than stopping at 1e-9, the same ``x``
(within 3e-13 of daqp), every sample polished and solved."""


def small_threads(n: int, m: int, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """One torch thread for the solve when every matrix of the batch is small (``n`` and
    ``m`` at most :data:`SMALL_THREADS_MAX_DIM`) and on the CPU; no change otherwise
    (:func:`dxopt.linalg.threads.small_work` with the per-matrix size as its measure: a batch
    of small matrices gains nothing from intra-op threads whatever the batch size).

    Measured: batch 128, n = 50 (m = 50, p = 25), forward+backward, the same process on the
    shared 2-core machine (load average 2.5-3.6): 0.25 s at 1 thread, 4.8 s at 2 threads
    without this cap.
    """
    if device.type == "cpu":
        size = float(max(n, m)) ** 3
        return small_work(size, limit=float(SMALL_THREADS_MAX_DIM) ** 3 + 1.0)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------
# penalty factorization + refinement: the polish and the backward share it


def penalty_factor(
    P: Tensor, A: Tensor, G: Tensor, active: Tensor, *, omega: float, sigma: float, steps: int
) -> tuple[PenaltyFactor, Tensor]:
    """Factor :math:`P + \\sigma s I + G_{\\mathcal A}^\\top W_G G_{\\mathcal A} + A^\\top W_A A`.

    Row weights are :math:`W_i = \\omega s / \\|C_i\\|_2^2` with :math:`s` the mean of
    :math:`|\\mathrm{diag} P|` (1 when that is 0), so every penalty term is :math:`\\omega`
    times the curvature scale of :math:`P`. Returns the factor and a ``(B,)`` mask of samples
    whose Cholesky failed.
    """
    if P.dtype == torch.float32:  # mixed precision: float32 data, float64 factorization
        P, A, G = P.double(), A.double(), G.double()
    scale = P.diagonal(dim1=-2, dim2=-1).abs().mean(-1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    tiny = torch.finfo(P.dtype).tiny ** 0.5

    def weights(M: Tensor) -> Tensor:
        norms = (M * M).sum(-1)
        return torch.where(norms > tiny, omega * scale[:, None] / norms.clamp_min(tiny), 0.0)

    w_ineq = weights(G) * active
    w_eq = weights(A)
    H = P + _gram(G, w_ineq) + _gram(A, w_eq)
    H.diagonal(dim1=-2, dim2=-1).add_((sigma * scale)[:, None])
    L, bad = _chol(H)
    return PenaltyFactor(L=L, w_ineq=w_ineq, w_eq=w_eq, active=active, steps=steps), bad


def kkt_solve(
    f: PenaltyFactor,
    P: Tensor,
    A: Tensor,
    G: Tensor,
    r1: Tensor,
    r2: Tensor,
    r3: Tensor,
    *,
    wide: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Solve the reduced KKT system on the active set, refined from the penalty factor.

    The system is

    .. math::
        P u + A^\\top v + G^\\top w = r_1,\\quad A u = r_2,\\quad
        G_i u = r_{3,i}\\ (i \\in \\mathcal A),\\quad w_i = 0\\ (i \\notin \\mathcal A),

    (symmetric, so the same routine serves the polish, with :math:`r = (-q, b, h)`, and the
    adjoint). Each pass solves the regularised :math:`K_\\delta` (:math:`\\delta = W^{-1}`
    in the multiplier blocks, :math:`\\sigma` on :math:`u`) by eliminating
    :math:`v = W_A(Au - r_2)`, :math:`w = W_G(Gu - r_3)`; ``f.steps`` refinement passes on the
    residual of the exact system remove the regularisation bias (at most; a sample stops at
    round-off or when a pass no longer halves its residual). With a float32 factor the
    residuals and the accumulated solution are float64 (mixed-precision refinement: float32
    factor, float64 residuals), so the result is accurate to float32 rounding of the exact
    solution whenever :math:`\\kappa(K)\\,\\epsilon_{32} < 1`; ``u, v, w`` come back in the
    inputs' dtype (``wide=True``: in the factor's float64). Returns ``u, v, w`` and the
    per-sample relative residual
    :math:`\\|\\text{res}\\|_\\infty / (1 + \\|r\\|_\\infty)`.
    """
    low, hi = P.dtype, f.L.dtype
    P, A, G, r1, r2, r3 = (t.to(hi) for t in (P, A, G, r1, r2, r3))
    act = f.active.to(hi)
    w_eq, w_ineq = f.w_eq, f.w_ineq

    def reg_solve(s1: Tensor, s2: Tensor, s3: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        s3 = s3 * act
        rhs = s1 + _rmv(A, w_eq * s2) + _rmv(G, w_ineq * s3)
        u = _cho_solve(f.L, rhs)
        return u, w_eq * (_mv(A, u) - s2), w_ineq * (_mv(G, u) - s3)

    def residual(u: Tensor, v: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e1 = r1 - _mv(P, u) - _rmv(A, v) - _rmv(G, w)
        return e1, r2 - _mv(A, u), (r3 - _mv(G, u)) * act

    size = 1.0 + torch.maximum(torch.maximum(_amax(r1), _amax(r2)), _amax(r3 * act))
    u, v, w = reg_solve(r1, r2, r3)
    prev = torch.full_like(size, float("inf"))
    for k in range(f.steps + 1):
        e1, e2, e3 = residual(u, v, w)
        err = torch.maximum(torch.maximum(_amax(e1), _amax(e2)), _amax(e3)) / size
        # a sample keeps refining while it is above round-off and its residual still at least
        # halves per pass (a stagnating one would only spend passes); stop (one host sync per
        # pass) when none does
        moving = (err > 8 * torch.finfo(hi).eps) & (err <= 0.5 * prev)
        if k == f.steps or not bool(moving.any()):
            break
        du, dv, dw = reg_solve(e1, e2, e3)
        keep = moving[:, None]
        u, v, w = (torch.where(keep, t + dt, t) for t, dt in ((u, du), (v, dv), (w, dw)))
        prev = torch.where(moving, err, prev)
    if wide:
        return u, v, w, err
    return u.to(low), v.to(low), w.to(low), err.to(low)


# ----------------------------------------------------------------------------------------
# interior point


@dataclass
class _Iterate:
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
        H = P + _gram(G, D)
        H.diagonal(dim1=-2, dim2=-1).add_(delta[:, None])
        self.L, bad = _chol(H)
        self.A, self.p = A, p
        if p:
            X = torch.linalg.solve_triangular(self.L, A.mT, upper=False)  # L^{-1} A^T
            S = X.mT @ X
            S.diagonal(dim1=-2, dim2=-1).add_(delta[:, None])
            self.LS, bad_s = _chol(S)
            bad = bad | bad_s
        self.bad = bad

    def solve(self, r1: Tensor, r2: Tensor) -> tuple[Tensor, Tensor]:
        """Solve :math:`H\\,dx + A^\\top dy = r_1`, :math:`A\\,dx = r_2`."""
        r1, r2 = r1.to(self.L.dtype), r2.to(self.L.dtype)
        u = _cho_solve(self.L, r1)
        if not self.p:
            return u.to(self.dtype), r2.to(self.dtype)
        dy = _cho_solve(self.LS, _mv(self.A, u) - r2)
        dx = _cho_solve(self.L, r1 - _rmv(self.A, dy))
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
    Px, Ax, Gx, Ay, Gz = _mv(P, x), _mv(A, x), _mv(G, x), _rmv(A, y), _rmv(G, z)
    rd, re, ri = Px + q + Ay + Gz, Ax - b, Gx + s - h
    pscale = torch.maximum(torch.maximum(_amax(h), _amax(b)), torch.maximum(_amax(Gx), _amax(Ax)))
    dscale = torch.maximum(torch.maximum(_amax(q), _amax(Px)), torch.maximum(_amax(Gz), _amax(Ay)))
    obj = (0.5 * _dot(x, Px) + _dot(q, x)).abs()
    m = max(h.shape[-1], 1)
    ok = torch.maximum(_amax(re), _amax(ri)) <= eps_abs + eps_rel * pscale
    ok = ok & (_amax(rd) <= eps_abs + eps_rel * dscale)
    gap_rel = eps_rel if gap_rel is None else gap_rel
    gap_abs = eps_abs if gap_abs is None else gap_abs
    ok = ok & (_dot(s.abs(), z.abs()) / m <= gap_abs + gap_rel * obj)
    return rd, re, ri, ok


def _certificates(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, G: Tensor, h: Tensor, it: _Iterate, eps: float
) -> tuple[Tensor, Tensor]:
    """Masks of samples whose iterates are primal / dual infeasibility certificates."""
    tiny = torch.finfo(q.dtype).tiny ** 0.5
    t = torch.maximum(_amax(it.y), _amax(it.z)).clamp_min(tiny)
    yh, zh = it.y / t[:, None], it.z / t[:, None]
    pinf = (_amax(_rmv(A, yh) + _rmv(G, zh)) <= eps) & (_dot(b, yh) + _dot(h, zh) < -eps)
    xh = it.x / _amax(it.x).clamp_min(tiny)[:, None]
    gx = _mv(G, xh)
    gmax = gx.amax(-1) if gx.shape[-1] else torch.zeros_like(t)
    dinf = (_amax(_mv(P, xh)) <= eps) & (_amax(_mv(A, xh)) <= eps) & (gmax <= eps)
    return pinf, dinf & (_dot(q, xh) < -eps)


def _initial_point(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, G: Tensor, h: Tensor, delta: Tensor
) -> _Iterate:
    """CVXOPT's starting point: solve the Newton system with :math:`D = I`, then shift."""
    newton = _Newton(P, A, G, torch.ones_like(h), delta)
    x, y = newton.solve(-q + _rmv(G, h), b)
    zh = _mv(G, x) - h  # the multiplier of the D = I system; the slack is -zh
    m = h.shape[-1]
    if m:
        ap = zh.amax(-1, keepdim=True)  # = -min(s)
        s = torch.where(ap < 0, -zh, -zh + 1 + ap)
        ad = (-zh).amax(-1, keepdim=True)
        z = torch.where(ad < 0, zh, zh + 1 + ad)
    else:
        s, z = zh, zh
    return _Iterate(x=x, y=y, z=z, s=s)


def _check_inputs(
    P: Tensor, q: Tensor, A: Tensor | None, b: Tensor | None, G: Tensor | None, h: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Validate shapes/dtypes/devices; return every input as a (B, ...) tensor (views)."""
    for name, t in (("P", P), ("q", q), ("A", A), ("b", b), ("G", G), ("h", h)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(
                f"torch_qp_solve: {name} must be a torch.Tensor, got {type(t).__name__}"
            )
    for mat, vec, mn, vn in ((A, b, "A", "b"), (G, h, "G", "h")):
        if (mat is None) != (vec is None):
            given, missing = (mn, vn) if vec is None else (vn, mn)
            raise ValueError(
                f"torch_qp_solve: {given} was given without {missing}; pass both or neither"
            )
    if P.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"torch_qp_solve: P must be float32 or float64, got {P.dtype}; convert with .double()"
        )
    if P.ndim not in (2, 3) or P.shape[-1] != P.shape[-2]:
        raise ValueError(
            f"torch_qp_solve: P must be (n, n) or (B, n, n), got shape {tuple(P.shape)}"
        )
    n = P.shape[-1]
    tensors = {"P": P, "q": q, "A": A, "b": b, "G": G, "h": h}
    batch = {1}
    for name, t in tensors.items():
        if t is None:
            continue
        if t.dtype != P.dtype or t.device != P.device:
            raise ValueError(
                f"torch_qp_solve: {name} has dtype {t.dtype} on {t.device} but P has {P.dtype} "
                f"on {P.device}; every input must share P's dtype and device"
            )
        base = 2 if name in ("P", "A", "G") else 1
        if t.ndim not in (base, base + 1):
            raise ValueError(
                f"torch_qp_solve: {name} must have {base} dims (unbatched) or {base + 1} "
                f"(batched), got shape {tuple(t.shape)}"
            )
        if t.ndim == base + 1:
            batch.add(t.shape[0])
        if not t.is_floating_point() or t.layout != torch.strided:
            raise ValueError(f"torch_qp_solve: {name} must be a dense floating tensor")
    if len(batch - {1}) > 1:
        raise ValueError(
            "torch_qp_solve: batched inputs disagree on the batch size "
            f"{sorted(batch - {1})}; use one batch size (or 1 to broadcast)"
        )
    B = max(batch)
    if q.shape[-1] != n:
        raise ValueError(f"torch_qp_solve: q must have n = {n} entries, got shape {tuple(q.shape)}")
    for mat, vec, mn, vn in ((A, b, "A", "b"), (G, h, "G", "h")):
        if (
            mat is not None
            and vec is not None
            and (mat.shape[-1] != n or mat.shape[-2] != vec.shape[-1])
        ):
            raise ValueError(
                f"torch_qp_solve: {mn} must be (k, n={n}) with {vn} of length k, got "
                f"{mn} {tuple(mat.shape)} and {vn} {tuple(vec.shape)}"
            )

    def full(t: Tensor | None, base: int, shape: tuple[int, ...]) -> Tensor:
        if t is None:
            return P.new_zeros((B, *shape))
        return (t.unsqueeze(0) if t.ndim == base else t).expand(B, *t.shape[-base:])

    p = 0 if b is None else b.shape[-1]
    m = 0 if h is None else h.shape[-1]
    return (
        full(P, 2, (n, n)),
        full(q, 1, (n,)),
        full(A, 2, (p, n)),
        full(b, 1, (p,)),
        full(G, 2, (m, n)),
        full(h, 1, (m,)),
    )


def _ipm(
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
    start: tuple[_Iterate, Tensor, Tensor] | None = None,
) -> tuple[_Iterate, Tensor, Tensor]:
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
    status = torch.full((B,), int(TorchQPStatus.MAX_ITER), dtype=torch.long, device=dev)
    if start is None:
        it = _initial_point(P, q, A, b, G, h, delta)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        iters = torch.zeros(B, dtype=torch.long, device=dev)
    else:
        it, done, iters = start
    if m == 0:
        return it, status, iters  # equality-only: the polish solves it exactly
    tiny = torch.finfo(q.dtype).tiny ** 0.5
    SOLVED, NUMERICAL = int(TorchQPStatus.SOLVED), int(TorchQPStatus.NUMERICAL_ERROR)
    # On the CPU a host sync is free, so every iteration tests for completion and the working
    # set shrinks to the samples still running (their data gathered once per shrink): each
    # sample costs its own iterations, not the slowest sample's. On other devices the batch
    # keeps its shape and syncs once per ``check_every`` iterations.
    compact = q.device.type == "cpu"
    full = (it, status, iters)
    work: Tensor | None = None  # indices of the working samples in the batch (None: all)
    data = (P, q, A, b, G, h, delta)

    def write_back() -> tuple[_Iterate, Tensor, Tensor]:
        if work is None:
            return it, status, iters
        f_it, f_status, f_iters = full
        put = lambda dst, src: dst.index_copy(0, work, src)  # noqa: E731
        return (
            _Iterate(
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
        mu = _dot(it.s, it.z) / m
        stalled = mu <= mu_floor * (1.0 + _amax(it.x) * _amax(q) + _amax(it.z) * _amax(h))
        status = torch.where(~done & ok, SOLVED, status)
        done = done | ok | stalled
        certify = k % check_every == 0 or k == max_iter
        if certify:
            pinf, dinf = _certificates(P, q, A, b, G, h, it, eps_inf)
            pinf, dinf = pinf & ~done, dinf & ~done
            status = torch.where(pinf, int(TorchQPStatus.PRIMAL_INFEASIBLE), status)
            status = torch.where(dinf & ~pinf, int(TorchQPStatus.DUAL_INFEASIBLE), status)
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
                it = _Iterate(x=it.x[live], y=it.y[live], z=it.z[live], s=it.s[live])
                rd, re, ri, mu = rd[live], re[live], ri[live], mu[live]
                done, status, iters = done[live], status[live], iters[live]
        D = it.z / it.s
        newton = _Newton(P, A, G, D, delta)

        def step(rc: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            t = ri - rc / it.z  # noqa: B023
            dx, dy = newton.solve(-rd - _rmv(G, D * t), -re)  # noqa: B023
            dz = D * (_mv(G, dx) + t)  # noqa: B023
            ds = -(rc + it.s * dz) / it.z  # noqa: B023
            return dx, dy, dz, ds

        dx, dy, dz, ds = step(it.s * it.z)
        a_aff = torch.minimum(_max_step(it.s, ds), _max_step(it.z, dz))[:, None]
        mu_aff = _dot(it.s + a_aff * ds, it.z + a_aff * dz) / m
        sig = (mu_aff / mu.clamp_min(tiny)).clamp(0.0, 1.0) ** 3
        dx, dy, dz, ds = step(it.s * it.z + ds * dz - (sig * mu)[:, None])
        alpha = 0.99 * torch.minimum(_max_step(it.s, ds), _max_step(it.z, dz))
        new = _Iterate(
            x=it.x + alpha[:, None] * dx,
            y=it.y + alpha[:, None] * dy,
            z=it.z + alpha[:, None] * dz,
            s=it.s + alpha[:, None] * ds,
        )
        fine = torch.isfinite(torch.cat([new.x, new.y], -1)).all(-1)
        fine = fine & (new.s > 0).all(-1) & (new.z > 0).all(-1) & ~newton.bad
        broken = ~done & ~fine
        status = torch.where(broken, NUMERICAL, status)
        move = (~done & fine)[:, None]
        done = done | broken
        iters = iters + move.squeeze(-1).long()
        it = _Iterate(
            x=torch.where(move, new.x, it.x),
            y=torch.where(move, new.y, it.y),
            z=torch.where(move, new.z, it.z),
            s=torch.where(move, new.s, it.s),
        )
    return write_back()


def _null_space(A: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
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


def _ipm_null_space(
    P: Tensor,
    q: Tensor,
    A: Tensor,
    G: Tensor,
    h: Tensor,
    null: tuple[Tensor, Tensor, Tensor, Tensor],
    ipm: dict,
) -> tuple[_Iterate, Tensor, Tensor, _Iterate]:
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
    qz = _rmv(Z, q + _mv(P, xp))
    Gz = G @ Z
    hz = h - _mv(G, xp)
    e_mat, e_vec = P.new_zeros(B, 0, Z.shape[-1]), q.new_zeros(B, 0)
    it, status, iters = _ipm(Pz, qz, e_mat, e_vec, Gz, hz, **ipm)
    x = xp + _mv(Z, it.x)
    grad = _mv(P, x) + q + _rmv(G, it.z)
    y = -torch.linalg.solve_triangular(R1, _rmv(Q1, grad).unsqueeze(-1), upper=True).squeeze(-1)
    return _Iterate(x=x, y=y, z=it.z, s=it.s), status, iters, it


def status_is(status: Tensor, *names: str) -> Tensor:
    """``(B,)`` mask of samples whose status is one of ``names`` (``TorchQPStatus`` names)."""
    out = torch.zeros_like(status, dtype=torch.bool)
    for name in names:
        out = out | (status == int(TorchQPStatus[name]))
    return out


def solve_detached(
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
    polish: bool,
    refine_steps: int | None,
) -> TorchQPResult:
    """:func:`torch_qp_solve` on validated ``(B, ...)`` inputs, without autograd."""
    with torch.no_grad(), small_threads(P.shape[-1], G.shape[-2], P.device):
        f64 = P.dtype == torch.float64
        user_abs, user_rel = eps_abs, eps_rel  # the polished point's certificate
        if not f64:
            eps_abs, eps_rel = max(eps_abs, 1e-5), max(eps_rel, 1e-5)
        ipm: dict[str, Any] = {
            "eps_abs": max(eps_abs, IPM_EPS_FLOOR),
            "eps_rel": max(eps_rel, 1e-10),  # residuals: the polish takes it from there
            "eps_inf": eps_inf,
            "max_iter": max_iter,
            "check_every": check_every,
            "gap_rel": 0.0,  # the complementarity decides the active set: keep it absolute
        }
        null = _null_space(A, b) if 0 < A.shape[-2] < A.shape[-1] and h.shape[-1] else None

        def run(**kw: Any) -> tuple[_Iterate, Tensor, Tensor, _Iterate]:
            if null is None:
                out = _ipm(P, q, A, b, G, h, **ipm, **kw)
                return (*out, out[0])
            return _ipm_null_space(P, q, A, G, h, null, {**ipm, **kw})

        it, status, iters, raw = run()
        nonzero = G.abs().amax(-1) > 0  # zero rows of G are never active (multiplier 0)
        steps = refine_steps if refine_steps is not None else REFINE_STEPS
        m, gap_abs = h.shape[-1], max(eps_abs, IPM_EPS_FLOOR)
        for attempt in range(3):
            # polish on the active set read off the iterate; where a sample's polish fails
            # certification (an ambiguous, nearly weakly active row), resume its interior
            # point with a 1000x tighter complementarity and polish again
            active = (it.z > it.s) & nonzero
            for _ in range(POLISH_ROUNDS):
                factor, bad = penalty_factor(
                    P, A, G, active, omega=1e6, sigma=1e-9, steps=steps
                )  # fmt: skip
                if not (polish or m == 0):
                    break
                # the polished point in float64 (float32 data: its float64 solution on the
                # active set, certified as the CPU path certifies its float64 points, then
                # rounded)
                xw, yw, zw, kkt_err = kkt_solve(factor, P, A, G, -q, b, h, wide=True)
                zw = torch.where(active, zw, 0.0)
                ok_p = _certify(P, q, A, b, G, h, xw, yw, zw, user_abs, user_rel) & ~bad
                if m == 0 or bool(ok_p.all()):
                    break
                # the CPU polish's rule: drop wrong-signed multipliers, add violated rows
                new = _polish_update(P, q, G, h, xw, zw, active)
                change = ~ok_p & ~bad & (new != active).any(-1)
                if not bool(change.any()):
                    break
                active = torch.where(change[:, None], new, active)
            if not (polish or m == 0):
                break
            xp, yp, zp = xw.to(P.dtype), yw.to(P.dtype), zw.to(P.dtype)
            retry = ~ok_p & (status == TorchQPStatus.SOLVED) & (iters < max_iter)
            if attempt == 2 or m == 0 or not bool(retry.any()):
                break
            gap_abs *= 1e-3
            it, status_new, iters, raw = run(gap_abs=gap_abs, start=(raw, ~retry, iters))
            status = torch.where(retry, status_new, status)
        x, y, z = it.x, it.y, torch.where(nonzero, it.z.clamp_min(0.0), 0.0)
        polished = torch.zeros_like(bad)
        if polish or m == 0:
            polished = ok_p & ~status_is(status, "PRIMAL_INFEASIBLE", "DUAL_INFEASIBLE")
            x = torch.where(polished[:, None], xp, x)
            y = torch.where(polished[:, None], yp, y)
            z = torch.where(polished[:, None], zp.clamp_min(0.0), z)
            if h.shape[-1] == 0 and bool((~ok_p).any()):
                # equality-only: the least-squares residual r = b - A A^+ b (-r is a Farkas
                # certificate when nonzero) and the penalty solve's (diverging) x are the
                # candidates
                r = b - _mv(A, _mv(torch.linalg.pinv(A), b)) if A.shape[-2] else b
                cand = _Iterate(x=xp, y=-r, z=zp, s=zp)
                pinf, dinf = _certificates(P, q, A, b, G, h, cand, eps_inf)
                pinf, dinf = pinf & ~ok_p, dinf & ~ok_p
                status = torch.where(pinf, int(TorchQPStatus.PRIMAL_INFEASIBLE), status)
                status = torch.where(dinf & ~pinf, int(TorchQPStatus.DUAL_INFEASIBLE), status)
        ok = _certify(P, q, A, b, G, h, x, y, z, eps_abs, eps_rel, settled_only=polish)
        if polish or m == 0:  # a polished sample: its float64 point's certificate
            ok = torch.where(polished, ok_p, ok)
        ok = ok & ~status_is(status, "PRIMAL_INFEASIBLE", "DUAL_INFEASIBLE")
        # not certified at the user's tolerance: an interior-point "SOLVED" becomes MAX_ITER
        status = torch.where(ok, int(TorchQPStatus.SOLVED), status)
        status = torch.where(
            ~ok & (status == TorchQPStatus.SOLVED), int(TorchQPStatus.MAX_ITER), status
        )
        # where the device's exact active-set derivative is the derivative (the CPU path's
        # rules would give the same); the other samples are sent to the CPU path
        # (dxopt.qp.api.device)
        regular = ok & polished
        if polish or m == 0:  # and the polish's own KKT solve reached round-off
            regular = regular & _regular(P, q, A, b, G, h, xw, zw, factor.active)
            regular = regular & (kkt_err <= ROUNDOFF_KKT)
        slacks = h - _mv(G, x)
        pres = torch.maximum(_amax(_mv(A, x) - b), _amax((-slacks).clamp_min(0.0)))
        dres = _amax(_mv(P, x) + q + _rmv(A, y) + _rmv(G, z))
        return TorchQPResult(
            x=x,
            eq_duals=y,
            ineq_duals=z,
            slacks=slacks,
            status=status,
            iterations=iters,
            primal_residual=pres,
            dual_residual=dres,
            polished=polished,
            factor=factor,
            regular=regular,
        )
