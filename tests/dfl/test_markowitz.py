"""The portfolio oracle and layer (dxopt.dfl.markowitz) against closed forms, finite
differences, and PyEPO's Gurobi portfolioModel / SPOPlus on identical inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import dxopt.dfl as dd
from dxopt.dfl.markowitz import PortfolioLayer, PortfolioOracle
from dxopt.dfl.oracles import OracleError

D = torch.float64


def _two_asset(s1: float, s2: float, rho: float, c: tuple[float, float]) -> np.ndarray:
    """By hand: x = (t, 1 - t), risk s1 t^2 + s2 (1 - t)^2 <= rho; the linear objective
    pushes t to the end of the feasible interval on the side of the larger return."""
    a = s1 + s2
    disc = s2 * s2 - a * (s2 - rho)
    lo, hi = (s2 - math.sqrt(disc)) / a, (s2 + math.sqrt(disc)) / a
    lo, hi = max(lo, 0.0), min(hi, 1.0)
    t = hi if c[0] > c[1] else lo
    return np.array([t, 1.0 - t])


@pytest.mark.parametrize("c", [(0.3, 0.1), (0.1, 0.3), (-0.2, 0.5)])
def test_two_assets_match_the_closed_form(c):
    s1, s2, gamma = 0.04, 0.01, 0.7  # budget 0.00875: between 0.008 (least) and 0.01
    cov = torch.tensor([[s1, 0.0], [0.0, s2]], dtype=D)
    oracle = PortfolioOracle(cov, gamma=gamma)
    rho = gamma * float(cov.mean())
    assert oracle.risk_level == pytest.approx(rho, rel=1e-15)
    x = oracle(torch.tensor(c, dtype=D))
    ref = _two_asset(s1, s2, rho, c)
    assert 0.0 < ref[0] < 1.0  # the risk bound is active: not a vertex of the simplex
    np.testing.assert_allclose(x.numpy(), ref, atol=1e-7)
    assert len(oracle.last_status) == 1
    assert oracle.last_status[0].ok


def test_loose_budget_gives_the_best_asset_and_tight_one_is_refused():
    cov = torch.diag(torch.tensor([0.01, 0.02, 0.03], dtype=D))
    # the budget gamma * mean(cov) = gamma * 0.02 / 3 >= 0.03 -> any vertex is feasible
    x = PortfolioOracle(cov, gamma=5.0)(torch.tensor([[0.1, 0.5, 0.2]], dtype=D))
    np.testing.assert_allclose(x.numpy(), [[0.0, 1.0, 0.0]], atol=1e-7)
    # least risk on the simplex is 1 / sum(1 / s_i) = 0.005454...; budget 0.1 * 0.00667 below
    with pytest.raises(OracleError, match="gamma"):
        PortfolioOracle(cov, gamma=0.1)(torch.tensor([0.1, 0.5, 0.2], dtype=D))


def test_bad_covariance_and_gamma_are_named():
    with pytest.raises(ValueError, match="covariance"):
        PortfolioOracle(torch.ones(2, 3, dtype=D))
    with pytest.raises(ValueError, match="covariance"):
        PortfolioOracle(torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=D))
    with pytest.raises(ValueError, match="positive definite"):
        PortfolioOracle(torch.ones(2, 2, dtype=D))
    with pytest.raises(TypeError, match="covariance"):
        PortfolioOracle([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="gamma"):
        PortfolioOracle(torch.eye(2, dtype=D), gamma=-1.0)


def _pyepo_model(cov: np.ndarray, gamma: float):
    grb = pytest.importorskip("gurobipy")
    from pyepo.model.grb import portfolioModel

    try:
        model = portfolioModel(cov.shape[0], cov, gamma=gamma)
    except grb.GurobiError as err:  # pragma: no cover - licence
        pytest.skip(f"gurobi unavailable: {err}")
    model._model.setParam("BarQCPConvTol", 1e-12)
    model._model.setParam("BarConvTol", 1e-12)
    return model


def test_oracle_matches_pyepo_portfolio_model():
    data = dd.portfolio(6, 4, 8, seed=3, dtype=D)
    cov = data.covariance.numpy()
    model = _pyepo_model(cov, 2.25)
    oracle = PortfolioOracle(data.covariance, gamma=2.25)
    x = oracle(data.costs)
    assert oracle.risk_level == pytest.approx(model.risk_level, rel=1e-14)
    for i in range(data.costs.shape[0]):
        model.setObj(data.costs[i].numpy())
        sol, obj = model.solve()
        assert float(data.costs[i] @ x[i]) == pytest.approx(obj, rel=1e-7, abs=1e-10)
        # the objective is flat to ~1e-7 along the risk boundary (Sigma ~ 1e-5), so the two
        # solvers' points differ by ~3e-5; ours is feasible and at least as good
        xg = torch.as_tensor(np.asarray(sol), dtype=D)
        assert float(data.costs[i] @ x[i]) >= float(data.costs[i] @ xg) - 1e-10
    risk = ((x @ data.covariance) * x).sum(-1)
    assert float(risk.max()) <= oracle.risk_level * (1 + 1e-7)
    assert float(x.min()) >= -1e-9
    np.testing.assert_allclose(x.sum(-1).numpy(), 1.0, atol=1e-9)


def test_spo_plus_matches_pyepo_on_identical_inputs():
    import pyepo

    data = dd.portfolio(6, 4, 8, seed=5, dtype=D)
    model = _pyepo_model(data.covariance.numpy(), 2.25)
    oracle = PortfolioOracle(data.covariance, gamma=2.25)
    c = data.costs
    x_true = oracle(c)
    z_true = (c * x_true).sum(-1, keepdim=True)
    c_hat = c + 0.05 * torch.randn(c.shape, generator=torch.Generator().manual_seed(0), dtype=D)
    c_hat.requires_grad_(True)
    ours = dd.SPOPlus(oracle)(c_hat, c, x_true, z_true)
    ours.backward()
    g_ours = c_hat.grad.clone()
    c_hat.grad = None
    theirs = pyepo.func.SPOPlus(model, processes=1)(c_hat, c, x_true, z_true)
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(g_ours.numpy(), c_hat.grad.numpy(), atol=1e-5)
    assert float(ours.detach()) > 0.0


def test_losses_run_on_the_oracle():
    data = dd.portfolio(4, 3, 5, seed=2, dtype=D)
    oracle = PortfolioOracle(data.covariance)
    x_true = oracle(data.costs)
    c_hat = data.costs.flip(-1).clone().requires_grad_(True)
    loss = dd.PerturbedFenchelYoung(oracle, n_samples=4, sigma=0.05, seed=0)(c_hat, x_true)
    loss.backward()
    assert float(loss.detach()) >= -1e-9 and torch.isfinite(c_hat.grad).all()
    z = dd.regret(oracle, data.costs.flip(-1), data.costs)
    assert float(z.min()) >= -1e-9 and float(z.max()) > 0.0


def test_layer_gradient_matches_finite_differences():
    data = dd.portfolio(2, 3, 5, seed=4, dtype=D)
    layer = PortfolioLayer(data.covariance, mu=0.05)
    c = data.costs[0].clone().requires_grad_(True)
    w = torch.linspace(-1.0, 1.0, 5, dtype=D)
    (layer(c) @ w).backward()
    fd = torch.empty(5, dtype=D)
    for h in (1e-5, 1e-6):
        for j in range(5):
            e = torch.zeros(5, dtype=D)
            e[j] = h
            with torch.no_grad():
                fd[j] = (layer(c + e) @ w - layer(c - e) @ w) / (2 * h)
        np.testing.assert_allclose(c.grad.numpy(), fd.numpy(), rtol=1e-4, atol=1e-6)
    assert float(c.grad.abs().max()) > 1e-3
    x = layer(data.costs)
    np.testing.assert_allclose(x.sum(-1).detach().numpy(), 1.0, atol=1e-8)


def test_pfyl_matches_pyepo_on_identical_inputs():
    """Both draw the noise as torch.randn((B, n, d)) from a CPU generator seeded alike, so in
    float64 the perturbed costs, hence the losses and gradients, are the same."""
    import pyepo

    data = dd.portfolio(6, 4, 8, seed=6, dtype=D)
    model = _pyepo_model(data.covariance.numpy(), 2.25)
    oracle = PortfolioOracle(data.covariance, gamma=2.25)
    x_true = oracle(data.costs)
    noise = 0.05 * torch.randn(data.costs.shape, generator=torch.Generator().manual_seed(1))
    c_hat = (data.costs + noise.to(D)).requires_grad_(True)
    ours = dd.PerturbedFenchelYoung(oracle, n_samples=3, sigma=0.02, seed=7)(c_hat, x_true)
    ours.backward()
    g_ours = c_hat.grad.clone()
    c_hat.grad = None
    pfy = pyepo.func.perturbedFenchelYoung(model, n_samples=3, sigma=0.02, processes=1, seed=7)
    theirs = pfy(c_hat, x_true)
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(g_ours.numpy(), c_hat.grad.numpy(), atol=1e-5)
    assert float(g_ours.abs().max()) > 1e-3
