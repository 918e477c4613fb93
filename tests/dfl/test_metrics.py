"""Regret: zero at the truth, positive (and equal to its definition) elsewhere, the normalised
regret as PyEPO defines it (checked against ``pyepo.metric.regret`` when installed), and the
report over a data loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dxopt.dfl import (
    KnapsackOracle,
    ShortestPathOracle,
    knapsack,
    normalized_regret,
    regret,
    regret_report,
    shortest_path,
)


def test_regret_zero_at_truth_and_positive_elsewhere():
    data = shortest_path(50, 4, seed=0, dtype=torch.float64)
    oracle = ShortestPathOracle((5, 5))
    c = data.costs
    assert torch.equal(regret(oracle, c, c), torch.zeros(50, dtype=c.dtype))
    c_hat = c + torch.randn(c.shape, generator=torch.Generator().manual_seed(0), dtype=c.dtype)
    r = regret(oracle, c_hat, c)
    assert (r >= 0).all() and (r > 0).any()
    z = oracle.objective(c, oracle(c))
    assert torch.allclose(r, oracle.objective(c, oracle(c_hat)) - z)
    assert torch.allclose(normalized_regret(oracle, c_hat, c), r.sum() / z.abs().sum())
    ks = knapsack(30, 4, 10, seed=0, dtype=torch.float64)
    kso = KnapsackOracle(ks.weights, ks.capacity)  # a maximisation: regret = z* - c'x(c_hat)
    rk = regret(kso, -ks.costs, ks.costs)
    assert (rk > 0).all() and torch.allclose(rk, kso.objective(ks.costs, kso(ks.costs)))
    with pytest.raises(ValueError, match="c: expected the shape"):
        regret(oracle, c_hat, c[:, :3])
    with pytest.raises(ValueError, match="optimum"):
        normalized_regret(oracle, c_hat, torch.zeros_like(c))


def test_regret_report_matches_pyepo_definition():
    data = shortest_path(64, 5, deg=2, seed=3).with_solutions(ShortestPathOracle((5, 5)))
    oracle = ShortestPathOracle((5, 5))
    model = torch.nn.Linear(5, 40)
    loader = DataLoader(data.dataset(), batch_size=16)
    report = regret_report(model, loader, oracle)
    with torch.no_grad():
        expected = normalized_regret(oracle, model(data.features), data.costs)
    assert report.count == 64 and report.normalized == pytest.approx(float(expected), rel=1e-6)
    assert model.training  # restored
    pyepo_metric = pytest.importorskip("pyepo.metric", reason="pyepo (test-only reference)")
    from pyepo.model.opt import optModel

    class DPModel(optModel):
        def _getModel(self):
            return None, None

        def setObj(self, cost):
            self.cost = torch.as_tensor(np.asarray(cost), dtype=torch.float64)

        def solve(self):
            sol = oracle(self.cost)
            return sol.numpy(), float((sol * self.cost).sum())

        @property
        def num_cost(self):
            return oracle.dim

    theirs = pyepo_metric.regret(model, DPModel(), loader)
    assert report.normalized == pytest.approx(theirs, rel=1e-5)
