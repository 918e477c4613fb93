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
of a well-defined map.

Linear algebra: rows of :math:`A` that depend on the earlier ones are dropped once, by qp's
dependence test (:mod:`dxopt.qp.certify.dependence`: the squared pivot of a row of the
row-normalised Gram matrix, the squared sine of its angle to the span of the rows before it,
below ``DEPENDENT_TOL``), read off :func:`dxopt.linalg.schur_factor` with :math:`P = I`; the
dropped rows must be solved by the kept rows' minimum-norm solution (else the equalities are
inconsistent). Each KKT system above (Newton steps and the backward) is solved by the block
elimination of :func:`dxopt.linalg.schur_factor` (:math:`H \\succ 0` when every variable has a
finite bound; otherwise :func:`dxopt.linalg.saddle_solve`), refined against the exact system
until its relative residual stops falling; a Newton step counts only when that residual is at
most ``KKT_RTOL``, and a backward whose residual is larger is refused (``on_failure``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.optimize
import torch
from torch import Tensor, nn

from dxopt._core import (
    NotConvergedError,
    Status,
    check_choice,
    check_int,
    check_on_failure,
    check_positive,
    handle_failure,
)
from dxopt.dfl._checks import check_cost_vectors
from dxopt.dfl._cost import CostMeter, Metered
from dxopt.dfl.lp import lp_keywords, no_other_keywords, split_lp

__all__ = ["KKT_RTOL", "LogBarrierLP"]

#: the largest relative residual :math:`\\|r - Kz\\|/\\|r\\|` of a solved KKT system that a
#: Newton step or a backward accepts (refinement brings it to round-off, about 1e-15)
KKT_RTOL = 1e-10
_REFINE_STEPS = 4  # refinement steps at most (each halves the residual at least, or stops)
_CONSISTENT_RTOL = 1e-9  # dropped equality rows: residual relative to |A||x| + |b|


def _independent_rows(A: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``A x = b`` independent of the earlier ones (module docstring: qp's
    dependence test on the pivots of :func:`dxopt.linalg.schur_factor` with :math:`P = I`; a
    row where the factorization breaks down is dropped and the rest refactored); a
    ``ValueError`` when the dropped rows contradict the kept ones."""
    from dxopt.linalg import schur_factor  # lazily, as every dxopt.qp / linalg use in dfl
    from dxopt.qp.certify.dependence import DEPENDENT_TOL

    n = A.shape[1]
    eye = torch.eye(n, dtype=torch.float64)
    keep = np.flatnonzero(np.abs(A).max(1) > 0)  # zero rows: consistent iff b_j = 0 (below)
    while keep.size:
        factor = schur_factor(eye, torch.from_numpy(A[keep])[None])
        assert factor is not None  # P = I always factors
        info = int(factor.info[0])
        if info == 0:
            keep = keep[factor.pivots[0].numpy() >= DEPENDENT_TOL]
            break
        keep = np.delete(keep, info - 1)  # the row whose pivot broke down depends on the rest
    Ak, bk = A[keep], b[keep]
    x = np.zeros(n)
    if keep.size:  # the minimum-norm solution of the kept rows, refined once
        factor = schur_factor(eye, torch.from_numpy(Ak)[None])
        assert factor is not None
        for _ in range(2):
            r = torch.from_numpy(bk - Ak @ x)[None]
            du, _ = factor.solve(torch.zeros(1, n, dtype=torch.float64), r)
            x = x + du[0].numpy()
    resid = np.abs(A @ x - b)
    if (resid > _CONSISTENT_RTOL * (np.abs(A) @ np.abs(x) + np.abs(b) + 1.0)).any():
        raise ValueError(
            "A, b: the equality constraints are inconsistent (no x solves Ax = b: row "
            f"{int(np.argmax(resid))} is off by {float(resid.max()):.3g} at the kept rows' "
            "minimum-norm solution); fix b or drop the contradicting rows."
        )
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
        x64 = x.to("cpu", torch.float64)
        u, residual = layer._kkt_solve(layer._hessian(x64), grad.to("cpu", torch.float64))
        bad = ~(residual <= KKT_RTOL) | ~torch.isfinite(x64).all(1)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            message = (
                f"LogBarrierLP backward: the KKT system of {int(bad.sum())} of {bad.numel()} "
                f"samples (first: sample {i}, relative residual {float(residual[i]):.3g}) was "
                f"not solved to KKT_RTOL={KKT_RTOL:g}, so their gradient is refused; the "
                "barrier Hessian is singular or ill-conditioned there (raise mu, or bound "
                "every variable)."
            )
            policy = layer.on_failure if layer.on_failure != "nan" else "ignore"
            handle_failure(policy, message, error=NotConvergedError, status=Status.INACCURATE)
            u[bad] = torch.nan
        return (-layer.sign * u).to(grad.device, grad.dtype), None


class LogBarrierLP(Metered, nn.Module):
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
            (NaN rows, and NaN gradients, for the samples that did not converge). A backward
            whose KKT residual misses ``KKT_RTOL`` raises under ``"raise"`` and otherwise gives
            NaN gradient rows for those samples (with a warning under ``"warn"``): a gradient
            is right or refused.
    """

    @lp_keywords()
    def __init__(
        self,
        *,
        mu: float = 0.1,
        sense: str = "min",
        max_iter: int = 100,
        tol: float = 1e-22,
        on_failure: str = "raise",
        **lp: Any,
    ) -> None:
        super().__init__()
        self.mu = check_positive("mu", mu)
        self.sense = check_choice("sense", sense, ("min", "max"))
        self.sign = 1.0 if sense == "min" else -1.0
        self.max_iter = check_int("max_iter", max_iter)
        self.tol = check_positive("tol", tol)
        self.on_failure = check_on_failure(on_failure, ("raise", "warn", "nan"))
        data, rest = split_lp("LogBarrierLP", lp)
        no_other_keywords("LogBarrierLP", rest)
        self.data = data
        d = self.dim = data.dim
        A_, b_ = data.A, data.b
        if A_ is not None and b_ is not None:
            A_, b_ = _independent_rows(A_, b_)
        self._lower, self._upper = data.has_lower, data.has_upper
        if not (self._lower.any() or self._upper.any() or data.G is not None):
            raise ValueError("LogBarrierLP: without bounds or inequalities the LP is unbounded.")
        x0 = self._interior_point(A_, b_, data.G, data.h, data.lb, data.ub)
        t = torch.float64
        self._A = torch.zeros(0, d, dtype=t) if A_ is None else torch.tensor(A_, dtype=t)
        self._G = None if data.G is None else torch.tensor(data.G, dtype=t)
        self._h = None if data.h is None else torch.tensor(data.h, dtype=t)
        self._lb = torch.as_tensor(np.where(self._lower, data.lb, 0.0), dtype=t)
        self._ub = torch.as_tensor(np.where(self._upper, data.ub, 0.0), dtype=t)
        self._lmask = torch.as_tensor(self._lower, dtype=t)
        self._umask = torch.as_tensor(self._upper, dtype=t)
        self._x0 = torch.as_tensor(x0, dtype=t)
        self._meter = CostMeter()
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

    def _hessian(self, x: Tensor) -> Tensor:
        """The barrier's Hessians :math:`H` ``(B, d, d)`` at ``x``."""
        s_l, s_u, s_g = self._slacks(x)
        H = torch.diag_embed(self.mu * (self._lmask / s_l**2 + self._umask / s_u**2))
        if s_g is not None and self._G is not None:
            H = H + self.mu * torch.einsum("ji,bj,jk->bik", self._G, 1 / s_g**2, self._G)
        return H

    def _kkt_solve(self, H: Tensor, r1: Tensor) -> tuple[Tensor, Tensor]:
        """Solve :math:`[[H, A^\\top], [A, 0]][u; w] = [r_1; 0]` for each sample by the block
        elimination of :func:`dxopt.linalg.schur_factor` (per sample by
        :func:`dxopt.linalg.saddle_solve` where :math:`H` is not positive definite), refined
        against the exact system while the residual halves; returns ``u`` ``(B, d)`` and the
        relative residual :math:`\\|r - Kz\\|_2 / \\|r\\|_2` ``(B,)``."""
        from dxopt.linalg import saddle_solve, schur_factor

        B, p = r1.shape[0], self._A.shape[0]
        A = self._A.expand(B, -1, -1)
        r2 = r1.new_zeros(B, p)
        factor = schur_factor(H, A)
        if factor is None:
            u, w = r1.clone(), r2.clone()
            A_np = self._A.numpy()
            for i in range(B):
                rhs = torch.cat([r1[i], r2[i]]).numpy()
                z, _ = saddle_solve(H[i].numpy(), A_np, rhs)
                u[i], w[i] = torch.from_numpy(z[: self.dim]), torch.from_numpy(z[self.dim :])
        else:
            u, w = factor.solve(r1, r2)
        norm = r1.norm(dim=1).clamp_min(torch.finfo(r1.dtype).tiny)

        def residuals(u: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            e1 = r1 - (H @ u.unsqueeze(-1)).squeeze(-1) - w @ self._A
            e2 = -(u @ self._A.T)
            return e1, e2, torch.cat([e1, e2], 1).norm(dim=1) / norm

        e1, e2, residual = residuals(u, w)
        for _ in range(_REFINE_STEPS if factor is not None else 0):
            du, dw = factor.solve(e1, e2)  # type: ignore[union-attr]
            f1, f2, rel = residuals(u + du, w + dw)
            better = rel < residual  # per sample: a step that does not help is not taken
            keep = better[:, None]
            u, w = torch.where(keep, u + du, u), torch.where(keep, w + dw, w)
            e1, e2 = torch.where(keep, f1, e1), torch.where(keep, f2, e2)
            halved = bool((rel < 0.5 * residual).any())
            residual = torch.where(better, rel, residual)
            if not halved:
                break
        return u, residual

    def _solve(self, c_hat: Tensor) -> Tensor:
        start = time.perf_counter()
        c = c_hat.to("cpu", torch.float64).reshape(-1, self.dim)
        x = self._x0.expand(c.shape[0], -1).clone()
        done = torch.zeros(c.shape[0], dtype=torch.bool)
        threshold = self.tol * (1 + c.abs().amax(1)) ** 2
        for _ in range(self.max_iter):
            s_l, s_u, s_g = self._slacks(x)
            grad = self.sign * c - self.mu * self._lmask / s_l + self.mu * self._umask / s_u
            if s_g is not None and self._G is not None:
                grad = grad + self.mu * (1 / s_g) @ self._G
            H = self._hessian(x)
            dx, residual = self._kkt_solve(H, -grad)
            # lambda^2 = dx' H dx (Boyd & Vandenberghe 10.2): non-negative and free of the
            # cancellation in -grad' dx, whose A^T nu part is large and orthogonal to dx; it
            # stops a sample only when its Newton system was solved to KKT_RTOL
            decrement = torch.einsum("bi,bij,bj->b", dx, H, dx)
            done = (decrement <= threshold) & (residual <= KKT_RTOL)
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
        self._meter.add(c.shape[0], time.perf_counter() - start)
        if not bool(done.all()):
            bad = int((~done).sum())
            message = (
                f"LogBarrierLP: {bad} of {c.shape[0]} samples missed tol={self.tol:g} after "
                f"max_iter={self.max_iter} Newton steps (or their Newton systems missed "
                f"KKT_RTOL={KKT_RTOL:g}); raise max_iter or mu."
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
