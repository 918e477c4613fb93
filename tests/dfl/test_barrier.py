"""The log-barrier LP layer against exact answers: the box (a closed-form quadratic root per
coordinate), the simplex (x_i = mu / (c_i + nu) with nu from a 1-D root), and central
differences on a grid's path polytope in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import optimize

from dxopt._core import NotConvergedError
from dxopt.dfl import flow_conservation, grid_graph
from dxopt.dfl.barrier import LogBarrierLP

MU = 0.1


def _box_closed_form(c: torch.Tensor) -> torch.Tensor:
    """argmin c x - mu (log x + log(1 - x)) on (0, 1): the root of c x^2 - (c + 2 mu) x + mu."""
    safe = torch.where(c.abs() > 1e-8, c, torch.ones_like(c))
    root = ((safe + 2 * MU) - torch.sqrt(safe**2 + 4 * MU**2)) / (2 * safe)
    return torch.where(c.abs() > 1e-8, root, torch.full_like(c, 0.5))


@pytest.mark.parametrize("sense", ["min", "max"])
def test_box_matches_closed_form_value_and_gradient(sense):
    layer = LogBarrierLP(lb=torch.zeros(5), ub=1.0, mu=MU, sense=sense)
    s = 1.0 if sense == "min" else -1.0
    gen = torch.Generator().manual_seed(0)
    c = (2 * torch.randn(3, 5, generator=gen, dtype=torch.float64)).requires_grad_(True)
    w = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    x = layer(c)
    assert torch.allclose(x, _box_closed_form(s * c.detach()), atol=1e-12)
    (x * w).sum().backward()
    c_ref = c.detach().clone().requires_grad_(True)
    (_box_closed_form(s * c_ref) * w).sum().backward()
    assert torch.allclose(c.grad, c_ref.grad, atol=1e-9)


def test_simplex_matches_the_dual_root_and_central_differences():
    d = 4
    layer = LogBarrierLP(A=torch.ones(2, d), b=torch.ones(2), lb=0.0, mu=MU)  # a repeated row
    c = torch.tensor([0.3, -0.5, 1.2, 0.1], dtype=torch.float64)
    x = layer(c.unsqueeze(0))[0]
    # stationarity: c_i - mu / x_i + nu = 0, sum x = 1
    nu = optimize.brentq(
        lambda v: (MU / (c.numpy() + v)).sum() - 1, -c.min().item() + 1e-12, 1e3, xtol=1e-15
    )
    assert torch.allclose(x, torch.tensor(MU / (c.numpy() + nu)), atol=1e-10)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    cg = c.clone().requires_grad_(True)
    (layer(cg) * w).sum().backward()
    for k in range(d):
        e = torch.zeros(d, dtype=torch.float64)
        e[k] = 1e-5
        fd = ((layer(c + e) - layer(c - e)) * w).sum() / 2e-5
        assert abs(fd.item() - cg.grad[k].item()) < 1e-6


def test_grid_path_polytope_gradient_matches_central_differences():
    edges = grid_graph(3, 3)
    A, b = flow_conservation(9, edges, 0, 8, drop_redundant=False)  # the layer drops one row
    layer = LogBarrierLP(A=A, b=b, lb=0.0, ub=1.0, mu=0.05)
    gen = torch.Generator().manual_seed(1)
    c = torch.rand(3, edges.shape[0], generator=gen, dtype=torch.float64)
    w = torch.randn(3, edges.shape[0], generator=gen, dtype=torch.float64)
    cg = c.clone().requires_grad_(True)
    x = layer(cg)
    assert torch.allclose(x.detach() @ A.T, b.expand(3, -1), atol=1e-12)
    assert (x > 0).all() and (x < 1).all()
    (x * w).sum().backward()
    direction = torch.randn(c.shape, generator=gen, dtype=torch.float64)
    h = 1e-5
    fd = ((layer(c + h * direction) - layer(c - h * direction)) * w).sum(1) / (2 * h)
    assert torch.allclose(fd, (cg.grad * direction).sum(1), atol=1e-6)


def test_barrier_failures_and_bad_inputs():
    with pytest.raises(NotConvergedError, match="max_iter"):
        LogBarrierLP(lb=torch.zeros(3), ub=1.0, mu=1e-3, max_iter=1)(torch.ones(1, 3) * 5)
    layer = LogBarrierLP(lb=torch.zeros(3), ub=1.0, mu=1e-3, max_iter=1, on_failure="nan")
    assert torch.isnan(layer(torch.ones(2, 3, dtype=torch.float64) * 5)).all()
    with pytest.raises(ValueError, match="interior"):
        LogBarrierLP(lb=torch.zeros(3), ub=torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="mu"):
        LogBarrierLP(lb=torch.zeros(3), ub=1.0, mu=0.0)
    with pytest.raises(ValueError, match="inconsistent"):
        LogBarrierLP(A=torch.ones(2, 3), b=torch.tensor([1.0, 2.0]), lb=0.0)
    with pytest.raises(ValueError, match="c_hat"):
        LogBarrierLP(lb=torch.zeros(3), ub=1.0)(torch.zeros(2, 4))
    assert np.isfinite(LogBarrierLP(lb=torch.zeros(3), ub=1.0)(torch.zeros(3)).numpy()).all()


def test_knapsack_relaxation_with_inequalities_matches_central_differences():
    rng = np.random.default_rng(0)
    W = torch.tensor(rng.integers(300, 800, (2, 10)) / 100.0)
    layer = LogBarrierLP(G=W, h=torch.tensor([12.0, 12.0]), lb=0.0, ub=1.0, mu=0.05, sense="max")
    c = torch.tensor(rng.uniform(1, 5, (2, 10)))
    w = torch.tensor(rng.normal(size=(2, 10)))
    cg = c.clone().requires_grad_(True)
    x = layer(cg)
    assert (x.detach() @ W.T < 12).all() and (x > 0).all() and (x < 1).all()
    (x * w).sum().backward()
    direction = torch.tensor(rng.normal(size=(2, 10)))
    h = 1e-5
    fd = ((layer(c + h * direction) - layer(c - h * direction)) * w).sum(1) / (2 * h)
    assert torch.allclose(fd, (cg.grad * direction).sum(1), atol=1e-6)


def test_free_variables_go_through_the_saddle_solve_and_match_the_closed_form():
    """x1 - x2 = 0, -1 <= x1 + x2 <= 1, no bounds: the barrier Hessian is singular (rank 1), so
    the Newton and backward systems take dxopt.linalg.saddle_solve. With x1 = x2 = t and
    a = c1 + c2 the barrier's stationarity is 4 a t^2 - 8 mu t - a = 0, so
    t = (2 mu - sqrt(4 mu^2 + a^2)) / (2 a)."""
    G = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    layer = LogBarrierLP(
        A=torch.tensor([[1.0, -1.0]]), b=torch.zeros(1), G=G, h=torch.ones(2), mu=MU
    )
    c = torch.tensor([[0.7, 0.2], [-1.5, 0.4], [0.3, -2.0]], dtype=torch.float64)
    cg = c.clone().requires_grad_(True)
    x = layer(cg)

    def closed_form(c: torch.Tensor) -> torch.Tensor:
        a = c.sum(1)
        t = (2 * MU - torch.sqrt(4 * MU**2 + a**2)) / (2 * a)
        return torch.stack([t, t], 1)

    assert torch.allclose(x.detach(), closed_form(c), atol=1e-12)
    w = torch.tensor([[1.0, -0.5], [2.0, 0.3], [-1.0, 1.0]], dtype=torch.float64)
    (x * w).sum().backward()
    c_ref = c.clone().requires_grad_(True)
    (closed_form(c_ref) * w).sum().backward()
    assert torch.allclose(cg.grad, c_ref.grad, atol=1e-9)


def test_a_backward_whose_kkt_residual_misses_the_tolerance_is_refused(monkeypatch):
    """The backward checks the refined residual of its KKT solve against KKT_RTOL; set below
    any residual, every sample's gradient is refused: raised, or NaN rows under "nan"."""
    import dxopt.dfl.barrier as barrier

    c = torch.tensor([[0.3, -0.5, 1.2]], dtype=torch.float64, requires_grad=True)
    layer = LogBarrierLP(A=torch.ones(1, 3), b=torch.ones(1), lb=0.0, mu=MU)
    x = layer(c)
    monkeypatch.setattr(barrier, "KKT_RTOL", -1.0)
    with pytest.raises(NotConvergedError, match="KKT_RTOL"):
        x.sum().backward()
    nan_layer = LogBarrierLP(A=torch.ones(1, 3), b=torch.ones(1), lb=0.0, mu=MU, on_failure="nan")
    monkeypatch.setattr(barrier, "KKT_RTOL", 1e-10)
    x = nan_layer(c)
    monkeypatch.setattr(barrier, "KKT_RTOL", -1.0)
    (g,) = torch.autograd.grad(x.sum(), c)
    assert torch.isnan(g).all()


def test_dependent_rows_are_dropped_by_the_pivot_test():
    """Three rows of which the third is the sum of the first two (and a zero row with b = 0):
    the layer keeps two; the same rows with a contradicting b are refused."""
    A = torch.tensor(
        [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    )
    layer = LogBarrierLP(A=A, b=torch.tensor([0.5, 0.5, 1.0, 0.0]), lb=0.0, mu=MU)
    assert layer._A.shape == (2, 4)
    x = layer(torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=torch.float64))
    assert torch.allclose(x @ A.T.double(), torch.tensor([[0.5, 0.5, 1.0, 0.0]]).double())
    with pytest.raises(ValueError, match="inconsistent"):
        LogBarrierLP(A=A, b=torch.tensor([0.5, 0.5, 1.1, 0.0]), lb=0.0)
    with pytest.raises(ValueError, match="inconsistent"):
        LogBarrierLP(A=A, b=torch.tensor([0.5, 0.5, 1.0, 0.1]), lb=0.0)


def test_a_refused_backward_under_warn_warns_and_gives_nan_rows(monkeypatch):
    import dxopt.dfl.barrier as barrier
    from dxopt import DxoptWarning

    c = torch.tensor([[0.3, -0.5, 1.2], [1.0, 0.2, 0.1]], dtype=torch.float64, requires_grad=True)
    layer = LogBarrierLP(A=torch.ones(1, 3), b=torch.ones(1), lb=0.0, mu=MU, on_failure="warn")
    x = layer(c)
    monkeypatch.setattr(barrier, "KKT_RTOL", -1.0)
    with pytest.warns(DxoptWarning, match="refused"):
        (g,) = torch.autograd.grad(x.sum(), c)
    assert torch.isnan(g).all()
