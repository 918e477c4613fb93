"""SNG, SPRING and ENGD as torch.optim.Optimizer, and the natgrad defects of issue 11.

Each test fails on the code before the change: param_groups / state_dict (SPRING momentum
included) / LR schedulers / closure steps; frozen parameters skipped (was a KeyError in the
zoo's closed-form Jacobian); a float32 model with a float64 problem named in a TypeError (was a
raw matmul RuntimeError); a plain-function residual shaped like a row-wise one warns towards
RowwiseResidual.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dxopt.natgrad import (
    ENGD,
    SNG,
    SPRING,
    Poisson2D,
    RowwiseResidual,
    residual_and_jacobian,
    tanh_mlp,
)

DT = torch.float64


def _regression(n: int = 40, d: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=DT)
    y = torch.randn(n, generator=gen, dtype=DT)
    model = nn.Linear(d, 1, dtype=DT)
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, d, generator=gen, dtype=DT))
        model.bias.zero_()
    return model, x, y


def _pinn_batch(seed: int = 0):
    return Poisson2D().sample(48, 16, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cls", [SNG, SPRING, ENGD])
def test_is_a_torch_optimizer_with_hyperparameters_in_param_groups(cls):
    model = tanh_mlp(2, (8,))
    opt = cls(model, Poisson2D().residual(model), damping=1e-6)
    assert isinstance(opt, torch.optim.Optimizer)
    (group,) = opt.param_groups
    assert group["damping"] == 1e-6 and "lr" in group
    assert [p for p in group["params"]] == list(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="exactly one parameter group"):
        opt.add_param_group({"params": [torch.zeros(2, dtype=DT, requires_grad=True)]})


def test_step_lr_scheduler_sets_the_step_size():
    model, x, y = _regression()
    opt = SNG(model, lambda p, idx: functional_call(model, p, (x[idx],)).reshape(-1) - y[idx])
    opt.lr = 0.4
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sizes = []
    for _ in range(3):
        sizes.append(opt.step(torch.arange(8)).step_size)  # no norm cap: step size = lr
        sched.step()
    assert sizes == pytest.approx([0.4, 0.2, 0.1], rel=0, abs=1e-15)


def test_spring_momentum_survives_state_dict_round_trip():
    model = tanh_mlp(2, (8,), seed=1)
    problem = Poisson2D()
    opt = SPRING(model, problem.residual(model), lr=0.3, damping=1e-6, norm_cap=1e-2)
    for k in range(3):
        opt.step(_pinn_batch(k))
    saved = copy.deepcopy(opt.state_dict())
    twin = copy.deepcopy(model)
    resumed = SPRING(twin, problem.residual(twin), lr=1.0, damping=1.0, norm_cap=None)
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == 0.3 and resumed.param_groups[0]["damping"] == 1e-6
    torch.testing.assert_close(resumed.phi, opt.phi, rtol=0, atol=0)
    assert float(opt.phi.norm()) > 0 and resumed.steps == 3
    # a fresh optimizer without the momentum takes a different step from the same point.
    fresh_model = copy.deepcopy(model)
    fresh = SPRING(fresh_model, problem.residual(fresh_model), lr=0.3, damping=1e-6, norm_cap=1e-2)
    for k in range(3, 5):
        opt.step(_pinn_batch(k))
        resumed.step(_pinn_batch(k))
        fresh.step(_pinn_batch(k))
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(not torch.equal(a, c) for a, c in zip(model.parameters(), fresh_model.parameters()))


@pytest.mark.parametrize("cls", [SNG, SPRING, ENGD])
def test_closure_step_equals_batch_step(cls):
    kwargs = {"damping": 1e-6} if cls is ENGD else {"lr": 0.5, "damping": 1e-6}
    model_a, x, y = _regression()
    model_b = copy.deepcopy(model_a)

    def residual(p, idx):
        return functional_call(model_a, p, (x[idx],)).reshape(-1) - y[idx]

    batch_opt = cls(model_a, residual, **kwargs)
    closure_opt = cls(model_b.parameters(), **kwargs)  # torch style: parameters + closure
    idx = torch.arange(0, 40, 3)
    for _ in range(2):
        ra = batch_opt.step(idx)
        rb = closure_opt.step(lambda: model_b(x[idx]).reshape(-1) - y[idx])
        assert rb.loss == pytest.approx(ra.loss, rel=1e-12)
        assert rb.step_size == ra.step_size and rb.cost.rows == ra.cost.rows == len(idx)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_closure_engd_solves_linear_least_squares_in_one_step():
    model, x, y = _regression(n=30, d=4)
    opt = ENGD(model.parameters(), damping=0.0)
    report = opt.step(lambda: model(x).reshape(-1) - y)
    design = torch.cat([x, torch.ones(30, 1, dtype=DT)], dim=1)
    solution = torch.linalg.lstsq(design, y).solution
    assert report.step_size == 1.0
    torch.testing.assert_close(
        torch.cat([model.weight.reshape(-1), model.bias]).detach(), solution, atol=1e-12, rtol=0
    )


def test_closure_and_batch_misuse_are_explained():
    model, x, _ = _regression()
    opt = SNG(model.parameters())
    with pytest.raises(TypeError, match="built without a residual function"):
        opt.step(torch.arange(4))
    with pytest.raises(ValueError, match="closure: expected it to return the residual as a 1-D"):
        opt.step(lambda: model(x))
    with pytest.raises(ValueError, match="carries no autograd graph"):
        opt.step(lambda: model(x).reshape(-1).detach())
    with pytest.raises(TypeError, match="residual function needs the parameters' names"):
        SNG(model.parameters(), lambda p, b: p["weight"].reshape(-1))


@pytest.mark.parametrize("cls", [SNG, SPRING, ENGD])
def test_frozen_parameter_is_skipped(cls):
    problem = Poisson2D()
    model = tanh_mlp(2, (8,), seed=2)
    model[0].bias.requires_grad_(False)
    frozen = model[0].bias.detach().clone()
    batch = _pinn_batch(3)
    residual = problem.residual(model)
    opt = cls(model, residual, damping=1e-6)
    names = list(opt.params())
    assert "0.bias" not in names
    # the closed-form Jacobian equals the vmap(grad) one, restricted to the trainable columns.
    r, jac = residual_and_jacobian(residual, opt.params(), batch)
    full_params = {n: p.detach() for n, p in model.named_parameters()}
    r_all, jac_all = RowwiseResidual.residual_and_jacobian(residual, full_params, batch)
    keep = torch.cat(
        [
            torch.full((p.numel(),), n != "0.bias", dtype=torch.bool)
            for n, p in model.named_parameters()
        ]
    )
    torch.testing.assert_close(r, r_all)
    torch.testing.assert_close(jac, jac_all[:, keep], rtol=1e-10, atol=1e-12)
    report = opt.step(batch)
    assert report.cost.rows == 64
    assert torch.equal(model[0].bias, frozen)


def test_float32_model_with_float64_problem_names_both_dtypes():
    model = tanh_mlp(2, (8,), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"torch\.float32.*Poisson2D problem is torch\.float64"):
        Poisson2D().residual(model)
    # a generic residual: the batch's dtype is checked against the parameters'.
    points = torch.rand(8, 2, dtype=DT)
    opt = SNG(model, lambda p, x: functional_call(model, p, (x,)).reshape(-1), damping=1e-2)
    with pytest.raises(
        TypeError, match=r"batch: holds torch\.float64 .* parameters are torch\.float32"
    ):
        opt.step(points)


def test_plain_residual_over_points_points_to_rowwise_residual():
    problem = Poisson2D()
    model = tanh_mlp(2, (8,))
    rowwise = problem.residual(model)

    def plain(params, batch):  # the same rows, as one function
        return rowwise(params, batch)

    batch = _pinn_batch(4)
    with pytest.warns(
        UserWarning, match="wrap the per-block row functions in dxopt.natgrad.RowwiseResidual"
    ):
        SNG(model, plain, damping=1e-6).step(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SNG(copy.deepcopy(model), rowwise, damping=1e-6).step(batch)


def test_renamed_options_still_work_for_one_release():
    model, x, y = _regression()

    def residual(p, idx):
        return functional_call(model, p, (x[idx],)).reshape(-1) - y[idx]

    with pytest.warns(DeprecationWarning, match="'grid_size' is renamed 'line_search_max_iter'"):
        opt = ENGD(model, residual, grid_size=5)
    assert opt.param_groups[0]["line_search_max_iter"] == 5
    with (
        pytest.warns(DeprecationWarning, match="'on_fallback' is renamed 'on_failure'"),
        pytest.warns(DeprecationWarning, match="'report' is renamed 'ignore'"),
    ):
        assert SNG(model, residual, on_fallback="report").on_failure == "ignore"
    with pytest.warns(DeprecationWarning, match="'model' is renamed 'params'"):
        assert SNG(model=model, residual=residual).model is model


def test_closure_jacobian_falls_back_to_rows_when_batching_fails(monkeypatch):
    model_a, x, y = _regression()
    model_b = copy.deepcopy(model_a)
    ref = SNG(model_a.parameters(), lr=0.5, damping=1e-6)
    ref.step(lambda: model_a(x).reshape(-1) - y)
    grad = torch.autograd.grad

    def no_batching(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            raise RuntimeError("no batching rule")
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", no_batching)
    SNG(model_b.parameters(), lr=0.5, damping=1e-6).step(lambda: model_b(x).reshape(-1) - y)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
