"""An empty batch (issue 35, item 8): parameters of shape (0, ...) give outputs of shape
(0, ...) and gradients of the parameters' shapes (zero for the shared ones)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cvxpy")

from dxopt.qp import CvxpyQPLayer

from ._problems import box_least_squares, simplex

F64 = torch.float64


@pytest.mark.parametrize("sparse", [False, True])
def test_empty_batch_gives_empty_outputs_and_gradients(sparse: bool) -> None:
    case = simplex(n=4, seed=3)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs, sparse=sparse)
    y = torch.zeros(0, 4, dtype=F64, requires_grad=True)
    result = layer.solve(y)
    x, total, nonneg = result.values
    assert x.shape == (0, 4) and total.shape == (0,) and nonneg.shape == (0, 4)
    assert result.status == ()
    (grad,) = torch.autograd.grad(
        x.sum() + nonneg.sum(),
        y,
    )
    assert grad.shape == (0, 4)


@pytest.mark.parametrize("sparse", [False, True])
def test_empty_batch_with_a_shared_parameter(sparse: bool) -> None:
    """F shared (unbatched), g an empty batch: outputs (0, n), dL/dF zero of F's shape."""
    case = box_least_squares(n=5, k=8, seed=2)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs[:1], sparse=sparse)
    F = case.values[0].clone().requires_grad_()
    g = torch.zeros(0, 8, dtype=F64, requires_grad=True)
    (x,) = layer(F, g)
    assert x.shape == (0, 5)
    grads = torch.autograd.grad(
        x.sum(),
        [F, g],
    )
    assert grads[0].shape == F.shape and not grads[0].any()
    assert grads[1].shape == (0, 8)
