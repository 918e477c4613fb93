"""A cone problem refused by CvxpyQPLayer names the exact atom or cone constraint and where
it sits (issue 35 item 11)."""

from __future__ import annotations

import pytest

pytest.importorskip("cvxpy")

import cvxpy as cp

from dxopt.qp import CvxpyQPLayer


def _refusal(objective, constraints) -> str:  # type: ignore[no-untyped-def]
    x_, y_ = objective
    problem = cp.Problem(y_, constraints)
    with pytest.raises(ValueError) as info:
        CvxpyQPLayer(problem, list(problem.parameters()), [x_])
    return str(info.value)


def test_the_refusal_names_the_atom_and_its_place() -> None:
    x, y = cp.Variable(3), cp.Parameter(3)
    base = cp.Minimize(cp.sum_squares(x - y))
    msg = _refusal((x, base), [x >= 0, cp.norm(x) <= 1])
    assert "norm2 in constraint 1" in msg and "dxopt.frontend.CvxpyLayer" in msg
    assert "constraint 0" not in msg  # the affine one is not blamed
    assert "entr in the objective" in _refusal(
        (x, cp.Minimize(-cp.sum(cp.entr(x)) + y @ x)), [cp.sum(x) == 1]
    )
    assert "log_sum_exp in the objective" in _refusal(
        (x, cp.Maximize(-cp.log_sum_exp(x) + y @ x)), [x <= 1]
    )
    assert "a SOC cone in constraint 0" in _refusal((x, base), [cp.SOC(cp.sum(x), x)])
    X = cp.Variable((2, 2), symmetric=True)
    msg = _refusal((x, base), [x <= 1, X >> 0, cp.trace(X) == cp.sum(x)])
    assert "a PSD cone in constraint 1" in msg
