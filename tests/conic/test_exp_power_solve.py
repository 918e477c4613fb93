"""Exponential and power cones through :func:`dxopt.conic.solve`: closed-form
optima and their derivatives (checked against the closed form and one-sided finite
differences), and certified infeasible/unbounded samples.

With the cone's first two entries fixed by a zero cone, ``(a, c)``:

- power cone :math:`a^\\alpha c^{1-\\alpha} \\ge |z|`: :math:`\\max z = a^\\alpha c^{1-\\alpha}`;
- exponential cone :math:`y e^{x/y} \\le z` with :math:`x = a, y = c`: :math:`\\min z = c e^{a/c}`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from dxopt import Status, conic

F64 = torch.float64


def _fixed_two(cone: conic.Cone, a: torch.Tensor, c: torch.Tensor, sign: float,
               obj: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``min obj'u`` with ``u in K`` and ``u_0 = sign * a``, ``u_1 = c``; returns ``u``."""
    q = obj.expand(a.shape[0], 3)
    A = torch.cat([torch.eye(3, dtype=F64)[:2], -torch.eye(3, dtype=F64)]).expand(a.shape[0], 5, 3)
    b = torch.stack([sign * a, c] + [torch.zeros_like(a)] * 3, dim=-1)
    sol = conic.solve(None, q, A, b, cones=[conic.ZeroCone(2), cone], atol=1e-10, rtol=1e-10)
    assert all(st is Status.SOLVED for st in sol.status)
    return sol.x


CASES: list[tuple[str, conic.Cone, float, torch.Tensor, int, Callable[[float, float], float]]] = [
    ("power", conic.PowerCone(0.3), 1.0, torch.tensor([0.0, 0.0, -1.0], dtype=F64), 2,
     lambda a, c: a**0.3 * c**0.7),
    ("exp", conic.ExpCone(), 1.0, torch.tensor([0.0, 0.0, 1.0], dtype=F64), 2,
     lambda a, c: c * math.exp(a / c)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "cone", "sign", "obj", "k", "exact"), CASES)
def test_closed_form_optimum_and_gradient(name, cone, sign, obj, k, exact) -> None:  # type: ignore[no-untyped-def]
    a0, c0 = 0.8, 1.3
    a = torch.tensor([a0], dtype=F64, requires_grad=True)
    c = torch.tensor([c0], dtype=F64, requires_grad=True)
    u = _fixed_two(cone, a, c, sign, obj)
    assert abs(u[0, k].item() - exact(a0, c0)) < 1e-7 * max(1.0, abs(exact(a0, c0)))
    ga, gc = torch.autograd.grad(u[0, k], (a, c))
    for h in (1e-4, 1e-5):  # one-sided slopes of the closed form agree (smooth) and match
        for g, fd_r, fd_l in (
            (ga, (exact(a0 + h, c0) - exact(a0, c0)) / h, (exact(a0, c0) - exact(a0 - h, c0)) / h),
            (gc, (exact(a0, c0 + h) - exact(a0, c0)) / h, (exact(a0, c0) - exact(a0, c0 - h)) / h),
        ):
            assert abs(fd_r - fd_l) < 1e-3 * max(1.0, abs(fd_r))
            assert abs(g.item() - 0.5 * (fd_r + fd_l)) < 1e-5 * max(1.0, abs(fd_r))
    # and the solver's own finite difference in a
    with torch.no_grad():
        h = 1e-5
        up = _fixed_two(cone, a.detach() + h, c.detach(), sign, obj)[0, k]
        dn = _fixed_two(cone, a.detach() - h, c.detach(), sign, obj)[0, k]
    assert abs((up - dn).item() / (2 * h) - ga.item()) < 1e-4 * max(1.0, abs(ga.item()))


def test_infeasible_and_unbounded_exp_samples_get_certified_statuses() -> None:
    # (x, y, z) in K_exp with y = 1 and z = -1 (z >= 0 on the cone): strongly infeasible;
    # min x with y = z = 1: unbounded below; max x with y = 1, z = 2: x = log 2
    q = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]], dtype=F64)
    A = torch.cat([torch.eye(3, dtype=F64)[1:], -torch.eye(3, dtype=F64)]).expand(3, 5, 3)
    b = torch.tensor([[1.0, -1.0, 0, 0, 0], [1.0, 1.0, 0, 0, 0], [1.0, 2.0, 0, 0, 0]], dtype=F64)
    cones = [conic.ZeroCone(2), conic.ExpCone()]
    sol = conic.solve(None, q, A, b, cones=cones, on_failure="nan")
    assert sol.status[0] is Status.INFEASIBLE
    assert sol.status[1] is Status.UNBOUNDED
    assert sol.status[2] is Status.SOLVED
    assert abs(sol.x[2, 0].item() - math.log(2.0)) < 1e-6
