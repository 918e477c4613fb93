"""The pieces of the QP function's vjp (:mod:`dxopt.qp.autograd.function`,
:class:`dxopt.qp.autograd.tangent.AdjointSolve`): :func:`adjoint_input` gathers the adjoint
system's data of some samples of a saved solve, :func:`run_adjoint` runs the backward method on
it, :func:`gradients_from_adjoint` turns the adjoint :math:`(u, w_J, w_E)` into parameter
gradients in torch ops that vmap batches, and :class:`FirstOrderOnly` is the base of every
Function here whose derivative must not be taken again (it raises instead of dropping the
QP's second-order term)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput, AdjointSolution, ForwardFactors
from dxopt.qp.problem.functorch import BASES

if TYPE_CHECKING:
    from dxopt.qp.problem.contracts import QPState

__all__ = ["FirstOrderOnly", "adjoint_input", "gradients_from_adjoint", "run_adjoint"]

_F64 = torch.float64

_TWICE = (
    "dxopt.qp: cannot differentiate twice through a QP solve: the second derivative (Hessians, "
    "jacfwd/jacrev of a gradient, double backward) is not implemented, and returning one "
    "without the QP's second-order term would be wrong. Use finite differences of the "
    "first-order derivative instead."
)


def _select(state: QPState, idx: Tensor | None) -> tuple[QPProblem, Tensor]:
    """The problem restricted (and repeated) to the samples ``idx`` (1-D; ``None``: all of
    them, in order) and their ``ok``."""
    problem, result = state.problem, state.result
    ok_all = torch.tensor([s.ok for s in result.status], dtype=torch.bool)
    S = problem.size
    if idx is None or (idx.numel() == S and (S == 0 or bool((idx == torch.arange(S)).all()))):
        return problem, ok_all
    fields: dict[str, Any] = {}
    for name, base in zip(("P", "q", "A", "b", "G", "h"), BASES):
        t = getattr(problem, name)
        fields[name] = (
            t[idx] if t is not None and t.layout == torch.strided and t.ndim == base + 1 else t
        )
    fields["q"] = problem.dense_vec("q")[idx]  # keeps the sub-problem batched
    return replace(problem, batch=int(idx.numel()), **fields), ok_all[idx]


def adjoint_input(
    state: QPState,
    idx: Tensor | None,
    grad_x: Tensor | None,
    grad_eq: Tensor | None,
    grad_ineq: Tensor | None,
) -> AdjointInput:
    """The :class:`AdjointInput` of the samples ``idx`` (1-D; ``None``: all, in order) with
    the right-hand side ``(grad_x, grad_ineq, grad_eq)`` (``(S, k)``, a shared ``(k,)`` or
    ``None`` for zero), float64 CPU, failed samples zeroed."""
    result = state.result
    problem, ok = _select(state, idx)
    S = problem.size
    okc = ok[:, None]

    def pick(t: Tensor) -> Tensor:
        return t if idx is None else t[idx]

    def clean(t: Tensor) -> Tensor:
        return torch.where(okc, t, torch.zeros_like(t))

    def rhs(g: Tensor | None, width: int) -> Tensor:
        if g is None:
            return torch.zeros(S, width, dtype=_F64)
        g = g.detach().to("cpu", _F64)
        return clean(g.expand(S, width) if g.ndim == 1 else g.reshape(S, width))

    active = None if result.active is None else pick(result.active) & okc
    settled = pick(torch.tensor(result.settled, dtype=torch.bool)) if result.settled else None
    return AdjointInput(
        problem=problem,
        x=clean(pick(result.x)),
        eq_duals=clean(pick(result.eq_duals)),
        ineq_duals=clean(pick(result.ineq_duals)),
        grad_x=rhs(grad_x, problem.n),
        grad_eq=rhs(grad_eq, problem.p),
        grad_ineq=rhs(grad_ineq, problem.m),
        ok=ok,
        active=active,
        settled=settled,
        factors=_picked_factors(result.factors, idx),
    )


def _picked_factors(factors: ForwardFactors | None, idx: Tensor | None) -> ForwardFactors | None:
    """The forward's factors of the samples ``idx`` (all for ``None``)."""
    if factors is None or idx is None:
        return factors
    return factors.take(idx.numpy())


def run_adjoint(state: QPState, data: AdjointInput) -> AdjointSolution:
    """The backward method's adjoint (zero when nothing depends on the parameters)."""
    problem = data.problem
    S = data.x.shape[0]
    if S == 0 or problem.n == 0:
        none = torch.zeros(S, problem.m, dtype=torch.bool)
        active = ActiveSet(none, none, none, torch.zeros(S), None, None)
        return AdjointSolution(
            torch.zeros(S, problem.n, dtype=_F64),
            torch.zeros(S, problem.m, dtype=_F64),
            torch.zeros(S, problem.p, dtype=_F64),
            active,
            torch.zeros(S, dtype=_F64),
        )
    return state.method.solve_adjoint(data, state.diagnostics)


def gradients_from_adjoint(
    u: Tensor,
    w_ineq: Tensor,
    w_eq: Tensor,
    x: Tensor,
    nu_J: Tensor,
    mu: Tensor,
    ndims: tuple[int | None, ...],
    needs: tuple[bool, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[Tensor | None, ...]:
    """The formulas of :mod:`dxopt.qp.backward.grads` on dense tensors of one call's shape (``(n,)``
    or ``(B, n)``), in torch ops that vmap batches: inputs that are not batched get the sum."""

    def outer(left: Tensor, right: Tensor) -> Tensor:
        return left.unsqueeze(-1) * right.unsqueeze(-2)

    def reduce(g: Tensor, k: int) -> Tensor:
        if u.ndim == 2 and ndims[k] == BASES[k]:
            g = g.sum(0)
        return g.to(dtype=dtype, device=device)

    grads: list[Tensor | None] = [None] * 6
    if needs[0]:
        grads[0] = reduce(-0.5 * (outer(u, x) + outer(x, u)), 0)
    if needs[1]:
        grads[1] = reduce(-u, 1)
    if ndims[2] is not None:
        grads[2] = reduce(-(outer(mu, u) + outer(w_eq, x)), 2) if needs[2] else None
        grads[3] = reduce(w_eq, 3) if needs[3] else None
    if ndims[4] is not None:
        grads[4] = reduce(-(outer(nu_J, u) + outer(w_ineq, x)), 4) if needs[4] else None
        grads[5] = reduce(w_ineq, 5) if needs[5] else None
    return tuple(grads)


class FirstOrderOnly(torch.autograd.Function):
    """Shared by the adjoint and tangent solves: differentiating them again (backward or
    forward mode) raises, so no second-order term is ever silently dropped."""

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(_TWICE)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise RuntimeError(_TWICE)
