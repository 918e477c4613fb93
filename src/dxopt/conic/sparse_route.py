"""The sparse route of :func:`dxopt.conic.solve`: large problems with sparse shared ``P``, ``A``.

Nothing here forms a dense ``(n, n)``, ``(m, n)`` or ``(n + m)``-square matrix:

- **forward**: the chain of :func:`dxopt.conic.forward.run_chain` (the same attempts) with
  the CSC data handed to the backends as they are (:mod:`dxopt.conic.backends`);
- **certificate**: :func:`dxopt.conic.certify.point_checks`, ``farkas_check`` and
  ``ray_check`` (the same checks and tolerances as the dense route) on sparse matrix-vector
  products;
- **polish**: up to :data:`~dxopt.conic.certify.POLISH_STEPS` Newton steps on
  :math:`F(x, w) = 0` per sample, each a sparse LU of the lifted Jacobian
  (:mod:`dxopt.conic.sparse_kkt`) shifted by :data:`~dxopt.conic.certify.POLISH_SHIFT`
  :math:`\\Vert L\\Vert_1` and refined against the exact ``J``; a step is kept only where it
  lowers :math:`\\Vert F\\Vert_\\infty` (the point is certified afterwards either way);
- **backward**: the adjoint :math:`J^\\top u = g` of :mod:`dxopt.conic.backward` (the same
  right-hand side, one-sided rule at kinks and gradient formulas) with a sparse LU of the
  lifted matrix shifted by :data:`BACKWARD_SHIFT` :math:`\\Vert J\\Vert_1` (only to keep
  SuperLU off an exactly singular matrix), refined against the exact :math:`J^\\top`
  (:func:`dxopt.linalg.refine`). A sample is accepted when the relative residual is at most
  :data:`~dxopt.conic.kkt.ROUNDOFF` and the estimate of :math:`\\kappa_1(J)`
  (:func:`dxopt.linalg.inverse_norm_1`) at most :data:`~dxopt.conic.backward.COND_MAX`;
  otherwise it is flagged ``singular`` in ``info.backward`` and the backward raises
  :class:`~dxopt.conic.types.ConicBackwardError` (the dense route's minimum-norm adjoint is an
  SVD, out of reach at this size: no gradient rather than a wrong one). Gradients with
  respect to ``P`` and ``A`` are sparse tensors on the input's stored entries
  (:math:`\\bar A_{ij} = -(y_i u_{x,j} + u_{w,i} x_j)`,
  :math:`\\bar P_{ij} = -\\tfrac12(u_{x,i} x_j + x_i u_{x,j})` at each stored
  :math:`(i, j)`), as :class:`dxopt.conic.sparse.Scatter` gives them on the dense route.

Forward mode (``jvp``) is the dense route's only.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.conic.backward import COND_MAX
from dxopt.conic.certify import (
    POLISH_ROUNDOFF,
    POLISH_SHIFT,
    POLISH_STEPS,
    Certified,
    clean,
    farkas_check,
    point_checks,
    ray_check,
)
from dxopt.conic.cones.base import Cone
from dxopt.conic.forward import Attempt, Checks, run_chain, scale_of
from dxopt.conic.kkt import EPS, ROUNDOFF, project_dual
from dxopt.conic.sparse_kkt import SparseJacobian, cone_jacobian_sparse
from dxopt.conic.sparse_problem import SparseConicProblem, sparse_problem
from dxopt.conic.types import (
    ConicBackwardError,
    ConicBackwardInfo,
    ConicDegenerateWarning,
    ConicInfo,
    ConicOptions,
    ConicSolution,
)
from dxopt.conic.warm import WarmStart, warm_attempt, warm_points
from dxopt.linalg import FactorizationError, inverse_norm_1, refine, shifted_splu

__all__ = ["BACKWARD_SHIFT", "SPARSE_CHECKS", "SparseConicFunction", "solve_sparse"]

BACKWARD_SHIFT = 1e2 * EPS
"""The backward's LU is of :math:`J + \\delta I`, :math:`\\delta` = this times
:math:`\\Vert J\\Vert_1`: refinement removes it in a round or two wherever
:math:`\\kappa_1(J) \\le` ``COND_MAX`` (it contracts by :math:`\\delta\\Vert J^{-1}\\Vert
\\le 10^{-2}`), and on a singular ``J`` the condition estimate of the shifted factor is about
:math:`1/(100\\,\\epsilon) > ` ``COND_MAX``."""


def _prod(M: Any, X: Tensor) -> Tensor:
    """Rows of ``X`` ``(k, c)`` times the scipy matrix ``M'``: ``(k, r)``."""
    return torch.from_numpy(np.ascontiguousarray((M @ X.numpy().T).T))


def _products(prob: SparseConicProblem, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(Ax, Px, A'y)`` per row."""
    return _prod(prob.A, x), _prod(prob.P, x), _prod(prob.A.T, y)


def _residual(
    prob: SparseConicProblem, q: np.ndarray, b: np.ndarray, x: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(y, F(x, w))`` of one sample (:mod:`dxopt.conic.kkt`)."""
    y = project_dual(prob.cones, prob.slices, torch.from_numpy(w)[None])[0].numpy()
    f1 = prob.P @ x + prob.A.T @ y + q
    f2 = prob.A @ x + y - w - b
    return y, np.concatenate([f1, f2])


def _amax(v: np.ndarray) -> float:
    return float(np.abs(v).max(initial=0.0))


def _lifted_solvers(J: SparseJacobian, shift: float, L: Any = None) -> tuple[Any, Any]:
    """``(solve, solve_t)``: :math:`(J + \\delta I)^{-1}` and its transpose through the LU of
    the shifted lifted matrix ``L`` (:mod:`dxopt.conic.sparse_kkt`; built here if not
    given)."""
    N, r = J.size, J.r
    # the pattern of L is nearly symmetric: minimum degree on L' + L (for the n = 5000
    # problem of benchmarks/conic/large.py 8x less fill than COLAMD, the LU 3x faster)
    lu = shifted_splu(
        J.lifted() if L is None else L,
        shift,
        size=N,
        what="lifted cone-program Jacobian",
        permc_spec="MMD_AT_PLUS_A",
    )
    pad = np.zeros(r)

    def solve(v: np.ndarray) -> np.ndarray:
        return lu.solve(np.concatenate([v, pad]))[:N]

    def solve_t(v: np.ndarray) -> np.ndarray:
        return lu.solve(np.concatenate([v, pad]), trans="T")[:N]

    return solve, solve_t


def _polish_one(
    prob: SparseConicProblem, q: np.ndarray, b: np.ndarray, x: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The safeguarded Newton steps of the module doc for one sample."""
    n = prob.n
    y, F = _residual(prob, q, b, x, w)
    f = _amax(F)
    parts = [prob.P @ x, prob.A.T @ y, q, prob.A @ x, y - w, b]
    scale = max(_amax(t) for t in parts)
    moved = False
    for _ in range(POLISH_STEPS):
        if not np.isfinite(f) or f <= POLISH_ROUNDOFF * scale:
            break
        D = cone_jacobian_sparse(prob.cones, prob.slices, torch.from_numpy(w))
        J = SparseJacobian(prob.P, prob.A, D)
        # the scale of the shift and of the refinement: ||L||_1, within a small factor of
        # ||J||_1 and free (the polished point is certified afterwards either way)
        L = J.lifted()
        norm = float(abs(L).sum(axis=0).max())
        try:
            solve, _ = _lifted_solvers(J, POLISH_SHIFT * norm, L)
        except FactorizationError:
            break
        dz = refine(solve, J.matvec, -F, norm=norm, target=ROUNDOFF, max_steps=3).z
        if not np.isfinite(dz).all():
            break
        x_new, w_new = x + dz[:n], w + dz[n:]
        _, F_new = _residual(prob, q, b, x_new, w_new)
        f_new = _amax(F_new)
        if not f_new < f:
            break
        x, w, F, f, moved = x_new, w_new, F_new, f_new, True
    return x, w, moved


def certify_sparse(
    prob: SparseConicProblem,
    idx: list[int],
    x: Tensor,
    y: Tensor,
    s: Tensor,
    options: ConicOptions,
) -> Certified:
    """Clean, polish and certify the points of the samples ``idx`` (the dense route's
    :func:`dxopt.conic.certify.certify_points`, on sparse products)."""
    ix = torch.as_tensor(idx, dtype=torch.long)
    q, b = prob.q[ix], prob.b[ix]
    finite, x, y, s = clean(x, y, s)
    w = y - s
    polished = torch.zeros_like(finite)
    if options.polish:
        x, w = x.clone(), w.clone()
        for j in torch.nonzero(finite).flatten().tolist():
            xj, wj, moved = _polish_one(
                prob, q[j].numpy(), b[j].numpy(), x[j].numpy(), w[j].numpy()
            )
            x[j], w[j] = torch.from_numpy(xj), torch.from_numpy(wj)
            polished[j] = moved
    y = project_dual(prob.cones, prob.slices, w)
    s = y - w
    ok, primal, dual, gap, reasons = point_checks(
        prob.cones, prob.slices, (x, y, s), (q, b), _products(prob, x, y), finite, options
    )
    return Certified(ok, x, y, s, w, primal, dual, gap, polished, reasons, None)


def _max_abs(M: Any) -> Tensor:
    return torch.tensor([float(abs(M).max()) if M.nnz else 0.0], dtype=torch.float64)


def certify_infeasible_sparse(
    prob: SparseConicProblem, idx: list[int], y: Tensor, tol: float
) -> Tensor:
    """:func:`dxopt.conic.certify.certify_infeasible` on sparse products."""
    b = prob.b[torch.as_tensor(idx, dtype=torch.long)]
    at = prob.A.T

    def aty(v: Tensor) -> Tensor:
        return _prod(at, v)

    return farkas_check(prob.cones, prob.slices, y, b, aty, _max_abs(prob.A), tol)


def certify_unbounded_sparse(
    prob: SparseConicProblem, idx: list[int], d: Tensor, tol: float
) -> Tensor:
    """:func:`dxopt.conic.certify.certify_unbounded` on sparse products."""
    q = prob.q[torch.as_tensor(idx, dtype=torch.long)]

    def pv(v: Tensor) -> Tensor:
        return _prod(prob.P, v)

    def av(v: Tensor) -> Tensor:
        return _prod(prob.A, v)

    maxima = (_max_abs(prob.P), _max_abs(prob.A))
    return ray_check(prob.cones, prob.slices, d, q, (pv, av), maxima, tol)


def kink_scale_sparse(prob: SparseConicProblem, x: Tensor, w: Tensor, y: Tensor) -> Tensor:
    """:func:`dxopt.conic.forward.kink_scale` on sparse products."""
    return scale_of(w, y, _products(prob, x, y), (prob.q, prob.b))


SPARSE_CHECKS = Checks(
    certify_sparse, certify_infeasible_sparse, certify_unbounded_sparse, kink_scale_sparse
)
"""The chain's certificate on the sparse route."""


@dataclass
class SparseCall:
    """The non-tensor side of one :class:`SparseConicFunction` call (the chain's result is
    written into it by the forward)."""

    prob: SparseConicProblem
    options: ConicOptions
    warm: tuple[Tensor, Tensor, Tensor] | None = None
    x: Tensor | None = None
    y: Tensor | None = None
    w: Tensor | None = None
    status: list[Any] = dataclasses.field(default_factory=list)
    info: ConicInfo | None = None
    kink_scale: Tensor | None = None


def _out(t: Tensor, prob: SparseConicProblem, ok: Tensor) -> Tensor:
    t = torch.where(ok[:, None], t, torch.full_like(t, float("nan")))
    t = t.to(dtype=prob.dtype, device=prob.device)
    return t if prob.batched else t[0]


def _cot(g: Tensor | None, B: int, d: int) -> Tensor:
    if g is None:
        return torch.zeros(B, d, dtype=torch.float64)
    return torch.nan_to_num(g.detach().to(dtype=torch.float64, device="cpu").reshape(B, d))


def _adjoint(call: SparseCall, gx: Tensor, gy: Tensor, gs: Tensor) -> dict[str, np.ndarray]:
    """``u = J^{-T} g`` per certified sample and the gradients of the module doc, summed
    over the batch (``P``, ``A`` on their patterns)."""
    prob, info = call.prob, call.info
    assert call.x is not None and call.y is not None and call.w is not None and info is not None
    assert call.kink_scale is not None
    B, n, m = prob.batch, prob.n, prob.m
    gq, gb = np.zeros((B, n)), np.zeros((B, m))
    A_rows, A_cols = prob.A_pattern.rows, prob.A_pattern.cols
    gA = np.zeros(A_rows.size)
    gP = np.zeros(prob.P_pattern.rows.size) if prob.P_pattern is not None else np.zeros(0)
    res, cond, singular = [0.0] * B, [float("nan")] * B, [False] * B
    steps = 0
    kinks: list[int] = []
    for i, st in enumerate(call.status):
        if not st.ok:
            continue
        if info.kink[i]:
            kinks.append(i)
        w = call.w[i]
        atol = call.options.kink_tol * float(call.kink_scale[i])
        D = cone_jacobian_sparse(prob.cones, prob.slices, w, atol)
        J = SparseJacobian(prob.P, prob.A, D)
        norm = J.norm_1()
        g = np.concatenate([gx[i].numpy(), D.rmatvec((gy[i] + gs[i]).numpy()) - gs[i].numpy()])
        try:
            solve, solve_t = _lifted_solvers(J, BACKWARD_SHIFT * norm)
        except FactorizationError:
            res[i], cond[i], singular[i] = float("inf"), float("inf"), True
            continue
        cond[i] = norm * inverse_norm_1(solve, solve_t, J.size)
        sol = refine(solve_t, J.rmatvec, g, norm=norm, target=EPS)
        res[i], steps = sol.residual, max(steps, sol.steps)
        if not (sol.residual <= ROUNDOFF and cond[i] <= COND_MAX):
            singular[i] = True
            continue
        ux, uw = sol.z[:n], sol.z[n:]
        x, y = call.x[i].numpy(), call.y[i].numpy()
        gq[i], gb[i] = -ux, uw
        gA -= y[A_rows] * ux[A_cols] + uw[A_rows] * x[A_cols]
        if prob.P_pattern is not None:
            r, c = prob.P_pattern.rows, prob.P_pattern.cols
            gP -= 0.5 * (ux[r] * x[c] + x[r] * ux[c])
    bi: ConicBackwardInfo = info.backward
    bi.linear_solver, bi.residual, bi.refinement_steps = "splu", tuple(res), steps
    bi.singular, bi.condition = tuple(singular), tuple(cond)
    bad = [i for i in range(B) if singular[i]]
    if bad:
        raise ConicBackwardError(
            f"dxopt.conic (sparse route): the Jacobian of samples {bad[:10]} is singular or "
            f"too ill-conditioned (condition estimate {cond[bad[0]]:.3g}, refined residual "
            f"{res[bad[0]]:.3g}; see sol.info.backward): no gradient is returned. A singular "
            "Jacobian means a non-unique solution or an unresolved kink; route='dense' gives "
            "the minimum-norm adjoint where the dense problem fits in memory"
        )
    if kinks:
        warnings.warn(
            f"dxopt.conic: the derivative of samples {kinks[:10]}"
            f"{'...' if len(kinks) > 10 else ''} is one-sided (a cone kink: a weakly active "
            "face taken as inactive); see sol.info.kink and sol.info.backward",
            ConicDegenerateWarning,
            stacklevel=4,
        )
    return {"q": gq, "b": gb, "A": gA, "P": gP}


class SparseConicFunction(torch.autograd.Function):
    """``(P, q, A, b, call) -> (x, y, s)`` on the sparse route (``P``, ``A`` the sparse
    inputs; ``P`` an empty placeholder when absent)."""

    @staticmethod
    def forward(P: Tensor, q: Tensor, A: Tensor, b: Tensor, call: SparseCall) -> Any:
        first: tuple[Attempt, ...] = () if call.warm is None else (warm_attempt(call.warm),)
        chain = run_chain(call.prob, call.options, first, SPARSE_CHECKS)
        call.x, call.y, call.w = chain.x, chain.y, chain.w
        call.status, call.info, call.kink_scale = chain.status, chain.info, chain.kink_scale
        ok = torch.tensor([st.ok for st in chain.status], dtype=torch.bool)
        prob = call.prob
        return _out(chain.x, prob, ok), _out(chain.y, prob, ok), _out(chain.s, prob, ok)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _P, q, _A, b, call = inputs
        ctx.call = call
        ctx.shapes = (tuple(q.shape), tuple(b.shape))
        ctx.mark_non_differentiable()

    @staticmethod
    def backward(ctx: Any, gx: Tensor | None, gy: Tensor | None, gs: Tensor | None) -> Any:
        call: SparseCall = ctx.call
        prob = call.prob
        B, n, m = prob.batch, prob.n, prob.m
        grads = _adjoint(call, _cot(gx, B, n), _cot(gy, B, m), _cot(gs, B, m))
        sq, sb = ctx.shapes

        def back(g: np.ndarray, shape: tuple[int, ...]) -> Tensor:
            t = torch.from_numpy(g)
            if len(shape) < 2 or not prob.batched:
                t = t.sum(0)
            return t.reshape(shape).to(dtype=prob.dtype, device=prob.device)

        need = ctx.needs_input_grad
        grad_P = None
        if prob.P_pattern is not None and need[0]:
            grad_P = prob.P_pattern.tensor(grads["P"])
        grad_A = prob.A_pattern.tensor(grads["A"]) if need[2] else None
        grad_q = back(grads["q"], sq) if need[1] else None
        grad_b = back(grads["b"], sb) if need[3] else None
        return grad_P, grad_q, grad_A, grad_b, None

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise ConicBackwardError(
            "dxopt.conic (sparse route): forward-mode AD is offered on the dense route only; "
            "use reverse mode (backward(), torch.autograd.grad) or pass route='dense'"
        )


def solve_sparse(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    cones: tuple[Cone, ...],
    options: ConicOptions,
    warm_start: WarmStart,
) -> ConicSolution:
    """One certified, differentiable solve on the sparse route (failed samples NaN; the
    caller applies ``on_failure``)."""
    prob = sparse_problem(P, q, A, b, cones, check_psd=options.check_psd)
    call = SparseCall(prob, options, warm=warm_points(prob, warm_start))
    P_in = P if P is not None else q.new_zeros(0)
    x, y, s = SparseConicFunction.apply(P_in, q, A, b, call)
    info = call.info
    assert info is not None
    if call.warm is not None:
        info = dataclasses.replace(info, warm=tuple(sv == "warm" for sv in info.solvers))
    return ConicSolution(x=x, y=y, s=s, status=tuple(call.status), info=info)
