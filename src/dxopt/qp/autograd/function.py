"""The module-level :class:`torch.autograd.Function` that runs the QP solve and attaches its
derivative.

Solving and differentiating are kept apart: the forward calls the solve that
:func:`dxopt.qp.solve` prepared (a :class:`~dxopt.qp.problem.contracts.QPCall`: validation,
backend, polish, certificate) and stores the :class:`QPState` on it; ``backward`` asks the
chosen backward method (:class:`~dxopt.qp.PenaltyBackward` or :class:`~dxopt.qp.KKTBackward`)
for the adjoint :math:`(u, w_J, w_E)` (:mod:`dxopt.qp.autograd.vjp`), from which
:mod:`dxopt.qp.backward.grads` forms every parameter gradient; ``jvp`` solves
the same system for the tangents (:mod:`dxopt.qp.autograd.tangent`). The solve runs *inside*
``forward`` because :mod:`torch.func` calls it with plain tensors (its inputs cannot be copied
to numpy before); ``vmap`` folds a vmapped dimension into the batch (one batched solve), and
under torch.func the backward goes through :class:`~dxopt.qp.autograd.tangent.AdjointSolve`, whose
own
``vmap`` rule batches the cotangents of ``jacrev``.

Double backward (``create_graph=True`` followed by a second differentiation through the QP) is
not implemented: under ``create_graph=True`` the gradients are tied to the incoming cotangents by
:class:`NoDoubleBackward`, whose backward raises ``RuntimeError`` ("cannot differentiate twice
...") instead of silently dropping the QP's second-order term. (``once_differentiable`` is not
enough: its error node is not connected to the inputs, so autograd prunes it and the second
derivative comes back without the QP's term.) Under torch.func the adjoint and tangent solves
raise the same error when differentiated (:mod:`dxopt.qp.autograd.tangent`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from dxopt._core.torch_compat import (
    functorch_transforms_active,
    functorch_unwrap_dead_wrappers,
    is_legacy_batched_tensor,
)
from dxopt.qp.autograd.tangent import AdjointSolve, TangentSolve
from dxopt.qp.autograd.vjp import adjoint_input, gradients_from_adjoint, run_adjoint
from dxopt.qp.backward.grads import parameter_gradients
from dxopt.qp.problem.contracts import QPCall, QPState
from dxopt.qp.problem.functorch import BASES, fold, functorch_active, logical_batch, unfold

__all__ = [
    "NoDoubleBackward",
    "QPFunction",
    "eager_gradients",
    "refuse_batched_cotangents",
    "refuse_second_order",
]

# the private helper torch's own Function.apply calls (None: no shortcut)
unwrap_dead_wrappers = functorch_unwrap_dead_wrappers


class QPFunction(torch.autograd.Function):
    """``(P, q, A, b, G, h, warm_start, call) -> (x, eq_duals, ineq_duals, idx)`` with the
    implicit derivative (``backward``), its tangent (``jvp``) and a ``vmap`` rule.

    ``idx`` (int64, ``()`` or ``(B,)``) is the index of each output row in the solve stored
    on ``call`` (``arange`` except under vmap, see :mod:`dxopt.qp.autograd.tangent`).
    """

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """``torch.autograd.Function.apply`` without its per-call ``inspect.signature`` binding
        (about 30 us, as much as a small solve) when it is a no-op: all eight arguments
        positional, no torch.func transform active (then the same two steps as torch's own
        ``apply``: unwrap dead functorch wrappers, then the C++ ``apply``). Every other call,
        torch.func included, goes through torch's ``apply`` unchanged."""
        if (
            len(args) == 8
            and not kwargs
            and unwrap_dead_wrappers is not None
            and not functorch_transforms_active()
        ):
            args = unwrap_dead_wrappers(args)
            return super(torch.autograd.Function, cls).apply(*args)  # type: ignore[misc]
        return super().apply(*args, **kwargs)

    @staticmethod
    def forward(
        P: Tensor,
        q: Tensor,
        A: Tensor | None,
        b: Tensor | None,
        G: Tensor | None,
        h: Tensor | None,
        warm_start: Tensor | None,
        call: QPCall,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        state = call.solve(P, q, A, b, G, h, warm_start)
        call.state = state
        problem, result = state.problem, state.result
        outs = []
        # float64 on the CPU (the common case): one numpy copy per output instead of two torch
        # ops; the outputs never share memory with ``result`` (the backward reads it)
        in_numpy = problem.dtype == torch.float64 and problem.device.type == "cpu"
        for t in (result.x, result.eq_duals, result.ineq_duals):
            numpy_ok = t.dtype == torch.float64 and t.device.type == "cpu" and not t.requires_grad
            if in_numpy and numpy_ok:
                a = t.numpy()
                outs.append(torch.from_numpy((a[0] if problem.batch is None else a).copy()))
                continue
            if problem.batch is None:
                t = t[0]
            outs.append(t.to(dtype=problem.dtype, device=problem.device, copy=True))
        if problem.batch is None:
            idx = torch.zeros((), dtype=torch.int64)
        else:
            idx = torch.arange(problem.size)
        return outs[0], outs[1], outs[2], idx

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.call = inputs[-1]
        ctx.mark_non_differentiable(output[3])
        # the inputs are saved even where the backward reads ``call`` (which may share their
        # memory), so autograd's version check refuses a backward after an in-place change
        anchors = inputs[:6] if functorch_active() else ()
        ctx.anchored = bool(anchors)
        ctx.ndims = tuple(None if t is None else t.ndim for t in inputs[:6])
        ctx.save_for_backward(output[3], *inputs[:6])
        ctx.save_for_forward(output[3], *anchors)

    @staticmethod
    def backward(
        ctx: Any,
        grad_x: Tensor | None,
        grad_eq: Tensor | None,
        grad_ineq: Tensor | None,
        _grad_idx: Any = None,
    ) -> tuple[Tensor | None, ...]:
        idx, *inputs = ctx.saved_tensors  # raises if an input changed in place since
        state: QPState = ctx.call.state
        if ctx.anchored or functorch_active():  # under torch.func: the vmappable path
            anchors = [t for t in inputs if t is not None] if ctx.anchored else []
            u, w_ineq, w_eq, x, nu_J, mu = AdjointSolve.apply(
                grad_x, grad_eq, grad_ineq, idx, ctx.call, *anchors
            )
            problem = state.problem
            grads = gradients_from_adjoint(
                u, w_ineq, w_eq, x, nu_J, mu, ctx.ndims, tuple(ctx.needs_input_grad[:6]),
                problem.dtype, problem.device,
            )  # fmt: skip
            return (*grads, None, None)
        needs = tuple(ctx.needs_input_grad[:6])
        refuse_batched_cotangents((grad_x, grad_eq, grad_ineq))
        grads = eager_gradients(state, grad_x, grad_eq, grad_ineq, needs)  # every sample
        return (*refuse_second_order(grads, (grad_x, grad_eq, grad_ineq)), None, None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> tuple[Tensor | None, ...]:
        idx, *inputs = ctx.saved_tensors
        anchors = [t for t in inputs if t is not None]
        dx, dmu, dnu = TangentSolve.apply(*tangents[:6], idx, ctx.call, *anchors)
        return dx, dmu, dnu, None

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any) -> tuple[Any, Any]:
        """Fold the vmapped dimension into the batch: one solve of ``V * B`` samples."""
        V = info.batch_size
        bases = (*BASES, 1)
        B = logical_batch(args[:6], in_dims[:6], BASES)
        folded = [fold(V, t, d, k, B) for t, d, k in zip(args[:7], in_dims[:7], bases)]
        if B is None and all(d is None for d in in_dims[:6]):  # only warm_start is vmapped
            folded[1] = folded[1].expand(V, -1)  # type: ignore[union-attr]
        outs = QPFunction.apply(*folded, args[7])
        return tuple(unfold(V, t, B) for t in outs), (0, 0, 0, 0)


def eager_gradients(
    state: QPState,
    grad_x: Tensor | None,
    grad_eq: Tensor | None,
    grad_ineq: Tensor | None,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """The parameter gradients of every sample of ``state`` for the output cotangents, by the
    state's backward method (plain autograd, outside torch.func)."""
    data = adjoint_input(state, None, grad_x, grad_eq, grad_ineq)
    if not any(needs[2:]):  # only dL/dP, dL/dq: the degenerate rule's rows cannot matter
        data = replace(data, needs_rows=False)
    elif not (needs[2] or needs[4]):  # no dL/dA, dL/dG: nor do the rule's multipliers
        data = replace(data, needs_matrices=False)
    return parameter_gradients(data, run_adjoint(state, data), needs)


def refuse_batched_cotangents(cotangents: tuple[Tensor | None, ...]) -> None:
    """Raise a clear ``RuntimeError`` for the cotangents of torch's legacy batched gradients
    (``torch.autograd.grad(..., is_grads_batched=True)``, ``torch.autograd.functional.jacobian``
    with ``vectorize=True``): the eager backward runs numpy/LAPACK, which that vmap cannot
    batch (``torch.func`` can: its transforms take the vmappable backward)."""
    check = _LEGACY_BATCHED
    if check is not None and any(g is not None and check(g) for g in cotangents):
        raise RuntimeError(
            "dxopt.qp: batched cotangents (torch.autograd.grad(is_grads_batched=True), "
            "torch.autograd.functional.jacobian/hessian(vectorize=True)) are not supported by "
            "the eager backward. Use vectorize=False, or torch.func.jacrev / "
            "torch.func.vmap(torch.func.vjp(...)), which dxopt.qp supports."
        )


_LEGACY_BATCHED = is_legacy_batched_tensor


def is_legacy_batched(t: Tensor) -> bool:
    """``t`` is a batched tensor of torch's legacy vmap (``torch._vmap_internals``)."""
    return bool(_LEGACY_BATCHED(t)) if _LEGACY_BATCHED is not None else False


def refuse_second_order(
    grads: tuple[Tensor | None, ...], cotangents: tuple[Tensor | None, ...]
) -> tuple[Tensor | None, ...]:
    """``grads`` unchanged, or under ``create_graph=True`` (cotangents that require grad)
    tied to them by :class:`NoDoubleBackward`, so a second pass raises."""
    anchors = [g for g in cotangents if g is not None and g.requires_grad]
    if not (torch.is_grad_enabled() and anchors):
        return grads
    return tuple(None if g is None else NoDoubleBackward.apply(g, *anchors) for g in grads)


class NoDoubleBackward(torch.autograd.Function):
    """Identity on a first-order gradient, linked to the cotangents it was computed from; its
    backward raises, so a second differentiation through the QP cannot silently drop a term."""

    @staticmethod
    def forward(grad: Tensor, *anchors: Tensor) -> Tensor:
        return grad.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Tensor) -> tuple[Tensor | None, ...]:
        raise RuntimeError(
            "dxopt.qp: cannot differentiate twice through a QP solve: the second derivative "
            "(double backward, Hessian-vector products with create_graph=True) is not "
            "implemented, and returning a Hessian without the QP's second-order term would be "
            "wrong. Use finite differences of the first-order gradient instead."
        )
