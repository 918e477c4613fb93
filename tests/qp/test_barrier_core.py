import itertools

import pytest
import torch

from dxopt.qp.backward.barrier import barrier_solve, barrier_vjp

D = torch.float64


def _problem():
    g = torch.Generator().manual_seed(0)
    n, p, m = 4, 6, 1
    M = torch.randn(n, n, generator=g, dtype=D)
    P = M @ M.T + torch.eye(n, dtype=D)
    q = torch.randn(n, generator=g, dtype=D)
    G = torch.randn(p, n, generator=g, dtype=D)
    h = torch.rand(p, generator=g, dtype=D) + 0.1
    A = torch.randn(m, n, generator=g, dtype=D)
    b = A @ (0.01 * torch.randn(n, generator=g, dtype=D))
    return P, q, G, h, A, b


def test_barrier_vjp_matches_central_finite_differences():
    P, q, G, h, A, b = _problem()
    mu = 1e-2
    x0 = torch.zeros(4, dtype=D)
    w = torch.linspace(-1.0, 1.0, 4, dtype=D)

    def loss(qq, hh, bb):
        return float(w @ barrier_solve(P, qq, G, hh, A, bb, mu=mu, x0=x0).x)

    sol = barrier_solve(P, q, G, h, A, b, mu=mu, x0=x0)
    gq, gh, gb = barrier_vjp(P, G, A, sol, w, mu=mu)
    eps = 1e-6
    for grad, idx in ((gq, 0), (gh, 1), (gb, 2)):
        args = [q, h, b]
        for i in range(args[idx].shape[0]):
            e = torch.zeros_like(args[idx])
            e[i] = eps
            up = list(args)
            dn = list(args)
            up[idx] = args[idx] + e
            dn[idx] = args[idx] - e
            fd = (loss(*up) - loss(*dn)) / (2 * eps)
            assert abs(fd - float(grad[i])) < 1e-6 * (1 + abs(fd))


def test_barrier_gradient_tends_to_exact_qp_gradient_as_mu_to_zero():
    # min 1/2 x^2 - x s.t. x <= 0.5 (active, strictly complementary): x* = 0.5, dx*/dq = 0,
    # dx*/dh = 1. Barrier: x - 1 + mu/(0.5 - x) = 0.
    P = torch.eye(1, dtype=D)
    q = torch.tensor([-1.0], dtype=D)
    G = torch.eye(1, dtype=D)
    h = torch.tensor([0.5], dtype=D)
    A = torch.zeros(0, 1, dtype=D)
    b = torch.zeros(0, dtype=D)
    errs = []
    for mu in (1e-2, 1e-4, 1e-6):
        sol = barrier_solve(P, q, G, h, A, b, mu=mu, x0=torch.zeros(1, dtype=D))
        gq, gh, _ = barrier_vjp(P, G, A, sol, torch.ones(1, dtype=D), mu=mu)
        errs.append(abs(float(gq[0])) + abs(float(gh[0]) - 1.0))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 1e-2


def test_barrier_gradient_continuous_across_active_set_switch():
    # x*(h) = min(h, 1) for min 1/2 x^2 - x s.t. x <= h: exact dx/dh jumps from 1 to 0 at h = 1.
    P = torch.eye(1, dtype=D)
    q = torch.tensor([-1.0], dtype=D)
    G = torch.eye(1, dtype=D)
    A = torch.zeros(0, 1, dtype=D)
    b = torch.zeros(0, dtype=D)
    mu = 1e-2
    hs = torch.linspace(0.5, 1.5, 101, dtype=D)
    grads = []
    for hv in hs:
        h = hv.reshape(1)
        sol = barrier_solve(P, q, G, h, A, b, mu=mu, x0=(h - 0.5).clamp(max=0.0) - 0.1)
        grads.append(float(barrier_vjp(P, G, A, sol, torch.ones(1, dtype=D), mu=mu)[1][0]))
    jumps = [abs(a - c) for a, c in itertools.pairwise(grads)]
    assert max(jumps) < 0.05  # the exact gradient jumps by 1 inside this grid
    assert grads[0] > 0.9 and grads[-1] < 0.1


def test_barrier_solve_rejects_infeasible_start_and_bad_mu():
    P, q, G, h, A, b = _problem()
    with pytest.raises(ValueError, match="x0"):
        barrier_solve(P, q, G, h, A, b, mu=1e-2, x0=torch.full((4,), 100.0, dtype=D))
    with pytest.raises(ValueError, match="mu"):
        barrier_solve(P, q, G, h, A, b, mu=0.0, x0=torch.zeros(4, dtype=D))
