"""Log-barrier (central path) solution of a QP and its exact derivative.

The smoothed problem at barrier parameter ``mu > 0`` is

    x(mu) = argmin_x 1/2 x'Px + q'x - mu * sum_i log(h_i - g_i'x)   s.t.  Ax = b,

whose stationarity conditions F(x, y; q, h, b) = 0 are

    Px + q + G' (mu / s) + A'y = 0,   Ax - b = 0,   s = h - Gx > 0.

With D = diag(mu / s^2) and K = [[P + G'DG, A'], [A, 0]], the implicit function
theorem gives, for an upstream gradient g on x, the solution [u; v] of K [u; v] = [g; 0] and

    dL/dq = -u,   dL/dh = D G u,   dL/db = v.

These are the exact derivatives of the well-defined map (q, h, b) -> x(mu) (P, G, A and mu are
held fixed); as mu -> 0 at a nondegenerate point they tend to the derivative of the QP solution,
and unlike it they are continuous when a constraint switches between active and inactive
(the barrier solution is a smooth function of the data). x(mu) is computed by damped Newton
from a strictly feasible start (Boyd & Vandenberghe, Convex Optimization, 2004, sec. 10.3, 11.2).

Not yet wired into ``QPOptions(backward=...)``; this module is the numerical core.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BarrierSolution", "barrier_solve", "barrier_vjp"]


@dataclass(frozen=True)
class BarrierSolution:
    """Barrier solution x(mu), equality multipliers y, slacks s = h - Gx and Newton iterations."""

    x: Tensor
    y: Tensor
    s: Tensor
    iterations: int


def _kkt(P: Tensor, G: Tensor, A: Tensor, s: Tensor, mu: float) -> Tensor:
    H = P + G.T @ ((mu / s**2)[:, None] * G)
    m = A.shape[0]
    top = torch.cat([H, A.T], dim=1)
    bottom = torch.cat([A, A.new_zeros(m, m)], dim=1)
    return torch.cat([top, bottom], dim=0)


def barrier_solve(
    P: Tensor,
    q: Tensor,
    G: Tensor,
    h: Tensor,
    A: Tensor,
    b: Tensor,
    *,
    mu: float,
    x0: Tensor,
    tol: float = 1e-12,
    max_iter: int = 100,
) -> BarrierSolution:
    """Solve the barrier problem by infeasible-start Newton from ``x0`` (``h - G x0 > 0`` needed).

    Raises ValueError when ``mu <= 0`` or ``x0`` is not strictly inside ``Gx < h``, and
    RuntimeError when Newton does not reach ``tol`` on the KKT residual in ``max_iter`` steps.
    """
    if not mu > 0:
        raise ValueError(f"barrier_solve: mu must be > 0, got {mu}; pass a small positive mu.")
    x = x0.clone()
    s = h - G @ x
    if not bool((s > 0).all()):
        raise ValueError(
            "barrier_solve: x0 must satisfy h - G x0 > 0 strictly; "
            f"got min slack {float(s.min())}. Pass a strictly feasible point."
        )
    n, m = x.shape[0], A.shape[0]
    y = x.new_zeros(m)
    for it in range(max_iter):
        r_dual = P @ x + q + G.T @ (mu / s) + A.T @ y
        r_prim = A @ x - b
        res = torch.cat([r_dual, r_prim])
        if float(res.abs().max()) <= tol * (1.0 + float(q.abs().max())):
            return BarrierSolution(x=x, y=y, s=s, iterations=it)
        step = torch.linalg.solve(_kkt(P, G, A, s, mu), -res)
        dx, dy = step[:n], step[n:]
        ds = -(G @ dx)
        t = 1.0
        neg = ds < 0
        if bool(neg.any()):
            t = min(1.0, 0.99 * float((-s[neg] / ds[neg]).min()))
        x, y = x + t * dx, y + t * dy
        s = h - G @ x
    raise RuntimeError(
        f"barrier_solve: Newton did not converge in {max_iter} iterations; raise max_iter or mu."
    )


def barrier_vjp(
    P: Tensor, G: Tensor, A: Tensor, sol: BarrierSolution, grad_x: Tensor, *, mu: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Exact (dL/dq, dL/dh, dL/db) of x(mu) at ``sol`` for the upstream gradient ``grad_x``."""
    n = grad_x.shape[0]
    rhs = torch.cat([grad_x, grad_x.new_zeros(A.shape[0])])
    uv = torch.linalg.solve(_kkt(P, G, A, sol.s, mu), rhs)
    u, v = uv[:n], uv[n:]
    return -u, (mu / sol.s**2) * (G @ u), v
