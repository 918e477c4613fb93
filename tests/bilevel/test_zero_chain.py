"""Zero-chain properties: one new coordinate per call, and the single-level chains."""

import math

import torch

from dxopt.bilevel import (
    AID,
    CG,
    ITD,
    CarmonChain,
    InnerLoop,
    JiInstance,
    NesterovChain,
    minimize_bilevel,
    run_single_level,
)


def _methods(ji: JiInstance):
    K = math.ceil(4 * math.sqrt(ji.kappa))
    agd = InnerLoop.agd(smoothness=1.0, strong_convexity=ji.mu, max_iter=K)
    lr = 1.0 / (10 * ji.n**2)
    yield AID(inner=agd, linear=CG(K), outer_lr=lr)
    yield AID(inner=InnerLoop.gd(smoothness=1.0, max_iter=K), linear=CG(K), outer_lr=lr)
    yield ITD(inner=agd, outer_lr=lr)


def test_ji_frontier_advances_at_most_one_coordinate_per_call() -> None:
    ji = JiInstance.for_accuracy(block=3, epsilon=0.25, links=6)
    for method in _methods(ji):
        result = minimize_bilevel(method, ji, max_iter=200, tol=ji.epsilon, track_frontier=True)
        assert result.first_nonzero_x is not None and result.first_nonzero_y is not None
        frontier = ji.frontier(result.first_nonzero_x, result.first_nonzero_y)
        steps = frontier[1:] - frontier[:-1]
        assert int(steps.max()) <= 1
        assert bool((frontier <= torch.arange(frontier.numel())).all())
        # eq. 8: x_i can become nonzero only after i * n calls
        fx = result.first_nonzero_x
        reached = fx > 0
        assert bool(reached.any())
        idx = torch.arange(1, ji.T + 1)[reached]
        assert bool((fx[reached] >= idx * ji.n).all())
        # stationarity needs the whole chain: the last coordinate is active at the end
        assert result.status.value == "solved"
        assert float(result.x[-1]) != 0.0
        assert int(fx[-1]) >= ji.T * ji.n


def test_carmon_chain_gradient_and_large_gradient_property() -> None:
    chain = CarmonChain(6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        u = torch.randn(6, dtype=torch.float64, generator=gen) * 1.5
        u_ad = u.clone().requires_grad_(True)
        (g_ad,) = torch.autograd.grad(chain.value(u_ad), u_ad)
        torch.testing.assert_close(chain.grad(u), g_ad, rtol=1e-10, atol=1e-12)
        u[-1] = 0.0  # last coordinate off: gradient norm > 1 (Carmon et al., Lemma 3)
        assert float(torch.linalg.vector_norm(chain.grad(u))) > 1.0


def test_nesterov_chain_gradient_and_zero_respecting_agd() -> None:
    q = NesterovChain(dim=50, smoothness=1.0, strong_convexity=0.01)
    x = torch.randn(50, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x_ad = x.clone().requires_grad_(True)
    (g_ad,) = torch.autograd.grad(q.value(x_ad), x_ad)
    torch.testing.assert_close(q.grad(x), g_ad)
    root = 10.0
    run = run_single_level(
        q.grad, 50, lr=1.0, momentum=(root - 1) / (root + 1), tol=0.0, max_calls=30
    )
    first = run.first_nonzero
    seen = first >= 0
    # coordinate j (0-based) can appear only at call j + 2 (call 1 queries zero)
    assert bool((first[seen] >= torch.arange(50)[seen] + 2).all())
    assert int(seen.sum()) == 29
