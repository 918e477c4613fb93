"""Differentiating :func:`dxopt.qp._torch_solver.torch_qp_solve`: the exact active-set adjoint.

At a solution with active inequality rows :math:`\\mathcal A`, the solution map satisfies the
reduced KKT system (Amos & Kolter, arXiv 1703.00443, with the multipliers of inactive rows held
at zero)

.. math::
    K\\begin{bmatrix} dx \\\\ dy \\\\ dz_{\\mathcal A}\\end{bmatrix} =
    \\begin{bmatrix} -dP\\,x - dq - dA^\\top y - dG^\\top z \\\\ db - dA\\,x \\\\
    dh_{\\mathcal A} - dG_{\\mathcal A} x\\end{bmatrix},\\qquad
    K = \\begin{bmatrix} P & A^\\top & G_{\\mathcal A}^\\top \\\\ A & 0 & 0 \\\\
    G_{\\mathcal A} & 0 & 0\\end{bmatrix}.

:math:`K` is symmetric, so the adjoint :math:`K[u; v; w] = [\\bar x; \\bar y; \\bar z_{\\mathcal
A}]` gives

.. math::
    \\bar q = -u,\\ \\bar P = -\\tfrac12(ux^\\top + xu^\\top),\\ \\bar A = -(yu^\\top + vx^\\top),
    \\ \\bar b = v,\\ \\bar G = -(zu^\\top + wx^\\top),\\ \\bar h = w

(:math:`w = 0` off :math:`\\mathcal A`). The adjoint is solved with the penalty Cholesky factor
the forward polish computed (:class:`dxopt.qp._torch_solver.PenaltyFactor`) and refined against
:math:`K` (:func:`dxopt.qp._torch_solver.kkt_solve`): no new factorization, one batched pair of
triangular solves per refinement pass. Inputs shared by the batch get gradients summed over the
batch. A sample with a nonzero cotangent that was not solved, not polished (its active set
unconfirmed, e.g. with ``polish=False``) or whose adjoint residual stays above tolerance makes
the backward raise :class:`dxopt.qp.QPBackwardError` instead of returning a wrong gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dxopt.qp._torch_solver import (
    PenaltyFactor,
    TorchQPResult,
    TorchQPStatus,
    _check_inputs,
    kkt_solve,
    small_threads,
    solve_detached,
)
from dxopt.qp._types import QPBackwardError

__all__ = ["TorchQPFunction", "torch_qp_differentiable"]

_BASE = (2, 1, 2, 1, 2, 1)  # unbatched ndim of P, q, A, b, G, h


def _reduce(g: Tensor, like: Tensor | None, base: int) -> Tensor | None:
    """Sum a ``(B, ...)`` gradient down to the shape of the input it belongs to."""
    if like is None:
        return None
    if like.ndim == base:
        return g.sum(0)
    if like.shape[0] == 1 and g.shape[0] != 1:
        return g.sum(0, keepdim=True)
    return g


class TorchQPFunction(torch.autograd.Function):
    """``(P, q, A, b, G, h) -> (x, y, z)`` of a batch of QPs solved by the torch solver.

    ``forward`` returns ``x, y, z`` (differentiable) followed by the solver's non-differentiable
    outputs (status, iterations, residuals, polish flags, slacks and the penalty factorization)
    so that ``setup_context`` saves everything through ``save_for_backward``.
    """

    @staticmethod
    def forward(
        P: Tensor,
        q: Tensor,
        A: Tensor | None,
        b: Tensor | None,
        G: Tensor | None,
        h: Tensor | None,
        options: dict[str, Any],
    ) -> tuple[Tensor, ...]:
        full = _check_inputs(P, q, A, b, G, h)
        opts = {k: v for k, v in options.items() if k != "diagnostics"}
        r = solve_detached(*(t.detach() for t in full), **opts)
        f = r.factor
        return (
            r.x,
            r.eq_duals,
            r.ineq_duals,
            r.slacks,
            r.status,
            r.iterations,
            r.primal_residual,
            r.dual_residual,
            r.polished,
            f.L,
            f.w_ineq,
            f.w_eq,
            f.active,
        )

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        P, q, A, b, G, h, options = inputs
        x, y, z, _, status = output[:5]
        polished = output[8]
        L, w_ineq, w_eq, active = output[-4:]
        ctx.mark_non_differentiable(*output[3:])
        ctx.steps = options["refine_steps"]
        ctx.diagnostics = options.get("diagnostics")
        ctx.present = tuple(t is not None for t in (A, G))
        ctx.shapes = tuple(None if t is None else (t.ndim, t.shape[0]) for t in inputs[:6])
        ctx.f64 = P.dtype == torch.float64
        saved = [t for t in (P, q, A, b, G, h) if t is not None]
        ctx.save_for_backward(*saved, x, y, z, status, polished, L, w_ineq, w_eq, active)

    @staticmethod
    def backward(
        ctx: Any, gx: Tensor | None, gy: Tensor | None, gz: Tensor | None, *_unused: Any
    ) -> tuple[Tensor | None, ...]:
        L, w_ineq = ctx.saved_tensors[-4:-2]
        with small_threads(L.shape[-1], w_ineq.shape[-1], L.device):
            return _backward(ctx, gx, gy, gz)


def _backward(
    ctx: Any, gx: Tensor | None, gy: Tensor | None, gz: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The body of :meth:`TorchQPFunction.backward` (see the module docstring)."""
    saved = list(ctx.saved_tensors)
    x, y, z, status, polished, L, w_ineq, w_eq, active = saved[-9:]
    ins = iter(saved[:-9])
    P, q = next(ins), next(ins)
    A, b = (next(ins), next(ins)) if ctx.present[0] else (None, None)
    G, h = (next(ins), next(ins)) if ctx.present[1] else (None, None)
    Pf, _, Af, _, Gf, _ = _check_inputs(P, q, A, b, G, h)
    gx = torch.zeros_like(x) if gx is None else gx
    gy = torch.zeros_like(y) if gy is None else gy
    gz = torch.zeros_like(z) if gz is None else gz
    used = (gx != 0).any(-1) | (gy != 0).any(-1) | (gz != 0).any(-1)
    # an unpolished sample's active set is not confirmed by an exact KKT solve: refuse it
    failed = used & ((status != TorchQPStatus.SOLVED) | ~polished)
    factor = PenaltyFactor(L=L, w_ineq=w_ineq, w_eq=w_eq, active=active, steps=ctx.steps)
    u, v, w, res = kkt_solve(factor, Pf, Af, Gf, gx, gy, gz)
    tol = 1e-10 if ctx.f64 else 1e-4
    bad = used & ~failed & ~(res <= tol)
    if bool((failed | bad).any()):
        idx_f = failed.nonzero().flatten().tolist()
        idx_b = bad.nonzero().flatten().tolist()
        raise QPBackwardError(
            "torch QP backward refused: "
            + (
                f"samples {idx_f} were not solved or not polished onto a verified active "
                f"set (status codes {status[failed].tolist()}, see TorchQPStatus; "
                f"polished {polished[failed].tolist()}); "
                if idx_f
                else ""
            )
            + (
                f"samples {idx_b} have adjoint residual {res[bad].tolist()} > {tol} "
                "(degenerate or ill-conditioned KKT system); "
                if idx_b
                else ""
            )
            + "give those samples a zero cotangent, or use dxopt.qp.solve with "
            "backward=KKTBackward() for a diagnosed fallback"
        )
    diag = ctx.diagnostics
    if diag is not None:  # dxopt.qp.solve's BackwardDiagnostics: what this backward did
        diag.method, diag.linear_solver = "torch", "cholesky (the forward polish's factor)"
        diag.residual = float(torch.where(used, res, 0.0).amax()) if res.numel() else 0.0
        diag.refinement_steps = ctx.steps
        diag.n_active = tuple(active.sum(-1).tolist())
    w = w * active
    need = ctx.needs_input_grad
    grads: list[Tensor | None] = [None] * 6

    def outer(left: Tensor, right: Tensor) -> Tensor:
        return left.unsqueeze(-1) * right.unsqueeze(-2)

    if need[0]:
        ux = outer(u, x)
        grads[0] = -0.5 * (ux + ux.mT)
    if need[1]:
        grads[1] = -u
    if A is not None:
        grads[2] = -(outer(y, u) + outer(v, x)) if need[2] else None
        grads[3] = v if need[3] else None
    if G is not None:
        grads[4] = -(outer(z, u) + outer(w, x)) if need[4] else None
        grads[5] = w if need[5] else None
    inputs = (P, q, A, b, G, h)
    out = [None if g is None else _reduce(g, inputs[k], _BASE[k]) for k, g in enumerate(grads)]
    return (*out, None)


def torch_qp_differentiable(
    P: Tensor,
    q: Tensor,
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    **options: Any,
) -> TorchQPResult:
    """:func:`dxopt.qp._torch_solver.torch_qp_solve` with gradients through ``x, y, z``."""
    steps = options.get("refine_steps")
    options = dict(options, refine_steps=steps if steps is not None else 4)
    out: tuple[Tensor, ...] = TorchQPFunction.apply(P, q, A, b, G, h, options)
    x, y, z, slacks, status, iters, pres, dres, polished, L, w_ineq, w_eq, active = out
    factor = PenaltyFactor(
        L=L, w_ineq=w_ineq, w_eq=w_eq, active=active, steps=options["refine_steps"]
    )
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
    )
