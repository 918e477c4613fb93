"""The regularised Frank-Wolfe layer and its Fenchel-Young loss (Dalle, Baty, Bouvier &
Parmentier, "Learning with combinatorial optimization layers: a probabilistic approach",
arXiv 2207.13513, 2022; Blondel, Martins & Niculae, "Learning with Fenchel-Young losses",
JMLR 2020), for the quadratic regulariser :math:`\\Omega(y) = \\frac\\lambda2\\|y\\|^2` on
:math:`C = \\mathrm{conv}(S)`, using only the linear oracle.

With :math:`s = \\pm 1` the sense and the score :math:`\\theta = -s\\hat c`,

.. math::
    \\hat y(\\hat c) = \\arg\\max_{y \\in C}\\ \\theta^\\top y - \\tfrac\\lambda2\\|y\\|^2
    = \\mathrm{proj}_C(-s\\hat c / \\lambda),

the Euclidean projection of :math:`t = -s\\hat c/\\lambda` onto the polytope, computed by
Wolfe's minimum-norm-point algorithm (Wolfe, Math. Programming 1976; a Frank-Wolfe method with
fully corrective affine steps on an affinely independent *corral* of vertices, finite in exact
arithmetic) with one batched oracle call per iteration. It stops when the Frank-Wolfe gap
:math:`\\gamma = (y - t)^\\top (y - v) \\le` ``tol`` :math:`\\cdot \\max(1, \\|y - t\\|^2)`
(:math:`v` the oracle's answer at :math:`y - t`), which certifies
:math:`\\|y - \\hat y\\| \\le \\sqrt{2\\gamma}`; :class:`FrankWolfeInfo` reports both.

- :class:`RegularizedFrankWolfe` returns :math:`\\hat y`. On the relative interior of the
  corral's face the projection is affine, :math:`\\hat y = v_0 + P_D(t - v_0)` with :math:`P_D`
  the orthogonal projector onto :math:`D = \\mathrm{span}\\{v_i - v_0\\}`, so the backward is
  :math:`\\nabla_{\\hat c} = -\\frac{s}{\\lambda} P_D \\bar y` (zero at a vertex). It is the exact
  Jacobian exactly when the face :math:`F_n` of :math:`C` exposed by the normal
  :math:`n = t - \\hat y` lies in the corral's affine hull (then :math:`\\hat y \\in
  \\mathrm{relint}\\,F_n`: strict complementarity, the projection is differentiable). On tied
  costs it need not: for the unit square and :math:`t = (\\frac12, \\frac12)` Wolfe stops on the
  diagonal, :math:`P_D` is rank one, the true Jacobian is :math:`I`. So, when the input
  requires grad, the forward probes :math:`F_n` with the oracle at :math:`n \\pm \\delta u`
  (:math:`u` an orthonormal basis of :math:`D^\\perp`, :math:`\\delta = 10^{-7}\\max(1, \\|n\\|)`;
  for small :math:`\\delta` the answer maximises :math:`\\pm u` over :math:`F_n`) and a vertex
  tied with :math:`\\hat y` under :math:`n` off the corral's affine hull refuses the gradient
  through ``on_failure`` (``Status.DEGENERATE``). Costs :math:`2(d - \\dim D)` batched oracle
  calls per forward.
- :class:`FrankWolfeFenchelYoung`:
  :math:`\\ell(\\hat c, y^*) = s\\,\\hat c^\\top(y^* - \\hat y) + \\frac\\lambda2(\\|y^*\\|^2 -
  \\|\\hat y\\|^2) \\ge 0`, the Fenchel-Young loss :math:`\\Omega^*(\\theta) + \\Omega(y^*) -
  \\theta^\\top y^*`, with gradient :math:`s(y^* - \\hat y)` (Danskin; no Jacobian needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt._core import (
    DxoptError,
    Status,
    check_int,
    check_on_failure,
    check_positive,
    handle_failure,
)
from dxopt.dfl.base import OracleLoss

__all__ = ["FrankWolfeFenchelYoung", "FrankWolfeInfo", "RegularizedFrankWolfe"]


@dataclass(frozen=True)
class FrankWolfeInfo:
    """What the last forward's projections achieved, per sample: ``gap`` (the Frank-Wolfe gap
    :math:`\\gamma`), ``error_bound`` (:math:`\\sqrt{2\\gamma} \\ge \\|y - \\hat y\\|`),
    ``iterations``, ``vertices`` (corral size) and ``status`` (``Status.SOLVED``: gap below
    ``tol``; ``Status.MAX_ITER``; ``Status.INACCURATE``: stalled above ``tol``, the oracle's
    answer already in the corral)."""

    gap: Tensor
    error_bound: Tensor
    iterations: Tensor
    vertices: Tensor
    status: tuple[Status, ...]


def _affine_minimizer(Q: np.ndarray) -> np.ndarray:
    """:math:`\\arg\\min_\\alpha \\|Q^\\top\\alpha\\|` s.t. :math:`\\sum\\alpha = 1` (rows of
    ``Q`` affinely independent: the bordered system is non-singular)."""
    k = Q.shape[0]
    K = np.zeros((k + 1, k + 1))
    K[:k, :k] = Q @ Q.T
    K[:k, k] = K[k, :k] = 1.0
    rhs = np.zeros(k + 1)
    rhs[k] = 1.0
    try:
        return np.linalg.solve(K, rhs)[:k]
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(K, rhs, rcond=None)[0][:k]


def _minor_cycle(V: np.ndarray, w: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Wolfe's minor cycle: move to the corral's affine minimizer, dropping vertices whose
    weight reaches zero on the way, until it lies inside the corral's hull."""
    while True:
        alpha = _affine_minimizer(V - t)
        if (alpha > 0).all():
            return V, alpha
        neg = alpha <= 0
        ratios = w[neg] / (w[neg] - alpha[neg])
        beta = float(ratios.min())
        w = w + beta * (alpha - w)
        drop = np.flatnonzero(neg)[int(ratios.argmin())]
        keep = w > 0
        keep[drop] = False
        V, w = V[keep], w[keep]
        w = w / w.sum()


class _Projection:
    """Wolfe's minimum-norm point of :math:`\\mathrm{conv}(S) - t` for each row of ``t``."""

    def __init__(self, layer: Any, t: np.ndarray) -> None:
        self.layer, self.t = layer, t
        B = t.shape[0]
        v0 = layer._lmo(-t)
        self.V = [v0[i : i + 1] for i in range(B)]
        self.w = [np.ones(1) for _ in range(B)]
        self.y = v0.copy()
        self.gap = np.full(B, np.inf)
        self.iters = np.zeros(B, dtype=np.int64)
        self.done = np.zeros(B, dtype=bool)  # stopped
        self.ok = np.zeros(B, dtype=bool)  # stopped with the gap below tol

    def run(self, max_iter: int, tol: float) -> None:
        for _ in range(max_iter):
            todo = np.flatnonzero(~self.done)
            if todo.size == 0:
                return
            r = self.y[todo] - self.t[todo]
            v = self.layer._lmo(r)
            for j, i in enumerate(todo):
                self.iters[i] += 1
                self.gap[i] = max(float(r[j] @ (self.y[i] - v[j])), 0.0)
                self.ok[i] = self.gap[i] <= tol * max(1.0, float(r[j] @ r[j]))
                if self.ok[i] or bool((self.V[i] == v[j]).all(1).any()):
                    self.done[i] = True  # converged, or stalled (v already in the corral)
                    continue
                V = np.vstack([self.V[i], v[j]])
                w = np.append(self.w[i], 0.0)
                self.V[i], self.w[i] = _minor_cycle(V, w, self.t[i])
                self.y[i] = self.w[i] @ self.V[i]
        if not self.done.all():  # the gap at the last iterate, for the report
            todo = np.flatnonzero(~self.done)
            r = self.y[todo] - self.t[todo]
            v = self.layer._lmo(r)
            self.gap[todo] = np.maximum(np.einsum("bd,bd->b", r, self.y[todo] - v), 0.0)


class _RFWFunction(torch.autograd.Function):
    @staticmethod
    def forward(c_hat: Tensor, y: Tensor, projector: Tensor, scale: float) -> Tensor:
        return y.reshape(c_hat.shape)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        c_hat, _, projector, scale = inputs
        ctx.save_for_backward(projector)
        ctx.scale, ctx.shape = scale, c_hat.shape

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (basis,) = ctx.saved_tensors  # (B, d, r) orthonormal bases of D
        g = grad.reshape(basis.shape[0], -1, 1)
        proj = basis @ (basis.transpose(1, 2) @ g)
        return (ctx.scale * proj).reshape(ctx.shape), None, None, None


class _FrankWolfeBase(OracleLoss):
    def __init__(
        self,
        oracle: Any,
        *,
        lambd: float = 1.0,
        max_iter: int = 1000,
        tol: float = 1e-10,
        on_failure: str = "raise",
        reduction: str = "mean",
    ) -> None:
        super().__init__(oracle, reduction=reduction)
        self.lambd = check_positive("lambd", lambd, hint="the regularisation weight must be > 0")
        self.max_iter = check_int("max_iter", max_iter)
        self.tol = check_positive("tol", tol)
        self.on_failure = check_on_failure(on_failure)
        self.last_info: FrankWolfeInfo | None = None

    def _lmo(self, r: np.ndarray) -> np.ndarray:
        """:math:`\\arg\\min_{v \\in S} r^\\top v` for each row (one oracle call)."""
        x = self.solver(torch.from_numpy(np.ascontiguousarray(self.sign * r)), force=True)
        return np.asarray(x.numpy(), dtype=np.float64)

    def _project(self, c_hat: Tensor) -> _Projection:
        self.check_costs(c_hat)
        flat = c_hat.detach().reshape(-1, c_hat.shape[-1]).to("cpu", torch.float64).numpy()
        proj = _Projection(self, -self.sign * flat / self.lambd)
        proj.run(self.max_iter, self.tol)
        status = tuple(
            Status.SOLVED if ok else Status.INACCURATE if done else Status.MAX_ITER
            for ok, done in zip(proj.ok, proj.done, strict=True)
        )
        self.last_info = FrankWolfeInfo(
            gap=torch.as_tensor(proj.gap),
            error_bound=torch.as_tensor(np.sqrt(2 * proj.gap)),
            iterations=torch.as_tensor(proj.iters),
            vertices=torch.as_tensor([len(V) for V in proj.V]),
            status=status,
        )
        if not proj.ok.all():
            bad = int(np.flatnonzero(~proj.ok)[0])
            why = "stalled" if proj.done[bad] else f"stopped at max_iter={self.max_iter}"
            handle_failure(
                self.on_failure,
                f"{type(self).__name__}: the Frank-Wolfe projection of sample {bad} {why} with "
                f"gap {proj.gap[bad]:.3g} > tol={self.tol:g} (relative); raise max_iter, loosen "
                "tol, or pass on_failure='warn' to accept it (see last_info).",
                error=DxoptError,
                status=status[bad],
            )
        return proj


class RegularizedFrankWolfe(_FrankWolfeBase):
    """The regularised optimisation layer :math:`\\hat y = \\mathrm{proj}_{\\mathrm{conv}(S)}
    (-s\\hat c/\\lambda)` (see :mod:`dxopt.dfl.frank_wolfe`), differentiable with the
    face projector; PyEPO's ``regularizedFrankWolfeOpt``.

    Args:
        oracle: the linear oracle of :math:`S`.
        lambd: :math:`\\lambda > 0` (default 1).
        max_iter: the iteration limit per sample (default 1000).
        tol: the relative Frank-Wolfe gap to reach (default 1e-10).
        on_failure: ``"raise"`` (default), ``"warn"`` or ``"ignore"`` when ``max_iter`` is hit.

    Call: ``y = rfw(c_hat)`` ``(B, d)``; :attr:`last_info` is the :class:`FrankWolfeInfo`.
    """

    def __init__(self, oracle: Any, **kwargs: Any) -> None:
        super().__init__(oracle, **kwargs)

    def forward(self, c_hat: Tensor) -> Tensor:
        proj = self._project(c_hat)
        d = c_hat.shape[-1]
        bases = []
        for V in proj.V:
            D = (V[1:] - V[0]).T
            bases.append(np.linalg.qr(D)[0] if D.shape[1] else np.zeros((d, 0)))
        width = max(b.shape[1] for b in bases)
        basis = np.zeros((len(bases), d, max(width, 1)))
        for i, b in enumerate(bases):
            basis[i, :, : b.shape[1]] = b
        if c_hat.requires_grad and torch.is_grad_enabled():
            self._certify_faces(proj, bases)
        y = torch.as_tensor(proj.y).to(c_hat.device, c_hat.dtype)
        Q = torch.as_tensor(basis).to(c_hat.device, c_hat.dtype)
        out: Tensor = _RFWFunction.apply(c_hat, y, Q, -self.sign / self.lambd)
        return out

    def _certify_faces(self, proj: _Projection, bases: list[np.ndarray]) -> None:
        """Refuse (``on_failure``) the face-projector Jacobian of the samples whose exposed face
        :math:`F_n` reaches off the corral's affine hull (see :mod:`dxopt.dfl.frank_wolfe`)."""
        d = proj.t.shape[1]
        rows, owner, comps = [], [], []
        for i, Q in enumerate(bases):
            n = proj.t[i] - proj.y[i]
            full = np.linalg.qr(np.hstack([Q, np.eye(d)]), mode="complete")[0]
            U = full[:, Q.shape[1] :]  # orthonormal basis of the complement of D
            delta = 1e-7 * max(1.0, float(np.linalg.norm(n)))
            for sgn in (1.0, -1.0):
                rows.append(-(n[None, :] + sgn * delta * U.T))  # LMO minimises: argmax n.v
                owner.extend([i] * U.shape[1])
            comps.append(U)
        if not owner:
            return
        v = self._lmo(np.vstack(rows))
        owner_arr = np.asarray(owner)
        bad = []
        for i, U in enumerate(comps):
            vi = v[owner_arr == i]
            if vi.size == 0:
                continue
            n = proj.t[i] - proj.y[i]
            scale = max(1.0, float(np.abs(proj.y[i]).max()), float(np.abs(vi).max()))
            tied = (vi - proj.y[i]) @ n >= -1e-9 * max(1.0, float(np.linalg.norm(n))) * scale
            off = np.abs((vi - proj.y[i]) @ U).max(axis=1) > 1e-7 * scale
            if (tied & off).any():
                bad.append(i)
        if bad:
            handle_failure(
                self.on_failure,
                f"{type(self).__name__}: the gradient of sample {bad[0]} (of {len(bad)}) is not "
                "defined by the corral: a vertex tied with the projection under the normal "
                "t - y lies off the corral's face (tied costs; the projection may not be "
                "differentiable there). Perturb the costs, or pass on_failure='warn' to accept "
                "the face-projector gradient.",
                error=DxoptError,
                status=Status.DEGENERATE,
            )


class FrankWolfeFenchelYoung(_FrankWolfeBase):
    """The Fenchel-Young loss of the quadratic regulariser on :math:`\\mathrm{conv}(S)` (see
    :mod:`dxopt.dfl.frank_wolfe`): :math:`\\ell = s\\,\\hat c^\\top(y^* - \\hat y) +
    \\frac\\lambda2(\\|y^*\\|^2 - \\|\\hat y\\|^2)`, gradient :math:`s(y^* - \\hat y)`; PyEPO's
    ``regularizedFrankWolfeFenchelYoung``. Arguments as :class:`RegularizedFrankWolfe` plus
    ``reduction``. Call: ``loss(c_hat, x_true)``.
    """

    def forward(self, c_hat: Tensor, x_true: Tensor) -> Tensor:
        if x_true.shape != c_hat.shape:
            raise ValueError(
                f"x_true: expected the shape of c_hat {tuple(c_hat.shape)}, got "
                f"{tuple(x_true.shape)}."
            )
        proj = self._project(c_hat)
        y_hat = torch.as_tensor(proj.y).to(c_hat.device, c_hat.dtype).reshape(c_hat.shape)
        y_true = x_true.detach().to(c_hat.dtype)
        loss = self.sign * (c_hat * (y_true - y_hat)).sum(-1) + 0.5 * self.lambd * (
            y_true.square().sum(-1) - y_hat.square().sum(-1)
        )
        return self.reduce(loss)
