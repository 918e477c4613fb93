"""The reduced-KKT adjoint system shared by both backward methods.

With the rows :math:`J` treated as active, the KKT conditions
:math:`Px + q + G_J^\\top\\nu_J + A^\\top\\mu = 0`, :math:`G_J x = h_J`, :math:`Ax = b` have the
symmetric Jacobian :math:`K = [[P, G_J^\\top, A^\\top], [G_J, 0, 0], [A, 0, 0]]`. For output
cotangents :math:`(\\bar x, \\bar\\nu, \\bar\\mu)` the adjoint solves

.. math:: K\\,[u;\\ w_J;\\ w_E] = [\\bar x;\\ \\bar\\nu_J;\\ \\bar\\mu]

and every parameter gradient follows from :math:`(u, w_J, w_E)` (see ``_grads.py``). Rows off
:math:`J` have :math:`\\nu_i \\equiv 0` locally, so their cotangents do not enter.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput

__all__ = ["kkt_apply", "kkt_residual"]


def kkt_apply(
    problem: QPProblem, used: Tensor, u: Tensor, w_ineq: Tensor, w_eq: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """:math:`K[u; w_J; w_E]` block by block (rows off :math:`J` masked by ``used``)."""
    y1 = problem.mv("P", u)
    y2 = torch.zeros_like(w_ineq)
    y3 = torch.zeros_like(w_eq)
    if problem.G is not None:
        y1 = y1 + problem.rmv("G", w_ineq * used)
        y2 = problem.mv("G", u) * used
    if problem.A is not None:
        y1 = y1 + problem.rmv("A", w_eq)
        y3 = problem.mv("A", u)
    return y1, y2, y3


def kkt_residual(
    data: AdjointInput, active: ActiveSet, u: Tensor, w_ineq: Tensor, w_eq: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Residual blocks of :math:`K[u; w] = rhs` and the per-sample relative residual."""
    used = active.used.to(torch.float64)
    y1, y2, y3 = kkt_apply(data.problem, used, u, w_ineq, w_eq)
    r1 = data.grad_x - y1
    r2 = data.grad_ineq * used - y2
    r3 = data.grad_eq - y3
    rhs_norm = data.grad_x.pow(2).sum(-1) + (data.grad_ineq * used).pow(2).sum(-1)
    rhs_norm = rhs_norm + data.grad_eq.pow(2).sum(-1)
    res = (r1.pow(2).sum(-1) + r2.pow(2).sum(-1) + r3.pow(2).sum(-1)).sqrt()
    rel = res / rhs_norm.sqrt().clamp_min(torch.finfo(torch.float64).tiny)
    return r1, r2, r3, torch.where(data.ok, rel, torch.zeros_like(rel))
