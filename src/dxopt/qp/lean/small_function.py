"""The autograd Function of the lean paths (:class:`SmallQPFunction`) and its plain apply
(:data:`apply_small`) for calls outside torch.func transforms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dxopt._core.torch_compat import SingleLevelFunction, functorch_unwrap_if_dead
from dxopt.qp.autograd.function import (
    is_legacy_batched,
    refuse_batched_cotangents,
    refuse_second_order,
)
from dxopt.qp.lean.records import SmallPoint
from dxopt.qp.lean.small import point_gradients
from dxopt.qp.lean.small_batch import small_batch_backward

__all__ = ["SmallQPFunction", "apply_small"]


def _gradients(solved: Any, *args: Any) -> tuple[Tensor | None, ...]:
    """The lean backward of ``solved``: one point's or a batch's."""
    if isinstance(solved, SmallPoint):
        return point_gradients(solved, *args)
    return small_batch_backward(solved, *args)


def outputs(solved: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, eq_duals, ineq_duals)``: ``solved.outputs``, the kernel's copies, as tensors of the
    inputs' dtype (float64: sharing the arrays)."""
    x, mu, nu = solved.outputs
    from_numpy = torch.from_numpy
    outs = (from_numpy(x), from_numpy(mu), from_numpy(nu))
    if solved.dtype is not torch.float64:
        dtype = solved.dtype
        return outs[0].to(dtype), outs[1].to(dtype), outs[2].to(dtype)
    return outs


class SmallQPFunction(torch.autograd.Function):
    """``(P, q, A, b, G, h, solved, method) -> (x, eq_duals, ineq_duals)`` of a problem the lean
    paths solved (a :class:`~dxopt.qp.lean.records.SmallPoint`, or a batch
    :class:`~dxopt.qp.lean.records.SmallBatch`): the forward hands out ``solved.outputs``, the
    backward is :func:`~dxopt.qp.lean.small.point_gradients` or
    :func:`~dxopt.qp.lean.small_batch.small_batch_backward` (the lean backward, and the general
    path's where that declines). Plain autograd only: :func:`small_inputs` and
    :func:`~dxopt.qp.lean.small_batch.small_batch_inputs` send torch.func and forward-mode AD to
    :class:`dxopt.qp.autograd.function.QPFunction`."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> tuple[Tensor, Tensor, Tensor]:
        solved, method = args[6], args[7]  # after the six data tensors (P, q, A, b, G, h)
        ctx.solved, ctx.method = solved, method
        ctx.set_materialize_grads(False)  # unused outputs: None, not zeros
        return outputs(solved)

    @staticmethod
    def backward(
        ctx: Any, grad_x: Tensor | None, grad_eq: Tensor | None, grad_ineq: Tensor | None
    ) -> Any:
        needs = ctx.needs_input_grad[:6]
        cotangents = (grad_x, grad_eq, grad_ineq)
        for g in cotangents:  # (a loop: any() of a generator costs a frame per call)
            if g is not None and (g.requires_grad or is_legacy_batched(g)):
                refuse_batched_cotangents(cotangents)
                grads = _gradients(ctx.solved, ctx.method, grad_x, grad_eq, grad_ineq, needs)
                return (*refuse_second_order(grads, cotangents), None, None)
        # plain cotangents: no graph to extend, the second-order guard has nothing to tie
        solved = ctx.solved
        if type(solved) is SmallPoint:  # (_gradients without its frame: the common call)
            grads = point_gradients(solved, ctx.method, grad_x, grad_eq, grad_ineq, needs)
        else:
            grads = small_batch_backward(solved, ctx.method, grad_x, grad_eq, grad_ineq, needs)
        return (*grads, None, None)


def _plain_apply() -> Callable[..., Any]:
    """:class:`SmallQPFunction`'s apply without the Python wrapper of
    :meth:`torch.autograd.Function.apply`, whose work (binding ``setup_context``'s arguments,
    the torch.func dispatch) the lean paths do not need: they run only outside torch.func
    transforms, for a Function without ``setup_context`` (2 of the tiny path's 90 us). Dead
    torch.func wrappers are unwrapped as there. Without an input that requires grad (or with
    grad mode off) it runs no Function at all: the outputs are :func:`outputs`, as the
    Function's forward would return them, without a node. Falls back to
    ``SmallQPFunction.apply`` where torch's internals differ."""
    if SingleLevelFunction is None or functorch_unwrap_if_dead is None:  # pragma: no cover
        return SmallQPFunction.apply  # other torch versions
    base = super(SingleLevelFunction, SmallQPFunction).apply
    unwrap = functorch_unwrap_if_dead
    if SmallQPFunction.setup_context is not torch.autograd.Function.setup_context:
        return SmallQPFunction.apply  # pragma: no cover - never: forward takes ctx

    def apply(
        P: Tensor, q: Tensor, A: Any, b: Any, G: Any, h: Any, solved: Any, method: Any
    ) -> Any:
        """(what torch's ``unwrap_dead_wrappers`` does, one tensor at a time; no Function, and
        so no autograd node, where no unwrapped input requires grad or grad mode is off)"""
        if not torch.is_grad_enabled():
            return outputs(solved)
        P, q = unwrap(P), unwrap(q)
        A = None if A is None else unwrap(A)
        b = None if b is None else unwrap(b)
        G = None if G is None else unwrap(G)
        h = None if h is None else unwrap(h)
        if (
            P.requires_grad or q.requires_grad
            or (A is not None and A.requires_grad) or (b is not None and b.requires_grad)
            or (G is not None and G.requires_grad) or (h is not None and h.requires_grad)
        ):  # fmt: skip
            return base(P, q, A, b, G, h, solved, method)
        return outputs(solved)

    return apply


apply_small = _plain_apply()
"""``SmallQPFunction.apply`` for calls outside torch.func transforms (:func:`_plain_apply`)."""
