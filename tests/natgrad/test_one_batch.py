"""One step sees one batch (issue 35, items 12-14): ENGD's line search replays the step's RNG
state and leaves module buffers as after one forward; RowwiseResidual's per-point contract is
checked; BatchNorm in train mode, a non-vmappable residual and a batch that requires grad give
clear messages or no warning."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dxopt.natgrad import ENGD, SNG, SPRING, RowwiseResidual, tanh_mlp

PI = math.pi
N_INTERIOR = 24


def _poisson_1d_rows(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """-u'' = pi^2 sin(pi x) on (0, 1), u(0) = u(1) = 0, rows scaled by 1/sqrt(N_b)."""
    x = x.detach().requires_grad_(True)
    u = model(x)
    (du,) = torch.autograd.grad(u.sum(), x, create_graph=True)
    (d2u,) = torch.autograd.grad(du.sum(), x, create_graph=True)
    interior = (-d2u - PI**2 * torch.sin(PI * x)).reshape(-1) / math.sqrt(x.shape[0])
    xb = torch.tensor([[0.0], [1.0]], dtype=x.dtype)
    return torch.cat([interior, model(xb).reshape(-1) / math.sqrt(2)])


def _relative_l2(model: nn.Module) -> float:
    x = torch.linspace(0, 1, 201, dtype=torch.float64).reshape(-1, 1)
    with torch.no_grad():
        ref = torch.sin(PI * x)
        return float(torch.linalg.vector_norm(model(x) - ref) / torch.linalg.vector_norm(ref))


def _run_poisson(*, fresh: bool, steps: int, line_search: str) -> nn.Module:
    """ENGD on the 1-D Poisson PINN with points drawn from the global RNG, either inside the
    closure (every call draws) or once per step outside it."""
    torch.manual_seed(0)
    model = tanh_mlp(1, (16,), seed=0)
    opt = ENGD(model.parameters(), damping=1e-8, line_search=line_search, line_search_max_iter=12)
    fixed: list[torch.Tensor] = []

    def closure() -> torch.Tensor:
        x = torch.rand(N_INTERIOR, 1, dtype=torch.float64) if fresh else fixed[-1]
        return _poisson_1d_rows(model, x)

    for _ in range(steps):
        if not fresh:
            fixed.append(torch.rand(N_INTERIOR, 1, dtype=torch.float64))
        opt.step(closure)
    return model


@pytest.mark.parametrize("line_search", ["grid", "descending"])
def test_engd_closure_drawing_fresh_points_steps_as_with_the_points_fixed_per_step(line_search):
    # Before the fix every line-search trial point saw new collocation points (rel. L2 2e-3
    # after 30 steps against 7e-6 with fixed points). Now a closure that draws its points
    # from the global RNG takes exactly the steps of one that is given them per step, and the
    # RNG moves on as after one draw per step.
    steps = 12
    fresh = _run_poisson(fresh=True, steps=steps, line_search=line_search)
    after_fresh = torch.rand(3)
    fixed = _run_poisson(fresh=False, steps=steps, line_search=line_search)
    after_fixed = torch.rand(3)
    for p, q in zip(fresh.parameters(), fixed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    assert torch.equal(after_fresh, after_fixed)
    assert _relative_l2(fixed) < 1e-3 < 0.4 < _relative_l2(tanh_mlp(1, (16,), seed=0))


def _bn_model() -> nn.Sequential:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Dropout(0.2), nn.Linear(6, 1)
    ).double()


@pytest.mark.parametrize("cls", [ENGD, SNG, SPRING])
def test_a_step_updates_batchnorm_running_statistics_once(cls):
    # ENGD's grid line search called the closure 32 times per step and each call moved the
    # running statistics (num_batches_tracked went up by 32). Now: as after one forward.
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(40, generator=gen, dtype=torch.float64)
    model = _bn_model()
    reference = copy.deepcopy(model)
    rng = torch.get_rng_state()
    reference(x)  # one train-mode forward (dropout draws from the global RNG)
    torch.set_rng_state(rng)
    opt = cls(model.parameters())
    report = opt.step(lambda: model(x).reshape(-1) - y)
    assert report.cost.forwards == (31 if cls is ENGD else 0)
    bn, ref = model[1], reference[1]
    assert int(bn.num_batches_tracked) == 1
    torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=1e-13, atol=0)
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=1e-13, atol=0)


# -- item 13: the RowwiseResidual contract ---------------------------------------------------
def _net(dtype: torch.dtype = torch.float64) -> nn.Sequential:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).to(dtype)


def test_a_row_function_reading_the_whole_batch_is_refused():
    # out - out.mean() is 0 on every single point: ENGD used to report loss 0.0 and stand still.
    model = _net()
    x = torch.randn(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def centred(p, xx):
        out = functional_call(model, p, (xx,)).reshape(-1)
        return out - out.mean()

    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"block 'centred' .* not per-point.*plain residual"):
        ENGD(model, RowwiseResidual([centred], names=["centred"])).step((x,))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_a_small_batch_dependence_is_refused_too():
    # 1e-6 of the batch mean: far above round-off (the scale is the rows' size), still refused.
    model = _net()
    x = torch.randn(30, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def leaky(p, xx):
        out = functional_call(model, p, (xx,)).reshape(-1)
        return out - xx[:, 0] + 1e-6 * out.mean()

    with pytest.raises(ValueError, match="not per-point"):
        RowwiseResidual([leaky]).residual_and_jacobian(dict(model.named_parameters()), (x,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_contract_check_does_not_refuse_an_exact_fit(dtype):
    # At an exact fit every row is round-off: a tolerance relative to |r| would refuse here.
    model = _net(dtype)
    x = torch.randn(64, 2, generator=torch.Generator().manual_seed(2), dtype=dtype)
    with torch.no_grad():
        target = model(x).reshape(-1)
    data = torch.cat([x, target[:, None]], dim=1)

    def fit(p, xx):
        return functional_call(model, p, (xx[:, :2],)).reshape(-1) - xx[:, 2]

    params = {n: p.detach() for n, p in model.named_parameters()}
    r, jac = RowwiseResidual([fit]).residual_and_jacobian(params, (data,))
    assert float(r.abs().max()) <= 1e3 * torch.finfo(dtype).eps
    assert float(jac.abs().max()) > 0.1


# -- item 14: clear messages, no per-step warning ---------------------------------------------
def test_batchnorm_in_train_mode_with_a_residual_function_is_a_clear_error():
    model = _bn_model()
    x = torch.randn(20, 3, dtype=torch.float64)

    def residual(p, batch):
        return functional_call(model, p, (batch,)).reshape(-1)

    opt = ENGD(model, residual)
    with pytest.raises(ValueError, match=r"'1' \(BatchNorm1d\) is in train mode.*model\.eval\(\)"):
        opt.step(x)
    model.eval()
    assert opt.step(x).loss > 0
    assert int(model[1].num_batches_tracked) == 0


def test_a_residual_that_vmap_cannot_run_gets_a_clear_error_in_the_grid_search():
    model = _net()
    x = torch.randn(20, 2, dtype=torch.float64)

    def residual(p, batch):
        out = functional_call(model, p, (batch,)).reshape(-1)
        return out * 2 if out.sum().item() > 1e9 else out - batch[:, 0]

    with pytest.raises(ValueError, match=r"vmap.*\.item\(\).*line_search='descending'"):
        ENGD(model, residual).step(x)
    report = ENGD(model, residual, line_search="descending").step(x)
    assert report.step_size > 0


@pytest.mark.parametrize("line_search", ["grid", "descending"])
def test_no_requires_grad_to_scalar_warning_per_step(line_search):
    # A PINN batch often carries requires_grad=True; the grid losses kept that graph and
    # float() warned on every step.
    model = tanh_mlp(2, (8,), seed=0)
    x = torch.rand(30, 2, dtype=torch.float64).requires_grad_(True)

    def row(p, xx):
        return functional_call(model, p, (xx,)).reshape(-1) - xx[:, 0]

    opt = ENGD(model, RowwiseResidual([row]), line_search=line_search)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            opt.step((x,))
    assert [str(w.message) for w in caught if "requires_grad" in str(w.message)] == []
