"""Issue 35, items 21-24: budgets counted as the oracle counts them, budget exhaustion and
divergence reported through the status vocabulary, zero curvature refused in words.

The judge of divergence is the spectrum of the quadratic lower level: gradient descent with
``lr > 2/L`` multiplies the top eigen-component of the residual by ``|1 - lr L| > 1`` per
iteration, with ``lr <= 1/L`` no component grows.
"""

from __future__ import annotations

import math

import pytest
import torch

from dxopt import DxoptWarning, Status
from dxopt.bilevel import (
    AID,
    CG,
    ITD,
    AutogradOracle,
    CountingOracle,
    HypergradientError,
    InnerLoop,
    Neumann,
    StocBiO,
    hypergradient,
    minimize_bilevel,
    random_quadratic_bilevel,
)


def _problem():
    p = random_quadratic_bilevel(3, 4, strong_convexity=0.1)
    eig = torch.linalg.eigvalsh(p.Q)
    return p, float(eig[-1]), float(eig[0])


def _aid(lr: float, *, max_iter: int = 200, linear=None, outer_lr: float = 0.0) -> AID:
    return AID(
        inner=InnerLoop(max_iter=max_iter, lr=lr),
        linear=linear if linear is not None else CG(max_iter=10),
        outer_lr=outer_lr,
    )


# -- item 21 ---------------------------------------------------------------------------------
def test_refused_call_of_a_wrapped_budget_is_not_counted() -> None:
    p, L, _ = _problem()
    budgeted = CountingOracle(p, budget=50)
    run = minimize_bilevel(_aid(1.0 / L, max_iter=10, outer_lr=0.1), budgeted, max_iter=100)
    assert run.status is Status.BUDGET_EXHAUSTED
    assert budgeted.total == 50
    assert run.cost.total == 50  # was 51: the outer counter counted the refused call
    assert run.cost == budgeted.cost
    # the driver's own budget: the same count
    own = minimize_bilevel(_aid(1.0 / L, max_iter=10, outer_lr=0.1), p, max_iter=100, budget=50)
    assert own.cost.total == 50 and own.cost == run.cost


# -- item 22 ---------------------------------------------------------------------------------
def test_hypergradient_budget_follows_on_failure() -> None:
    p, L, _ = _problem()
    x = torch.ones(3, dtype=torch.float64)
    result = hypergradient(CountingOracle(p, budget=3), x, _aid(1.0 / L), on_failure="ignore")
    assert result.status is Status.BUDGET_EXHAUSTED
    assert bool(torch.isnan(result.direction).all()) and result.direction.shape == (3,)
    assert result.cost.total == 3 and result.state is None
    with pytest.warns(DxoptWarning, match="budget"):
        warned = hypergradient(CountingOracle(p, budget=3), x, _aid(1.0 / L), on_failure="warn")
    assert warned.status is Status.BUDGET_EXHAUSTED
    with pytest.raises(HypergradientError, match="larger budget") as err:
        hypergradient(CountingOracle(p, budget=3), x, _aid(1.0 / L))
    assert err.value.status is Status.BUDGET_EXHAUSTED
    # enough budget: certified as before
    assert hypergradient(CountingOracle(p, budget=10**6), x, _aid(1.0 / L)).status.ok


# -- item 23 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize(
    "lower",
    [
        lambda x, y: (x * y).sum(),  # linear in y: zero curvature
        lambda x, y: (x * y).sum() + y.sum(),
        lambda x, y: (x**2).sum(),  # does not read y
    ],
    ids=["bilinear", "affine", "no-y"],
)
def test_zero_curvature_lower_level_is_refused_in_words(lower, dense: bool) -> None:
    with pytest.raises(ValueError, match="strongly convex in y"):
        AutogradOracle(lambda x, y: (y**2).sum(), lower, dim_x=2, dim_y=2, dense_hessian=dense)


def test_zero_curvature_products_are_zero_not_an_autograd_error() -> None:
    oracle = AutogradOracle(
        lambda x, y: (y**2).sum(),
        lambda x, y: (x * y).sum(),
        dim_x=2,
        dim_y=2,
        check_strong_convexity=False,
    )
    x, y, v = (torch.tensor([1.0, 2.0], dtype=torch.float64) for _ in range(3))
    assert torch.equal(oracle.hvp_yy(x, y, v), torch.zeros(2, dtype=torch.float64))
    assert torch.equal(oracle.jvp_xy(x, y, v), v)  # d/dx (y . x) . v = v exactly
    assert torch.equal(oracle.grad_g(x, y)[1], x)


# -- item 24 ---------------------------------------------------------------------------------
def test_diverging_inner_loop_is_diverged_with_nan_direction() -> None:
    p, L, _ = _problem()
    x = torch.ones(3, dtype=torch.float64)
    with pytest.raises(HypergradientError, match="lower its step size") as err:
        hypergradient(p, x, _aid(3.0 / L))
    assert err.value.status is Status.DIVERGED
    assert "raise the inner loop's max_iter" not in str(err.value)
    result = hypergradient(p, x, _aid(3.0 / L), on_failure="ignore")
    assert result.status is Status.DIVERGED and not result.status.ok
    assert result.inner_residual is not None and result.inner_residual > 1e40  # |1-3|^200
    assert bool(torch.isnan(result.direction).all())
    assert "lower the step size" in Status.DIVERGED.message


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_capped_convergent_loop_stays_max_iter(momentum: float) -> None:
    """lr = 1/L converges but 3 iterations miss the tolerance: MAX_ITER (raise max_iter),
    never DIVERGED, with the approximate estimate returned (finite)."""
    p, L, _ = _problem()
    x = torch.ones(3, dtype=torch.float64)
    method = AID(
        inner=InnerLoop(max_iter=3, lr=1.0 / L, momentum=momentum),
        linear=CG(max_iter=10),
        outer_lr=0.0,
    )
    result = hypergradient(p, x, method, on_failure="ignore")
    assert result.status is Status.MAX_ITER
    assert bool(torch.isfinite(result.direction).all())


def test_lr_just_below_two_over_l_is_not_diverged() -> None:
    """lr = 1.99/L: the top component shrinks by |1 - 1.99| per iteration (slowly): capped,
    not diverged."""
    p, L, _ = _problem()
    result = hypergradient(
        p, torch.ones(3, dtype=torch.float64), _aid(1.99 / L, max_iter=5), on_failure="ignore"
    )
    assert result.status is Status.MAX_ITER


@pytest.mark.parametrize("kind", ["aid-neumann", "stocbio"])
def test_diverging_neumann_adjoint_is_diverged(kind: str) -> None:
    p, L, _ = _problem()
    x = torch.ones(3, dtype=torch.float64)
    inner = InnerLoop(max_iter=400, lr=1.0 / L)
    series = Neumann(max_iter=200, lr=3.0 / L)
    method = (
        AID(inner=inner, linear=series, outer_lr=0.0)
        if kind == "aid-neumann"
        else StocBiO(inner=inner, neumann=series, outer_lr=0.0)
    )
    result = hypergradient(p, x, method, on_failure="ignore")
    assert result.status is Status.DIVERGED
    assert result.linear_residual is not None and result.linear_residual > 1e40
    # the same series at lr = 1/L converges: certified
    ok = AID(inner=inner, linear=Neumann(max_iter=400, lr=1.0 / L), outer_lr=0.0)
    assert hypergradient(p, x, ok).status is Status.SOLVED


def test_diverging_itd_is_diverged() -> None:
    p, L, _ = _problem()
    method = ITD(inner=InnerLoop(max_iter=200, lr=3.0 / L), outer_lr=0.0)
    result = hypergradient(p, torch.ones(3, dtype=torch.float64), method, on_failure="ignore")
    assert result.status is Status.DIVERGED


def test_minimize_bilevel_stops_at_the_last_finite_iterate() -> None:
    p, L, _ = _problem()
    run = minimize_bilevel(_aid(3.0 / L, outer_lr=0.1), p, max_iter=50)
    assert run.status is Status.DIVERGED
    assert bool(torch.isfinite(run.x).all()) and bool(torch.isfinite(run.y).all())
    assert run.iterations < 50
    assert len(run.trajectory.calls) == run.iterations + 1
    assert run.direction is not None and not bool(torch.isfinite(run.direction).all())
    # a convergent run is untouched
    fine = minimize_bilevel(_aid(1.0 / L, outer_lr=0.1), p, max_iter=5)
    assert fine.status is Status.MAX_ITER and fine.iterations == 5
    assert math.isfinite(fine.trajectory.hypergradient_norm[-1])
