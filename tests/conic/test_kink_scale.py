"""The kink tolerance is relative to the largest entry of the point, not to its 2-norm: a
strictly complementary multiplier of 2e-6 among 4000 unit multipliers is not a kink (with the
2-norm scale, sqrt(4000) * 1e-7 = 6.3e-6 > 2e-6 flagged it DEGENERATE and the one-sided rule
then gave a wrong derivative of a smooth solution map)."""

from __future__ import annotations

import torch

import dxopt.conic as dc
from dxopt import Status

F64 = torch.float64


def test_small_strictly_complementary_multiplier_in_a_large_problem_is_not_a_kink():
    m = 4000
    idx = torch.arange(m)
    eye = torch.sparse_coo_tensor(torch.stack([idx, idx]), torch.ones(m, dtype=F64), (m, m))
    P, A = eye.coalesce(), (-eye).coalesce()
    q = torch.ones(m, dtype=F64)
    q[0] = 2e-6  # x = max(-q, 0) = 0, multiplier y = q > 0: strictly complementary
    q.requires_grad_(True)
    b = torch.zeros(m, dtype=F64)
    sol = dc.solve(P, q, A, b, cones=[dc.NonnegCone(m)], atol=1e-10, rtol=1e-10)
    assert sol.status[0] is Status.SOLVED, sol.status
    assert not sol.info.kink[0]
    assert abs(float(sol.y.reshape(-1)[0]) - 2e-6) < 1e-9
    (g,) = torch.autograd.grad(sol.x.sum(), q)
    # every row active with a positive multiplier: x stays 0 under small changes of q
    assert torch.allclose(g, torch.zeros_like(g), atol=1e-9), float(g.abs().max())
