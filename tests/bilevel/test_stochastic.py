"""Ji's Bernoulli oracle is unbiased with the predicted variance; stochastic methods run on it."""

import math

import torch

from dxopt.bilevel import (
    SOBA,
    InnerLoop,
    JiBernoulliOracle,
    JiInstance,
    Neumann,
    StocBiO,
    minimize_bilevel,
)


def test_bernoulli_oracle_is_unbiased_with_variance_one_over_p() -> None:
    ji = JiInstance(block=3, links=3, chain_scale=0.1)
    p = 0.25
    noisy = JiBernoulliOracle(ji, probability=p, generator=torch.Generator().manual_seed(0))
    x = torch.zeros(ji.dim_x, dtype=torch.float64)
    y = torch.zeros(ji.dim_y, dtype=torch.float64)
    y[ji.n - 1] = 0.3  # y^(0)_n active: coordinate n-1 of block 0 would extend the chain
    _, exact = ji.grad_g(x, y)
    draws = torch.stack([noisy.grad_g(x, y)[1] for _ in range(4000)])
    new = (exact != 0) & (y == 0)
    assert int(new.sum()) >= 1
    mean, std = draws.mean(0), draws.std(0)
    # mean: within 4 standard errors; variance of (xi/p) g is g^2 (1-p)/p
    se = exact.abs() * math.sqrt((1 - p) / p) / math.sqrt(draws.shape[0])
    assert bool(((mean - exact).abs() <= 4 * se + 1e-15).all())
    predicted = exact[new].abs() * math.sqrt((1 - p) / p)
    assert bool(((std[new] - predicted).abs() <= 0.1 * predicted).all())
    # coordinates inside the query's support are exact
    torch.testing.assert_close(draws[:, ~new], exact[~new].expand(draws.shape[0], -1))


def test_stochastic_methods_reach_the_target_on_the_noisy_chain() -> None:
    ji = JiInstance.for_accuracy(block=2, epsilon=0.25, links=4)
    K = math.ceil(4 * ji.kappa)
    lr = 1.0 / (10 * ji.n**2)
    methods = [
        StocBiO(
            inner=InnerLoop.gd(smoothness=1.0, max_iter=K), neumann=Neumann(K, 1.0), outer_lr=lr,
            batch_size=2,
        ),
        SOBA(inner_lr=0.5, outer_lr=0.2 * lr),
    ]  # fmt: skip
    for method in methods:
        noisy = JiBernoulliOracle(ji, probability=0.5, generator=torch.Generator().manual_seed(1))
        result = minimize_bilevel(method, noisy, max_iter=20_000, tol=ji.epsilon)
        assert result.status.value == "solved", type(method).__name__
        assert result.cost.total >= ji.T * ji.n
