"""One cost bookkeeping in dxopt.dfl: every oracle, loss and layer that solves reports
``cost`` (a dxopt.Cost: ``forwards`` = cost vectors solved), ``calls`` (batched calls) and
``reset_cost()`` the same way, counted exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dxopt.dfl as dfl
from dxopt import Cost

D = torch.float64


def _check(obj, call, rows: int) -> None:
    assert obj.cost == Cost() and obj.calls == 0
    call()
    call()
    assert obj.cost == Cost(forwards=2 * rows) and obj.calls == 2
    assert obj.cost.seconds > 0.0
    assert obj.reset_cost() == Cost(forwards=2 * rows)
    assert obj.cost == Cost() and obj.calls == 0 and obj.cost.seconds == 0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: dfl.ShortestPathOracle((3, 3)),
        lambda: dfl.KnapsackOracle(np.ones((1, 4)), 2.0),
        lambda: dfl.TSPOracle(4),
        lambda: dfl.LPOracle(A=torch.ones(1, 3), b=torch.ones(1), lb=0.0),
        lambda: dfl.MILPOracle(A_ub=np.ones((1, 3)), b_ub=[2.0], bounds=(0, 1)),
        lambda: dfl.CallableOracle(lambda c: (c == c.min()).double(), dim=3),
    ],
)
def test_every_oracle_counts_its_solves(make):
    oracle = make()
    c = torch.rand(5, oracle.dim, generator=torch.Generator().manual_seed(0), dtype=D)
    _check(oracle, lambda: oracle(c), 5)


def test_losses_count_the_oracle_solves_they_make():
    oracle = dfl.ShortestPathOracle((3, 3))
    c = torch.rand(4, oracle.dim, generator=torch.Generator().manual_seed(1), dtype=D)
    x, z = oracle(c), (oracle(c) * c).sum(-1)
    spo = dfl.SPOPlus(oracle)
    _check(spo, lambda: spo(c, c, x, z), 4)
    ptb = dfl.PerturbedFenchelYoung(oracle, n_samples=3)
    _check(ptb, lambda: ptb(c, x), 12)


def test_layers_count_the_cost_vectors_they_solve():
    lp = {"A": torch.ones(1, 3), "b": torch.ones(1), "lb": 0.0}
    c = torch.tensor([[0.3, -0.5, 1.2], [1.0, 0.0, 2.0]], dtype=D)
    qptl = dfl.QPTL(**lp, eps=0.5)
    _check(qptl, lambda: qptl(c), 2)
    barrier = dfl.LogBarrierLP(**lp, mu=0.1)
    _check(barrier, lambda: barrier(c), 2)
    data = dfl.portfolio(2, 3, 4, seed=4, dtype=D)
    layer = dfl.PortfolioLayer(data.covariance, mu=0.05)
    _check(layer, lambda: layer(data.costs), 2)
