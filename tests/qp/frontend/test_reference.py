"""CvxpyQPLayer against cvxpylayers (an independent implementation: cone program + diffcp) and
against kink-aware central/one-sided finite differences, on cvxpylayers' QP examples.

The reference runs SCS at 1e-10 with diffcp's dense derivative (``_ref_cvxpylayers``):
measured there to reproduce known QP solutions to <= 3.1e-9 and exact gradients to <= 2.6e-9
(relative). Tolerances here: outputs within ``SOLUTION_ATOL`` of the reference, gradients of a
random linear functional of every output (variables and multipliers) within ``GRADIENT_RTOL``
for each parameter, and the layer's gradient equal to stable one-sided difference quotients
along a random direction per parameter: central differences at three steps, a verdict only
when they agree (a kink between ``x - t d`` and ``x + t d`` or solver noise makes them move:
no verdict) and the two one-sided quotients at the smallest step agree with them too (no
kink at ``x``); every parameter must get a verdict, so the check cannot pass vacuously.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

pytest.importorskip("cvxpy")
pytest.importorskip("cvxpylayers")

from _ref_cvxpylayers import REFERENCE_SOLVER_ARGS
from _ref_problems import relative_error

from dxopt.qp import CvxpyQPLayer

from ._central import central_quotient
from ._problems import Case, box_least_squares, mpc, optnet, simplex

SOLUTION_ATOL = 1e-7
GRADIENT_RTOL = {"kkt": 1e-7, "penalty": 1.1e-6}
CASES = {"optnet": optnet, "box_lsq": box_least_squares, "simplex": simplex, "mpc": mpc}


def _weights(outputs: tuple[Tensor, ...], seed: int) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outputs]


def _loss(outputs: tuple[Tensor, ...], weights: list[Tensor]) -> Tensor:
    return sum((w * o).sum() for w, o in zip(weights, outputs))  # type: ignore[return-value]


def _grads(layer: torch.nn.Module, values: list[Tensor], weights: list[Tensor] | None, **kw):
    leaves = [v.clone().requires_grad_() for v in values]
    outputs = layer(*leaves, **kw)
    if weights is None:
        weights = _weights(outputs, 5)
    grads = torch.autograd.grad(_loss(outputs, weights), leaves, allow_unused=True)
    grads = tuple(torch.zeros_like(v) if g is None else g for v, g in zip(values, grads))
    return [o.detach() for o in outputs], grads, weights


def _reference_layer(case: Case):
    import cvxpy as cp
    from cvxpylayers.torch import CvxpyLayer

    outputs = [o if isinstance(o, cp.Variable) else o.dual_variables[0] for o in case.outputs]
    return CvxpyLayer(case.problem, parameters=case.parameters, variables=outputs)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_cvxpylayers(name: str, backward: str) -> None:
    case = CASES[name](batch=3, seed=1)
    ours = CvxpyQPLayer(case.problem, case.parameters, case.outputs, backward=backward)
    ref = _reference_layer(case)
    mine, my_grads, weights = _grads(ours, case.values, None)
    theirs, their_grads, _ = _grads(ref, case.values, weights, solver_args=REFERENCE_SOLVER_ARGS)
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) <= SOLUTION_ATOL
    for parameter, a, b in zip(case.parameters, my_grads, their_grads):
        assert relative_error(a, b, floor=1.0) <= GRADIENT_RTOL[backward], parameter.name()


@pytest.mark.parametrize("name", list(CASES))
def test_matches_cvxpy_duals(name: str) -> None:
    """Variables and multipliers equal CVXPY's own ``value`` / ``constraint.dual_value``."""
    from ._problems import cvxpy_solution

    case = CASES[name](seed=2)
    outputs = CvxpyQPLayer(case.problem, case.parameters, case.outputs)(*case.values)
    for mine, theirs in zip(outputs, cvxpy_solution(case, case.values)):
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine.numpy(), theirs, atol=1e-7)


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_finite_differences(name: str, backward: str) -> None:
    case = CASES[name](seed=3)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs, backward=backward)
    _, grads, weights = _grads(layer, case.values, None)
    rng = np.random.default_rng(0)
    verdicts = 0
    for i, (value, grad) in enumerate(zip(case.values, grads)):
        direction = rng.standard_normal(tuple(value.shape))

        def f(v: np.ndarray, i: int = i) -> float:
            values = list(case.values)
            values[i] = torch.tensor(v)
            with torch.no_grad():
                return float(_loss(layer(*values), weights))

        quotient = central_quotient(f, value.numpy(), direction)
        analytic = float((grad * torch.tensor(direction)).sum())
        if quotient is not None:
            assert abs(analytic - quotient) <= 1e-6 * (1 + abs(analytic)), case.parameters[i]
            verdicts += 1
    assert verdicts == len(case.values)  # stable active sets: every parameter is judged
