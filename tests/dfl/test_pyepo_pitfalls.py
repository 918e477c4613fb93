"""What a PyEPO user tripped over (issue 39, item 6), each checked against the behaviour it
replaces: certified TSP answers and regrets that refuse uncertified ones, the sense of a
CallableOracle, errors that name their argument, half-precision costs, ``processes=``, and the
knapsack branch and bound's limits."""

from __future__ import annotations

import itertools
import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dxopt import DxoptWarning, Status
from dxopt.dfl import (
    CallableOracle,
    KnapsackOracle,
    OracleError,
    ShortestPathOracle,
    SPOPlus,
    TSPOracle,
    regret,
    regret_report,
)


def _tsp_costs(m, n, seed):
    gen = torch.Generator().manual_seed(seed)
    pts = torch.rand(n, m, 2, generator=gen, dtype=torch.float64)
    i, j = torch.triu_indices(m, m, offset=1)
    return (pts[:, i] - pts[:, j]).norm(dim=-1)


def test_tsp_default_is_exact_where_cheap_and_heuristic_answers_are_marked():
    m = 8
    c = _tsp_costs(m, 200, seed=0)
    exact, heur, default = (
        TSPOracle(m, method="exact"),
        TSPOracle(m, method="heuristic"),
        TSPOracle(m),
    )
    z_exact = exact.objective(c, exact(c))
    z_heur = heur.objective(c, heur(c))
    assert (z_heur > z_exact + 1e-9).any()  # the heuristic misses some optima here
    assert torch.allclose(default.objective(c, default(c)), z_exact, atol=1e-12)
    assert default.exact and default.last_status == (Status.SOLVED,) * 200
    assert not heur.exact and set(heur.last_status) == {Status.INACCURATE}
    assert TSPOracle(TSPOracle.EXACT_AUTO_MAX + 1).method == "heuristic"


def test_regret_refuses_a_heuristics_gap_unless_asked():
    m = 8
    c = _tsp_costs(m, 20, seed=1)
    c_hat = c + 0.1 * _tsp_costs(m, 20, seed=2)
    heur = TSPOracle(m, method="heuristic")
    with pytest.raises(OracleError, match="not certified"):
        regret(heur, c_hat, c)
    loader = DataLoader(TensorDataset(c_hat, c), batch_size=10)
    with pytest.raises(OracleError, match="not certified"):
        regret_report(lambda f: f, loader, heur)
    with pytest.warns(DxoptWarning, match="not certified"):
        gap = regret(heur, c_hat, c, on_failure="warn")
    assert gap.shape == (20,)
    exact = TSPOracle(m)
    r = regret(exact, c_hat, c)
    assert (r >= 0).all() and torch.allclose(
        r, exact.objective(c, exact(c_hat)) - exact.objective(c, exact(c))
    )


def _argmax_corner(c):  # maximises c'x over the unit box's corners
    return (c > 0).double()


def test_callable_oracle_with_the_wrong_sense_is_detected():
    gen = torch.Generator().manual_seed(0)
    c = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    c_hat = c + torch.randn(8, 5, generator=gen, dtype=torch.float64)
    wrong = CallableOracle(_argmax_corner, dim=5)  # forgot sense="max"
    x = wrong(c)
    z = (c * x).sum(1)
    with pytest.raises(ValueError, match="sense='max'"):
        SPOPlus(wrong, reduction="none")(c_hat, c, x, z)
    with pytest.raises(ValueError, match="sense='max'"):
        regret(wrong, c_hat, c)
    right = CallableOracle(_argmax_corner, dim=5, sense="max")
    loss = SPOPlus(right, reduction="none")(c_hat, c, x, z)
    assert (loss >= 0).all() and (regret(right, c_hat, c) >= 0).all()
    # an oracle declared inexact is not second-guessed, and its regrets are refused
    loose = CallableOracle(_argmax_corner, dim=5, exact=False)
    SPOPlus(loose, reduction="none")(c_hat, c, x, z)
    with pytest.raises(OracleError, match="not certified"):
        regret(loose, c_hat, c)


def test_errors_name_the_argument():
    oracle = ShortestPathOracle((3, 3))
    c = torch.rand(4, oracle.dim)
    x = oracle(c)
    with pytest.raises(ValueError, match="z_true: expected one optimum per cost vector"):
        SPOPlus(oracle)(c, c, x, torch.zeros(4, 2))
    SPOPlus(oracle)(c, c, x, oracle.objective(c, x)[:, None])  # (B, 1) is PyEPO's shape
    with pytest.raises(ValueError, match="capacity: expected a number or one capacity"):
        KnapsackOracle(np.ones((2, 5)), capacity=[1.0, 2.0, 3.0])
    loader = DataLoader(TensorDataset(torch.randn(4, 3), c), batch_size=2)
    with pytest.raises(TypeError, match="PyEPO's order"):
        regret_report(torch.nn.Linear(3, oracle.dim), oracle, loader)
    with pytest.raises(TypeError, match="float16"):
        oracle(c.half())
    with pytest.raises(TypeError, match="bfloat16"):
        SPOPlus(oracle)(c.bfloat16(), c.bfloat16(), x.bfloat16(), torch.zeros(4))


def test_pyepo_processes_keyword_is_accepted_and_explained():
    oracle = ShortestPathOracle((3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SPOPlus(oracle, processes=1)
    with pytest.warns(DxoptWarning, match="processes=4 is accepted .* and ignored"):
        SPOPlus(oracle, processes=4)
    with pytest.raises(ValueError, match="processes"):
        SPOPlus(oracle, processes=-1)


def _correlated_knapsack():
    rng = np.random.default_rng(0)
    W = rng.integers(300, 800, (2, 50)) / 100.0
    return W, W.sum(1) / 2, torch.as_tensor(10.0 * W.sum(0))[None]


def test_knapsack_time_and_node_limits_stop_a_hard_instance():
    W, cap, values = _correlated_knapsack()
    KnapsackOracle(W, cap, time_limit=0.01, on_failure="ignore")(values)  # compile first
    oracle = KnapsackOracle(W, cap, time_limit=0.2)
    start = time.perf_counter()
    with pytest.warns(DxoptWarning, match="time_limit"):
        x = oracle(values)
    assert time.perf_counter() - start < 3.0
    assert oracle.last_status == (Status.BUDGET_EXHAUSTED,) and not oracle.exact
    assert (W @ x[0].numpy() <= cap + 1e-9).all()
    assert float((values * x).sum()) <= oracle.last_bound[0]
    with pytest.raises(OracleError, match="node_limit") as err:
        KnapsackOracle(W, cap, node_limit=1000, on_failure="raise")(values)
    assert err.value.status is Status.BUDGET_EXHAUSTED
    assert torch.isnan(KnapsackOracle(W, cap, node_limit=10, on_failure="nan")(values)).all()


def test_knapsack_without_limits_hitting_is_solved_and_bound_is_the_optimum():
    rng = np.random.default_rng(5)
    W, cap = rng.integers(300, 800, (2, 10)) / 100.0, np.array([15.0, 15.0])
    values = rng.uniform(1, 10, (6, 10))
    oracle = KnapsackOracle(W, cap, node_limit=10**6)
    x = oracle(torch.as_tensor(values)).numpy()
    X = np.array(list(itertools.product([0.0, 1.0], repeat=10)))
    best = (values @ X[(cap + 1e-9 >= X @ W.T).all(1)].T).max(1)
    assert np.allclose((values * x).sum(1), best) and np.allclose(oracle.last_bound, best)
    assert oracle.last_status == (Status.SOLVED,) * 6


def test_pyepo_stream_and_defaults_reproduce_gendata_exactly():
    pyepo_sp = pytest.importorskip("pyepo.data.shortestpath", reason="pyepo reference missing")
    pyepo_ks = pytest.importorskip("pyepo.data.knapsack", reason="pyepo reference missing")
    from dxopt.dfl import knapsack, shortest_path

    for kwargs in ({}, {"deg": 4, "noise_width": 0.5, "seed": 7}):
        ours = shortest_path(40, 5, grid=(4, 6), stream="pyepo", dtype=torch.float64, **kwargs)
        x, c = pyepo_sp.genData(40, 5, (4, 6), **kwargs)
        assert np.array_equal(ours.features.numpy(), x) and np.array_equal(ours.costs.numpy(), c)
        ours = knapsack(30, 5, 12, stream="pyepo", dtype=torch.float64, **kwargs)
        w, x, c = pyepo_ks.genData(30, 5, 12, **kwargs)
        assert np.array_equal(ours.weights.numpy(), w) and np.array_equal(ours.costs.numpy(), c)
        assert np.array_equal(ours.features.numpy(), x)
    assert knapsack(2, 3, 4, stream="pyepo").params["dim"] == 1  # PyEPO's default
    assert shortest_path(2, 3).params["noise_width"] == 0.5  # ours, as documented
    with pytest.raises(ValueError, match="stream"):
        shortest_path(2, 3, stream="numpy")
