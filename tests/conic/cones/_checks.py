"""Checks shared by the tests of the three-dimensional cones (exponential, power).

Membership is tested with the cones' defining inequalities, never with the code under test;
``x`` counts as in a cone when ``x + slack * c`` is, with ``c`` a fixed interior direction
(so the test asks for ``dist(x, K) <= slack |c|``, well-conditioned near the cone's faces where
the defining function itself is not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

Member = Callable[[Tensor], Tensor]


def in_with_slack(member: Member, x: Tensor, interior: Tensor, slack: Tensor) -> Tensor:
    """``member(x + slack * interior)`` (``slack`` of shape ``x.shape[:-1]``)."""
    return member(x + slack[..., None] * interior)


def check_moreau(
    p: Tensor,
    v: Tensor,
    *,
    member: Member,
    member_dual: Member,
    interior: Tensor,
    interior_dual: Tensor,
    rtol: float,
) -> None:
    """``p = Pi_K(v)``: ``p in K``, ``p - v in K*``, ``<p, p - v> = 0`` (the optimality
    conditions of the projection, i.e. Moreau's decomposition), each to ``rtol |v|``."""
    n = safe_norm(v)
    slack = rtol * n + 1e-300
    bad = ~in_with_slack(member, p, interior, slack)
    assert not bool(bad.any()), f"Pi(v) not in K for v = {v[bad][:3].tolist()}"
    bad = ~in_with_slack(member_dual, p - v, interior_dual, slack)
    assert not bool(bad.any()), f"Pi(v) - v not in K* for v = {v[bad][:3].tolist()}"
    n1 = torch.where(n > 0, n, torch.ones_like(n))[..., None]
    inner = ((p / n1) * ((p - v) / n1)).sum(-1).abs()  # <p, p - v> / |v|^2
    assert bool((inner <= rtol).all()), float(inner.max())


def central_jacobian(project: Callable[[Tensor], Tensor], v: Tensor, h: float) -> Tensor:
    """Central differences of ``project`` at each row of ``v`` ``(N, 3)``: ``(N, 3, 3)``."""
    cols = []
    for j in range(3):
        e = torch.zeros(3, dtype=v.dtype)
        e[j] = h
        cols.append((project(v + e) - project(v - e)) / (2 * h))
    return torch.stack(cols, -1)


def safe_norm(v: Tensor) -> Tensor:
    """``|v|`` over the last axis without under- or overflow (``|1e-200 e_1| = 1e-200``)."""
    m = v.abs().amax(dim=-1)
    m1 = torch.where(m > 0, m, torch.ones_like(m))
    return m * torch.linalg.vector_norm(v / m1[..., None], dim=-1)


def unit_rows(v: Tensor) -> Tensor:
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)


def worst_gap_to_clarabel(prob: Any, x: Any, par: Any, v: Tensor, p: Tensor) -> float:
    """The largest ``|x_clarabel - p|`` over the rows of ``v`` of CVXPY + Clarabel solving the
    projection ``prob``; asserts that ours (in K to round-off) is no farther from ``v``."""
    import cvxpy as cp

    worst = 0.0
    for vi, pi in zip(v.numpy(), p.numpy(), strict=True):
        par.value = vi
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
        assert prob.status in ("optimal", "optimal_inaccurate")
        worst = max(worst, float(np.abs(x.value - pi).max()))
        assert np.sum((pi - vi) ** 2) <= np.sum((x.value - vi) ** 2) + 1e-13
    return worst
