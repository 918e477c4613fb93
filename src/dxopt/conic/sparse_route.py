"""The sparse route of :func:`dxopt.conic.solve`: large problems with sparse shared ``P``, ``A``.

Nothing here forms a dense ``(n, n)``, ``(m, n)`` or ``(n + m)``-square matrix:

- **forward**: the chain of :func:`dxopt.conic.forward.run_chain` (the same attempts) with
  the CSC data handed to the backends as they are (:mod:`dxopt.conic.backends`);
- **certificate**: :func:`dxopt.conic.certify.point_checks`, ``farkas_check`` and
  ``ray_check`` (the same checks and tolerances as the dense route) on sparse matrix-vector
  products;
- **polish**: up to :data:`~dxopt.conic.polish.POLISH_STEPS` Newton steps on
  :math:`F(x, w) = 0` per sample, each a sparse LU of the lifted Jacobian
  (:mod:`dxopt.conic.sparse_kkt`) shifted by :data:`~dxopt.conic.polish.POLISH_SHIFT`
  :math:`\\Vert L\\Vert_1` and refined against the exact ``J``; a step is kept only where it
  lowers :math:`\\Vert F\\Vert_\\infty` (the point is certified afterwards either way);
- **derivatives** (:mod:`dxopt.conic.sparse_adjoint`): reverse mode (``backward()``,
  :func:`torch.autograd.grad`, :func:`torch.func.grad` / ``vjp``;
  :class:`SparseAdjointFunction`) and forward mode (:mod:`torch.autograd.forward_ad`,
  :func:`torch.func.jvp`; :class:`SparseTangentFunction`) by implicit differentiation of
  :math:`F(x, w) = 0` with the formulas, sign conventions and one-sided rule at kinks of
  :mod:`dxopt.conic.backward`, each solve a sparse LU of the lifted Jacobian refined against
  the exact :math:`J` or :math:`J^\\top` and checked (residual at round-off, condition
  estimate at most :data:`~dxopt.conic.backward.COND_MAX`); a singular Jacobian gets the
  checked minimum-norm solution (LSMR) flagged ``singular`` in ``info.backward`` with a
  :class:`~dxopt.conic.types.ConicDegenerateWarning`, or where that fails its checks a
  :class:`~dxopt.conic.types.ConicBackwardError`.
  Gradients with respect to ``P`` and ``A`` are sparse tensors on the input's stored entries,
  as :class:`dxopt.conic.sparse.Scatter` gives them on the dense route; their tangents are
  the input's matrix tangents (sparse COO/CSR or dense; torch itself builds no sparse dual
  tensor, so through its forward AD a sparse input's tangent arrives as zero).
  :mod:`torch.func` transforms see the problem's tensors only inside
  :class:`SparseConicFunction`'s forward (the checks and the problem are built there);
  ``torch.func.vmap`` has no rule here (pass a batch instead).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

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
from dxopt.conic.kkt import ROUNDOFF, project_dual
from dxopt.conic.sparse_adjoint import BACKWARD_SHIFT, adjoint_gradients, tangent_matrix, tangents
from dxopt.conic.sparse_kkt import SparseJacobian, cone_jacobian_sparse, lifted_solvers
from dxopt.conic.sparse_problem import SparseConicProblem, sparse_problem
from dxopt.conic.types import (
    ConicInfo,
    ConicOptions,
    ConicSolution,
)
from dxopt.conic.warm import WarmStart, warm_attempt, warm_points
from dxopt.linalg import FactorizationError, refine

__all__ = [
    "BACKWARD_SHIFT",
    "SPARSE_CHECKS",
    "SparseAdjointFunction",
    "SparseCall",
    "SparseConicFunction",
    "SparseSpec",
    "SparseTangentFunction",
    "solve_sparse",
]


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
            solve, _ = lifted_solvers(J, POLISH_SHIFT * norm, L)
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


@dataclass
class SparseSpec:
    """The non-tensor inputs of one :class:`SparseConicFunction` call. The forward checks
    the tensors and builds the problem (inside a :mod:`torch.func` transform only an
    autograd Function's forward sees plain tensors, whose values numpy can read) and leaves
    its :class:`SparseCall` in ``call``."""

    cones: tuple[Cone, ...]
    options: ConicOptions
    warm_start: WarmStart
    P_given: bool
    call: SparseCall | None = None


def _out(t: Tensor, prob: SparseConicProblem, ok: Tensor) -> Tensor:
    t = torch.where(ok[:, None], t, torch.full_like(t, float("nan")))
    t = t.to(dtype=prob.dtype, device=prob.device)
    return t if prob.batched else t[0]


def _tangent(t: Tensor | None, B: int, d: int) -> Tensor:
    """The tangent of ``q`` or ``b`` (shared ``(d,)`` or batched ``(B, d)``) as ``(B, d)``."""
    if t is None:
        return torch.zeros(B, d, dtype=torch.float64)
    return t.detach().to(dtype=torch.float64, device="cpu").reshape(-1, d).expand(B, d)


def _cot(g: Tensor | None, B: int, d: int) -> Tensor:
    if g is None:
        return torch.zeros(B, d, dtype=torch.float64)
    return torch.nan_to_num(g.detach().to(dtype=torch.float64, device="cpu").reshape(B, d))


class SparseConicFunction(torch.autograd.Function):
    """``(P, q, A, b, spec) -> (x, y, s)`` on the sparse route (``P``, ``A`` the sparse
    inputs; ``P`` an empty placeholder when absent); forward mode through
    :class:`SparseTangentFunction`."""

    @staticmethod
    def forward(P: Tensor, q: Tensor, A: Tensor, b: Tensor, spec: SparseSpec) -> Any:
        options = spec.options
        prob = sparse_problem(
            P if spec.P_given else None, q, A, b, spec.cones, check_psd=options.check_psd
        )
        call = SparseCall(prob, options, warm=warm_points(prob, spec.warm_start))
        spec.call = call
        first: tuple[Attempt, ...] = () if call.warm is None else (warm_attempt(call.warm),)
        chain = run_chain(prob, options, first, SPARSE_CHECKS)
        call.x, call.y, call.w = chain.x, chain.y, chain.w
        call.status, call.info, call.kink_scale = chain.status, chain.info, chain.kink_scale
        ok = torch.tensor([st.ok for st in chain.status], dtype=torch.bool)
        return _out(chain.x, prob, ok), _out(chain.y, prob, ok), _out(chain.s, prob, ok)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _P, q, _A, b, spec = inputs
        ctx.call = spec.call
        ctx.shapes = (tuple(q.shape), tuple(b.shape))
        ctx.mark_non_differentiable()

    @staticmethod
    def backward(ctx: Any, gx: Tensor | None, gy: Tensor | None, gs: Tensor | None) -> Any:
        need = tuple(bool(v) for v in ctx.needs_input_grad[:4])
        grads = SparseAdjointFunction.apply(gx, gy, gs, ctx.call, need, ctx.shapes)
        return (*(g if k else None for g, k in zip(grads, need)), None)

    @staticmethod
    def jvp(
        ctx: Any, dP: Tensor | None, dq: Tensor | None, dA: Tensor | None, db: Tensor | None, _: Any
    ) -> Any:
        return SparseTangentFunction.apply(dP, dq, dA, db, ctx.call)


class SparseAdjointFunction(torch.autograd.Function):
    """``(gx, gy, gs, call, need, shapes) -> (gP, gq, gA, gb)``: the reverse mode of
    :class:`SparseConicFunction` (:func:`dxopt.conic.sparse_adjoint.adjoint_gradients`), a
    Function of its own so that inside :func:`torch.func.grad` / ``vjp`` the cotangents reach
    numpy as plain tensors; gradients not in ``need`` are empty placeholders. Its outputs
    are not differentiable (no second derivatives)."""

    @staticmethod
    def forward(
        gx: Tensor | None,
        gy: Tensor | None,
        gs: Tensor | None,
        call: Any,
        need: tuple[bool, ...],
        shapes: tuple[tuple[int, ...], tuple[int, ...]],
    ) -> Any:
        prob = call.prob
        B, n, m = prob.batch, prob.n, prob.m
        grads = adjoint_gradients(call, _cot(gx, B, n), _cot(gy, B, m), _cot(gs, B, m))
        sq, sb = shapes
        empty = torch.zeros(0, dtype=prob.dtype, device=prob.device)

        def back(g: np.ndarray, shape: tuple[int, ...]) -> Tensor:
            t = torch.from_numpy(g)
            if len(shape) < 2 or not prob.batched:
                t = t.sum(0)
            return t.reshape(shape).to(dtype=prob.dtype, device=prob.device)

        grad_P = empty
        if prob.P_pattern is not None and need[0]:
            grad_P = prob.P_pattern.tensor(grads["P"])
        grad_A = prob.A_pattern.tensor(grads["A"]) if need[2] else empty
        grad_q = back(grads["q"], sq) if need[1] else empty
        grad_b = back(grads["b"], sb) if need[3] else empty
        return grad_P, grad_q, grad_A, grad_b

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.mark_non_differentiable(*output)


class SparseTangentFunction(torch.autograd.Function):
    """``(dP, dq, dA, db, call) -> (dx, dy, ds)``: the forward mode of
    :class:`SparseConicFunction` (:func:`dxopt.conic.sparse_adjoint.tangents`), a Function
    of its own so that inside :func:`torch.func.jvp` the tangents reach numpy as plain
    tensors. Its outputs are not differentiable (no second derivatives)."""

    @staticmethod
    def forward(
        dP: Tensor | None, dq: Tensor | None, dA: Tensor | None, db: Tensor | None, call: Any
    ) -> Any:
        prob = call.prob
        B, n, m = prob.batch, prob.n, prob.m
        tP = tangent_matrix("P", dP, (n, n)) if prob.P_pattern is not None else None
        tA = tangent_matrix("A", dA, (m, n))
        dx, dy, ds = tangents(call, tP, _tangent(dq, B, n), tA, _tangent(db, B, m))
        ok = torch.ones(B, dtype=torch.bool)
        return _out(dx, prob, ok), _out(dy, prob, ok), _out(ds, prob, ok)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.mark_non_differentiable(*output)


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
    spec = SparseSpec(cones, options, warm_start, P is not None)
    P_in = P if P is not None else q.new_zeros(0)
    x, y, s = SparseConicFunction.apply(P_in, q, A, b, spec)
    call = spec.call
    assert call is not None
    info = call.info
    assert info is not None
    if call.warm is not None:
        info = dataclasses.replace(info, warm=tuple(sv == "warm" for sv in info.solvers))
    return ConicSolution(x=x, y=y, s=s, status=tuple(call.status), info=info)
