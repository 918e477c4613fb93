"""I-MLE and AI-MLE: the sum-of-Gamma noise against its exact law (the sum of kappa draws is the
maximum of m standard exponentials minus log m, Renyi's representation; PyEPO's sampler against
the same law); with Gumbel noise on the simplex the layer's expectation is a softmax and the
estimator's expectation its finite difference (statistical, within Monte Carlo error); PyEPO's
implicitMLE / adaptiveImplicitMLE on identical noise; AI-MLE's per-sample step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from tests.dfl._enum import enum_oracle, pyepo_model

from dxopt.dfl import AIMLE, IMLE, KnapsackOracle, ShortestPathOracle, sum_of_gamma


def _sum_of_kappa_cdf(m):
    return lambda x: np.where(x >= -math.log(m), (1 - np.exp(-x) / m).clip(0) ** m, 0.0)


@pytest.mark.parametrize("kappa,m", [(5.0, 10), (3.0, 40)])
def test_sum_of_gamma_has_its_exact_law(kappa, m):
    gen = torch.Generator().manual_seed(0)
    draws = sum_of_gamma((int(kappa), 40000), kappa=kappa, n_iterations=m, generator=gen)
    one = draws[0].numpy()
    mean = (sum(1 / i for i in range(1, m + 1)) - math.log(m)) / kappa
    var = sum(1 / i**2 for i in range(1, m + 1)) / kappa
    assert abs(one.mean() - mean) < 5 * math.sqrt(var / one.size)
    assert stats.kstest(draws.sum(0).numpy(), _sum_of_kappa_cdf(m)).pvalue > 1e-3
    # a wrong law is rejected: the Gumbel limit is off at m = 10 for this sample size
    if m == 10:
        assert stats.kstest(draws.sum(0).numpy(), stats.gumbel_r.cdf).pvalue < 1e-3


def test_pyepo_sum_of_gamma_has_the_same_law():
    utils = pytest.importorskip("pyepo.func.utils", reason="pyepo (test-only reference) missing")
    dist = utils.sumGammaDistribution(kappa=5, n_iterations=10, seed=3)
    draws = dist.sample(size=(5, 20000)).sum(0)
    assert stats.kstest(draws, _sum_of_kappa_cdf(10)).pvalue > 1e-3


def _softmax_case(sense, seed=0):
    V = torch.eye(4, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    c_hat = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    g = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    return enum_oracle(V, sense), c_hat, g


@pytest.mark.parametrize("sense", ["min", "max"])
@pytest.mark.parametrize("two_sides", [False, True])
def test_imle_gumbel_expectations_on_the_simplex(sense, two_sides):
    oracle, c_hat, g = _softmax_case(sense)
    s = 1.0 if sense == "min" else -1.0
    sigma, lambd, n = 0.5, 0.5, 40000

    def F(c):  # E[x(c - s sigma G)] = softmax(-s c / sigma), Gumbel-max
        return torch.softmax(-s * c / sigma, dim=-1)

    layer = IMLE(oracle, n_samples=n, sigma=sigma, lambd=lambd, noise="gumbel", two_sides=two_sides)
    c = c_hat.clone().requires_grad_(True)
    y = layer(c)
    p = F(c_hat)
    assert ((y.detach() - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-12).all()
    (y * g).sum().backward()
    if two_sides:
        expected = (F(c_hat + lambd * g) - F(c_hat - lambd * g)) / (2 * lambd)
    else:
        expected = s * (F(c_hat + s * lambd * g) - F(c_hat)) / lambd
    bound = 5 / (lambd * math.sqrt(n))  # each draw's term lies in [-1/lambd, 1/lambd]
    assert ((c.grad - expected).abs() <= bound).all()
    assert expected.abs().max() > 4 * bound  # a sign error would be caught
    assert layer.cost.forwards == 2 * n * (3 if two_sides else 2)  # forward + backward


class _Fixed:
    """A PyEPO noise distribution replaying given draws."""

    def __init__(self, draws):
        self.draws = list(draws)

    def sample(self, size, device=None, dtype=torch.float64):
        out = self.draws.pop(0)
        assert tuple(out.shape) == tuple(size)
        return out.to(dtype)


def _problems(seed):
    gen = torch.Generator().manual_seed(seed)
    ks = KnapsackOracle(torch.rand(2, 8, generator=gen, dtype=torch.float64) * 3 + 1, 7.0)
    return gen, (ShortestPathOracle((3, 3)), ks)


@pytest.mark.parametrize("two_sides", [False, True])
def test_imle_equals_pyepo_on_identical_noise(two_sides):
    pyepo_func = pytest.importorskip("pyepo.func", reason="pyepo (test-only reference) missing")
    gen, oracles = _problems(5)
    for oracle in oracles:
        s = 1.0 if oracle.sense == "min" else -1.0
        c_hat = torch.randn(6, oracle.dim, generator=gen, dtype=torch.float64)
        g = torch.randn(6, oracle.dim, generator=gen, dtype=torch.float64)
        eps = IMLE(oracle, seed=9).sample_noise((6, 10, oracle.dim))
        ours = IMLE(oracle, seed=9, sigma=0.7, lambd=2.0, two_sides=two_sides)
        theirs = pyepo_func.IMLE(
            pyepo_model(oracle),
            sigma=0.7,
            lambd=2.0,
            two_sides=two_sides,
            distribution=_Fixed([-s * eps]),
        )
        a, b = c_hat.clone().requires_grad_(True), c_hat.clone().requires_grad_(True)
        ya, yb = ours(a), theirs(b)
        assert torch.allclose(ya, yb.to(ya.dtype), atol=1e-12)
        (ya * g).sum().backward()
        (yb * g).sum().backward()
        assert torch.allclose(a.grad, b.grad.to(a.dtype), rtol=1e-6, atol=1e-10)


def test_aimle_equals_pyepo_one_sample_at_a_time():
    pyepo_func = pytest.importorskip("pyepo.func", reason="pyepo (test-only reference) missing")
    gen, (oracle, _) = _problems(6)
    c_hats = torch.randn(4, 1, oracle.dim, generator=gen, dtype=torch.float64)
    gs = torch.randn(4, 1, oracle.dim, generator=gen, dtype=torch.float64)
    ours = AIMLE(oracle, seed=2, sigma=0.5)
    replay = AIMLE(oracle, seed=2)
    eps = [replay.sample_noise((1, 10, oracle.dim)) for _ in range(4)]
    theirs = pyepo_func.AIMLE(
        pyepo_model(oracle), sigma=0.5, distribution=_Fixed([-e for e in eps])
    )  # min: PyEPO perturbs c_hat + sigma * noise
    for c_hat, g in zip(c_hats, gs, strict=True):
        a, b = c_hat.clone().requires_grad_(True), c_hat.clone().requires_grad_(True)
        (ours(a) * g).sum().backward()
        (theirs(b) * g).sum().backward()
        assert torch.allclose(a.grad, b.grad.to(a.dtype), rtol=1e-6, atol=1e-10)
        assert ours.alpha == pytest.approx(theirs.alpha, abs=1e-12)
    assert ours.alpha > 1.0  # sparse gradients: alpha grew towards the target density


def test_aimle_step_is_per_sample_and_zero_gradient_rows_stay_zero():
    _, (oracle, _) = _problems(7)
    gen = torch.Generator().manual_seed(8)
    c_hat = torch.randn(3, oracle.dim, generator=gen, dtype=torch.float64)
    g = torch.randn(3, oracle.dim, generator=gen, dtype=torch.float64)
    g[1] = 0.0
    layer = AIMLE(oracle, seed=4, sigma=0.5, alpha=0.8)
    eps = AIMLE(oracle, seed=4).sample_noise((3, 10, oracle.dim))
    c = c_hat.clone().requires_grad_(True)
    (layer(c) * g).sum().backward()
    p = c_hat.unsqueeze(1) - 0.5 * eps
    x = oracle(p.reshape(-1, oracle.dim)).reshape(p.shape)
    for i in (0, 2):
        lam = 0.8 * c_hat[i].norm() / g[i].norm()
        shifted = oracle(p[i] + lam * g[i])
        assert torch.allclose(c.grad[i], (shifted - x[i]).mean(0) / lam, atol=1e-12)
    assert torch.equal(c.grad[1], torch.zeros(oracle.dim, dtype=torch.float64))
    with pytest.raises(TypeError, match="lambd"):
        AIMLE(oracle, lambd=1.0)
