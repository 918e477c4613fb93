"""cvxpylayers as an independent reference for QP solutions and their gradients.

The QP is written for CVXPY with a factor :math:`L` of the Hessian, :math:`P = L^\\top L`
(``quad_form`` with a parametric P is not DPP), so the reference differentiates with
respect to :math:`L`; ``dxopt`` sees :math:`P = L^\\top L` built by torch, and the chain
rule makes the two gradients with respect to :math:`L` comparable.

Reference accuracy. diffcp solves the cone program with SCS (an operator-splitting method
whose iterates are exact cone projections, so the point at which diffcp differentiates the
residual map is self-consistent) at ``eps_abs = eps_rel = 1e-10``, and differentiates it in
"dense" mode (an exact dense solve; no LSQR iteration cap, cf. cvxpylayers issues #69/#70).
Measured on 60 strictly complementary problems from ``qp_zoo.complementary_qp``
(n = 5..15, with and without each constraint block): solution error <= 3.1e-9 (max abs),
gradient error against the exact reduced-KKT formula <= 2.6e-9 (relative). Clarabel, an
interior-point method, was *not* accurate enough here: its slightly interior point gave
gradient errors up to 1.9e-3 on the same problems.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
from torch import Tensor

#: SCS inside diffcp at tight tolerances, dense derivative (see module docstring).
REFERENCE_SOLVER_ARGS: dict[str, Any] = {
    "solve_method": "SCS",
    "mode": "dense",
    "eps_abs": 1e-10,
    "eps_rel": 1e-10,
    "max_iters": 200_000,
    "verbose": False,
    "n_jobs_forward": 1,
    "n_jobs_backward": 1,
}


class ReferenceSolution(NamedTuple):
    """x and the multipliers of each block from cvxpylayers (None where a block is absent)."""

    x: Tensor
    eq_duals: Tensor | None
    ineq_duals: Tensor | None
    lb_duals: Tensor | None = None
    ub_duals: Tensor | None = None


@functools.lru_cache(maxsize=16)
def _layer(n: int, m: int, p: int, box: bool) -> Any:
    import cvxpy as cp
    from cvxpylayers.torch import CvxpyLayer

    x = cp.Variable(n)
    factor = cp.Parameter((n, n))
    q = cp.Parameter(n)
    parameters = [factor, q]
    constraints = []
    duals = []
    if p > 0:
        A, b = cp.Parameter((p, n)), cp.Parameter(p)
        eq = A @ x == b
        constraints.append(eq)
        parameters += [A, b]
        duals.append(eq.dual_variables[0])
    if m > 0:
        G, h = cp.Parameter((m, n)), cp.Parameter(m)
        ineq = G @ x <= h
        constraints.append(ineq)
        parameters += [G, h]
        duals.append(ineq.dual_variables[0])
    if box:
        lb, ub = cp.Parameter(n), cp.Parameter(n)
        lower, upper = x >= lb, x <= ub
        constraints += [lower, upper]
        parameters += [lb, ub]
        duals += [lower.dual_variables[0], upper.dual_variables[0]]
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(factor @ x) + q @ x), constraints)
    assert problem.is_dpp()
    return CvxpyLayer(problem, parameters=parameters, variables=[x, *duals])


def reference_solve(
    factor: Tensor,
    q: Tensor,
    A: Tensor | None = None,
    b: Tensor | None = None,
    G: Tensor | None = None,
    h: Tensor | None = None,
    *,
    lb: Tensor | None = None,
    ub: Tensor | None = None,
) -> ReferenceSolution:
    """Solve min ½‖L x‖² + qᵀx s.t. Ax = b, Gx ≤ h (and lb ≤ x ≤ ub, both finite, if given)
    with cvxpylayers (differentiable, float64)."""
    n = factor.shape[-1]
    m = 0 if G is None else G.shape[-2]
    p = 0 if A is None else A.shape[-2]
    args = [factor, q]
    if p > 0:
        args += [A, b]
    if m > 0:
        args += [G, h]
    box = lb is not None and ub is not None
    if box:
        args += [lb, ub]
    solver_args = dict(REFERENCE_SOLVER_ARGS)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in args)):
        solver_args.pop("mode")  # diffcp forwards it to the solver when no gradient is taken
    outputs = _layer(n, m, p, box)(*args, solver_args=solver_args)
    x, rest = outputs[0], list(outputs[1:])
    eq_duals = rest.pop(0) if p > 0 else None
    ineq_duals = rest.pop(0) if m > 0 else None
    lb_duals, ub_duals = (rest[0], rest[1]) if box else (None, None)
    return ReferenceSolution(x, eq_duals, ineq_duals, lb_duals, ub_duals)
