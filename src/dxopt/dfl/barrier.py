"""The log-barrier LP layer (Mandi & Guns, "Interior point solving for LP-based prediction +
optimisation", NeurIPS 2020): the LP is smoothed by a logarithmic barrier of weight
:math:`\\mu > 0`,

.. math:: x_\\mu(\\hat c) = \\arg\\min_x\\ s\\,\\hat c^\\top x - \\mu\\Big(\\sum_i \\log(x_i - l_i)
    + \\sum_i \\log(u_i - x_i) + \\sum_j \\log(h_j - g_j^\\top x)\\Big)
    \\quad\\text{s.t.}\\quad Ax = b

(finite bounds only), the central path point of the LP at barrier weight :math:`\\mu`; as
:math:`\\mu \\to 0` it tends to the LP's optimum. It is solved by damped Newton steps on the
equality-constrained KKT system from a strictly interior point (found once by an LP), and
differentiated exactly by the implicit function theorem: with
:math:`H = \\nabla^2` of the barrier,

.. math:: \\begin{bmatrix} H & A^\\top \\\\ A & 0 \\end{bmatrix}
    \\begin{bmatrix} u \\\\ w \\end{bmatrix} = \\begin{bmatrix} \\bar x \\\\ 0 \\end{bmatrix},
    \\qquad \\bar c = -s\\,u .

Unlike IntOpt we stop at a fixed :math:`\\mu` (a smoothing parameter like QPTL's
:math:`\\epsilon`) instead of the homotopy's last iterate, so the derivative is the exact one
of a well-defined map; rows of :math:`A` that depend on the others are dropped once.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.linalg
import scipy.optimize
import torch
from torch import Tensor, nn

from dxopt._core import (
    Cost,
    NotConvergedError,
    Status,
    check_choice,
    check_int,
    check_on_failure,
    check_positive,
    handle_failure,
)
from dxopt.dfl._checks import as_array, check_cost_vectors, lp_bounds, lp_dimension, lp_matrix

__all__ = ["LogBarrierLP"]


def _independent_rows(A: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop rows of ``A x = b`` that depend on the others (QR with column pivoting of
    :math:`A^\\top`); a ``ValueError`` when the dropped rows contradict the kept ones."""
    _, R, piv = scipy.linalg.qr(A.T, mode="economic", pivoting=True)
    diag = np.abs(np.diag(R))
    rank = int((diag > diag.max() * max(A.shape) * np.finfo(float).eps).sum()) if diag.size else 0
    keep = np.sort(piv[:rank])
    Ak, bk = A[keep], b[keep]
    coef, *_ = np.linalg.lstsq(Ak.T, A.T, rcond=None)
    if not np.allclose(coef.T @ bk, b, atol=1e-9 * (1 + np.abs(b).max())):
        raise ValueError("A, b: the equality constraints are inconsistent (no x solves Ax = b).")
    return Ak, bk


class _BarrierFunction(torch.autograd.Function):
    @staticmethod
    def forward(c_hat: Tensor, layer: LogBarrierLP) -> Tensor:
        return layer._solve(c_hat.detach())

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.layer = inputs[1]
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        layer: LogBarrierLP = ctx.layer
        K = layer._kkt(x.to(torch.float64))
        n = layer.dim
        zeros = torch.zeros(grad.shape[0], K.shape[-1] - n, dtype=torch.float64)
        rhs = torch.cat([grad.to(torch.float64), zeros], 1)
        u = torch.linalg.solve(K, rhs)[:, :n]
        return (-layer.sign * u).to(grad.dtype), None


class LogBarrierLP(nn.Module):
    """Log-barrier smoothed LP layer: ``x = layer(c_hat)`` ``(B, d)`` with exact gradients.

    Args:
        A, b, G, h, lb, ub: the LP (numbers for ``lb`` / ``ub`` bound every entry; infinite
            bounds carry no barrier). The set must have a strictly interior point.
        mu: the barrier weight :math:`\\mu > 0` (larger is smoother).
        sense: ``"min"`` or ``"max"``.
        max_iter, tol: Newton iterations and the tolerance on the squared Newton decrement
            relative to the cost scale, :math:`\\lambda^2 \\le` ``tol`` :math:`(1 +
            \\|\\hat c\\|_\\infty)^2` (the barrier objective is then within half of that of its
            minimum, Boyd & Vandenberghe 9.6; Newton converges quadratically, so a tight ``tol``
            costs one or two steps).
        on_failure: ``"raise"`` (:class:`dxopt.NotConvergedError`), ``"warn"`` or ``"nan"``
            (NaN rows, and NaN gradients, for the samples that did not converge).
    """

    def __init__(
        self,
        *,
        A: Any = None,
        b: Any = None,
        G: Any = None,
        h: Any = None,
        lb: Any = None,
        ub: Any = None,
        mu: float = 0.1,
        sense: str = "min",
        max_iter: int = 100,
        tol: float = 1e-22,
        on_failure: str = "raise",
    ) -> None:
        super().__init__()
        self.mu = check_positive("mu", mu)
        self.sense = check_choice("sense", sense, ("min", "max"))
        self.sign = 1.0 if sense == "min" else -1.0
        self.max_iter = check_int("max_iter", max_iter)
        self.tol = check_positive("tol", tol)
        self.on_failure = check_on_failure(on_failure, ("raise", "warn", "nan"))
        d = self.dim = lp_dimension("LogBarrierLP", A=A, b=b, G=G, h=h, lb=lb, ub=ub)
        A_ = None if A is None else lp_matrix("A", A, d)
        G_ = None if G is None else lp_matrix("G", G, d)
        lb_, ub_ = lp_bounds(lb, ub, d)
        b_ = None if A_ is None else as_array("b", b, (A_.shape[0],))
        h_ = None if G_ is None else as_array("h", h, (G_.shape[0],))
        if A_ is not None and b_ is not None:
            A_, b_ = _independent_rows(A_, b_)
        self._lower, self._upper = np.isfinite(lb_), np.isfinite(ub_)
        if not (self._lower.any() or self._upper.any() or G_ is not None):
            raise ValueError("LogBarrierLP: without bounds or inequalities the LP is unbounded.")
        x0 = self._interior_point(A_, b_, G_, h_, lb_, ub_)
        t = torch.float64
        self._A = torch.zeros(0, d, dtype=t) if A_ is None else torch.as_tensor(A_, dtype=t)
        self._G = None if G_ is None else torch.as_tensor(G_, dtype=t)
        self._h = None if h_ is None else torch.as_tensor(h_, dtype=t)
        self._lb = torch.as_tensor(np.where(self._lower, lb_, 0.0), dtype=t)
        self._ub = torch.as_tensor(np.where(self._upper, ub_, 0.0), dtype=t)
        self._lmask = torch.as_tensor(self._lower, dtype=t)
        self._umask = torch.as_tensor(self._upper, dtype=t)
        self._x0 = torch.as_tensor(x0, dtype=t)
        self.cost = Cost()
        self.status: list[Status] = []

    def _interior_point(self, A, b, G, h, lb, ub) -> np.ndarray:
        """max t s.t. Ax = b, x - lb >= t, ub - x >= t, h - Gx >= t ||g_j||, t <= 1 (an LP)."""
        d = self.dim
        rows, rhs = [], []
        eye = np.eye(d)
        for mask, sgn, bound in ((self._lower, -1.0, lb), (self._upper, 1.0, ub)):
            for i in np.nonzero(mask)[0]:
                rows.append(np.append(sgn * eye[i], 1.0))
                rhs.append(sgn * bound[i])
        if G is not None:
            for j in range(G.shape[0]):
                rows.append(np.append(G[j], np.linalg.norm(G[j])))
                rhs.append(h[j])
        A_eq = None if A is None else np.hstack([A, np.zeros((A.shape[0], 1))])
        res = scipy.optimize.linprog(
            np.append(np.zeros(d), -1.0), A_ub=np.array(rows), b_ub=np.array(rhs),
            A_eq=A_eq, b_eq=b, bounds=[(None, None)] * d + [(None, 1.0)], method="highs",
        )  # fmt: skip
        if res.status != 0 or res.x[-1] <= 1e-9:
            raise ValueError(
                "A, b, G, h, lb, ub: the feasible set has no strictly interior point (or is "
                "empty); the log barrier needs one. Remove fixed variables or use QPTL."
            )
        return np.asarray(res.x[:d])

    def _slacks(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        s_l = torch.where(self._lmask > 0, x - self._lb, torch.ones_like(x))
        s_u = torch.where(self._umask > 0, self._ub - x, torch.ones_like(x))
        s_g = None if self._G is None or self._h is None else self._h - x @ self._G.T
        return s_l, s_u, s_g

    def _barrier(self, c: Tensor, x: Tensor) -> Tensor:
        s_l, s_u, s_g = self._slacks(x)
        if (s_l <= 0).any() or (s_u <= 0).any() or (s_g is not None and (s_g <= 0).any()):
            logs = torch.full(x.shape[:1], -torch.inf, dtype=x.dtype)
            bad = (s_l <= 0).any(1) | (s_u <= 0).any(1)
            if s_g is not None:
                bad |= (s_g <= 0).any(1)
            ok = ~bad
            logs[ok] = self._logs(s_l[ok], s_u[ok], None if s_g is None else s_g[ok])
        else:
            logs = self._logs(s_l, s_u, s_g)
        return self.sign * (c * x).sum(1) - self.mu * logs

    def _logs(self, s_l: Tensor, s_u: Tensor, s_g: Tensor | None) -> Tensor:
        out = (self._lmask * s_l.log()).sum(1) + (self._umask * s_u.log()).sum(1)
        return out if s_g is None else out + s_g.log().sum(1)

    def _kkt(self, x: Tensor) -> Tensor:
        """The KKT matrices ``[[H, A^T], [A, 0]]`` ``(B, d + p, d + p)`` at ``x``."""
        s_l, s_u, s_g = self._slacks(x)
        H = torch.diag_embed(self.mu * (self._lmask / s_l**2 + self._umask / s_u**2))
        if s_g is not None and self._G is not None:
            H = H + self.mu * torch.einsum("ji,bj,jk->bik", self._G, 1 / s_g**2, self._G)
        p = self._A.shape[0]
        top = torch.cat([H, self._A.T.expand(x.shape[0], -1, -1)], 2)
        bottom = torch.cat([self._A.expand(x.shape[0], -1, -1), x.new_zeros(x.shape[0], p, p)], 2)
        return torch.cat([top, bottom], 1)

    def _solve(self, c_hat: Tensor) -> Tensor:
        start = time.perf_counter()
        c = c_hat.to("cpu", torch.float64).reshape(-1, self.dim)
        x = self._x0.expand(c.shape[0], -1).clone()
        n = self.dim
        done = torch.zeros(c.shape[0], dtype=torch.bool)
        threshold = self.tol * (1 + c.abs().amax(1)) ** 2
        for _ in range(self.max_iter):
            s_l, s_u, s_g = self._slacks(x)
            grad = self.sign * c - self.mu * self._lmask / s_l + self.mu * self._umask / s_u
            if s_g is not None and self._G is not None:
                grad = grad + self.mu * (1 / s_g) @ self._G
            K = self._kkt(x)
            rhs = torch.cat([-grad, x.new_zeros(x.shape[0], K.shape[-1] - n)], 1)
            dx = torch.linalg.solve(K, rhs)[:, :n]
            # lambda^2 = dx' H dx (Boyd & Vandenberghe 10.2): non-negative and free of the
            # cancellation in -grad' dx, whose A^T nu part is large and orthogonal to dx
            decrement = torch.einsum("bi,bij,bj->b", dx, K[:, :n, :n], dx)
            done = decrement <= threshold
            if bool(done.all()):
                break
            # the largest step keeping every slack positive, then Armijo backtracking
            inf = torch.full_like(dx, torch.inf)
            ratios = [
                torch.where((dx < 0) & (self._lmask > 0), -s_l / dx, inf),
                torch.where((dx > 0) & (self._umask > 0), s_u / dx, inf),
            ]
            if s_g is not None and self._G is not None:
                ds = -(dx @ self._G.T)
                ratios.append(torch.where(ds < 0, -s_g / ds, torch.full_like(ds, torch.inf)))
            t_max = torch.cat(ratios, 1)
            t = torch.clamp(0.99 * t_max.min(1).values, max=1.0)
            # phi / mu is self-concordant: with its decrement below 0.1^2 the full step is
            # feasible and accepted (the quadratic phase; Boyd & Vandenberghe 9.6.4), where
            # Armijo's test could not even resolve the decrease in floating point
            quadratic = (decrement < 0.01 * self.mu) & (t_max.min(1).values > 1.0)
            t = torch.where(quadratic, torch.ones_like(t), t)
            f0 = self._barrier(c, x)
            for _ in range(60):
                trial = x + t[:, None] * dx
                fail = ~(self._barrier(c, trial) <= f0 - 0.25 * t * decrement)
                fail &= ~done & ~quadratic
                if not bool(fail.any()):
                    break
                t = torch.where(fail, 0.5 * t, t)
            x = torch.where(done[:, None], x, x + t[:, None] * dx)
        self.status = [Status.SOLVED if d else Status.MAX_ITER for d in done.tolist()]
        self.cost = self.cost + Cost(forwards=c.shape[0], seconds=time.perf_counter() - start)
        if not bool(done.all()):
            bad = int((~done).sum())
            message = (
                f"LogBarrierLP: {bad} of {c.shape[0]} samples missed tol={self.tol:g} after "
                f"max_iter={self.max_iter} Newton steps; raise max_iter or mu."
            )
            handle_failure(self.on_failure if self.on_failure != "nan" else "ignore", message,
                           error=NotConvergedError, status=Status.MAX_ITER)  # fmt: skip
            if self.on_failure == "nan":
                x[~done] = torch.nan
        return x.to(c_hat.device, c_hat.dtype).reshape(c_hat.shape)

    def forward(self, c_hat: Tensor) -> Tensor:
        check_cost_vectors("c_hat", c_hat, self.dim)
        flat = c_hat.reshape(-1, self.dim)
        out: Tensor = _BarrierFunction.apply(flat, self)
        return out.reshape(c_hat.shape)
