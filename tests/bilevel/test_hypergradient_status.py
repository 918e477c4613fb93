"""hypergradient() reports whether its estimate can be trusted (issue 28, item 8).

The judge of "trusted" is the exact hypergradient of the quadratic bilevel problem, computed
here from its closed form with dense solves (not through the oracle's own Cholesky).
"""

from __future__ import annotations

import pytest
import torch

from dxopt import DxoptError, DxoptWarning, Status
from dxopt.bilevel import (
    AID,
    CG,
    F2BA,
    ITD,
    SOBA,
    HypergradientError,
    HypergradientResult,
    InnerLoop,
    Neumann,
    QuadraticBilevel,
    StocBiO,
    hypergradient,
    random_quadratic_bilevel,
)


def closed_form(p: QuadraticBilevel, x: torch.Tensor) -> torch.Tensor:
    r"""``grad H = F_xx x + F_yx^T y* + a - P^T Q^{-1} (F_yx x + F_yy y* + b)``,
    ``y* = -Q^{-1}(P x + q)``."""
    y = -torch.linalg.solve(p.Q, p.P @ x + p.q)
    fy = p.F_yx @ x + p.F_yy @ y + p.b
    return p.F_xx @ x + p.F_yx.T @ y + p.a - p.P.T @ torch.linalg.solve(p.Q, fy)


def relative_error(d: torch.Tensor, exact: torch.Tensor) -> float:
    return float((d - exact).norm() / exact.norm())


def capped_aid() -> AID:
    return AID(inner=InnerLoop(max_iter=5, lr=1.0), linear=CG(max_iter=5), outer_lr=0.0)


def test_issue_repro_capped_solve_is_not_reported_ok() -> None:
    """The issue's case: 100% off the exact hypergradient. Before, it came back with no
    status and no warning; now it raises by default and says MAX_ITER when asked to."""
    p = random_quadratic_bilevel(5, 8, strong_convexity=1e-6)
    x = torch.ones(5, dtype=torch.float64)
    exact = closed_form(p, x)
    with pytest.raises(HypergradientError, match=r"inner residual .* adjoint residual") as err:
        hypergradient(p, x, capped_aid())
    assert err.value.status is Status.MAX_ITER and isinstance(err.value, DxoptError)
    result = hypergradient(p, x, capped_aid(), on_failure="ignore")
    assert relative_error(result.direction, exact) > 0.9  # the estimate really is wrong
    assert result.status is Status.MAX_ITER and not result.status.ok
    assert result.inner_residual is not None and result.inner_residual > 1e-3
    assert result.linear_residual is not None and result.linear_residual > 1e-3
    with pytest.warns(DxoptWarning, match="not certified"):
        warned = hypergradient(p, x, capped_aid(), on_failure="warn")
    assert warned.status is Status.MAX_ITER
    torch.testing.assert_close(warned.direction, result.direction, rtol=0, atol=0)


def test_well_conditioned_problem_is_solved_and_matches_the_closed_form() -> None:
    p = random_quadratic_bilevel(5, 8, strong_convexity=0.2, seed=3)
    x = torch.linspace(-1.0, 2.0, 5, dtype=torch.float64)
    inner = InnerLoop.agd(smoothness=1.0, strong_convexity=0.2, max_iter=150)
    result = hypergradient(p, x, AID(inner=inner, linear=CG(8), outer_lr=0.0))
    assert result.status is Status.SOLVED
    assert result.inner_residual is not None and result.inner_residual < 1e-10
    assert result.linear_residual is not None and result.linear_residual < 1e-10
    torch.testing.assert_close(result.direction, closed_form(p, x), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(
    "method",
    [
        ITD(inner=InnerLoop.gd(smoothness=1.0, max_iter=300), outer_lr=0.0),
        StocBiO(
            inner=InnerLoop.gd(smoothness=1.0, max_iter=300),
            neumann=Neumann(max_iter=300, lr=1.0),
            outer_lr=0.0,
        ),
    ],
    ids=["ITD", "StocBiO"],
)
def test_every_method_that_converges_is_solved(method) -> None:
    p = random_quadratic_bilevel(4, 6, strong_convexity=0.3, seed=1)
    x = torch.ones(4, dtype=torch.float64)
    result = hypergradient(p, x, method)
    assert result.status is Status.SOLVED
    torch.testing.assert_close(result.direction, closed_form(p, x), rtol=1e-9, atol=1e-11)


def test_warm_start_at_the_solution_does_not_certify_a_short_unroll() -> None:
    """y0 = y*: the inner residual is zero, but one unrolled step leaves the adjoint far off
    (ITD's implied v is one Neumann term); a status judged on y alone would say SOLVED."""
    p = random_quadratic_bilevel(4, 6, strong_convexity=0.3, seed=1)
    x = torch.ones(4, dtype=torch.float64)
    itd = ITD(inner=InnerLoop.gd(smoothness=1.0, max_iter=1), outer_lr=0.0)
    result = hypergradient(p, x, itd, y0=p.lower_solution(x), on_failure="ignore")
    assert result.inner_residual is not None and result.inner_residual < 1e-12
    assert relative_error(result.direction, closed_form(p, x)) > 1e-2
    assert result.status is Status.MAX_ITER


def test_biased_and_single_loop_methods_are_not_certified() -> None:
    """F2BA with a finite penalty is biased by O(1/lambda); one SOBA step uses v = 0."""
    p = random_quadratic_bilevel(4, 6, strong_convexity=0.3, seed=1)
    x = torch.ones(4, dtype=torch.float64)
    exact = closed_form(p, x)
    f2ba = F2BA(inner=InnerLoop.gd(smoothness=1.0, max_iter=400), penalty=1e3, outer_lr=0.0)
    for method in (f2ba, SOBA(inner_lr=1.0, outer_lr=0.0)):
        result = hypergradient(p, x, method, on_failure="ignore")
        assert relative_error(result.direction, exact) > 1e-5
        assert result.status is Status.MAX_ITER, type(method).__name__


def test_badly_scaled_problem_keeps_its_verdicts() -> None:
    """The test is relative to the size of the cancelling terms: scaling g and f by 1e8 (or
    1e-8) changes neither verdict."""
    base = random_quadratic_bilevel(4, 6, strong_convexity=0.3, seed=2)
    x = torch.ones(4, dtype=torch.float64)
    good = AID(inner=InnerLoop.gd(smoothness=1.0, max_iter=300), linear=CG(6), outer_lr=0.0)
    bad = AID(inner=InnerLoop.gd(smoothness=1.0, max_iter=3), linear=CG(2), outer_lr=0.0)
    for scale in (1e-8, 1e8):
        p = QuadraticBilevel(
            Q=base.Q * scale,
            P=base.P * scale,
            q=base.q * scale,
            F_xx=base.F_xx * scale,
            F_yx=base.F_yx * scale,
            F_yy=base.F_yy * scale,
            a=base.a * scale,
            b=base.b * scale,
        )
        lr = 1.0 / scale
        scaled_good = AID(inner=InnerLoop(max_iter=300, lr=lr), linear=good.linear, outer_lr=0)
        scaled_bad = AID(inner=InnerLoop(max_iter=3, lr=lr), linear=bad.linear, outer_lr=0)
        ok = hypergradient(p, x, scaled_good)
        assert ok.status is Status.SOLVED
        torch.testing.assert_close(ok.direction, closed_form(p, x), rtol=1e-8, atol=0.0)
        assert hypergradient(p, x, scaled_bad, on_failure="ignore").status is Status.MAX_ITER


def test_zero_solution_is_not_poisoned_by_tiny_norms() -> None:
    """y* = 0 and grad_y f(x, 0) = 0 (q = 0, x = 0, b = 0): every residual is exactly zero and
    the estimate is exact, so it is SOLVED even with atol = 0."""
    base = random_quadratic_bilevel(3, 5, strong_convexity=0.5, seed=4)
    p = QuadraticBilevel(
        Q=base.Q,
        P=base.P,
        q=torch.zeros(5, dtype=torch.float64),
        F_xx=base.F_xx,
        F_yx=base.F_yx,
        F_yy=base.F_yy,
        a=base.a,
        b=torch.zeros(5, dtype=torch.float64),
    )
    x = torch.zeros(3, dtype=torch.float64)
    result = hypergradient(p, x, capped_aid())
    assert result.status is Status.SOLVED
    assert result.inner_residual == 0.0 and result.linear_residual == 0.0
    torch.testing.assert_close(result.direction, closed_form(p, x), rtol=0, atol=0)


def test_non_finite_estimate_is_failed() -> None:
    p = random_quadratic_bilevel(3, 5, strong_convexity=0.5, seed=4)
    x = torch.ones(3, dtype=torch.float64)
    diverging = AID(inner=InnerLoop(max_iter=2000, lr=3.0), linear=CG(5), outer_lr=0.0)
    with pytest.raises(HypergradientError, match="not finite") as err:
        hypergradient(p, x, diverging)
    assert err.value.status is Status.FAILED


def test_method_without_estimate_point_is_not_trusted() -> None:
    class Plain:  # a user's method: init/step only
        outer_lr = 0.0

        def init(self, oracle, x, y0):
            return AID(inner=InnerLoop(max_iter=200, lr=1.0), linear=CG(5), outer_lr=0).init(
                oracle, x, y0
            )

        def step(self, oracle, x, state):
            return AID(inner=InnerLoop(max_iter=200, lr=1.0), linear=CG(5), outer_lr=0).step(
                oracle, x, state
            )

    p = random_quadratic_bilevel(3, 5, strong_convexity=0.5, seed=4)
    x = torch.ones(3, dtype=torch.float64)
    result = hypergradient(p, x, Plain(), on_failure="ignore")
    assert result.status is Status.INACCURATE and result.linear_residual is None


def test_value_is_a_deprecated_alias_of_direction() -> None:
    p = random_quadratic_bilevel(3, 5, strong_convexity=0.5, seed=4)
    x = torch.ones(3, dtype=torch.float64)
    result = hypergradient(p, x, "exact")
    assert result.status is Status.SOLVED
    with pytest.warns(DeprecationWarning, match="renamed direction"):
        old = result.value
    assert old is result.direction
    with pytest.warns(DeprecationWarning, match="'value' is renamed 'direction'"):
        built = HypergradientResult(value=old, y=result.y, cost=result.cost)
    assert built.direction is old


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rtol": -1.0}, "rtol"),
        ({"atol": float("nan")}, "atol"),
        ({"on_failure": "nan"}, "on_failure"),
    ],
)
def test_bad_options_are_refused(kwargs, message) -> None:
    p = random_quadratic_bilevel(3, 5, strong_convexity=0.5, seed=4)
    with pytest.raises(ValueError, match=message):
        hypergradient(p, torch.ones(3, dtype=torch.float64), capped_aid(), **kwargs)
