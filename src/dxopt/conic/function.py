"""The one autograd Function of :mod:`dxopt.conic`: certified forward, implicit backward/jvp.

:class:`ConicFunction` takes ``(P, q, A, b, call)``; ``call`` (a :class:`ConicCall`) carries the
checked problem and options in and the :class:`~dxopt.conic.forward.ForwardState` out (the
statuses and diagnostics the result reports). Reverse mode and forward mode
(:meth:`ConicFunction.jvp`) share one Jacobian and LU per forward state
(:mod:`dxopt.conic.backward`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dxopt.conic.backward import adjoint_gradients, tangents
from dxopt.conic.forward import ForwardState, solve_forward
from dxopt.conic.problem import ConicProblem
from dxopt.conic.smoothed import smoothed_gradients
from dxopt.conic.types import ConicBackwardError, ConicOptions, Smoothed
from dxopt.conic.warm import warm_attempt

__all__ = ["ConicCall", "ConicFunction"]


@dataclass
class ConicCall:
    """The non-tensor side of one :class:`ConicFunction` call."""

    prob: ConicProblem
    options: ConicOptions
    state: ForwardState | None = None
    warm: tuple[Tensor, Tensor, Tensor] | None = None


def _out(t: Tensor, prob: ConicProblem, ok: Tensor) -> Tensor:
    t = torch.where(ok[:, None], t, torch.full_like(t, float("nan")))
    t = t.to(dtype=prob.dtype, device=prob.device)
    return t if prob.batched else t[0]


def _in(t: Tensor | None, shape: tuple[int, ...]) -> Tensor:
    if t is None:
        return torch.zeros(shape, dtype=torch.float64)
    return t.detach().to(dtype=torch.float64, device="cpu").reshape(shape)


class ConicFunction(torch.autograd.Function):
    """``(P, q, A, b, call) -> (x, y, s)`` (``P`` may be an empty placeholder when absent)."""

    @staticmethod
    def forward(P: Tensor, q: Tensor, A: Tensor, b: Tensor, call: ConicCall) -> Any:
        first = () if call.warm is None else (warm_attempt(call.warm),)
        state = solve_forward(call.prob, call.options, first)
        call.state = state
        ok = state.ok
        prob = call.prob
        return _out(state.x, prob, ok), _out(state.y, prob, ok), _out(state.s, prob, ok)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        P, q, A, b, call = inputs
        ctx.call = call
        ctx.shapes = tuple(tuple(t.shape) for t in (P, q, A, b))
        ctx.mark_non_differentiable()

    @staticmethod
    def backward(ctx: Any, gx: Tensor | None, gy: Tensor | None, gs: Tensor | None) -> Any:
        call: ConicCall = ctx.call
        state = call.state
        assert state is not None
        prob = call.prob
        B, n, m = prob.batch, prob.n, prob.m
        cot = (
            torch.nan_to_num(_in(gx, (B, n))),
            torch.nan_to_num(_in(gy, (B, m))),
            torch.nan_to_num(_in(gs, (B, m))),
        )
        smooth = call.options.backward
        if isinstance(smooth, Smoothed):
            gP, gq, gA, gb = smoothed_gradients(state, smooth, *cot)
        else:
            gP, gq, gA, gb = adjoint_gradients(state, *cot)
        sP, sq, sA, sb = ctx.shapes

        def back(g: Tensor, shape: tuple[int, ...], batched_ndim: int) -> Tensor:
            if len(shape) < batched_ndim or not prob.batched:
                g = g.sum(0)
            return g.reshape(shape).to(dtype=prob.dtype, device=prob.device)

        grad_P = back(gP, sP, 3) if prob.P_given and ctx.needs_input_grad[0] else None
        grad_q = back(gq, sq, 2) if ctx.needs_input_grad[1] else None
        grad_A = back(gA, sA, 3) if ctx.needs_input_grad[2] else None
        grad_b = back(gb, sb, 2) if ctx.needs_input_grad[3] else None
        return grad_P, grad_q, grad_A, grad_b, None

    @staticmethod
    def jvp(
        ctx: Any, dP: Tensor | None, dq: Tensor | None, dA: Tensor | None, db: Tensor | None, _: Any
    ) -> Any:
        call: ConicCall = ctx.call
        state = call.state
        assert state is not None
        if isinstance(call.options.backward, Smoothed):
            raise ConicBackwardError(
                "dxopt.conic: backward=Smoothed(...) offers reverse mode only (backward(), "
                "torch.autograd.grad); for forward-mode AD use backward='kkt'"
            )
        prob = call.prob
        B, n, m = prob.batch, prob.n, prob.m
        sP, _sq, sA, _sb = ctx.shapes

        def lead(shape: tuple[int, ...], batched_ndim: int) -> int:
            return shape[0] if len(shape) == batched_ndim else 1

        tP = _in(dP if prob.P_given else None, (lead(sP, 3), n, n))
        tq = (
            _in(dq, (-1, n)).expand(B, n)
            if dq is not None
            else torch.zeros(B, n, dtype=torch.float64)
        )
        tA = _in(dA, (lead(sA, 3), m, n))
        tb = (
            _in(db, (-1, m)).expand(B, m)
            if db is not None
            else torch.zeros(B, m, dtype=torch.float64)
        )
        dx, dy, ds = tangents(state, tP, tq, tA, tb)
        ok = torch.ones(B, dtype=torch.bool)
        return _out(dx, prob, ok), _out(dy, prob, ok), _out(ds, prob, ok)
