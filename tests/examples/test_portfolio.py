"""A tiny run of the portfolio demo, and the constraints of its QP decisions."""

from __future__ import annotations

import math

import torch
from examples.portfolio import run as demo
from examples.portfolio.data import covariance, features, load_weekly
from examples.portfolio.problem import PortfolioSpec, constraint_matrices, rhs


def test_tiny_demo_run_gives_valid_portfolios_and_finite_metrics(tmp_path):
    summary = demo.run(steps=2, batch=4, horizon=2, seed=0, test_weeks=6, backward="penalty",
                       out_dir=tmp_path)  # fmt: skip
    assert set(summary["metrics"]) == {"decision-focused", "predict-then-optimize",
                                       "equal weights"}  # fmt: skip
    for name, row in summary["metrics"].items():
        assert all(math.isfinite(v) for v in row.values()), name
        assert row["ann. volatility"] > 0 and row["final wealth"] > 0
        weights = torch.tensor(summary["results"][name]["weights"], dtype=torch.float64)
        assert weights.shape == (6, 20)
        torch.testing.assert_close(weights.sum(dim=1), torch.ones(6, dtype=torch.float64))
        assert weights.min() >= -1e-8
    ew = torch.tensor(summary["results"]["equal weights"]["weights"], dtype=torch.float64)
    torch.testing.assert_close(ew, torch.full_like(ew, 1 / 20))
    assert (tmp_path / "wealth.png").stat().st_size > 0
    assert summary["plot"] == str(tmp_path / "wealth.png")


def test_qp_decisions_satisfy_constraints_and_carry_gradients():
    data = load_weekly()
    spec = PortfolioSpec(assets=20, horizon=3)
    t = torch.tensor([100, 200, 300])
    model = demo.ReturnModel(spec.horizon)
    mu = model(features(data, t, demo.LAGS), data.vol[t])
    cov = covariance(data, t)
    w0 = torch.softmax(torch.randn(3, 20, dtype=torch.float64), dim=1)
    w = demo.decide(spec, mu, cov, w0, "penalty")  # (B, H, N)
    A, b, G = constraint_matrices(spec)
    flat = w.detach().reshape(3, -1)
    torch.testing.assert_close(flat @ A.T, b.expand(3, -1))
    assert flat.min() >= -1e-8
    assert (flat @ G.T <= rhs(spec, w0) + 1e-8).all()  # long-only and trade limits
    trades = w.detach() - torch.cat([w0[:, None], w.detach()[:, :-1]], dim=1)
    assert trades.abs().max() <= spec.trade_limit + 1e-8
    loss = -demo.realized_utility(spec, w, torch.randn_like(w) * 0.02, cov, w0).mean()
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
