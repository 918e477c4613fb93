"""Per-row Jacobians and input derivatives against finite differences and torch.func."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, hessian, jacrev

from dxopt.natgrad import (
    Heat1D,
    Poisson2D,
    Poisson5D,
    RowwiseResidual,
    input_derivatives,
    residual_and_jacobian,
    tanh_mlp,
)

DT = torch.float64
PROBLEMS = [Poisson2D(), Heat1D(), Poisson5D()]


class _Wrapped(nn.Module):
    """Hides the Sequential so that the generic torch.func path is taken."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_forward_derivatives_match_torch_func_hessian(problem):
    model = tanh_mlp(problem.dim, (7, 5), seed=2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = problem.sample_interior(6, torch.Generator().manual_seed(0))
    u, grad, diag = input_derivatives(model, params, x)

    def point(xx):
        return functional_call(model, params, (xx.unsqueeze(0),)).reshape(())

    for i in range(6):
        assert torch.allclose(u[i], point(x[i]), atol=1e-14)
        assert torch.allclose(grad[i], jacrev(point)(x[i]), atol=1e-13)
        assert torch.allclose(diag[i], hessian(point)(x[i]).diagonal(), atol=1e-12)
    wrapped = _Wrapped(model)
    wparams = {k: v.detach() for k, v in wrapped.named_parameters()}
    for ours, generic in zip((u, grad, diag), input_derivatives(wrapped, wparams, x), strict=True):
        assert torch.allclose(ours, generic, atol=1e-12)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_rowwise_jacobian_matches_central_differences(problem):
    model = tanh_mlp(problem.dim, (6,), seed=3)
    residual = problem.residual(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    batch = problem.sample(9, 5, torch.Generator().manual_seed(1))
    r, jac = residual_and_jacobian(residual, params, batch, chunk_size=4)
    assert r.shape == (14,) and jac.shape == (14, sum(p.numel() for p in params.values()))
    assert torch.allclose(r, residual(params, batch), atol=1e-13)
    gen = torch.Generator().manual_seed(2)
    direction = {k: torch.randn(v.shape, generator=gen, dtype=DT) for k, v in params.items()}
    eps = 1e-6
    plus = residual({k: v + eps * direction[k] for k, v in params.items()}, batch)
    minus = residual({k: v - eps * direction[k] for k, v in params.items()}, batch)
    flat = torch.cat([direction[k].reshape(-1) for k in params])
    assert torch.allclose((plus - minus) / (2 * eps), jac @ flat, rtol=1e-7, atol=1e-8)


def test_generic_jacrev_path_agrees_with_rowwise_path():
    problem = Poisson2D()
    model = tanh_mlp(2, (5,), seed=4)
    rowwise = problem.residual(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    batch = problem.sample(7, 3, torch.Generator().manual_seed(3))
    r1, j1 = residual_and_jacobian(rowwise, params, batch)
    r2, j2 = residual_and_jacobian(lambda p, b: rowwise(p, b), params, batch, chunk_size=3)
    assert torch.allclose(r1, r2, atol=1e-14) and torch.allclose(j1, j2, atol=1e-12)


def test_rowwise_residual_weights_blocks_by_inverse_sqrt_size():
    def row(params, x):
        return params["w"] * x[:, 0]

    residual = RowwiseResidual([row, row], names=("a", "b"))
    params = {"w": torch.tensor(2.0, dtype=DT)}
    batch = (torch.ones(4, 1, dtype=DT), torch.ones(9, 1, dtype=DT))
    r = residual(params, batch)
    assert torch.allclose(r[:4], torch.full((4,), 2.0 / 2, dtype=DT))
    assert torch.allclose(r[4:], torch.full((9,), 2.0 / 3, dtype=DT))
    loss = 0.5 * float(r @ r)
    assert abs(loss - (0.5 * 4.0 + 0.5 * 4.0)) < 1e-12  # mean of squares per block


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("hidden", [(6,), (5, 4)])
def test_closed_form_mlp_jacobian_matches_vmap_grad(problem, hidden):
    model = tanh_mlp(problem.dim, hidden, seed=5)
    residual = problem.residual(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    batch = problem.sample(11, 6, torch.Generator().manual_seed(4))
    r_fast, j_fast = residual.residual_and_jacobian(params, batch)
    r_ref, j_ref = RowwiseResidual.residual_and_jacobian(residual, params, batch, chunk_size=5)
    assert torch.allclose(r_fast, r_ref, atol=1e-13)
    assert torch.allclose(j_fast, j_ref, atol=1e-12)
    # A model that is not a plain Sequential takes the vmap(grad) path and agrees too.
    wrapped = _Wrapped(model)
    wres = problem.residual(wrapped)
    wparams = {k: v.detach() for k, v in wrapped.named_parameters()}
    r_w, j_w = residual_and_jacobian(wres, wparams, batch)
    assert torch.allclose(r_w, r_ref, atol=1e-13) and torch.allclose(j_w, j_ref, atol=1e-12)
