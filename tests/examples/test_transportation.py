"""The transportation demo: forecasts in the constraints' right-hand side, differentiated
through ``dxopt.qp.solve``; its plan, its gradient (float64, kink-aware finite differences) and
a tiny run."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from examples.transportation import run as demo

from dxopt.qp import QPDegenerateWarning

NET = demo.Network.make(0)


def test_plan_is_feasible_and_delivers_the_forecast_when_stock_allows():
    _, d = NET.sample(8, seed=5)
    small = 0.5 * d  # total well under the stock
    x = demo.plan(NET, small)
    assert x.shape == (8, demo.DEPOTS, demo.STORES)
    assert x.min() >= -1e-8
    assert (x.sum(dim=2) <= NET.stock + 1e-7).all()
    # shortage (10 a unit) is dearer than any route, so the plan ships exactly the forecast
    torch.testing.assert_close(x.sum(dim=1), small, atol=1e-6, rtol=0)
    big = 3.0 * d  # more than the depots hold: every depot ships all its stock
    x_big = demo.plan(NET, big)
    torch.testing.assert_close(x_big.sum(dim=2), NET.stock.expand(8, -1), atol=1e-6, rtol=0)


def _cost(d_hat: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QPDegenerateWarning)
        return demo.realised_cost(NET, demo.plan(NET, d_hat), d).sum()


def test_gradient_through_the_constraints_matches_finite_differences():
    """Central differences at two steps; a sample whose two differences disagree sits near a
    kink (an active-set change or a relu of the realised cost) and gets no verdict."""
    _, d = NET.sample(12, seed=7)
    g = torch.Generator().manual_seed(3)
    d_hat = d * (0.8 + 0.4 * torch.rand(d.shape, generator=g, dtype=torch.float64))
    judged = 0
    for k in range(len(d)):
        point = d_hat[k : k + 1].clone().requires_grad_()
        (grad,) = torch.autograd.grad(_cost(point, d[k : k + 1]), point)
        direction = torch.randn(1, demo.STORES, generator=g, dtype=torch.float64)
        direction /= direction.norm()
        slopes = []
        for step in (1e-4, 1e-6):
            up = _cost(point.detach() + step * direction, d[k : k + 1])
            down = _cost(point.detach() - step * direction, d[k : k + 1])
            slopes.append(float(up - down) / (2 * step))
        if not math.isclose(slopes[0], slopes[1], rel_tol=1e-4, abs_tol=1e-6):
            continue  # unstable: no verdict
        judged += 1
        assert float((grad * direction).sum()) == pytest.approx(slopes[1], rel=1e-4, abs=1e-6)
    assert judged >= 6, f"only {judged} of 12 samples away from kinks"


def test_tiny_run_writes_results_and_true_demand_is_cheapest(tmp_path):
    summary = demo.run(seeds=[0], num_train=64, num_test=100, epochs=2, out_dir=tmp_path)
    costs = {k: v[0] for k, v in summary["costs"].items()}
    assert set(costs) == {"two-stage", "decision-focused", "true demand"}
    assert all(math.isfinite(c) and c > 0 for c in costs.values())
    # planning with the demand itself leaves only shipping and smoothing costs
    assert costs["true demand"] < min(costs["two-stage"], costs["decision-focused"])
    assert "one seed" in summary["verdict"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["costs"] == summary["costs"]
    assert (tmp_path / "cost.png").stat().st_size > 0
