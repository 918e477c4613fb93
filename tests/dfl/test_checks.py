"""The LP-data and cost-vector checks that LPOracle, QPTL and LogBarrierLP share name the
argument and say what was expected, the same way in all three."""

from __future__ import annotations

import pytest
import torch

from dxopt.dfl import QPTL, LogBarrierLP, LPOracle

LAYERS = [LPOracle, QPTL, LogBarrierLP]


@pytest.mark.parametrize("cls", LAYERS)
def test_lp_data_is_checked_once_for_all(cls):
    owner = cls.__name__
    with pytest.raises(ValueError, match=f"{owner}: A, b / G, h: give both"):
        cls(A=torch.ones(1, 3), lb=0.0)
    with pytest.raises(ValueError, match=f"{owner}: give the LP's constraints"):
        cls(lb=0.0, ub=1.0)
    if cls is not QPTL:  # QPTL hands its tensors to dxopt.qp.solve, which checks them
        with pytest.raises(ValueError, match="A: expected a 2-D matrix with 3 columns"):
            cls(A=torch.ones(2, 1, 3), b=torch.ones(1), lb=torch.zeros(3))
        with pytest.raises(ValueError, match="G: expected finite"):
            cls(G=torch.tensor([[1.0, float("inf"), 0.0]]), h=torch.ones(1), lb=0.0, ub=1.0)
        with pytest.raises(ValueError, match="h: expected numbers, got NaN"):
            cls(G=torch.ones(1, 3), h=torch.tensor([float("nan")]), lb=0.0, ub=1.0)
        with pytest.raises(ValueError, match=r"lb, ub: lb\[1\] = 2.0 > ub\[1\] = 1.0"):
            cls(lb=torch.tensor([0.0, 2.0, 0.0]), ub=1.0)


@pytest.mark.parametrize("cls", LAYERS)
def test_cost_vectors_are_checked_the_same_way(cls):
    layer = cls(lb=torch.zeros(3), ub=1.0)
    name = "c" if cls is LPOracle else "c_hat"
    with pytest.raises(ValueError, match=rf"{name}: expected shape \(3,\) or \(B, 3\)"):
        layer(torch.zeros(2, 4))
    with pytest.raises(TypeError, match=f"{name}: expected a floating"):
        layer(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=f"{name}: expected finite"):
        layer(torch.tensor([0.0, float("nan"), 1.0]))
