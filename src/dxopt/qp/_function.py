"""The module-level :class:`torch.autograd.Function` that attaches the QP derivative.

Solving and differentiating are kept apart: :func:`dxopt.qp.solve` runs the forward solve
first; this Function only hands the solution out and, in ``backward``, asks the chosen backward
method (:class:`~dxopt.qp.PenaltyBackward` or :class:`~dxopt.qp.KKTBackward`) for the adjoint
:math:`(u, w_J, w_E)`, from which ``_grads.py`` forms every parameter gradient.

Double backward (``create_graph=True`` followed by a second differentiation through the QP) is
not implemented: under ``create_graph=True`` the gradients are tied to the incoming cotangents by
:class:`NoDoubleBackward`, whose backward raises ``RuntimeError`` ("cannot differentiate twice
...") instead of silently dropping the QP's second-order term. (``once_differentiable`` is not
enough: its error node is not connected to the inputs, so autograd prunes it and the second
derivative comes back without the QP's term.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from dxopt.qp._active import ActiveSet
from dxopt.qp._adjoint import AdjointInput, AdjointSolution
from dxopt.qp._forward import ForwardResult
from dxopt.qp._grads import parameter_gradients
from dxopt.qp._problem import QPProblem
from dxopt.qp._types import BackwardDiagnostics

__all__ = ["BackwardMethod", "NoDoubleBackward", "QPFunction", "QPState"]


@runtime_checkable
class BackwardMethod(Protocol):
    """A backward method: computes the adjoint from the saved solution.

    The extension point of :func:`dxopt.qp.solve`: any object with these two members can be
    passed as ``backward=``; :class:`dxopt.qp.BackwardBase` provides the shared options, the
    active set and the degenerate-problem policy.
    """

    @property
    def name(self) -> str: ...

    def solve_adjoint(
        self, data: AdjointInput, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution: ...


@dataclass(frozen=True)
class QPState:
    """Non-tensor context of one call: the canonical problem, its solution, the method."""

    problem: QPProblem
    result: ForwardResult
    method: BackwardMethod
    diagnostics: BackwardDiagnostics


def _cotangent(g: Tensor | None, size: int, width: int) -> Tensor:
    if g is None:
        return torch.zeros(size, width, dtype=torch.float64)
    return g.detach().to("cpu", torch.float64).reshape(size, width)


class QPFunction(torch.autograd.Function):
    """``(P, q, A, b, G, h, state) -> (x, eq_duals, ineq_duals)`` with the implicit derivative."""

    @staticmethod
    def forward(
        P: Tensor,
        q: Tensor,
        A: Tensor | None,
        b: Tensor | None,
        G: Tensor | None,
        h: Tensor | None,
        state: QPState,
    ) -> tuple[Tensor, Tensor, Tensor]:
        problem, result = state.problem, state.result
        outs = []
        for t in (result.x, result.eq_duals, result.ineq_duals):
            if problem.batch is None:
                t = t[0]
            outs.append(t.to(dtype=problem.dtype, device=problem.device, copy=True))
        return outs[0], outs[1], outs[2]

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.state = inputs[-1]

    @staticmethod
    def backward(
        ctx: Any, grad_x: Tensor | None, grad_eq: Tensor | None, grad_ineq: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        state: QPState = ctx.state
        problem, result = state.problem, state.result
        S = problem.size
        ok = torch.tensor([s.ok for s in result.status], dtype=torch.bool)
        okc = ok[:, None]

        def clean(t: Tensor) -> Tensor:
            return torch.where(okc, t, torch.zeros_like(t))

        data = AdjointInput(
            problem=problem,
            x=clean(result.x),
            eq_duals=clean(result.eq_duals),
            ineq_duals=clean(result.ineq_duals),
            grad_x=clean(_cotangent(grad_x, S, problem.n)),
            grad_eq=clean(_cotangent(grad_eq, S, problem.p)),
            grad_ineq=clean(_cotangent(grad_ineq, S, problem.m)),
            ok=ok,
            active=None if result.active is None else result.active & okc,
            settled=torch.tensor(result.settled, dtype=torch.bool) if result.settled else None,
        )
        if S == 0 or problem.n == 0:  # nothing depends on the parameters
            none = torch.zeros(S, problem.m, dtype=torch.bool)
            active = ActiveSet(none, none, none, torch.zeros(S), None, None)
            f64 = torch.float64
            adjoint = AdjointSolution(
                torch.zeros(S, problem.n, dtype=f64),
                torch.zeros(S, problem.m, dtype=f64),
                torch.zeros(S, problem.p, dtype=f64),
                active,
                torch.zeros(S, dtype=f64),
            )
        else:
            adjoint = state.method.solve_adjoint(data, state.diagnostics)
        grads = parameter_gradients(data, adjoint, tuple(ctx.needs_input_grad[:6]))
        anchors = [g for g in (grad_x, grad_eq, grad_ineq) if g is not None and g.requires_grad]
        if torch.is_grad_enabled() and anchors:  # create_graph=True: refuse a second pass
            grads = tuple(None if g is None else NoDoubleBackward.apply(g, *anchors) for g in grads)
        return (*grads, None)


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
