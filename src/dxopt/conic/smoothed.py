"""Smoothed gradients of a cone program: the exact derivative of its barrier solution.

With ``backward=Smoothed(mu)`` (:class:`~dxopt.conic.types.Smoothed`) the forward is the
certified solution as always; the backward differentiates instead the point
:math:`z(\\mu) = (x, y, s)(\\mu)` of the central path, the solution of the barrier problem

.. math::

    \\min_x \\tfrac12 x^\\top P x + q^\\top x + \\mu F(b - Ax) \\quad\\text{s.t.}\\quad
    A_0 x = b_0 ,

with :math:`F = \\sum_i F_i` the cones' logarithmic barriers
(:meth:`dxopt.conic.cones.base.Cone.barrier`: :math:`-\\sum\\log s` for the orthant,
:math:`-\\log(t^2 - \\Vert x\\Vert^2)` for the
second-order cone, :math:`-\\log\\det S` for the PSD cone, the 3-self-concordant barrier of
the exponential cone) and :math:`A_0, b_0` the zero-cone rows. Its optimality conditions,
with the dual :math:`y = -\\mu\\nabla F(s)` (in :math:`\\operatorname{int} K^*`) on the barrier
rows, are :math:`G(z; \\theta) = 0`:

.. math::

    G = \\begin{pmatrix} Px + A^\\top y + q \\\\ Ax + s - b \\\\
    y_K + \\mu\\nabla F(s_K) \\\\ s_0 \\end{pmatrix}, \\qquad
    \\partial_z G = \\begin{pmatrix} P & A^\\top & 0 \\\\ A & 0 & I \\\\
    0 & E_K & \\mu\\nabla^2 F(s_K) \\oplus I_0 \\end{pmatrix}

(:math:`E_K` the identity on the barrier rows, zero on the zero-cone rows). **The point** is
found by Newton's method on :math:`G = 0` from the certified solution moved into the interior
(:math:`s_K + \\tau e`, :math:`e` each cone's
:meth:`~dxopt.conic.cones.base.Cone.barrier_center`,
:math:`\\tau = \\mu / (1 + \\Vert y\\Vert_\\infty)`, and :math:`y_K = -\\mu\\nabla F(s_K)`),
each step backtracked to keep :math:`s_K` interior and to decrease :math:`\\Vert G\\Vert_\\infty`
until :math:`\\Vert G\\Vert_\\infty` is at round-off of the data (:data:`NEWTON_RTOL`). **The
derivative** is the implicit one,
:math:`dz = -(\\partial_z G)^{-1}\\,\\partial_\\theta G\\,d\\theta`;
reverse mode solves :math:`(\\partial_z G)^\\top u = (\\bar x, \\bar y, \\bar s)` (one batched
LU with refinement, :func:`dxopt.conic.kkt.solve_refined`) and, as in
:mod:`dxopt.conic.backward`, :math:`\\bar q = -u_1`, :math:`\\bar b = u_2`,
:math:`\\bar P = -\\tfrac12(u_1 x^\\top + x u_1^\\top)`, :math:`\\bar A = -(y u_1^\\top + u_2
x^\\top)` at :math:`z(\\mu)`.

:math:`z(\\mu)` is a smooth function of the data wherever the barrier problem has a unique
solution, so this gradient is continuous where the exact one jumps (a constraint switching
between active and inactive); it converges to the exact derivative as :math:`\\mu \\to 0` at a
strictly complementary point, with a bias of order :math:`\\mu`. A sample whose Newton
iteration does not reach round-off within ``max_iter`` steps, or whose adjoint solve misses
round-off, is **refused** (:class:`~dxopt.conic.types.ConicBackwardError`): no gradient rather
than a wrong one; so is a sample whose barrier problem has no solution (a feasible set
without interior, e.g. a relaxed sample of ``infeasible="relax"`` whose shifted set is one
point). Failed forward samples get zero gradient. Cones without a barrier
(:class:`~dxopt.conic.PowerCone`) are refused when the solve is called
(:func:`check_barriers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt.conic.certify import subset
from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.zero import ZeroCone
from dxopt.conic.forward import ForwardState, solve_forward
from dxopt.conic.kkt import EPS, lu_factor_finite, solve_refined
from dxopt.conic.problem import ConicProblem, conic_problem
from dxopt.conic.types import ConicBackwardError, ConicOptions, Smoothed

__all__ = [
    "NEWTON_RTOL",
    "barrier_point",
    "barrier_solution",
    "check_barriers",
    "smoothed_gradients",
]

NEWTON_RTOL = 1e3 * EPS
"""The Newton iteration stops once :math:`\\Vert G\\Vert_\\infty` is below this times the
scale of the data and of the point (:math:`\\Vert q\\Vert_\\infty, \\Vert b\\Vert_\\infty,
\\Vert Px\\Vert_\\infty, \\Vert A^\\top y\\Vert_\\infty, \\Vert Ax\\Vert_\\infty,
\\Vert s\\Vert_\\infty, \\mu\\Vert\\nabla F\\Vert_\\infty`)."""
BACKTRACK = 60
"""Halvings of a Newton step at most."""


def check_barriers(cones: tuple[Cone, ...]) -> None:
    """Refuse cones without a log-barrier (``backward=Smoothed(...)`` at solve time)."""
    for i, cone in enumerate(cones):
        if isinstance(cone, ZeroCone):
            continue
        try:
            cone.barrier_center()
        except NotImplementedError:
            raise ValueError(
                f"backward: Smoothed needs each cone's log-barrier, but cones[{i}] = {cone!r} "
                "has none in dxopt.conic; use backward='kkt' for this problem"
            ) from None


def _mv(M: Tensor, v: Tensor) -> Tensor:
    return (M @ v[..., None])[..., 0]


@dataclass(frozen=True)
class BarrierPoint:
    """:math:`z(\\mu)` of the samples ``idx`` and the Jacobian :math:`\\partial_z G` there."""

    idx: list[int]
    x: Tensor
    y: Tensor
    s: Tensor
    M: Tensor
    residual: Tensor
    converged: Tensor


def _barrier_parts(prob: ConicProblem, s: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradient ``(k, m)``, Hessian ``(k, m, m)`` (block-diagonal), the interior mask and the
    barrier-row mask ``(m,)`` (zero-cone rows: 0 in the first two, True in the third)."""
    k, m = s.shape
    grad = s.new_zeros(k, m)
    hess = s.new_zeros(k, m, m)
    inside = torch.ones(k, dtype=torch.bool)
    rows = torch.zeros(m, dtype=torch.bool)
    for cone, sl in zip(prob.cones, prob.slices):
        if isinstance(cone, ZeroCone):
            continue
        g, H, ok = cone.barrier(s[:, sl])
        grad[:, sl], hess[:, sl, sl] = g, H
        inside &= ok
        rows[sl] = True
    return grad, hess, inside, rows


def _residual(
    data: tuple[Tensor, ...], mu: float, x: Tensor, y: Tensor, s: Tensor, grad: Tensor,
    rows: Tensor,
) -> Tensor:  # fmt: skip
    P, q, A, b = data
    g1 = _mv(P, x) + _mv(A.transpose(-1, -2), y) + q
    g2 = _mv(A, x) + s - b
    g3 = torch.where(rows, y + mu * grad, s)
    return torch.cat([g1, g2, g3], dim=-1)


def _jacobian(data: tuple[Tensor, ...], mu: float, hess: Tensor, rows: Tensor) -> Tensor:
    P, _, A, _ = data
    k, m = hess.shape[0], hess.shape[-1]
    n = P.shape[-1]
    M = hess.new_zeros(k, n + 2 * m, n + 2 * m)
    eye = torch.eye(m, dtype=hess.dtype)
    M[:, :n, :n] = P
    M[:, :n, n : n + m] = A.transpose(-1, -2)
    M[:, n : n + m, :n] = A
    M[:, n : n + m, n + m :] = eye
    M[:, n + m :, n : n + m] = torch.diag(rows.to(hess.dtype))
    M[:, n + m :, n + m :] = torch.where(rows[:, None], mu * hess, eye)
    return M


def _amax(v: Tensor) -> Tensor:
    return v.abs().amax(dim=-1) if v.shape[-1] else v.new_zeros(v.shape[:-1])


def _scale(
    data: tuple[Tensor, ...], mu: float, x: Tensor, y: Tensor, s: Tensor, grad: Tensor
) -> Tensor:
    P, q, A, b = data
    parts = [_amax(q), _amax(b), _amax(_mv(P, x)), _amax(_mv(A.transpose(-1, -2), y)),
             _amax(_mv(A, x)), _amax(s), mu * _amax(grad)]  # fmt: skip
    return torch.stack(parts).amax(0)


def barrier_point(state: ForwardState, options: Smoothed) -> BarrierPoint:
    """Newton's method for :math:`z(\\mu)` from the certified points (module doc)."""
    prob, mu = state.prob, options.mu
    idx = torch.nonzero(state.ok).flatten().tolist()
    ix = torch.as_tensor(idx, dtype=torch.long)
    data = subset(prob, idx)
    n, m = prob.n, prob.m
    x, y, s = state.x[ix].clone(), state.y[ix].clone(), state.s[ix].clone()
    center = torch.zeros(m, dtype=torch.float64)
    _, _, _, rows = _barrier_parts(prob, s)
    for cone, sl in zip(prob.cones, prob.slices):
        if not isinstance(cone, ZeroCone):
            center[sl] = cone.barrier_center()
    tau = mu / (1 + _amax(y))
    s = torch.where(rows, s + tau[:, None] * center, torch.zeros_like(s))
    grad, hess, _, _ = _barrier_parts(prob, s)
    y = torch.where(rows, -mu * grad, y)
    G = _residual(data, mu, x, y, s, grad, rows)
    fnorm = _amax(G)
    scale = _scale(data, mu, x, y, s, grad)
    done = fnorm <= NEWTON_RTOL * scale
    for _ in range(options.max_iter):
        if bool(done.all()):
            break
        M = _jacobian(data, mu, hess, rows)
        LU, piv, valid = lu_factor_finite(M)
        dz = torch.linalg.lu_solve(LU, piv, -G[..., None])[..., 0]
        dz = torch.where((valid & ~done)[:, None] & torch.isfinite(dz), dz, torch.zeros_like(dz))
        alpha = torch.where(done, torch.zeros_like(fnorm), torch.ones_like(fnorm))
        accepted = done.clone()
        new = (x, y, s, grad, hess, G, fnorm)
        for _ in range(BACKTRACK):
            trial_s = s + alpha[:, None] * dz[:, n + m :]
            g_t, h_t, in_t, _ = _barrier_parts(prob, trial_s)
            trial_x = x + alpha[:, None] * dz[:, :n]
            trial_y = y + alpha[:, None] * dz[:, n : n + m]
            G_t = _residual(data, mu, trial_x, trial_y, trial_s, g_t, rows)
            f_t = _amax(G_t)
            good = ~accepted & in_t & torch.isfinite(f_t) & (f_t < fnorm)
            if bool(good.any()):
                pick = good[:, None]
                new = (
                    torch.where(pick, trial_x, new[0]), torch.where(pick, trial_y, new[1]),
                    torch.where(pick, trial_s, new[2]), torch.where(pick, g_t, new[3]),
                    torch.where(good[:, None, None], h_t, new[4]),
                    torch.where(pick, G_t, new[5]), torch.where(good, f_t, new[6]),
                )  # fmt: skip
                accepted |= good
            if bool(accepted.all()):
                break
            alpha = torch.where(accepted, alpha, 0.5 * alpha)
        stuck = ~accepted
        x, y, s, grad, hess, G, fnorm = new
        scale = _scale(data, mu, x, y, s, grad)
        done = done | (fnorm <= NEWTON_RTOL * scale) | stuck
    converged = fnorm <= NEWTON_RTOL * scale
    M = _jacobian(data, mu, hess, rows)
    return BarrierPoint(idx, x, y, s, M, fnorm / torch.clamp(scale, min=EPS), converged)


def barrier_solution(
    P: Tensor | None, q: Tensor, A: Tensor, b: Tensor, *, cones: tuple[Cone, ...],
    smoothed: Smoothed, options: ConicOptions | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """:math:`(x, y, s)(\\mu)` itself (float64, batched ``(B, .)``, not differentiable) and a
    per-sample mask of the samples where Newton's method reached round-off: the map whose
    derivative ``backward=Smoothed(mu)`` is (for checks and plots)."""
    prob = conic_problem(P, q, A, b, cones, check_psd=True)
    check_barriers(prob.cones)
    state = solve_forward(prob, options if options is not None else ConicOptions())
    point = barrier_point(state, smoothed)
    nan = torch.full((prob.batch,), float("nan"), dtype=torch.float64)
    out = [nan[:, None].expand(-1, d).clone() for d in (prob.n, prob.m, prob.m)]
    ok = torch.zeros(prob.batch, dtype=torch.bool)
    if point.idx:
        ix = torch.as_tensor(point.idx, dtype=torch.long)
        out[0][ix], out[1][ix], out[2][ix] = point.x, point.y, point.s
        ok[ix] = point.converged
    return out[0], out[1], out[2], ok


def smoothed_gradients(
    state: ForwardState, options: Smoothed, gx: Tensor, gy: Tensor, gs: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(gP, gq, gA, gb)`` per sample (float64, as :func:`dxopt.conic.backward.adjoint_gradients`):
    the vector-Jacobian product of :math:`z(\\mu)`; refused where it cannot be trusted."""
    prob = state.prob
    B, n, m = prob.batch, prob.n, prob.m
    f64 = torch.float64
    gP, gq = torch.zeros(B, n, n, dtype=f64), torch.zeros(B, n, dtype=f64)
    gA, gb = torch.zeros(B, m, n, dtype=f64), torch.zeros(B, m, dtype=f64)
    key = f"smoothed {options!r}"
    point = state.cache.get(key)
    if point is None:
        point = barrier_point(state, options)
        state.cache[key] = point
    if not point.idx:
        return gP, gq, gA, gb
    bad = [i for j, i in enumerate(point.idx) if not bool(point.converged[j])]
    if bad:
        raise ConicBackwardError(
            f"dxopt.conic: backward=Smoothed(mu={options.mu}): Newton's method for the barrier "
            f"solution did not reach round-off for samples {bad[:10]} within "
            f"{options.max_iter} steps (relative residuals "
            f"{[float(point.residual[point.idx.index(i)]) for i in bad[:3]]}); raise mu or "
            "max_iter, or use backward='kkt'"
        )
    ix = torch.as_tensor(point.idx, dtype=torch.long)
    rhs = torch.cat([gx[ix], gy[ix], gs[ix]], dim=-1)
    sol, _ = solve_refined(point.M, rhs, adjoint=True)
    if not bool(sol.ok.all()):
        bad = [i for j, i in enumerate(point.idx) if not bool(sol.ok[j])]
        raise ConicBackwardError(
            f"dxopt.conic: backward=Smoothed(mu={options.mu}): the adjoint system of samples "
            f"{bad[:10]} could not be solved to round-off (a singular barrier Jacobian: "
            "redundant equality rows?); use backward='kkt'"
        )
    res = [0.0] * B
    for j, i in enumerate(point.idx):
        res[i] = float(sol.residual[j])
    info = state.info.backward
    info.linear_solver, info.residual, info.refinement_steps = (
        "lu (smoothed)",
        tuple(res),
        sol.steps,
    )
    info.singular, info.condition = (False,) * B, (float("nan"),) * B
    u = sol.z
    u1, u2 = u[:, :n], u[:, n : n + m]
    x, y = point.x, point.y
    outer = u1[:, :, None] * x[:, None, :]
    gP[ix] = -0.5 * (outer + outer.transpose(-1, -2))
    gq[ix] = -u1
    gA[ix] = -(y[:, :, None] * u1[:, None, :] + u2[:, :, None] * x[:, None, :])
    gb[ix] = u2
    return gP, gq, gA, gb
