"""The default dense/sparse route of CvxpyQPLayer (issue 35 item 9): a constrained MPC with
420 canonical variables goes dense (its sparse backward was 125x slower), a large sparse
problem goes sparse. Not timed: the rule itself is checked on the problem shapes."""

from __future__ import annotations

import pytest

pytest.importorskip("cvxpy")

import cvxpy as cp

from dxopt.qp import CvxpyQPLayer
from dxopt.qp.frontend._layer import SPARSE_MIN_KKT

from ._problems import mpc


def test_constrained_mpc_of_horizon_30_routes_dense() -> None:
    case = mpc(horizon=30, nx=8, nu=6)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs[:1])
    c = layer.compiled
    assert c.n >= 420  # the reported shape: 30 * (8 + 6) = 420 states and inputs at least
    assert c.n + c.p + c.m <= SPARSE_MIN_KKT
    assert layer.sparse is False
    assert CvxpyQPLayer(case.problem, case.parameters, case.outputs[:1], sparse=True).sparse


def test_a_large_sparse_problem_routes_sparse() -> None:
    n = 1100
    x, y = cp.Variable(n), cp.Parameter(n)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [x >= 0, cp.diff(x) <= 1])
    layer = CvxpyQPLayer(problem, [y], [x], eliminate=False)
    c = layer.compiled
    assert c.n + c.p + c.m > SPARSE_MIN_KKT
    assert layer.sparse is True
