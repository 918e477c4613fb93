"""CvxpyQPLayer's options are QPOptions' fields, written once: its signature lists them after
its own arguments, a keyword that is not an option is a TypeError naming it, and the options
reach the QPLayer it holds."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import dxopt.qp as dqp
from dxopt.qp.problem.options import QPOptions

cp = pytest.importorskip("cvxpy")


def _simplex() -> tuple[object, object, object]:
    x, y = cp.Variable(3), cp.Parameter(3)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.sum(x) == 1, x >= 0])
    return problem, y, x


def test_the_signature_lists_every_option_once() -> None:
    params = inspect.signature(dqp.CvxpyQPLayer).parameters
    own = ["problem", "parameters", "variables", "sparse", "eliminate"]
    assert list(params) == [*own, *QPOptions.names()]
    defaults = {f.name: f.default for f in dataclasses.fields(QPOptions)}
    assert {k: params[k].default for k in QPOptions.names()} == defaults
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in QPOptions.names())


def test_unknown_keywords_are_named_and_options_reach_the_layer() -> None:
    problem, y, x = _simplex()
    with pytest.raises(TypeError, match=r"CvxpyQPLayer: unexpected keyword argument\(s\) 'eps'"):
        dqp.CvxpyQPLayer(problem, parameters=[y], variables=[x], eps=1e-6)
    with pytest.raises(TypeError, match=r"QPLayer: unexpected keyword argument\(s\) 'tol'"):
        dqp.QPLayer(tol=1e-6)
    with pytest.raises(ValueError, match="on_failure: expected one of"):
        dqp.CvxpyQPLayer(problem, parameters=[y], variables=[x], on_failure="loud")
    layer = dqp.CvxpyQPLayer(problem, parameters=[y], variables=[x], solver="daqp", eps_abs=1e-10)
    assert layer.qp.qp_options == QPOptions(solver="daqp", eps_abs=1e-10)
    (x_star,) = layer(torch.tensor([0.5, 0.2, -1.0], dtype=torch.float64))
    # projection onto the simplex: x = max(y - t, 0) with t = -0.15 (0.65 + 0.35 = 1)
    torch.testing.assert_close(x_star, torch.tensor([0.65, 0.35, 0.0], dtype=torch.float64))
