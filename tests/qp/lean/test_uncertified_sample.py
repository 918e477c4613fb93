"""A sample whose compiled dual active-set point does not certify (ill-conditioned ``P`` at
the default ``eps_abs = 1e-9``) is solved by daqp on its own; the rest of the batch keeps the
compiled solver and the lean route (it used to send the whole batch to the general path)."""

from __future__ import annotations

import numpy as np
import torch
from benchmarks.qp_speed.illcond import ill_conditioned

import dxopt.qp as dqp
from dxopt.qp.api.solve import solve_with
from dxopt.qp.problem.options import QPOptions


def _ill_conditioned(batch: int, n: int = 50, m: int = 50, p: int = 25):
    """The qp_speed benchmark's ill-conditioned problems (``benchmarks/qp_speed/illcond.py``:
    ``P = Q diag(logspace(-6, 0)) Q' + 1e-8 I``, ``G`` dense positive, a few rows active),
    stacked into a batch."""
    probs = [ill_conditioned(n, seed=seed, m=m, p=p) for seed in range(batch)]
    parts = [(pr.P, pr.q, pr.A, pr.b, pr.G, pr.h) for pr in probs]
    return [torch.tensor(np.stack(col)) for col in zip(*parts)]


def test_an_uncertified_sample_goes_to_daqp_alone():
    P, q, A, b, G, h = _ill_conditioned(12)
    qg = q.clone().requires_grad_()
    sol = dqp.solve(P, qg, A=A, b=b, G=G, h=h)
    assert sol.info.route == "lean_batch"
    solvers = set(sol.info.sample_solvers)
    assert solvers == {"dual_active_set", "daqp"}, sol.info.sample_solvers  # both kinds here
    assert all(s is dqp.QPStatus.SOLVED for s in sol.status)
    ref = solve_with(P, q, A, b, G, h, None, None, None, QPOptions(), route="general")
    scale = 1.0 + float(ref.x.abs().max())
    torch.testing.assert_close(sol.x.detach(), ref.x, rtol=0, atol=1e-7 * scale)
    assert max(sol.info.primal_residual) <= 1e-9 * scale
    (grad,) = torch.autograd.grad(sol.x.sum(), qg)
    qr = q.clone().requires_grad_()
    ref = solve_with(P, qr, A, b, G, h, None, None, None, QPOptions(), route="general")
    (grad_ref,) = torch.autograd.grad(ref.x.sum(), qr)
    gscale = 1.0 + float(grad_ref.abs().max())
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-6 * gscale)
