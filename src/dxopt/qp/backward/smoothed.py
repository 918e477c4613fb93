"""Smoothed gradients: the exact derivative of the log-barrier (central-path) solution.

**What is differentiated.** At a barrier parameter :math:`\\mu > 0` the smoothed problem is

.. math::
    x(\\mu) = \\arg\\min_x \\tfrac12 x^\\top Px + q^\\top x - \\mu\\sum_i \\log(h_i - g_i^\\top x)
    \\quad\\text{s.t.}\\quad Ax = b,

the point of the central path (Boyd & Vandenberghe, *Convex Optimization*, 2004, sec. 11.2;
Wright, *Primal-Dual Interior-Point Methods*, 1997, ch. 1). With :math:`s = h - Gx > 0` and
:math:`\\lambda = \\mu / s`, it is the unique solution of

.. math::
    Px + q + G^\\top\\lambda + A^\\top y = 0,\\quad Gx + s = h,\\quad Ax = b,\\quad
    s\\circ\\lambda = \\mu\\mathbf 1,

a smooth function of :math:`(P, q, A, b, G, h)` wherever :math:`K` below is nonsingular. The
forward still returns the certified QP solution :math:`x^\\star`; only the backward differs:
it returns the gradient of :math:`(x(\\mu), y(\\mu), \\lambda(\\mu))`.

**Newton from the certified solution.** The equations are solved by infeasible-start
primal-dual Newton at fixed :math:`\\mu` from :math:`x^\\star` (interior start:
:math:`\\lambda_0 = \\max(\\nu^\\star, \\sqrt\\mu)`, :math:`s_0 = \\max(h - Gx^\\star,
\\mu/\\lambda_0)`, :math:`\\lambda_0 \\leftarrow \\max(\\nu^\\star, \\mu/s_0)`), with the
fraction-to-the-boundary rule (0.995) and backtracking on :math:`\\|F\\|_2^2`. Eliminating
:math:`(ds, d\\lambda)` leaves :math:`[[P + G^\\top DG, A^\\top], [A, 0]]`, :math:`D =
\\lambda / s`, factored per step by :func:`dxopt.linalg.schur_factor` for the whole batch.
It stops when every block of the residual is below ``SMOOTHED_NEWTON_TOL`` over its own scale
(stationarity over :math:`1 + \\max(\\|Px\\|, \\|q\\|, \\|G^\\top\\lambda\\|,
\\|A^\\top y\\|)_\\infty`, the rows over :math:`1 + \\max(\\|Gx\\|, \\|h\\|)_\\infty` and
:math:`1 + \\max(\\|Ax\\|, \\|b\\|)_\\infty`, centrality :math:`\\|s\\circ\\lambda -
\\mu\\|_\\infty/\\mu`), then takes one more (quadratically convergent) step. A sample that
does not get there in ``max_iter`` steps raises :class:`~dxopt.qp.QPBackwardError` with
``status=Status.MAX_ITER``: no gradient instead of a wrong one.

**The derivative.** With :math:`D = \\operatorname{diag}(\\lambda/s)` (:math:`=\\mu/s^2`) and
:math:`K = [[P + G^\\top DG, A^\\top], [A, 0]]`, the cotangents
:math:`(\\bar x, \\bar\\lambda, \\bar y)` give :math:`K[u; v] = [\\bar x + G^\\top D\\bar\\lambda;
\\bar y]`, :math:`w = D(Gu - \\bar\\lambda)`, and

.. math::
    \\bar q = -u,\\ \\bar P = -\\tfrac12(ux^\\top + xu^\\top),\\ \\bar h = w,\\
    \\bar G = -(\\lambda u^\\top + wx^\\top),\\ \\bar b = v,\\ \\bar A = -(yu^\\top + vx^\\top)

at :math:`(x, \\lambda, y) = (x(\\mu), \\lambda(\\mu), y(\\mu))`: the formulas of
:mod:`dxopt.qp.backward.grads` with every inequality row used. The adjoint solve is refined
against :math:`K` and its normwise backward error
:math:`\\|r - Kz\\|_\\infty / (\\|K\\|_\\infty\\|z\\|_\\infty + \\|r\\|_\\infty)` must be within
``max_residual``. As :math:`\\mu \\to 0` at a nondegenerate solution (strict complementarity,
LICQ, second-order sufficiency) :math:`x(\\mu) - x^\\star = O(\\mu)` and the gradient tends to
the exact one at the same rate (Fiacco & McCormick, *Nonlinear Programming: Sequential
Unconstrained Minimization Techniques*, 1968).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt._core import Status
from dxopt._core.validate import check_int, check_positive
from dxopt.linalg.schur import SchurFactor, schur_factor
from dxopt.qp.certify.tolerances import (
    SMOOTHED_ARMIJO,
    SMOOTHED_BOUNDARY,
    SMOOTHED_HALVINGS,
    SMOOTHED_MAX_NEWTON,
    SMOOTHED_MAX_RESIDUAL,
    SMOOTHED_NEWTON_TOL,
    SMOOTHED_REFINE_STEPS,
)
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput, AdjointSolution
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = ["BarrierData", "BarrierPoint", "Smoothed", "barrier_adjoint", "central_path"]

_F64 = torch.float64


def _mv(M: Tensor, v: Tensor) -> Tensor:
    return (M @ v.unsqueeze(-1)).squeeze(-1)


def _rmv(M: Tensor, w: Tensor) -> Tensor:
    return (M.mT @ w.unsqueeze(-1)).squeeze(-1)


def _amax(t: Tensor) -> Tensor:
    """Per-sample max of ``|t|`` over the last axis (0 for an empty axis)."""
    return t.abs().amax(-1) if t.shape[-1] else t.new_zeros(t.shape[:-1])


@dataclass(frozen=True)
class BarrierData:
    """Dense float64 batch ``(S, ...)`` of the problem; ``G``/``A`` have zero rows when absent."""

    P: Tensor
    q: Tensor
    G: Tensor
    h: Tensor
    A: Tensor
    b: Tensor

    @staticmethod
    def of(problem: QPProblem, idx: Tensor) -> BarrierData:
        """The samples ``idx`` of ``problem`` (sparse matrices densified)."""
        S, n = problem.size, problem.n

        def mat(name: str, rows: int) -> Tensor:
            t = problem.dense(name)
            return torch.zeros(S, rows, n, dtype=_F64) if t is None else t.to(_F64)

        def vec(name: str, rows: int) -> Tensor:
            t = getattr(problem, name)
            return torch.zeros(S, rows, dtype=_F64) if t is None else problem.dense_vec(name)

        P, q = mat("P", n), vec("q", n)
        G, h = mat("G", problem.m), vec("h", problem.m)
        A, b = mat("A", problem.p), vec("b", problem.p)
        return BarrierData(P[idx], q[idx], G[idx], h[idx], A[idx], b[idx])

    def take(self, idx: Tensor) -> BarrierData:
        """The samples ``idx``."""
        return BarrierData(
            self.P[idx], self.q[idx], self.G[idx], self.h[idx], self.A[idx], self.b[idx]
        )


@dataclass(frozen=True)
class BarrierPoint:
    """The central-path point: ``x, s = h - Gx, lam = mu / s, y`` ``(S, k)``, the Newton steps
    taken and the final relative residual ``(S,)``."""

    x: Tensor
    s: Tensor
    lam: Tensor
    y: Tensor
    iterations: int
    residual: Tensor


def _residual(
    d: BarrierData, x: Tensor, s: Tensor, lam: Tensor, y: Tensor, mu: float
) -> tuple[tuple[Tensor, Tensor, Tensor, Tensor], Tensor, Tensor]:
    """The residual blocks ``(r_d, r_p, r_e, r_c)``, the per-sample relative residual (module
    docstring) and the merit :math:`\\|F\\|_2^2`."""
    Px, Gl, Ay, Gx, Ax = _mv(d.P, x), _rmv(d.G, lam), _rmv(d.A, y), _mv(d.G, x), _mv(d.A, x)
    r = (Px + d.q + Gl + Ay, Gx + s - d.h, Ax - d.b, s * lam - mu)
    scale_d = 1.0 + torch.stack([_amax(Px), _amax(d.q), _amax(Gl), _amax(Ay)]).amax(0)
    scale_p = 1.0 + torch.maximum(_amax(Gx), _amax(d.h))
    scale_e = 1.0 + torch.maximum(_amax(Ax), _amax(d.b))
    rel = torch.stack(
        [_amax(r[0]) / scale_d, _amax(r[1]) / scale_p, _amax(r[2]) / scale_e, _amax(r[3]) / mu]
    ).amax(0)
    merit = (r[0] * r[0]).sum(-1) + (r[1] * r[1]).sum(-1) + (r[2] * r[2]).sum(-1)
    merit = merit + (r[3] * r[3]).sum(-1)
    return r, rel, merit


def _factor(d: BarrierData, D: Tensor) -> tuple[SchurFactor, Tensor, bool]:
    """Factor :math:`[[H, A^\\top], [A, 0]]`, :math:`H = P + G^\\top DG`; where :math:`H` is
    not positive definite, the equivalent :math:`[[H + A^\\top A, A^\\top], [A, 0]]` (positive
    definite iff the system is nonsingular, for independent rows of ``A``). Returns the
    factor, ``H`` and whether the shifted matrix was factored."""
    H = d.P + d.G.mT @ (D.unsqueeze(-1) * d.G)
    factor = schur_factor(H, d.A)
    if factor is not None:
        return factor, H, False
    factor = schur_factor(H + d.A.mT @ d.A, d.A) if d.A.shape[1] else None
    if factor is None:
        raise QPBackwardError(
            "smoothed backward: the barrier KKT matrix [[P + G'DG, A'], [A, 0]] is singular "
            "(the barrier problem has no unique solution: P is singular on the null space of "
            "A and G); regularise P or use backward='kkt'.",
            status=Status.FAILED,
        )
    return factor, H, True


def _solve(
    factor: SchurFactor, A: Tensor, shifted: bool, r1: Tensor, r2: Tensor
) -> tuple[Tensor, Tensor]:
    """:math:`[[H, A^\\top], [A, 0]]^{-1}[r_1; r_2]` by the factor of :func:`_factor` (the
    shifted matrix takes the right-hand side :math:`r_1 + A^\\top r_2`)."""
    return factor.solve(r1 + _rmv(A, r2) if shifted else r1, r2)


def central_path(
    d: BarrierData,
    x0: Tensor,
    nu0: Tensor,
    y0: Tensor,
    *,
    mu: float,
    max_iter: int = SMOOTHED_MAX_NEWTON,
    tol: float = SMOOTHED_NEWTON_TOL,
) -> BarrierPoint:
    """The central-path point at ``mu`` by primal-dual Newton from ``(x0, nu0, y0)`` (module
    docstring); raises :class:`~dxopt.qp.QPBackwardError` (``Status.MAX_ITER``) naming the
    samples that do not converge."""
    lam = nu0.clamp(min=math.sqrt(mu))
    s = torch.maximum(d.h - _mv(d.G, x0), mu / lam)
    lam = torch.maximum(nu0, mu / s)
    x, y = x0.clone(), y0.clone()
    extra = True  # one step past the tolerance
    rel = torch.full((x.shape[0],), math.inf, dtype=_F64)
    for it in range(max_iter + 2):
        r, rel, merit = _residual(d, x, s, lam, y, mu)
        if bool((rel <= tol).all()):
            if not extra:
                return BarrierPoint(x, s, lam, y, it, rel)
            extra = False
        elif it >= max_iter:
            break
        factor, _, shifted = _factor(d, lam / s)
        r1 = -r[0] - _rmv(d.G, (-r[3] + lam * r[1]) / s)
        dx, dy = _solve(factor, d.A, shifted, r1, -r[2])
        ds = -r[1] - _mv(d.G, dx)
        dlam = (-r[3] - lam * ds) / s
        step = torch.ones(x.shape[0], dtype=_F64)
        if ds.shape[-1]:
            ratio = torch.cat([s / (-ds).clamp(min=1e-300), lam / (-dlam).clamp(min=1e-300)], -1)
            step = (SMOOTHED_BOUNDARY * ratio.amin(-1)).clamp(max=1.0)
        taken = step.clone()  # samples that find no decrease keep the smallest step
        # the samples still backtracking: converged ones take the plain Newton step (their
        # merit is at round-off and need not decrease)
        todo = torch.nonzero(~(rel <= tol)).flatten()
        sub = d.take(todo)
        for _ in range(SMOOTHED_HALVINGS if todo.numel() else 0):
            c = step[todo, None]
            _, _, trial = _residual(
                sub, x[todo] + c * dx[todo], s[todo] + c * ds[todo],
                lam[todo] + c * dlam[todo], y[todo] + c * dy[todo], mu,
            )  # fmt: skip
            good = trial <= (1.0 - 2.0 * SMOOTHED_ARMIJO * step[todo]) * merit[todo]
            taken[todo] = step[todo]
            if bool(good.all()):
                break
            keep = torch.nonzero(~good).flatten()
            todo = todo[keep]
            sub = sub.take(keep)
            step[todo] = 0.5 * step[todo]
            taken[todo] = step[todo]
        c = taken[:, None]
        x, s, lam, y = x + c * dx, s + c * ds, lam + c * dlam, y + c * dy
    bad = torch.nonzero(~(rel <= tol)).flatten().tolist()
    raise QPBackwardError(
        f"smoothed backward: the barrier Newton did not reach the central path at mu={mu:g} "
        f"in {max_iter} steps at batch indices {bad} (relative residual {float(rel.max()):.3g}, "
        f"tolerance {tol:g}); the gradient would be wrong. Use a larger mu, a larger max_iter "
        "or backward='kkt'.",
        status=Status.MAX_ITER,
    )


def barrier_adjoint(
    d: BarrierData,
    pt: BarrierPoint,
    grad_x: Tensor,
    grad_lam: Tensor,
    grad_y: Tensor,
    *,
    steps: int = SMOOTHED_REFINE_STEPS,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(u, w, v, backward error)`` of the barrier adjoint (module docstring), refined
    against :math:`K` for up to ``steps`` steps."""
    D = pt.lam / pt.s
    factor, H, shifted = _factor(d, D)
    r1 = grad_x + _rmv(d.G, D * grad_lam)
    r2 = grad_y
    u, v = _solve(factor, d.A, shifted, r1, r2)
    norm_K = (H.abs().sum(-1) + d.A.abs().sum(-2)).amax(-1)  # K is symmetric
    if d.A.shape[1]:
        norm_K = torch.maximum(norm_K, d.A.abs().sum(-1).amax(-1))
    norm_r = torch.maximum(_amax(r1), _amax(r2))
    error = torch.zeros(H.shape[0], dtype=_F64)
    for _ in range(steps + 1):
        e1 = r1 - _mv(H, u) - _rmv(d.A, v)
        e2 = r2 - _mv(d.A, u)
        size = norm_K * torch.maximum(_amax(u), _amax(v)) + norm_r
        error = torch.maximum(_amax(e1), _amax(e2)) / torch.where(size > 0, size, 1.0)
        if bool((error <= 4 * torch.finfo(_F64).eps).all()):
            break
        du, dv = _solve(factor, d.A, shifted, e1, e2)
        u, v = u + du, v + dv
    w = D * (_mv(d.G, u) - grad_lam)
    return u, w, v, error


@dataclass(frozen=True, kw_only=True)
class Smoothed:
    """Smoothed backward: the exact gradient of the log-barrier solution :math:`x(\\mu)`.

    Pass as ``backward=Smoothed(mu=1e-3)`` to :func:`dxopt.qp.solve`, :class:`dxopt.qp.QPLayer`
    or :class:`dxopt.frontend.CvxpyQPLayer`. The forward is unchanged (the certified QP
    solution); the backward differentiates
    :math:`x(\\mu) = \\arg\\min \\tfrac12 x^\\top Px + q^\\top x - \\mu\\sum_i\\log(h_i - g_i^\\top
    x)` s.t. :math:`Ax = b` (with its multipliers :math:`\\lambda = \\mu/(h - Gx)` and
    :math:`y`) in all of ``P, q, A, b, G, h``; math in :mod:`dxopt.qp.backward.smoothed`.

    **When to prefer it.** The exact derivative of a QP solution is piecewise: it jumps when a
    constraint switches between active and inactive, and it is zero in directions that only
    move inactive constraints. Decision-focused learning with piecewise-constant losses
    (regret of an LP-like decision) and training where the active set keeps changing get no or
    erratic signal from it; the barrier solution is a smooth function of the data, so its
    gradient is continuous and informative across such switches (the central-path smoothing of
    decision-focused learning; Mandi & Guns, "Interior point solving for LP-based prediction +
    optimisation", NeurIPS 2020). It is a *biased* gradient of the QP solution: the bias is
    :math:`O(\\mu)` at a nondegenerate point. Use ``backward="kkt"``/``"penalty"`` when the
    exact derivative is wanted.

    Args:
        mu: barrier parameter, in the units of the objective (a finite float > 0); larger is
            smoother and more biased.
        max_iter: Newton steps before the sample is reported as not converged.
        max_residual: largest normwise backward error of the adjoint solve accepted.

    Forward-mode differentiation (``jvp``, ``torch.func.jacfwd``) is refused.
    """

    mu: float = 1e-3
    max_iter: int = SMOOTHED_MAX_NEWTON
    max_residual: float = SMOOTHED_MAX_RESIDUAL

    def __post_init__(self) -> None:
        hint = "pass e.g. Smoothed(mu=1e-3)"
        object.__setattr__(self, "mu", check_positive("mu", self.mu, hint=hint))
        check_int("max_iter", self.max_iter, minimum=1)
        check_positive("max_residual", self.max_residual)

    @property
    def name(self) -> str:
        return "smoothed"

    def solve_adjoint(
        self, data: AdjointInput, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """The barrier adjoint of the solved samples (failed ones get zeros)."""
        problem = data.problem
        S, n, m, p = data.x.shape[0], problem.n, problem.m, problem.p
        u = torch.zeros(S, n, dtype=_F64)
        w_ineq, lam = torch.zeros(S, m, dtype=_F64), torch.zeros(S, m, dtype=_F64)
        w_eq, y = torch.zeros(S, p, dtype=_F64), torch.zeros(S, p, dtype=_F64)
        x = data.x.clone()
        residual = torch.zeros(S, dtype=_F64)
        idx = torch.nonzero(data.ok).flatten()
        if idx.numel():
            d = BarrierData.of(problem, idx)
            pt = central_path(
                d, data.x[idx], data.ineq_duals[idx].clamp(min=0.0), data.eq_duals[idx],
                mu=self.mu, max_iter=self.max_iter,
            )  # fmt: skip
            uu, ww, vv, err = barrier_adjoint(
                d, pt, data.grad_x[idx], data.grad_ineq[idx], data.grad_eq[idx]
            )
            u[idx], w_ineq[idx], w_eq[idx], residual[idx] = uu, ww, vv, err
            x[idx], lam[idx], y[idx] = pt.x, pt.lam, pt.y
        used = data.ok[:, None].expand(S, m).clone()
        none = torch.zeros(S, m, dtype=torch.bool)
        active = ActiveSet(used.clone(), none, used, torch.zeros(S, dtype=_F64), None, None)
        diagnostics.method = "smoothed"
        diagnostics.linear_solver = "schur"
        diagnostics.residual = float(residual.max()) if residual.numel() else 0.0
        diagnostics.n_active = active.n_active
        diagnostics.n_weak = active.n_weak
        bad = torch.nonzero(~(residual <= self.max_residual)).flatten().tolist()
        if bad:
            raise QPBackwardError(
                f"smoothed backward: the barrier adjoint was solved only to backward error "
                f"{float(residual[bad].max()):.3g} (limit {self.max_residual:g}) at batch "
                f"indices {bad}; the gradient would be wrong. Use a larger mu.",
                status=Status.INACCURATE,
            )
        return AdjointSolution(u, w_ineq, w_eq, active, residual, ineq_duals=lam, eq_duals=y, x=x)
