"""One canonical variable (issue 35, item 7): the map must place the right-hand sides of
equality and inequality rows when a matrix row and an offset have the same width (n == 1).
Each case against CVXPY's own solution and against finite differences (closed forms where
there is one), and cvxpylayers' infeasible and unbounded examples as statuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("cvxpy")

import cvxpy as cp

from dxopt import Status
from dxopt.qp import CvxpyQPLayer
from dxopt.qp.problem.types import QPSolveError

from ._central import central_quotient

F64 = torch.float64
CLARABEL_TIGHT = {"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12}


def _scalar_cases():  # type: ignore[no-untyped-def]
    """(name, problem, parameters, outputs, values, d output / d parameter in closed form)."""
    x, p = cp.Variable(), cp.Parameter(name="p")
    lower = x >= p
    yield ("x >= p, active", cp.Problem(cp.Minimize(cp.square(x)), [lower]), [p], [x, lower],
           [1.5], [1.0, 2.0])  # x = p, dual = 2p: slopes 1 and 2  # fmt: skip
    yield ("x >= p, inactive", cp.Problem(cp.Minimize(cp.square(x)), [lower]), [p], [x, lower],
           [-1.5], [0.0, 0.0])  # fmt: skip
    y, r = cp.Variable(), cp.Parameter(name="r")
    equal = y == r
    # min y^2 s.t. y == r: y = r, the multiplier -2r (stationarity 2y + mu = 0)
    yield ("x == p", cp.Problem(cp.Minimize(cp.square(y)), [equal]), [r], [y, equal], [0.7],
           [1.0, -2.0])  # fmt: skip
    z, lo, hi = cp.Variable(1), cp.Parameter(1, name="lo"), cp.Parameter(1, name="hi")
    # min (z - 3)^2 s.t. lo <= z <= hi with hi = 2 active: z = hi
    box = [z >= lo, z <= hi]
    yield ("lo <= x <= hi (x of shape (1,))",
           cp.Problem(cp.Minimize(cp.sum_squares(z - 3.0)), box), [lo, hi], [z, box[1]],
           [[-1.0], [2.0]], None)  # fmt: skip


@pytest.mark.parametrize("case", list(_scalar_cases()), ids=lambda c: c[0])
def test_one_variable_matches_cvxpy_and_finite_differences(case) -> None:  # type: ignore[no-untyped-def]
    name, problem, parameters, outputs, values, slopes = case
    layer = CvxpyQPLayer(problem, parameters, outputs, backward="kkt")
    tensors = [torch.tensor(v, dtype=F64) for v in values]
    for parameter, value in zip(parameters, values):
        parameter.value = np.asarray(value, dtype=np.float64)
    problem.solve(solver=cp.CLARABEL, **CLARABEL_TIGHT)
    leaves = [t.clone().requires_grad_() for t in tensors]
    results = layer(*leaves)
    references = [o.value if isinstance(o, cp.Variable) else o.dual_value for o in outputs]
    for mine, theirs in zip(results, references):
        assert mine.shape == np.shape(theirs)
        np.testing.assert_allclose(mine.detach().numpy(), theirs, atol=1e-7)
    for k, output in enumerate(results):
        grads = torch.autograd.grad(output.sum(), leaves, retain_graph=True)
        for j, t in enumerate(tensors):

            def f(v: np.ndarray, j: int = j, k: int = k) -> float:
                args = [torch.tensor(v) if i == j else s for i, s in enumerate(tensors)]
                with torch.no_grad():
                    return float(layer(*args)[k].sum())

            quotient = central_quotient(f, t.numpy().astype(np.float64), np.ones(t.shape))
            assert quotient is not None, f"{name}: a kink at the test point"
            assert abs(float(grads[j].sum()) - quotient) <= 1e-6
            if slopes is not None:  # one parameter: the closed form too
                assert abs(float(grads[j].sum()) - slopes[k]) <= 1e-9


def test_cvxpylayers_infeasible_example_is_a_status() -> None:
    """cvxpylayers' own test: min p s.t. x >= 1, x <= -1 (a SolverError there)."""
    x, param = cp.Variable(1), cp.Parameter(1)
    problem = cp.Problem(cp.Minimize(param), [x >= 1, x <= -1])
    one = torch.ones(1, dtype=F64)
    with pytest.raises(QPSolveError, match="infeasible"):
        CvxpyQPLayer(problem, [param], [x])(one)
    result = CvxpyQPLayer(problem, [param], [x], on_failure="nan").solve(one)
    assert result.status == (Status.INFEASIBLE,)
    assert bool(torch.isnan(result.values[0]).all())


def test_cvxpylayers_unbounded_example_is_a_status() -> None:
    """cvxpylayers' own test: min x s.t. x <= p (a SolverError there)."""
    x, param = cp.Variable(1), cp.Parameter(1)
    problem = cp.Problem(cp.Minimize(x), [x <= param])
    one = torch.ones(1, dtype=F64)
    with pytest.raises(QPSolveError, match="unbounded"):
        CvxpyQPLayer(problem, [param], [x])(one)
    result = CvxpyQPLayer(problem, [param], [x], on_failure="nan").solve(one)
    assert result.status == (Status.UNBOUNDED,)
    assert bool(torch.isnan(result.values[0]).all())
