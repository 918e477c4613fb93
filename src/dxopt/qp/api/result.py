"""Result assembly of :func:`dxopt.qp.solve`: the :class:`~dxopt.qp.QPSolution` of every route
(the box bounds' multipliers split off the inequality ones, :mod:`dxopt.qp.api.bounds`) and its
registration as a pytree for :mod:`torch.func`."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from dxopt._core.torch_compat import register_pytree_node
from dxopt.qp.problem.types import QPInfo, QPSolution, QPStatus

__all__ = ["solution"]


def solution(
    x: Tensor,
    mu: Tensor,
    nu: Tensor,
    status: tuple[QPStatus, ...],
    info: QPInfo,
    has_eq: bool,
    m_user: int | None,
    lb: Tensor | None,
    ub: Tensor | None,
    k_lb: int,
    k_ub: int,
) -> QPSolution:
    """The :class:`QPSolution`: the bound rows' multipliers split off the inequality ones
    (``m_user`` rows of the user's ``G``, then ``k_lb`` and ``k_ub`` bound rows)."""
    lb_duals = ub_duals = None
    if lb is not None or ub is not None:
        m0 = m_user or 0
        lb_duals = nu[..., m0 : m0 + k_lb] if lb is not None else None
        ub_duals = nu[..., m0 + k_lb : m0 + k_lb + k_ub] if ub is not None else None
        nu = nu[..., :m0]
    return QPSolution.from_every_field(
        x, mu if has_eq else None, nu if m_user is not None else None, status, info, lb_duals,
        ub_duals,
    )  # fmt: skip


_SOLUTION_TENSORS = ("x", "eq_duals", "ineq_duals", "lb_duals", "ub_duals")


def _flatten_solution(sol: QPSolution) -> tuple[list[Tensor], Any]:
    present = tuple(getattr(sol, k) is not None for k in _SOLUTION_TENSORS)
    leaves = [getattr(sol, k) for k, p in zip(_SOLUTION_TENSORS, present) if p]
    return leaves, (present, sol.status, sol.info)


def _unflatten_solution(values: Any, context: Any) -> QPSolution:
    present, status, info = context
    it = iter(values)
    x, mu, nu, lb_duals, ub_duals = (next(it) if p else None for p in present)
    return QPSolution(x, mu, nu, status, info, lb_duals=lb_duals, ub_duals=ub_duals)  # type: ignore[arg-type]


# a pytree (tensors as leaves, status and info as context): torch.func.vmap, jacrev(has_aux)
# and friends can return a whole QPSolution
register_pytree_node(
    QPSolution,
    _flatten_solution,
    _unflatten_solution,
    serialized_type_name="dxopt.qp.QPSolution",
)
