"""QPTL against exact references: on the simplex its solution is the Euclidean projection of
-c/eps with the closed-form Jacobian -(1/eps)(I_S - 11'/|S|) on the support S; on a grid's
path polytope its gradient matches central differences in float64 (refused where the active
set changes within the step)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from dxopt.dfl import QPTL, flow_conservation, grid_graph


def _project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (Held, Wolfe & Crowder 1974)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    k = np.nonzero(u * np.arange(1, len(v) + 1) > css - 1)[0][-1]
    return np.maximum(v - (css[k] - 1) / (k + 1), 0.0)


def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degeneracy warnings are not under test here
        return fn(*args)


@pytest.mark.parametrize("sense", ["min", "max"])
def test_qptl_on_the_simplex_matches_projection_and_its_jacobian(sense):
    d, eps = 6, 0.5
    layer = QPTL(A=torch.ones(1, d), b=torch.ones(1), lb=0.0, eps=eps, sense=sense)
    gen = torch.Generator().manual_seed(0)
    c_hat = torch.randn(4, d, generator=gen, dtype=torch.float64).requires_grad_(True)
    x = _quiet(layer, c_hat)
    s = 1.0 if sense == "min" else -1.0
    for i in range(4):
        v = -s * c_hat[i].detach().numpy() / eps
        ref = _project_simplex(v)
        assert np.allclose(x[i].detach().numpy(), ref, atol=1e-8)
        support = ref > 1e-9
        assert 1 <= support.sum() < d  # a non-trivial active set
        jac = np.zeros((d, d))
        S = np.nonzero(support)[0]
        jac[np.ix_(S, S)] = -(s / eps) * (np.eye(len(S)) - 1.0 / len(S))
        for k in range(d):
            (g,) = torch.autograd.grad(x[i, k], c_hat, retain_graph=True)
            assert torch.allclose(g[i], torch.tensor(jac[k]), atol=1e-7)
            assert torch.all(g[torch.arange(4) != i] == 0)


def test_qptl_gradient_matches_central_differences_on_a_grid():
    edges = grid_graph(3, 3)
    A, b = flow_conservation(9, edges, 0, 8)
    d = edges.shape[0]
    layer = QPTL(A=A, b=b, lb=0.0, ub=1.0, eps=0.3)
    gen = torch.Generator().manual_seed(2)
    c_hat = (0.2 * torch.randn(5, d, generator=gen, dtype=torch.float64)).requires_grad_(True)
    w = torch.randn(5, d, generator=gen, dtype=torch.float64)
    _quiet(lambda: _quiet(layer, c_hat).mul(w).sum().backward())
    direction = torch.randn(5, d, generator=gen, dtype=torch.float64)
    analytic = (c_hat.grad * direction).sum(1)
    verdicts = 0
    for i in range(5):

        def f(t, i=i):
            with torch.no_grad():
                return (_quiet(layer, c_hat[i] + t * direction[i]) * w[i]).sum().item()

        estimates = [(f(h) - f(-h)) / (2 * h) for h in (1e-3, 1e-4)]
        if abs(estimates[0] - estimates[1]) > 1e-5 * (1 + abs(estimates[1])):
            continue  # the active set changes within the step: no verdict
        verdicts += 1
        assert abs(estimates[1] - analytic[i].item()) < 1e-5 * (1 + abs(analytic[i].item()))
    assert verdicts >= 3
    assert layer.cost.forwards >= 5


def test_qptl_bad_inputs():
    with pytest.raises(ValueError, match="eps"):
        QPTL(lb=torch.zeros(3), eps=0.0)
    with pytest.raises(ValueError, match="constraints"):
        QPTL(eps=1.0)
    layer = QPTL(lb=torch.zeros(3), ub=torch.ones(3))
    with pytest.raises(ValueError, match="c_hat"):
        layer(torch.zeros(2, 4))


def test_qptl_on_the_full_rank_5x5_grid_matches_one_sided_differences():
    """The benchmark's layer: the 5x5 path polytope from ``flow_conservation`` (full row rank
    by default). Its gradient equals the one through the full, rank-deficient system (the same
    QP, there through the degenerate backward) and kink-aware one-sided differences."""
    from tests.qp._fd import one_sided

    edges = grid_graph(5, 5)
    d = edges.shape[0]
    gen = torch.Generator().manual_seed(4)
    c_hat = (1.0 + 0.5 * torch.randn(6, d, generator=gen, dtype=torch.float64)).requires_grad_()
    w = torch.randn(6, d, generator=gen, dtype=torch.float64)
    grads = []
    for drop in (True, False):
        A, b = flow_conservation(25, edges, 0, 24, drop_redundant=drop)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degeneracy warnings are not under test here
            x = QPTL(A=A, b=b, lb=0.0, ub=1.0, eps=0.5)(c_hat)
            (g,) = torch.autograd.grad((x * w).sum(), c_hat)
        grads.append(g)
    assert grads[0].abs().max() > 0.1  # a non-trivial gradient
    torch.testing.assert_close(grads[0], grads[1], atol=1e-9, rtol=1e-9)
    A, b = flow_conservation(25, edges, 0, 24)
    layer = QPTL(A=A, b=b, lb=0.0, ub=1.0, eps=0.5)
    rng = np.random.default_rng(0)
    verdicts = 0
    for i in range(6):

        def f(c: np.ndarray, i: int = i) -> float:
            with torch.no_grad():
                return float((_quiet(layer, torch.from_numpy(c)) * w[i]).sum())

        direction = rng.standard_normal(d)
        sides = one_sided(f, c_hat[i].detach().numpy(), direction)
        if not sides:
            continue  # unstable on both sides: no verdict
        claim = float(grads[0][i] @ torch.from_numpy(direction))
        assert min(abs(claim - s) for s in sides) <= 1e-5 * (1 + abs(claim)), (claim, sides)
        verdicts += 1
    assert verdicts >= 4


@pytest.mark.parametrize(
    ("option", "error", "match"),
    [
        ({"solver": "no-such-backend"}, ValueError, "solver"),
        ({"eps_abs": -1.0}, ValueError, "eps_abs"),
        ({"on_failure": "explode"}, ValueError, "on_failure"),
        ({"backward": "nah"}, ValueError, "backward"),
        ({"bogus": 1}, TypeError, "bogus"),
    ],
)
def test_qptl_checks_its_qp_options_at_construction(option, error, match):
    """The options go to a QPLayer built in __init__: a bad one raises there, before any
    batch (it used to be stored unchecked and raise at the first forward)."""
    with pytest.raises(error, match=match):
        QPTL(lb=torch.zeros(3), ub=torch.ones(3), **option)
    layer = QPTL(lb=torch.zeros(3), ub=torch.ones(3), solver="daqp", eps_abs=1e-10)
    assert layer.qp_options["solver"] == "daqp" and layer.qp_options["eps_abs"] == 1e-10
    x = layer(torch.tensor([[1.0, -1.0, 0.02]], dtype=torch.float64))
    # the box projection of -c/eps (eps = 0.1): x = clip(-10 c, 0, 1)
    assert torch.allclose(x, torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64), atol=1e-9)
