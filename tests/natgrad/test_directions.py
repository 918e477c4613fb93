"""Unit checks of the direction formulas and of the optimizers on linear least squares."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dxopt.natgrad import (
    ENGD,
    SNG,
    CholeskyFallbackError,
    gauss_newton_direction,
    kernel_direction,
    spring_direction,
)

DT = torch.float64


def _system(rows: int, cols: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen, dtype=DT), torch.randn(
        rows, generator=gen, dtype=DT
    )


@pytest.mark.parametrize(("rows", "cols"), [(6, 11), (11, 6)])
def test_kernel_and_parameter_forms_agree(rows, cols):
    jac, r = _system(rows, cols)
    lam = 0.37
    kernel = kernel_direction(jac, r, damping=lam).direction
    param = torch.linalg.solve(jac.T @ jac + lam * torch.eye(cols, dtype=DT), jac.T @ r)
    gn = gauss_newton_direction(jac, r, damping=lam).direction
    assert torch.allclose(kernel, param, rtol=1e-10, atol=1e-12)
    assert torch.allclose(gn, param, rtol=1e-10, atol=1e-12)


def test_small_damping_interpolates_rows_with_minimum_norm():
    jac, r = _system(5, 12, seed=1)
    d = kernel_direction(jac, r, damping=1e-12).direction
    assert float((jac @ d - r).abs().max()) < 1e-9
    assert torch.allclose(d, torch.linalg.pinv(jac) @ r, atol=1e-9)


def test_scaling_rows_by_c_equals_damping_over_c_squared():
    jac, r = _system(5, 9, seed=2)
    c, lam = 3.0, 0.2
    scaled = kernel_direction(c * jac, c * r, damping=lam).direction
    rescaled = kernel_direction(jac, r, damping=lam / c**2).direction
    assert torch.allclose(scaled, rescaled, rtol=1e-11, atol=1e-13)


def test_spring_direction_is_momentum_plus_projected_correction():
    jac, r = _system(4, 10, seed=3)
    prev = torch.randn(10, generator=torch.Generator().manual_seed(9), dtype=DT)
    mu, lam = 0.9, 1e-3
    phi = spring_direction(jac, r, prev, damping=lam, momentum=mu).direction
    kernel = jac @ jac.T + lam * torch.eye(4, dtype=DT)
    expected = mu * prev + jac.T @ torch.linalg.solve(kernel, r - mu * jac @ prev)
    assert torch.allclose(phi, expected, rtol=1e-12, atol=1e-13)


class _Linear(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(n, dtype=DT))


def _linear_residual(a: torch.Tensor, b: torch.Tensor):
    def residual(params, batch):
        rows = batch
        return a[rows] @ params["theta"] - b[rows]

    return residual


def test_gauss_newton_with_unit_step_solves_linear_model_in_one_step():
    a, _ = _system(30, 8, seed=4)
    theta_star = torch.randn(8, generator=torch.Generator().manual_seed(5), dtype=DT)
    b = a @ theta_star
    model = _Linear(8)
    opt = ENGD(model, _linear_residual(a, b), damping=0.0)
    report = opt.step(torch.arange(30))
    assert report.step_size == 1.0
    assert torch.allclose(model.theta.detach(), theta_star, atol=1e-12)


def test_sng_on_consistent_system_converges_like_randomized_kaczmarz():
    a, _ = _system(40, 10, seed=6)
    theta_star = torch.randn(10, generator=torch.Generator().manual_seed(7), dtype=DT)
    b = a @ theta_star
    model = _Linear(10)
    opt = SNG(model, _linear_residual(a, b), lr=1.0, damping=0.0)
    gen = torch.Generator().manual_seed(8)
    for _ in range(60):
        opt.step(torch.randperm(40, generator=gen)[:5])
    assert float((model.theta.detach() - theta_star).norm()) < 1e-6 * float(theta_star.norm())


def test_cholesky_failure_is_reported_or_raised():
    # A zero row and no damping: the kernel has a zero pivot, so Cholesky must fail.
    a, _ = _system(3, 6, seed=9)
    a = torch.cat([a, torch.zeros(1, 6, dtype=DT)])
    b = torch.randn(4, generator=torch.Generator().manual_seed(10), dtype=DT)
    model = _Linear(6)
    opt = SNG(model, _linear_residual(a, b), lr=1.0, damping=0.0)
    report = opt.step(torch.arange(4))
    assert report.used_fallback and report.solve_method in ("cholesky+jitter", "eigh-pinv")
    assert opt.fallbacks == 1
    with pytest.warns(RuntimeWarning, match="Cholesky of the kernel failed"):
        SNG(_Linear(6), _linear_residual(a, b), damping=0.0, on_failure="warn").step(
            torch.arange(4)
        )
    strict = SNG(_Linear(6), _linear_residual(a, b), damping=0.0, on_failure="raise")
    with pytest.raises(CholeskyFallbackError, match="Increase damping"):
        strict.step(torch.arange(4))
