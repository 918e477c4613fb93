"""The linear algebra of the batched torch QP solver: the penalty factorization of the
active set's KKT system and its refined solve, shared by the polish
(:mod:`dxopt.qp.solvers.torch_driver`) and the backward
(:mod:`dxopt.qp.autograd.torch_function`), plus the small batched helpers (Cholesky without a
host sync, Gram matrices) and the one-thread rule for small batched matrices.

**Polish factor.** OSQP's polish (Stellato et al., arXiv 1711.08013, section 4) solves the
reduced KKT system :math:`K = [[P, C^\\top], [C, 0]]`, :math:`C = [A; G_{\\mathcal A}]`, by
factoring the penalty matrix :math:`P + \\sigma I + C^\\top W C` (the quasi-definite
:math:`K_\\delta` with :math:`\\delta = W^{-1}` after eliminating the multipliers) and refining
against :math:`K`. float32 data are factored in float64 (mixed precision; the refinement's
residuals and accumulated solution are float64 too). Matrix-vector products use the
row-vector form ``v[..., None, :] @ M.mT`` (torch's batched ``M @ v[..., None]`` is about 3x
slower on the CPU).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from dxopt.linalg.threads import small_work
from dxopt.qp.certify.torch_ops import amax, mv, rmv
from dxopt.qp.solvers.torch_types import PenaltyFactor

__all__ = [
    "SMALL_THREADS_MAX_DIM",
    "cho_solve",
    "cholesky_flagged",
    "kkt_solve",
    "penalty_factor",
    "small_threads",
    "weighted_gram",
]


# ----------------------------------------------------------------------------------------
# small batched helpers: matrices are (B, r, n), vectors (B, r)


def weighted_gram(G: Tensor, d: Tensor) -> Tensor:
    """:math:`G^\\top \\mathrm{diag}(d) G` per sample."""
    return (G.mT * d.unsqueeze(-2)) @ G


def cholesky_flagged(H: Tensor) -> tuple[Tensor, Tensor]:
    """Batched Cholesky without a host sync, and the ``(B,)`` mask of failed samples.

    A failed sample's factor is garbage (solves with it give non-finite values); callers mask
    it out with the returned flag.
    """
    L, info = torch.linalg.cholesky_ex(H)
    return L, info != 0


def cho_solve(L: Tensor, r: Tensor) -> Tensor:
    """:math:`(LL^\\top)^{-1} r` by two triangular solves (faster than ``cholesky_solve``)."""
    t = torch.linalg.solve_triangular(L, r.unsqueeze(-1), upper=False)
    return torch.linalg.solve_triangular(L.mT, t, upper=True).squeeze(-1)


SMALL_THREADS_MAX_DIM = 256


def small_threads(n: int, m: int, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """One torch thread for the solve when every matrix of the batch is small (``n`` and
    ``m`` at most :data:`SMALL_THREADS_MAX_DIM`) and on the CPU; no change otherwise
    (:func:`dxopt.linalg.threads.small_work` with the per-matrix size as its measure: a batch
    of small matrices gains nothing from intra-op threads whatever the batch size).

    Intra-op threads on such a batch cost more than they save (20x at batch 128, n = 50;
    ``benchmarks/qp_speed/results/routing_measurements.md``).
    """
    if device.type == "cpu":
        size = float(max(n, m)) ** 3
        return small_work(size, limit=float(SMALL_THREADS_MAX_DIM) ** 3 + 1.0)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------
# penalty factorization + refinement: the polish and the backward share it


def penalty_factor(
    P: Tensor, A: Tensor, G: Tensor, active: Tensor, *, omega: float, sigma: float, max_refine: int
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
    H = P + weighted_gram(G, w_ineq) + weighted_gram(A, w_eq)
    H.diagonal(dim1=-2, dim2=-1).add_((sigma * scale)[:, None])
    L, bad = cholesky_flagged(H)
    return PenaltyFactor(L=L, w_ineq=w_ineq, w_eq=w_eq, active=active, max_refine=max_refine), bad


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
    :math:`v = W_A(Au - r_2)`, :math:`w = W_G(Gu - r_3)`; ``f.max_refine`` refinement passes on the
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
        rhs = s1 + rmv(A, w_eq * s2) + rmv(G, w_ineq * s3)
        u = cho_solve(f.L, rhs)
        return u, w_eq * (mv(A, u) - s2), w_ineq * (mv(G, u) - s3)

    def residual(u: Tensor, v: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e1 = r1 - mv(P, u) - rmv(A, v) - rmv(G, w)
        return e1, r2 - mv(A, u), (r3 - mv(G, u)) * act

    size = 1.0 + torch.maximum(torch.maximum(amax(r1), amax(r2)), amax(r3 * act))
    u, v, w = reg_solve(r1, r2, r3)
    prev = torch.full_like(size, float("inf"))
    for k in range(f.max_refine + 1):
        e1, e2, e3 = residual(u, v, w)
        err = torch.maximum(torch.maximum(amax(e1), amax(e2)), amax(e3)) / size
        # refine while above round-off and halving per pass (a stagnating sample would only
        # spend passes)
        moving = (err > 8 * torch.finfo(hi).eps) & (err <= 0.5 * prev)
        if k == f.max_refine or not bool(moving.any()):
            break
        du, dv, dw = reg_solve(e1, e2, e3)
        keep = moving[:, None]
        u, v, w = (torch.where(keep, t + dt, t) for t, dt in ((u, du), (v, dv), (w, dw)))
        prev = torch.where(moving, err, prev)
    if wide:
        return u, v, w, err
    return u.to(low), v.to(low), w.to(low), err.to(low)
