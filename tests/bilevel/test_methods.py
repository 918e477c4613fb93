"""Every method's hypergradient estimate agrees with the exact one (x held fixed)."""

import pytest
import torch

from dxopt.bilevel import (
    AID,
    CG,
    F2BA,
    ITD,
    SOBA,
    InnerLoop,
    Neumann,
    QuadraticBilevel,
    RegularizationTask,
    StocBiO,
    minimize_bilevel,
    random_quadratic_bilevel,
)

MU, L = 0.2, 1.0
AGD = InnerLoop.agd(smoothness=L, strong_convexity=MU, max_iter=30)
GD = InnerLoop.gd(smoothness=L, max_iter=30)

# (method with outer_lr = 0 so x stays at x0, outer iterations, relative tolerance)
METHODS = {
    "AID-CG+AGD": (AID(inner=AGD, linear=CG(20), outer_lr=0.0), 20, 1e-6),
    "AID-CG+GD": (AID(inner=GD, linear=CG(20), outer_lr=0.0), 20, 1e-6),
    "AID-Neumann+GD": (AID(inner=GD, linear=Neumann(300, 1.0 / L), outer_lr=0.0), 20, 1e-6),
    "ITD+GD": (ITD(inner=InnerLoop.gd(smoothness=L, max_iter=300), outer_lr=0.0), 3, 1e-6),
    "ITD+AGD": (
        ITD(inner=InnerLoop.agd(smoothness=L, strong_convexity=MU, max_iter=150), outer_lr=0.0),
        3,
        1e-6,
    ),
    "stocBiO": (StocBiO(inner=GD, neumann=Neumann(300, 1.0 / L), outer_lr=0.0), 20, 1e-6),
    "SOBA": (SOBA(inner_lr=1.0 / L, outer_lr=0.0), 600, 1e-6),
    "F2BA": (F2BA(inner=AGD, penalty=1e7, outer_lr=0.0), 20, 1e-6),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", list(METHODS))
def test_estimate_matches_exact_hypergradient(name: str, seed: int) -> None:
    problem = random_quadratic_bilevel(5, 8, strong_convexity=MU, smoothness=L, seed=seed)
    x0 = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 10))
    method, iterations, rtol = METHODS[name]
    result = minimize_bilevel(method, problem, max_iter=iterations, x0=x0, evaluate=False)
    exact = problem.exact_hypergradient(x0)
    assert result.direction is not None
    err = float(
        torch.linalg.vector_norm(result.direction - exact) / torch.linalg.vector_norm(exact)
    )
    assert err < rtol, f"{name}: relative error {err:.2e}"
    assert torch.equal(result.x, x0)


def test_itd_without_convergence_is_the_derivative_of_the_unrolled_iterate() -> None:
    """Few unrolled steps: ITD equals autograd through the same unrolled AGD loop."""
    problem = random_quadratic_bilevel(4, 6, strong_convexity=MU, smoothness=L, seed=5)
    inner = InnerLoop.agd(smoothness=L, strong_convexity=MU, max_iter=4)
    x0 = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    result = minimize_bilevel(
        ITD(inner=inner, outer_lr=0.0, warm_start=False), problem, max_iter=1, x0=x0
    )
    x = x0.clone().requires_grad_(True)
    y, _ = inner.run(lambda w: problem.Q @ w + problem.P @ x + problem.q, torch.zeros(6).double())
    (grad_x,) = torch.autograd.grad(problem.upper(x, y), x)
    assert result.direction is not None
    torch.testing.assert_close(result.direction, grad_x, rtol=1e-12, atol=1e-12)


def test_aid_on_a_nonquadratic_lower_level(regularization_task: RegularizationTask) -> None:
    """Logistic lower level (breast cancer): AID-CG and ITD match the Newton-based exact
    hypergradient."""
    task = regularization_task
    x0 = torch.full((task.oracle.dim_x,), 1.0, dtype=torch.float64)
    mu = task.strong_convexity * float(torch.exp(x0).min())
    inner = InnerLoop.agd(smoothness=task.smoothness, strong_convexity=mu, max_iter=300)
    exact = task.oracle.exact_hypergradient(x0)
    for method in (AID(inner=inner, linear=CG(60), outer_lr=0.0), ITD(inner=inner, outer_lr=0.0)):
        result = minimize_bilevel(method, task.oracle, max_iter=3, x0=x0, evaluate=False)
        assert result.direction is not None
        diff = torch.linalg.vector_norm(result.direction - exact)
        assert float(diff / torch.linalg.vector_norm(exact)) < 1e-6


def test_outer_loop_decreases_the_upper_objective() -> None:
    p = random_quadratic_bilevel(5, 8, strong_convexity=MU, smoothness=L, seed=3)
    eye5, eye8 = torch.eye(5, dtype=torch.float64), torch.eye(8, dtype=torch.float64)
    problem = QuadraticBilevel(  # convex upper level: H is a strongly convex quadratic
        Q=p.Q, P=p.P, q=p.q, F_xx=eye5, F_yx=0 * p.F_yx, F_yy=eye8, a=p.a, b=p.b
    )
    J = torch.linalg.solve(p.Q, p.P)  # dy*/dx = -J
    L_H = float(torch.linalg.eigvalsh(eye5 + J.T @ J)[-1])
    method = AID(inner=AGD, linear=CG(20), outer_lr=1.0 / L_H)
    result = minimize_bilevel(method, problem, max_iter=2000, tol=1e-8)
    assert result.status.value == "solved"
    assert result.trajectory.hypergradient_norm[-1] <= 1e-8
    x0 = torch.zeros(5, dtype=torch.float64)
    H0 = problem.upper(x0, problem.lower_solution(x0))
    assert float(problem.upper(result.x, problem.lower_solution(result.x))) < float(H0)
