"""Forward mode and :mod:`torch.func` support of the QP function.

**Tangents (jvp).** Differentiating the KKT conditions on the active set :math:`J`,
:math:`Px + q + G_J^\\top\\nu_J + A^\\top\\mu = 0`, :math:`G_Jx = h_J`, :math:`Ax = b`, gives

.. math::
    K\\,[\\dot x;\\ \\dot\\nu_J;\\ \\dot\\mu] =
    [-(\\operatorname{sym}(\\dot P)x + \\dot q + \\dot G_J^\\top\\nu_J + \\dot A^\\top\\mu);\\
    \\dot h_J - \\dot G_Jx;\\ \\dot b - \\dot Ax],\\qquad
    K = [[P, G_J^\\top, A^\\top], [G_J, 0, 0], [A, 0, 0]],

with :math:`\\dot\\nu = 0` off :math:`J` and :math:`\\operatorname{sym}(\\dot P) = (\\dot P +
\\dot P^\\top)/2` (the objective sees only the symmetric part of :math:`P`). :math:`K` is the
symmetric matrix of the adjoint system (:mod:`dxopt.qp.backward.adjoint`), so the tangent is the
backward method's own ``solve_adjoint`` applied to this right-hand side: the same active set,
factorization, refinement and residual check, and (penalty: the symmetric regularised system;
kkt: :math:`K` itself) the jvp is the transpose of the vjp. Degenerate samples (dependent
active rows) use the rows and multipliers of the method's degenerate rule
(:meth:`dxopt.qp.BackwardBase.degenerate_rule`, :mod:`dxopt.qp.backward.degenerate_rule`), which
depends on the point and the active set only, never on the (co)tangents: the tangent system is
solved on the rule's final rows (``rule_fixed``) with the rule's multipliers in its right-hand
side, and where those rows are still dependent (minimum-norm samples) the multiplier part is
projected onto their range, so the solve is :math:`K^+` on both sides and the jvp is exactly
the transpose of the vjp under ``"auto"``, ``"vertex"`` and ``"min_norm"`` (moving one of two
duplicated rows moves :math:`x` by half, the transpose of the vjp's equal split).
Failed samples (``on_failure="nan"``) get zero tangents, as they give
zero gradients.

**vmap.** The solve and the linear solves are CPU/SciPy code that torch.func cannot batch
through, so every Function here has a ``vmap`` staticmethod that *folds* the vmapped dimension
(size :math:`V`) into the problem's batch dimension: inputs become ``(V * B, ...)`` (``V``
outermost; unbatched inputs vmapped over are repeated over the batch, shared ones stay shared),
one batched call runs, and the outputs are unfolded to ``(V, B, ...)``. Nested vmaps fold
level by level, the outermost vmap slowest. The forward returns ``idx``, the index of each
output row in that folded solve (an integer output, not differentiable); the adjoint and the
tangent solve take ``idx`` with the (co)tangents, so a cotangent vmapped over by ``jacrev``
(the forward not vmapped) and a forward vmapped under ``grad`` are both one batched solve of
the samples ``idx`` points to.

**Second order.** The adjoint and tangent solves read the problem from the saved state, so
they take the QP's inputs as *anchors*: unused in the computation, but they connect the
first-order result to the inputs, and differentiating it again reaches :class:`AdjointSolve`'s
or :class:`TangentSolve`'s ``backward``/``jvp``, which raise instead of silently dropping the
QP's second-order term.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dxopt.qp.autograd.vjp import FirstOrderOnly, adjoint_input, run_adjoint
from dxopt.qp.backward.notices import collect_warnings, trial_warnings
from dxopt.qp.problem.contracts import AdjointInput, AdjointSolution
from dxopt.qp.problem.functorch import BASES, fold, fold_index, logical_batch, unfold
from dxopt.qp.problem.types import QPBackwardError

if TYPE_CHECKING:
    from dxopt.qp.problem.contracts import QPState

_F64 = torch.float64

__all__ = ["AdjointSolve", "TangentSolve"]


class AdjointSolve(FirstOrderOnly):
    """``(grad_x, grad_eq, grad_ineq, idx, call, *anchors) -> (u, w_J, w_E, x, nu_J, mu)``.

    The adjoint :math:`K[u; w_J; w_E] = [\\bar x; \\bar\\nu_J; \\bar\\mu]` of the samples
    ``idx`` of the saved solve (float64 CPU, one row per entry of ``idx``), with the point
    ``x``, ``nu_J = nu * used`` and ``mu`` the gradient formulas need.
    """

    @staticmethod
    def forward(
        grad_x: Tensor | None,
        grad_eq: Tensor | None,
        grad_ineq: Tensor | None,
        idx: Tensor,
        call: Any,
        *anchors: Tensor,
    ) -> tuple[Tensor, ...]:
        state = call.state
        flat = idx.reshape(-1)
        data = adjoint_input(state, flat, grad_x, grad_eq, grad_ineq)
        adj = run_adjoint(state, data)
        used = adj.active.used.to(_F64)
        shape = tuple(idx.shape)
        nu = data.ineq_duals if adj.ineq_duals is None else adj.ineq_duals
        mu = data.eq_duals if adj.eq_duals is None else adj.eq_duals
        x = data.x if adj.x is None else adj.x
        outs = (adj.u, adj.w_ineq * used, adj.w_eq, x, nu * used, mu)
        return tuple(t.reshape(*shape, t.shape[-1]) for t in outs)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.mark_non_differentiable(*output[3:])

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
        grad_x, grad_eq, grad_ineq, idx, call, *anchors = args
        V = info.batch_size
        B = logical_batch((idx,), in_dims[3:4], (0,))
        folded = [fold(V, t, d, 1, B) for t, d in zip((grad_x, grad_eq, grad_ineq), in_dims)]
        idx_f = fold_index(V, idx, in_dims[3], B)
        if idx_f.ndim == 0:  # an unbatched call vmapped only over its cotangents
            idx_f = idx_f.expand(V)
        outs = AdjointSolve.apply(*folded, idx_f, call, *anchors)
        return tuple(unfold(V, t, B) for t in outs), (0,) * len(outs)


# ---------------------------------------------------------------------------------------------
# the jvp


def _per_sample(t: Tensor | None, S: int, base: int) -> Tensor | None:
    if t is None:
        return None
    t = t.detach().to("cpu", _F64)
    return t if t.ndim == base else t.reshape(S, *t.shape[-base:])


def _mv(M: Tensor, v: Tensor) -> Tensor:
    """``M @ v`` per sample (``M`` shared ``(k, n)`` or ``(S, k, n)``, ``v`` ``(S, n)``)."""
    return v @ M.T if M.ndim == 2 else torch.bmm(M, v.unsqueeze(-1)).squeeze(-1)


def _rmv(M: Tensor, w: Tensor) -> Tensor:
    """``M^T @ w`` per sample."""
    return w @ M if M.ndim == 2 else torch.bmm(w.unsqueeze(-2), M).squeeze(-2)


def tangent_rhs(
    data: AdjointInput, tangents: tuple[Tensor | None, ...], used: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The right-hand side of the tangent system (module docstring), float64 CPU ``(S, k)``;
    ``used`` masks the multipliers of the stationarity row (``None``: every row)."""
    S, n = data.x.shape
    dP, dq, dA, db, dG, dh = (_per_sample(t, S, b) for t, b in zip(tangents, BASES))
    x = data.x
    r1 = torch.zeros(S, n, dtype=_F64)
    r2 = torch.zeros(S, data.problem.m, dtype=_F64)
    r3 = torch.zeros(S, data.problem.p, dtype=_F64)
    if dP is not None:
        r1 = r1 - 0.5 * (_mv(dP, x) + _rmv(dP, x))
    if dq is not None:
        r1 = r1 - dq
    if dA is not None:
        r1 = r1 - _rmv(dA, data.eq_duals)
        r3 = r3 - _mv(dA, x)
    if db is not None:
        r3 = r3 + db
    if dG is not None:
        nu = data.ineq_duals if used is None else data.ineq_duals * used
        r1 = r1 - _rmv(dG, nu)
        r2 = r2 - _mv(dG, x)
    if dh is not None:
        r2 = r2 + dh
    ok = data.ok[:, None]
    return tuple(torch.where(ok, r, torch.zeros_like(r)) for r in (r1, r2, r3))  # type: ignore[return-value]


def _regular_tangent(
    state: QPState, base: AdjointInput, tangents: tuple[Tensor | None, ...]
) -> AdjointSolution | None:
    """The tangent solve of a batch whose backward finds no dependent active rows and no
    singular reduced KKT matrix (its warnings, if any, join the call's), else ``None`` (then the
    degenerate rule's rows and multipliers are fixed first). A method without
    ``degenerate_rule`` always returns here."""
    if getattr(state.method, "degenerate_rule", None) is None:
        return None
    r1, r2, r3 = tangent_rhs(base, tangents, None)
    with trial_warnings() as trial:
        try:
            adj = run_adjoint(state, replace(base, grad_x=r1, grad_ineq=r2, grad_eq=r3))
        except QPBackwardError:
            return None
    diag = state.diagnostics
    if any(diag.dependent_rows or ()) or any(diag.pseudo_inverse or ()) or diag.weak_kept:
        return None
    if tangents[4] is not None and bool(((base.ineq_duals != 0) & ~adj.active.used).any()):
        return None  # multipliers of rows left out must not enter the stationarity row
    trial.commit()
    return adj


def _rule(state: QPState, base: AdjointInput) -> Any:
    """The degenerate rule of the state's backward method for the samples of ``base``
    (:meth:`dxopt.qp.BackwardBase.degenerate_rule`), or ``None`` (a custom method without
    one, or nothing to differentiate)."""
    rule = getattr(state.method, "degenerate_rule", None)
    if rule is None or base.x.shape[0] == 0 or base.problem.n == 0:
        return None
    return rule(base)


def _tangent_outputs(
    state: QPState, idx: Tensor, adj: AdjointSolution
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dmu, dnu)`` of the tangent solve in the inputs' shape, dtype and device."""
    problem = state.problem
    shape = tuple(idx.shape)

    def out(t: Tensor) -> Tensor:
        return t.reshape(*shape, t.shape[-1]).to(dtype=problem.dtype, device=problem.device)

    return out(adj.u), out(adj.w_eq), out(adj.w_ineq * adj.active.used.to(_F64))


class TangentSolve(FirstOrderOnly):
    """``(dP, dq, dA, db, dG, dh, idx, call, *anchors) -> (dx, dmu, dnu)``: the jvp of the
    samples ``idx`` of the saved solve, in the inputs' dtype and device."""

    @staticmethod
    def forward(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
        with collect_warnings():  # one warning per message and call
            return TangentSolve._solve(*args)

    @staticmethod
    def _solve(*args: Any) -> tuple[Tensor, Tensor, Tensor]:
        tangents = args[:6]
        idx, call = args[6], args[7]
        state = call.state
        if getattr(state.method, "name", "") == "smoothed":
            raise RuntimeError(
                "dxopt.qp: forward-mode differentiation (jvp, torch.func.jacfwd) is not "
                "implemented for backward=Smoothed(...); use reverse mode (backward, jacrev)."
            )
        base = adjoint_input(state, idx.reshape(-1), None, None, None)
        regular = _regular_tangent(state, base, tangents)
        if regular is not None:  # independent active rows: the rule plays no part
            return _tangent_outputs(state, idx, regular)
        rule = _rule(state, base)
        if rule is not None:  # the vjp's rows and multipliers: the jvp is its transpose
            used = rule.active.used
            base = replace(base, ineq_duals=rule.ineq_duals, eq_duals=rule.eq_duals)
            r1, r2, r3 = tangent_rhs(base, tangents, used.to(_F64))
            fixed = replace(base, grad_x=r1, grad_ineq=r2, grad_eq=r3, active=used, rule_fixed=True)
            adj = run_adjoint(state, fixed)
            state.method.record_rule(rule, state.diagnostics)
            return _tangent_outputs(state, idx, adj)
        r1, r2, r3 = tangent_rhs(base, tangents, None)
        adj = run_adjoint(state, replace(base, grad_x=r1, grad_ineq=r2, grad_eq=r3))
        used = adj.active.used
        if tangents[4] is not None and bool(((base.ineq_duals != 0) & ~used).any()):
            # multipliers of rows the backward left out do not enter its stationarity row
            r1, r2, r3 = tangent_rhs(base, tangents, used.to(_F64))
            adj = run_adjoint(state, replace(base, grad_x=r1, grad_ineq=r2, grad_eq=r3))
            used = adj.active.used
        return _tangent_outputs(state, idx, adj)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
        V = info.batch_size
        idx, call, anchors = args[6], args[7], args[8:]
        B = logical_batch((idx,), in_dims[6:7], (0,))
        folded = [fold(V, t, d, b, B) for t, d, b in zip(args[:6], in_dims[:6], BASES)]
        idx_f = fold_index(V, idx, in_dims[6], B)
        if idx_f.ndim == 0:
            idx_f = idx_f.expand(V)
        outs = TangentSolve.apply(*folded, idx_f, call, *anchors)
        return tuple(unfold(V, t, B) for t in outs), (0, 0, 0)
