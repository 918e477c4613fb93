"""The detached solve of the batched torch QP solver: inputs to :class:`TorchQPResult`.

Runs the interior point (:mod:`dxopt.qp.solvers.torch_ipm`; on the null space of ``A`` when it
has full row rank), polishes its iterate onto the identified active set with the penalty
factor of :mod:`dxopt.qp.solvers.torch_kkt`, certifies the polished point by the CPU path's
rules (:mod:`dxopt.qp.certify.torch_certify`), retries the samples whose polish fails and
sets the per-sample statuses and the *regular* flags; no autograd (the Function of
:mod:`dxopt.qp.autograd.torch_function` wraps it).

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
in float64 on the same float32-rounded data (``tests/qp/solvers/test_float32_device.py``): relative
errors 2e-8 to 7e-8 for ``x``, the multipliers and every gradient, cond(P) from 1 to 1e6. This
is the choice made here in place of qpax's relaxed interior point (which differentiates a
smoothed point instead). On a GPU the float64 factorizations cost the device's float64 rate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dxopt._core import Status
from dxopt.qp.certify.tolerances import IPM_EPS_FLOOR, ROUNDOFF_KKT, TORCH_REFINE_STEPS
from dxopt.qp.certify.torch_certify import certify, infeasibility_masks, polish_update
from dxopt.qp.certify.torch_certify import regular as regular_rows
from dxopt.qp.certify.torch_ops import amax, mv, rmv
from dxopt.qp.solvers.torch_ipm import (
    Iterate,
    interior_point,
    interior_point_null_space,
    null_space_basis,
)
from dxopt.qp.solvers.torch_kkt import (
    kkt_solve,
    penalty_factor,
    small_threads,
)
from dxopt.qp.solvers.torch_types import TorchOptions, TorchQPResult, code, status_mask

__all__ = ["POLISH_ROUNDS", "batch_inputs", "solve_detached"]

POLISH_ROUNDS = 4
"""Active sets each polish tries: the interior point's, then the CPU polish's corrections
(:func:`dxopt.qp.certify.torch_certify.polish_update`) for the samples that do not certify."""


def batch_inputs(
    P: Tensor, q: Tensor, A: Tensor | None, b: Tensor | None, G: Tensor | None, h: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Every input as a ``(B, ...)`` tensor (broadcast views; zero-row ``A, b`` / ``G, h``
    where absent). The inputs must be validated already: by
    :func:`dxopt.qp.problem.canonical.canonical_problem` (``keep_device=True``), the one
    validator of every route, which :func:`dxopt.qp.solve` and
    :func:`dxopt.qp.autograd.torch_entry.torch_qp_solve` run first."""
    n = P.shape[-1]
    sizes = [t.shape[0] for t, base in ((P, 2), (q, 1), (A, 2), (b, 1), (G, 2), (h, 1))
             if t is not None and t.ndim > base]  # fmt: skip
    B = max(sizes, default=1)

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


def solve_detached(
    P: Tensor, q: Tensor, A: Tensor, b: Tensor, G: Tensor, h: Tensor, options: TorchOptions
) -> TorchQPResult:
    """:func:`~dxopt.qp.autograd.torch_entry.torch_qp_solve` on validated ``(B, ...)`` inputs
    (:func:`batch_inputs`), without autograd, with the checked ``options``
    (:class:`~dxopt.qp.solvers.torch_types.TorchOptions`: ``max_iter`` interior-point
    iterations at most, ``max_refinement`` refinement passes of each KKT solve at most,
    ``None``: :data:`~dxopt.qp.certify.tolerances.TORCH_REFINE_STEPS`)."""
    eps_abs, eps_rel, polish = options.eps_abs, options.eps_rel, options.polish
    eps_inf, max_iter, check_every = options.eps_inf, options.max_iter, options.check_every
    max_refine = options.max_refinement
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
        null = null_space_basis(A, b) if 0 < A.shape[-2] < A.shape[-1] and h.shape[-1] else None

        def run(**kw: Any) -> tuple[Iterate, Tensor, Tensor, Iterate]:
            if null is None:
                out = interior_point(P, q, A, b, G, h, **ipm, **kw)
                return (*out, out[0])
            return interior_point_null_space(P, q, A, G, h, null, {**ipm, **kw})

        it, status, iters, raw = run()
        nonzero = G.abs().amax(-1) > 0  # zero rows of G are never active (multiplier 0)
        max_refine = TORCH_REFINE_STEPS if max_refine is None else max_refine
        m, gap_abs = h.shape[-1], max(eps_abs, IPM_EPS_FLOOR)
        for attempt in range(3):
            # a polish that fails certification (a nearly weakly active row) resumes the
            # interior point with a 1000x tighter complementarity to settle that row's side
            active = (it.z > it.s) & nonzero
            for _ in range(POLISH_ROUNDS):
                factor, bad = penalty_factor(
                    P, A, G, active, omega=1e6, sigma=1e-9, max_refine=max_refine
                )  # fmt: skip
                if not (polish or m == 0):
                    break
                # in float64 even for float32 data: certified as the CPU path's points are
                xw, yw, zw, kkt_err = kkt_solve(factor, P, A, G, -q, b, h, wide=True)
                zw = torch.where(active, zw, 0.0)
                ok_p = certify(P, q, A, b, G, h, xw, yw, zw, user_abs, user_rel) & ~bad
                if m == 0 or bool(ok_p.all()):
                    break
                # the CPU polish's rule: drop wrong-signed multipliers, add violated rows
                new = polish_update(
                    P, q, G, h, xw, zw, active, eps_abs=user_abs, eps_rel=user_rel
                )  # fmt: skip
                change = ~ok_p & ~bad & (new != active).any(-1)
                if not bool(change.any()):
                    break
                active = torch.where(change[:, None], new, active)
            if not (polish or m == 0):
                break
            xp, yp, zp = xw.to(P.dtype), yw.to(P.dtype), zw.to(P.dtype)
            retry = ~ok_p & (status == code(Status.SOLVED)) & (iters < max_iter)
            if attempt == 2 or m == 0 or not bool(retry.any()):
                break
            gap_abs *= 1e-3
            it, status_new, iters, raw = run(gap_abs=gap_abs, start=(raw, ~retry, iters))
            status = torch.where(retry, status_new, status)
        x, y, z = it.x, it.y, torch.where(nonzero, it.z.clamp_min(0.0), 0.0)
        polished = torch.zeros_like(bad)
        if polish or m == 0:
            polished = ok_p & ~status_mask(status, Status.INFEASIBLE, Status.UNBOUNDED)
            x = torch.where(polished[:, None], xp, x)
            y = torch.where(polished[:, None], yp, y)
            z = torch.where(polished[:, None], zp.clamp_min(0.0), z)
            if h.shape[-1] == 0 and bool((~ok_p).any()):
                # equality-only: -r, r = b - A A^+ b, is a Farkas certificate when nonzero
                r = b - mv(A, mv(torch.linalg.pinv(A), b)) if A.shape[-2] else b
                cand = Iterate(x=xp, y=-r, z=zp, s=zp)
                pinf, dinf = infeasibility_masks(P, q, A, b, G, h, cand.x, cand.y, cand.z, eps_inf)
                pinf, dinf = pinf & ~ok_p, dinf & ~ok_p
                status = torch.where(pinf, code(Status.INFEASIBLE), status)
                status = torch.where(dinf & ~pinf, code(Status.UNBOUNDED), status)
        ok = certify(P, q, A, b, G, h, x, y, z, eps_abs, eps_rel, settled_only=polish)
        if polish or m == 0:  # a polished sample: its float64 point's certificate
            ok = torch.where(polished, ok_p, ok)
        ok = ok & ~status_mask(status, Status.INFEASIBLE, Status.UNBOUNDED)
        # not certified at the user's tolerance: an interior-point "SOLVED" becomes MAX_ITER
        status = torch.where(ok, code(Status.SOLVED), status)
        status = torch.where(~ok & (status == code(Status.SOLVED)), code(Status.MAX_ITER), status)
        # only there is the device's active-set derivative the CPU path's (dxopt.qp.api.device)
        regular = ok & polished
        if polish or m == 0:  # and the polish's own KKT solve reached round-off
            regular = regular & regular_rows(P, q, A, b, G, h, xw, zw, factor.active)
            regular = regular & (kkt_err <= ROUNDOFF_KKT)
        slacks = h - mv(G, x)
        pres = torch.maximum(amax(mv(A, x) - b), amax((-slacks).clamp_min(0.0)))
        dres = amax(mv(P, x) + q + rmv(A, y) + rmv(G, z))
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
