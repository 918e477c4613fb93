"""Analytic oracles against autograd, exact hypergradients against finite differences,
and exact call counting."""

import math

import pytest
import torch

from dxopt import Cost
from dxopt.bilevel import (
    AID,
    CG,
    AutogradOracle,
    CountingOracle,
    InnerLoop,
    JiInstance,
    Status,
    minimize_bilevel,
    random_quadratic_bilevel,
)


def _rand(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(
        n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )


def _ji_point(ji: JiInstance, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A point where the Psi terms are active (chain entries around the threshold)."""
    x = _rand(ji.dim_x, seed, 1.5 * ji.lam / ji.n)
    y = ji.lower_solution(x) + _rand(ji.dim_y, seed + 1, 0.2 * ji.lam)
    return x, y


@pytest.mark.parametrize("block,links", [(2, 3), (4, 5)])
def test_ji_analytic_oracles_equal_autograd(block: int, links: int) -> None:
    ji = JiInstance(block=block, links=links, chain_scale=0.05, lower_smoothness=2.0)
    auto = AutogradOracle(ji.upper, ji.lower, dim_x=ji.dim_x, dim_y=ji.dim_y)
    x, y = _ji_point(ji, 0)
    v = _rand(ji.dim_y, 7)
    for name in ("grad_f", "grad_g"):
        for a, b in zip(getattr(ji, name)(x, y), getattr(auto, name)(x, y)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ji.hvp_yy(x, y, v), auto.hvp_yy(x, y, v), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ji.jvp_xy(x, y, v), auto.jvp_xy(x, y, v), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ji.lower_solution(x), auto.lower_solution(x), rtol=1e-9, atol=1e-13)
    torch.testing.assert_close(
        ji.exact_hypergradient(x), auto.exact_hypergradient(x), rtol=1e-6, atol=1e-9
    )


def test_quadratic_analytic_oracles_equal_autograd() -> None:
    p = random_quadratic_bilevel(4, 6, seed=0)
    auto = AutogradOracle(p.upper, p.lower, dim_x=4, dim_y=6)
    x, y, v = _rand(4, 1), _rand(6, 2), _rand(6, 3)
    for name in ("grad_f", "grad_g"):
        for a, b in zip(getattr(p, name)(x, y), getattr(auto, name)(x, y)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p.hvp_yy(x, y, v), auto.hvp_yy(x, y, v))
    torch.testing.assert_close(p.jvp_xy(x, y, v), auto.jvp_xy(x, y, v))
    torch.testing.assert_close(p.exact_hypergradient(x), auto.exact_hypergradient(x))


def test_logistic_task_analytic_oracles_equal_autograd(regularization_task) -> None:
    o = regularization_task.oracle
    auto = AutogradOracle(o.upper, o.lower, dim_x=30, dim_y=30)
    x, w, v = _rand(30, 1, 0.5), _rand(30, 2, 0.3), _rand(30, 3)
    for name in ("grad_f", "grad_g"):
        for a, b in zip(getattr(o, name)(x, w), getattr(auto, name)(x, w)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(o.hvp_yy(x, w, v), auto.hvp_yy(x, w, v), rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(o.jvp_xy(x, w, v), auto.jvp_xy(x, w, v), rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(
        o.exact_hypergradient(x), auto.exact_hypergradient(x), rtol=1e-7, atol=1e-12
    )


def _central_difference(H, x: torch.Tensor, h: float) -> torch.Tensor:
    out = torch.empty_like(x)
    for i in range(x.numel()):
        e = torch.zeros_like(x)
        e[i] = h
        out[i] = (H(x + e) - H(x - e)) / (2 * h)
    return out


def test_exact_hypergradient_matches_finite_differences_quadratic() -> None:
    p = random_quadratic_bilevel(4, 6, seed=4)
    x = _rand(4, 5)
    fd = _central_difference(lambda z: p.upper(z, p.lower_solution(z)), x, 1e-5)
    torch.testing.assert_close(p.exact_hypergradient(x), fd, rtol=1e-7, atol=1e-8)


def test_ji_hypergradient_is_the_scaled_carmon_chain() -> None:
    """H(x) = lambda^2 L_f / L * fbar_T(n x / lambda); its gradient matches finite differences."""
    from dxopt.bilevel import CarmonChain

    ji = JiInstance(block=3, links=4, chain_scale=0.1)
    x = _rand(ji.dim_x, 8, 1.2 * ji.lam / ji.n)
    u = ji.C_e * ji.n * x / ji.lam
    H = ji.upper(x, ji.lower_solution(x))
    torch.testing.assert_close(H, ji.scale * CarmonChain(ji.T).value(u), rtol=1e-12, atol=0.0)
    fd = _central_difference(lambda z: ji.upper(z, ji.lower_solution(z)), x, 1e-6 * ji.lam)
    torch.testing.assert_close(ji.exact_hypergradient(x), fd, rtol=1e-6, atol=1e-9)


def test_ji_constants() -> None:
    ji = JiInstance.for_accuracy(block=4, epsilon=0.25)
    assert ji.kappa == 4 * 16 + 1
    assert math.floor(16 / (12 * 0.25**2)) == ji.T
    assert math.isclose(ji.epsilon, 0.25)
    B = ji.block_hessian
    eig = torch.linalg.eigvalsh(B)
    assert math.isclose(float(eig[0]), ji.mu, rel_tol=1e-9)
    assert float(eig[-1]) <= ji.L_g * (1 + 1e-12)
    assert math.isclose(ji.C_l * float(ji.M_col_n[-1]), ji.C_e * ji.n, rel_tol=1e-12)
    assert math.isclose(ji.C_r * float(ji.M_col_n[0]), ji.C_e * ji.n, rel_tol=1e-12)


def test_counting_is_exact() -> None:
    """AID's calls follow its formula: K grad_g, 1 grad_f, N (+1 warm residual) HVP, 1 JVP."""
    p = random_quadratic_bilevel(3, 5, seed=0)
    K, N, iters = 7, 4, 6
    method = AID(inner=InnerLoop.gd(smoothness=1.0, max_iter=K), linear=CG(N), outer_lr=0.05)
    result = minimize_bilevel(method, p, max_iter=iters)
    assert result.cost == Cost(
        grad_f=iters, grad_g=K * iters, hvps=N * iters + (iters - 1), jvps=iters
    )
    assert result.trajectory.calls == tuple(
        (K + N + 2) * t + max(t - 1, 0) for t in range(iters + 1)
    )

    counting = CountingOracle(p)
    x, y = torch.zeros(3, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    for _ in range(3):
        counting.grad_f(x, y)
    counting.hvp_yy(x, y, y)
    counting.exact_hypergradient(x)  # evaluation is free
    counting.upper_value(x, y)
    assert counting.cost == Cost(grad_f=3, hvps=1)
    assert counting.total == 4


def test_budget_stops_cleanly_with_the_last_complete_iterate() -> None:
    p = random_quadratic_bilevel(3, 5, seed=0)
    method = AID(inner=InnerLoop.gd(smoothness=1.0, max_iter=7), linear=CG(4), outer_lr=0.05)
    result = minimize_bilevel(method, p, max_iter=1000, budget=100)
    assert result.status is Status.BUDGET_EXHAUSTED
    assert result.cost.total == 100  # the refused call is not counted
    reference = minimize_bilevel(method, p, max_iter=result.iterations)
    torch.testing.assert_close(result.x, reference.x, rtol=0, atol=0)
    assert result.trajectory.calls[-1] <= 100
