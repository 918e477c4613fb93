"""The JAIR benchmark's loaders: the shipped data, the protocol (standardisation, shuffle,
550/100/139 split) against scikit-learn's, the knapsack against the MILP oracle, and a
scheduling instance solved by MILPOracle against scipy's milp on a model built here
independently (every start slot a variable, the forbidden ones fixed to 0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import Bounds, LinearConstraint, milp

from dxopt.dfl import MILPOracle
from dxopt.dfl.jair import _file as jair_file
from dxopt.dfl.jair import (
    jair_knapsack,
    jair_prices,
    jair_scheduling,
    read_energy_instance,
)


def test_protocol_equals_the_benchmarks_sklearn_pipeline():
    sk_pre = pytest.importorskip("sklearn.preprocessing", reason="sklearn reference missing")
    sk_utils = pytest.importorskip("sklearn.utils")
    with jair_file("icon_prices.npz").open("rb") as fh, np.load(fh) as data:
        raw = {k: data[k] for k in data.files}
    scaler = sk_pre.StandardScaler()
    x_tr = scaler.fit_transform(raw["X_1gtrain"][:, 1:]).reshape(-1, 48, 8)
    x_te = scaler.transform(raw["X_1gtest"][:, 1:]).reshape(-1, 48, 8)
    x = np.concatenate([x_tr, x_te])
    y = np.concatenate([raw["y_train"].reshape(-1, 48), raw["y_test"].reshape(-1, 48)])
    xs, ys = sk_utils.shuffle(x, y, random_state=3)
    ours_x, ours_y, weights = jair_prices(seed=3)
    assert ours_x.shape == (789, 48, 8) and weights.shape == (48,)
    np.testing.assert_allclose(ours_x, xs, rtol=0, atol=1e-12)
    assert np.array_equal(ours_y, ys)
    assert not np.array_equal(jair_prices(seed=4)[1], ours_y)


def test_knapsack_split_shapes_and_oracle():
    task = jair_knapsack(120, seed=1)
    sizes = [len(task.train), len(task.valid), len(task.test)]
    assert sizes == [550, 100, 139]
    assert task.train.features.shape == (550, 48, 8) and task.test.costs.shape == (139, 48)
    assert task.oracle.sense == "max" and task.oracle.capacity.tolist() == [120.0]
    assert torch.equal(task.costs_from_prices(task.prices["valid"]), task.valid.costs)
    p = task.prices["valid"].double().requires_grad_(True)  # the identity map: exactly p @ I
    c = task.costs_from_prices(p)
    assert torch.equal(c, p @ task.cost_map.T) and c.requires_grad
    days = task.valid.costs[:4].double()
    x = task.oracle(days)
    w = task.oracle.weights
    ref = MILPOracle(A_ub=w, b_ub=[120.0], bounds=(0, 1), sense="max").solve(days)
    assert ref.certified and torch.allclose((days * x).sum(1), ref.objective, rtol=1e-12)
    assert (x.numpy() @ w.T <= 120 + 1e-9).all()
    with pytest.raises(ValueError, match="capacity"):
        jair_knapsack([60, 120])


def test_read_energy_instance_one():
    inst = read_energy_instance(jair_file("load1.txt").read_text())
    assert inst.capacity.shape == (3, 1) and inst.duration.shape == (10,)
    assert inst.duration[0] == 10 and inst.earliest[0] == 1 and inst.latest[0] == 25
    assert inst.power[0] == pytest.approx(471.40) and inst.use[0, 0] == 2610
    assert inst.capacity[:, 0].tolist() == [5481, 5583, 5547]


def _independent_schedule(inst, prices):
    """scipy milp on x[f, m, t] for every t in 0..47 (bounds close the forbidden starts)."""
    F, (M, R), N = inst.duration.shape[0], inst.capacity.shape, 48
    idx = lambda f, m, t: (f * M + m) * N + t  # noqa: E731
    n = F * M * N
    cost, ub = np.zeros(n), np.zeros(n)
    eq = np.zeros((F, n))
    res = np.zeros((M * N * R, n))
    for f in range(F):
        D = inst.duration[f]
        for m in range(M):
            for t in range(N):
                j = idx(f, m, t)
                eq[f, j] = 1
                if inst.earliest[f] <= t and t + D <= inst.latest[f]:
                    ub[j] = 1
                    cost[j] = inst.power[f] * prices[t : t + D].sum()
                    for s in range(t, t + D):
                        for r in range(R):
                            res[(m * N + s) * R + r, j] += inst.use[f, r]
    cap = np.array([inst.capacity[m, r] for m in range(M) for s in range(N) for r in range(R)])
    out = milp(
        cost, integrality=np.ones(n), bounds=Bounds(np.zeros(n), ub),
        constraints=[LinearConstraint(eq, 1, 1), LinearConstraint(res, -np.inf, cap)],
    )  # fmt: skip
    assert out.success
    return out.fun


def test_scheduling_instance_solved_by_milp_oracle_matches_an_independent_model():
    task = jair_scheduling(1, seed=0)
    assert [len(task.train), len(task.valid), len(task.test)] == [550, 100, 139]
    inst = read_energy_instance(jair_file("load1.txt").read_text())
    prices = task.prices["test"][:2].double()
    c = task.costs_from_prices(prices)
    assert torch.allclose(c.float(), task.test.costs[:2], rtol=1e-6)
    for dtype in (torch.float64, torch.float32, torch.float64):  # the kept map per dtype
        p = prices.to(dtype)
        assert torch.equal(task.costs_from_prices(p), p @ task.cost_map.to(dtype).T)
    sol = task.oracle.solve(c)
    assert sol.certified
    var = task.params["variables"]
    for i in range(2):
        ref = _independent_schedule(inst, prices[i].numpy())
        assert abs(float(sol.objective[i]) - ref) <= 1e-9 * abs(ref)
        chosen = var[sol.x[i].numpy() > 0.5]  # check the schedule itself
        assert sorted(chosen[:, 0].tolist()) == list(range(10))  # every task once
        load = np.zeros((3, 48))
        for f, m, t in chosen:
            assert inst.earliest[f] <= t and t + inst.duration[f] <= inst.latest[f]
            load[m, t : t + inst.duration[f]] += inst.use[f, 0]
        assert (load <= inst.capacity[:, :1] + 1e-9).all()
        cost = sum(inst.power[f] * prices[i, t : t + inst.duration[f]].sum() for f, _, t in chosen)
        assert float(cost) == pytest.approx(float(sol.objective[i]), rel=1e-12)
