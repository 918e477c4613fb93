"""The generators against their published definitions and PyEPO's: exact expectations, and a
two-sample test of per-seed statistics (each seed draws its own B, so seeds are the
independent units) against ``pyepo.data`` with tolerances from the seed-to-seed spread."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dxopt.dfl import (
    KnapsackOracle,
    ShortestPathOracle,
    TSPOracle,
    knapsack,
    portfolio,
    shortest_path,
    tsp,
)

SEEDS = 30


def _stats(c: np.ndarray) -> np.ndarray:
    """Per-data-set statistics: mean, std and the 10/50/90% quantiles of all entries."""
    c = np.asarray(c, dtype=float)
    return np.array([c.mean(), c.std(), *np.quantile(c, [0.1, 0.5, 0.9])])


def _agree(ours: list[np.ndarray], theirs: list[np.ndarray], z: float = 4.5) -> np.ndarray:
    """Two-sample z statistics of the per-seed statistics; returns |difference| / (z * se)."""
    a, b = np.array(ours), np.array(theirs)
    se = np.sqrt(a.var(0, ddof=1) / len(a) + b.var(0, ddof=1) / len(b))
    return np.abs(a.mean(0) - b.mean(0)) / (z * se + 1e-12)


def test_shortest_path_mean_is_exact_for_deg_1():
    data = shortest_path(4000, 5, deg=1, noise_width=0.5, seed=0, dtype=torch.float64)
    per_sample = data.costs.mean(1).numpy()  # samples are independent given B
    se = per_sample.std(ddof=1) / math.sqrt(len(per_sample))
    # E[c] = (E[(Bx)_j / sqrt p + 3] + 1) / 3.5 * E[eps] = 4 / 3.5 for every B
    assert abs(per_sample.mean() - 4 / 3.5) < 5 * se
    assert data.features.shape == (4000, 5) and data.costs.shape == (4000, 40)


@pytest.mark.parametrize("deg", [1, 4])
def test_shortest_path_distribution_matches_pyepo(deg):
    pyepo_sp = pytest.importorskip("pyepo.data.shortestpath", reason="pyepo reference missing")
    ours = [_stats(shortest_path(100, 5, deg=deg, seed=s).costs) for s in range(SEEDS)]
    theirs = [
        _stats(pyepo_sp.genData(100, 5, (5, 5), deg=deg, noise_width=0.5, seed=1000 + s)[1])
        for s in range(SEEDS)
    ]
    assert (_agree(ours, theirs) < 1).all()
    # the test has power: a wrong degree is rejected
    wrong = [_stats(shortest_path(100, 5, deg=deg + 1, seed=s).costs) for s in range(SEEDS)]
    assert (_agree(wrong, theirs) > 1).any()


def test_knapsack_distribution_matches_pyepo():
    pyepo_ks = pytest.importorskip("pyepo.data.knapsack", reason="pyepo reference missing")
    ours, theirs = [], []
    for s in range(SEEDS):
        d = knapsack(100, 5, 32, dim=2, deg=2, seed=s)
        ours.append(np.concatenate([_stats(d.costs), _stats(d.weights)]))
        w, _, c = pyepo_ks.genData(100, 5, 32, dim=2, deg=2, noise_width=0.5, seed=1000 + s)
        theirs.append(np.concatenate([_stats(c), _stats(w)]))
    assert (_agree(ours, theirs) < 1).all()
    d = knapsack(10, 5, 32, seed=0)
    assert torch.equal(d.costs, d.costs.ceil()) and d.capacity.tolist() == [20.0, 20.0]
    w = d.weights.numpy()
    assert w.min() >= 3.0 and w.max() <= 7.99 and np.allclose(w * 100, np.round(w * 100))


def test_tsp_and_portfolio_distributions_match_pyepo():
    pyepo_tsp = pytest.importorskip("pyepo.data.tsp", reason="pyepo reference missing")
    from pyepo.data import portfolio as pyepo_pf

    ours = [_stats(tsp(50, 5, 8, deg=2, seed=s).costs) for s in range(SEEDS)]
    theirs = [
        _stats(pyepo_tsp.genData(50, 5, 8, deg=2, noise_width=0.5, seed=1000 + s)[1])
        for s in range(SEEDS)
    ]
    assert (_agree(ours, theirs) < 1).all()
    ours, theirs = [], []
    for s in range(SEEDS):
        d = portfolio(50, 5, 10, deg=2, seed=s)
        ours.append(np.concatenate([_stats(d.costs), _stats(d.covariance)]))
        cov, _, r = pyepo_pf.genData(50, 5, 10, deg=2, noise_level=1, seed=1000 + s)
        theirs.append(np.concatenate([_stats(r), _stats(cov)]))
    assert (_agree(ours, theirs) < 1).all()


def test_with_solutions_dataset_and_subset():
    data = shortest_path(20, 3, grid=(3, 3), seed=1)
    oracle = ShortestPathOracle((3, 3))
    with pytest.raises(ValueError, match="with_solutions"):
        data.dataset()
    solved = data.with_solutions(oracle)
    assert torch.equal(solved.objectives, (solved.costs * solved.solutions).sum(1))
    _, _, x, z = solved.dataset()[0]
    assert x.shape == (12,) and z.shape == ()
    assert len(solved.subset(slice(0, 5))) == 5
    ks = knapsack(6, 3, 8, seed=0)
    ks = ks.with_solutions(KnapsackOracle(ks.weights, ks.capacity))
    assert ((ks.solutions.double() @ ks.weights.T) <= 20 + 1e-9).all()
    ts = tsp(4, 3, 6, seed=0).with_solutions(TSPOracle(6))
    assert (ts.solutions.sum(1) == 6).all()


def test_generators_refuse_bad_arguments():
    with pytest.raises(ValueError, match="noise_width"):
        shortest_path(10, 5, noise_width=1.5)
    with pytest.raises(ValueError, match="deg"):
        shortest_path(10, 5, deg=0)
    with pytest.raises(ValueError, match="num_items"):
        knapsack(10, 5, 0)
    with pytest.raises(ValueError, match="num_nodes"):
        tsp(10, 5, 2)
