"""``on_failure`` takes the shared vocabulary's "warn" and "ignore" (issue 35 item 11): the
failed samples are NaN with their status, the others are kept; "warn" warns once."""

from __future__ import annotations

import warnings

import pytest
import torch

import dxopt
import dxopt.qp as dqp


def _batch() -> tuple[torch.Tensor, ...]:
    P = torch.eye(2, dtype=torch.float64)
    q = torch.tensor([[-1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    G = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    h = torch.tensor([[-1.0, -1.0], [2.0, 2.0]], dtype=torch.float64)  # sample 0 infeasible
    return P, q, G, h


@pytest.mark.parametrize("solver", ["auto", "clarabel"])
def test_warn_returns_nan_rows_with_statuses_and_warns_once(solver: str) -> None:
    P, q, G, h = _batch()
    with pytest.warns(dxopt.DxoptWarning, match="0") as record:
        sol = dqp.solve(P, q, G=G, h=h, solver=solver, on_failure="warn")
    assert len([w for w in record if issubclass(w.category, dxopt.DxoptWarning)]) == 1
    assert sol.status == (dqp.QPStatus.INFEASIBLE, dqp.QPStatus.SOLVED)
    assert torch.isnan(sol.x[0]).all()
    assert torch.allclose(sol.x[1].detach(), torch.tensor([1.0, 0.0], dtype=torch.float64))
    (grad,) = torch.autograd.grad(sol.x[1].sum(), q)
    assert torch.isfinite(grad).all()


def test_ignore_is_silent_and_equals_nan() -> None:
    P, q, G, h = _batch()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sol = dqp.solve(P, q, G=G, h=h, on_failure="ignore")
    assert [str(w.message) for w in seen] == []
    ref = dqp.solve(P, q, G=G, h=h, on_failure="nan")
    assert sol.status == ref.status
    assert torch.equal(torch.nan_to_num(sol.x.detach(), 7.0), torch.nan_to_num(ref.x.detach(), 7.0))


def test_a_word_outside_the_vocabulary_is_refused_naming_the_choices() -> None:
    P, q, G, h = _batch()
    with pytest.raises(ValueError, match=r"on_failure: expected one of 'raise', 'nan', 'warn'"):
        dqp.solve(P, q, G=G, h=h, on_failure="skip")


def test_the_cvxpy_layer_takes_warn() -> None:
    cp = pytest.importorskip("cvxpy")
    x, lo = cp.Variable(1), cp.Parameter(1)
    problem = cp.Problem(cp.Minimize(cp.sum_squares(x)), [x >= lo, x <= 1])
    layer = dqp.CvxpyQPLayer(problem, parameters=[lo], variables=[x], on_failure="warn")
    with pytest.warns(dxopt.DxoptWarning):
        (out,) = layer(torch.tensor([[0.5], [2.0]], dtype=torch.float64))
    assert torch.allclose(out[0], torch.tensor([0.5], dtype=torch.float64))
    assert torch.isnan(out[1]).all()
