"""Bad input gets a clear error naming the argument; an exhausted budget gets a status."""

import pytest
import torch

from dxopt.bilevel import (
    AID,
    CG,
    F2BA,
    SOBA,
    AutogradOracle,
    CountingOracle,
    InnerLoop,
    JiInstance,
    Neumann,
    QuadraticBilevel,
    Status,
    StocBiO,
    minimize_bilevel,
    random_quadratic_bilevel,
)


def _upper(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y).sum()


def test_lower_level_not_strongly_convex_is_refused() -> None:
    def concave_lower(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -0.5 * (y * y).sum() + (x * y).sum()

    with pytest.raises(ValueError, match=r"lower: expected g\(x, .\) strongly convex"):
        AutogradOracle(_upper, concave_lower, dim_x=3, dim_y=3)

    p = random_quadratic_bilevel(2, 3, seed=0)
    with pytest.raises(ValueError, match="Q: the lower level must be strongly convex"):
        QuadraticBilevel(
            Q=torch.diag(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)),
            P=p.P, q=p.q, F_xx=p.F_xx, F_yx=p.F_yx, F_yy=p.F_yy, a=p.a, b=p.b,
        )  # fmt: skip


def test_mismatched_shapes_are_refused() -> None:
    p = random_quadratic_bilevel(2, 3, seed=0)
    with pytest.raises(ValueError, match="F_yx: expected shape \\(3, 2\\)"):
        QuadraticBilevel(Q=p.Q, P=p.P, q=p.q, F_xx=p.F_xx, F_yx=p.F_yx.T, F_yy=p.F_yy, a=p.a, b=p.b)
    with pytest.raises(ValueError, match="x0: expected shape \\(2,\\), got \\(3,\\)"):
        minimize_bilevel(
            SOBA(inner_lr=0.5, outer_lr=0.1), p, max_iter=3, x0=torch.zeros(3).double()
        )

    def lower(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (y * y).sum() + (x * y).sum()

    with pytest.raises(ValueError, match="upper: expected a scalar tensor"):
        AutogradOracle(lambda x, y: x * y, lower, dim_x=3, dim_y=3)
    with pytest.raises(ValueError, match="calling it with x of shape \\(2,\\)"):
        AutogradOracle(_upper, lower, dim_x=2, dim_y=3)


def test_logistic_task_checks_its_data() -> None:
    from dxopt.bilevel import LogisticRegularization

    A = torch.zeros(4, 3, dtype=torch.float64)
    s = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="base_strength: expected rho > 0"):
        LogisticRegularization(
            features_train=A, labels_train=s, features_val=A, labels_val=s, base_strength=0.0
        )
    with pytest.raises(ValueError, match="labels_val: expected shape \\(4,\\)"):
        LogisticRegularization(
            features_train=A, labels_train=s, features_val=A, labels_val=s[:3], base_strength=1.0
        )


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="lr: expected a positive finite number"):
        InnerLoop(max_iter=3, lr=-1.0)
    with pytest.raises(ValueError, match="max_iter: expected an integer >= 1, got 0"):
        CG(0)
    with pytest.raises(ValueError, match="momentum"):
        InnerLoop(max_iter=3, lr=1.0, momentum=1.0)
    with pytest.raises(ValueError, match="outer_lr"):
        AID(inner=InnerLoop(max_iter=3, lr=1.0), linear=CG(3), outer_lr=float("nan"))
    with pytest.raises(TypeError, match="linear: expected CG"):
        AID(inner=InnerLoop(max_iter=3, lr=1.0), linear="cg", outer_lr=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="penalty"):
        F2BA(inner=InnerLoop(max_iter=3, lr=1.0), penalty=0.0, outer_lr=0.1)
    with pytest.raises(ValueError, match="batch_size"):
        StocBiO(inner=InnerLoop(max_iter=3, lr=1.0), neumann=Neumann(3, 1.0), outer_lr=0.1,
                batch_size=0)  # fmt: skip
    with pytest.raises(ValueError, match="block: expected an integer n >= 2"):
        JiInstance(block=1, links=3, chain_scale=0.1)
    with pytest.raises(TypeError, match="oracle: expected an object with"):
        CountingOracle(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        CountingOracle(random_quadratic_bilevel(2, 3), budget=-1)


@pytest.mark.parametrize("budget", [0, 1, 37])
def test_exhausted_budget_is_a_status_not_an_exception(budget: int) -> None:
    p = random_quadratic_bilevel(2, 3, seed=0)
    method = AID(inner=InnerLoop.gd(smoothness=1.0, max_iter=5), linear=CG(3), outer_lr=0.1)
    result = minimize_bilevel(method, p, max_iter=10_000, budget=budget, tol=1e-12)
    assert result.status is Status.BUDGET_EXHAUSTED
    assert result.cost.total == budget
    assert len(result.trajectory.calls) == result.iterations + 1
