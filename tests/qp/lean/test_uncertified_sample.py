"""A sample whose compiled dual active-set point does not certify (ill-conditioned ``P`` at
the default ``eps_abs = 1e-9``) is solved by daqp on its own; the rest of the batch keeps the
compiled solver and the lean route (it used to send the whole batch to the general path)."""

from __future__ import annotations

import numpy as np
import torch

import dxopt.qp as dqp
from dxopt.qp.api.solve import solve_with
from dxopt.qp.problem.options import QPOptions


def _ill_conditioned(batch: int, n: int = 50, m: int = 50, p: int = 25):
    """``P = Q diag(logspace(-6, 0)) Q' + 1e-8 I``, ``G`` dense positive, a few rows violated at
    the equality-constrained minimiser (so some are active)."""
    out = []
    for seed in range(batch):
        rng = np.random.default_rng(10_000 + seed)
        Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        P = (Q * np.logspace(-6, 0, n)) @ Q.T + 1e-8 * np.eye(n)
        P = 0.5 * (P + P.T)
        q = rng.standard_normal(n)
        G = rng.uniform(size=(m, n)) + 1e-3
        A = rng.standard_normal((p, n))
        b = A @ rng.standard_normal(n)
        K = np.block([[P, A.T], [A, np.zeros((p, p))]])
        Gx = G @ np.linalg.solve(K, np.concatenate([-q, b]))[:n]
        scale = max(float(np.abs(Gx).max()), 1.0)
        s = scale * rng.uniform(0.05, 1.0, size=m)
        rows = rng.choice(m, size=5, replace=False)
        s[rows] = -0.1 * scale * rng.uniform(0.5, 1.0, size=5)
        out.append((P, q, A, b, G, Gx + s))
    return [torch.tensor(np.stack(parts)) for parts in zip(*out)]


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
