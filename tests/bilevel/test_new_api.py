"""y0, the one-shot hypergradient and the matrix-free AutogradOracle (issue 11, bilevel)."""

from __future__ import annotations

import time

import pytest
import torch

from dxopt import Cost, Status
from dxopt.bilevel import (
    AID,
    CG,
    ITD,
    AutogradOracle,
    InnerLoop,
    hypergradient,
    minimize_bilevel,
    random_quadratic_bilevel,
)


def _two_layer_lower(h: int = 4):
    """g(x, y) = mean((sum_j v_j tanh(w_j a) - t)^2) + (x^2/2) ||y||^2 with y = (w, v).

    y = 0 is a stationary point of the data term for every x (tanh(0) = 0 and v = 0 cut every
    gradient path): an inner network started at zero never moves.
    """
    a = torch.linspace(-2, 2, 20, dtype=torch.float64)
    t = torch.sin(a)

    def lower(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        w, v = y[:h], y[h:]
        pred = torch.tanh(a[:, None] * w[None, :]) @ v
        return ((pred - t) ** 2).mean() + 0.5 * 1e-3 * torch.exp(x[0]) * (y * y).sum()

    def upper(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (y * y).sum()

    return AutogradOracle(upper, lower, dim_x=1, dim_y=2 * h, check_strong_convexity=False)


def test_y0_starts_the_inner_network_away_from_the_symmetric_point() -> None:
    oracle = _two_layer_lower()
    method = ITD(inner=InnerLoop(max_iter=50, lr=0.5), outer_lr=0.0)
    stuck = minimize_bilevel(method, oracle, max_iter=2, evaluate=False)
    assert torch.count_nonzero(stuck.y) == 0  # the zero start never moves
    y0 = 0.5 * torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    moved = minimize_bilevel(method, oracle, max_iter=2, y0=y0, evaluate=False)
    x = torch.zeros(1, dtype=torch.float64)
    assert float(oracle.lower(x, moved.y)) < 0.5 * float(oracle.lower(x, y0))
    with pytest.raises(ValueError, match=r"y0: expected shape \(8,\), got \(3,\)"):
        minimize_bilevel(method, oracle, max_iter=1, y0=torch.zeros(3, dtype=torch.float64))


def test_y0_warm_start_at_the_solution_needs_no_inner_iterations() -> None:
    p = random_quadratic_bilevel(3, 6, strong_convexity=0.3, seed=1)
    x = torch.ones(3, dtype=torch.float64)
    aid = AID(inner=InnerLoop.gd(smoothness=1.0, max_iter=1), linear=CG(6), outer_lr=0.0)
    warm = hypergradient(p, x, aid, y0=p.lower_solution(x))
    torch.testing.assert_close(warm.direction, p.exact_hypergradient(x), rtol=1e-9, atol=1e-10)
    assert warm.status is Status.SOLVED
    cold = hypergradient(p, x, aid, on_failure="ignore")
    assert float((cold.direction - p.exact_hypergradient(x)).norm()) > 1e-3
    assert cold.status is Status.MAX_ITER


def test_one_shot_hypergradient_matches_exact_and_counts_calls() -> None:
    p = random_quadratic_bilevel(4, 7, strong_convexity=0.2, seed=0)
    x = torch.linspace(-1, 1, 4, dtype=torch.float64)
    inner = InnerLoop.agd(smoothness=1.0, strong_convexity=0.2, max_iter=200)
    result = hypergradient(p, x, AID(inner=inner, linear=CG(7), outer_lr=0.0))
    torch.testing.assert_close(result.direction, p.exact_hypergradient(x), rtol=1e-8, atol=1e-10)
    assert result.cost == Cost(grad_f=1, grad_g=200, hvps=7, jvps=1)
    assert result.cost.seconds > 0
    exact = hypergradient(p, x, "exact")
    torch.testing.assert_close(exact.direction, p.exact_hypergradient(x))
    assert exact.cost.oracle_calls == 0
    with pytest.raises(ValueError, match="method: expected a method instance"):
        hypergradient(p, x, "cg")
    with pytest.raises(ValueError, match=r"x: expected shape \(4,\)"):
        hypergradient(p, torch.zeros(2, dtype=torch.float64), "exact")


def _large_quadratic(dim_x: int, dim_y: int):
    """g = 1/2 sum d_i y_i^2 + (P x) . y + mu-free softplus-free: closed-form y*, Hessian."""
    gen = torch.Generator().manual_seed(0)
    d = torch.linspace(0.5, 2.0, dim_y, dtype=torch.float64)
    P = torch.randn(dim_y, dim_x, generator=gen, dtype=torch.float64) / dim_y**0.5
    target = torch.randn(dim_y, generator=gen, dtype=torch.float64)

    def lower(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (d * y * y).sum() + (P @ x) @ y

    def upper(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((y - target) ** 2).sum() + 0.5 * (x * x).sum()

    def exact(x: torch.Tensor) -> torch.Tensor:
        y = -(P @ x) / d
        return x - P.T @ ((y - target) / d)

    return upper, lower, exact


def test_dim_y_1500_never_builds_a_dense_hessian(monkeypatch: pytest.MonkeyPatch) -> None:
    """Construction and default (evaluate=True) steps at dim_y = 1500 use only products."""

    def refuse(*args, **kwargs):
        raise AssertionError("dense Hessian built without being asked")

    monkeypatch.setattr(AutogradOracle, "dense_second_derivatives", refuse)
    upper, lower, exact = _large_quadratic(5, 1500)
    start = time.perf_counter()
    oracle = AutogradOracle(upper, lower, dim_x=5, dim_y=1500)
    x = torch.ones(5, dtype=torch.float64)
    torch.testing.assert_close(oracle.exact_hypergradient(x), exact(x), rtol=1e-8, atol=1e-9)
    inner = InnerLoop.agd(smoothness=2.0, strong_convexity=0.5, max_iter=40)
    method = AID(inner=inner, linear=CG(30), outer_lr=0.1)
    result = minimize_bilevel(method, oracle, max_iter=3)
    elapsed = time.perf_counter() - start
    assert len(result.trajectory.hypergradient_norm) == 4
    assert result.trajectory.hypergradient_norm[-1] < result.trajectory.hypergradient_norm[0]
    assert elapsed < 30.0, f"{elapsed:.1f} s"


def test_matrix_free_probe_refuses_a_concave_lower_level() -> None:
    with pytest.raises(ValueError, match="non-positive curvature"):
        AutogradOracle(
            lambda x, y: (x * y).sum(), lambda x, y: -0.5 * (y * y).sum(), dim_x=3, dim_y=3
        )


def test_dense_and_matrix_free_exact_hypergradients_agree() -> None:
    upper, lower, exact = _large_quadratic(3, 30)
    x = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    free = AutogradOracle(upper, lower, dim_x=3, dim_y=30)
    dense = AutogradOracle(upper, lower, dim_x=3, dim_y=30, dense_hessian=True)
    torch.testing.assert_close(free.exact_hypergradient(x), exact(x), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(dense.exact_hypergradient(x), exact(x), rtol=1e-9, atol=1e-10)


def test_deprecated_names_still_work_with_a_warning() -> None:
    p = random_quadratic_bilevel(2, 3, seed=0)
    with pytest.warns(DeprecationWarning, match="'steps' is renamed 'max_iter'"):
        inner = InnerLoop.gd(smoothness=1.0, steps=3)
    with pytest.warns(DeprecationWarning, match="'max_iterations' is renamed 'max_iter'"):
        old = minimize_bilevel(AID(inner=inner, linear=CG(2), outer_lr=0.1), p, max_iterations=2)
    new = minimize_bilevel(AID(inner=inner, linear=CG(2), outer_lr=0.1), p, max_iter=2)
    torch.testing.assert_close(old.x, new.x, rtol=0, atol=0)
    assert old.counts == new.cost and inner.steps == 3
    with pytest.warns(DeprecationWarning, match="OracleCounts is deprecated"):
        from dxopt.bilevel import OracleCounts

        assert OracleCounts(grad_f=1, hvp=2) == Cost(grad_f=1, hvps=2)
    from dxopt.bilevel import Status

    assert Status.CONVERGED is Status.SOLVED


def test_float32_autograd_oracle_evaluates_within_float32_accuracy() -> None:
    upper, lower, exact = _large_quadratic(3, 50)

    def to32(fn):
        return lambda x, y: fn(x.double(), y.double()).float()

    oracle = AutogradOracle(to32(upper), to32(lower), dim_x=3, dim_y=50, dtype=torch.float32)
    x = torch.tensor([0.3, -1.0, 2.0])
    got = oracle.exact_hypergradient(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact(x.double()), rtol=1e-4, atol=1e-5)
