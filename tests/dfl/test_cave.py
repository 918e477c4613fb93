"""CaVE: the binding normals of a small polytope by hand; the cone projection against the QP it
solves (``dxopt.qp``); the loss in closed form, zero exactly when the true solution is optimal
for the prediction (shortest paths, LP duality), its gradient against finite differences with
the target held; the polar-cone fallback; PyEPO's coneAlignedCosine on identical inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.dfl._enum import enum_oracle, pyepo_model, subsets

from dxopt import qp
from dxopt.dfl import (
    CaVE,
    ShortestPathOracle,
    binding_normals,
    cone_projection,
    flow_conservation,
    grid_graph,
)


def _rows(t):
    return {tuple(r) for r in t.tolist() if any(r)}


def test_binding_normals_by_hand():
    A, b = np.ones((1, 3)), np.ones(1)
    G, h = np.array([[1.0, 1.0, 0.0]]), np.array([1.0])
    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    N = binding_normals(x, A=A, b=b, G=G, h=h, lb=0.0, ub=1.0)
    assert N.shape == (2, 6, 3)
    assert _rows(N[0]) == {
        (1.0, 1.0, 1.0),
        (-1.0, -1.0, -1.0),
        (1.0, 1.0, 0.0),
        (0.0, -1.0, 0.0),
        (0.0, 0.0, -1.0),
        (1.0, 0.0, 0.0),
    }
    assert _rows(N[1]) == {
        (1.0, 1.0, 1.0),
        (-1.0, -1.0, -1.0),
        (-1.0, 0.0, 0.0),
        (0.0, -1.0, 0.0),
        (0.0, 0.0, 1.0),
    }
    with pytest.raises(ValueError, match="x: expected shape"):
        binding_normals(x[:, :2], A=A, b=b)


def test_cone_projection_equals_the_qp():
    gen = torch.Generator().manual_seed(0)
    N = torch.randn(6, 5, 4, generator=gen, dtype=torch.float64)
    N[2, 3:] = 0.0  # padding rows
    a = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    p, lam = cone_projection(a, N)
    for i in range(6):
        Ni = N[i][N[i].abs().sum(1) > 0]
        m = Ni.shape[0]
        sol = qp.solve(
            Ni @ Ni.T,
            -(Ni @ a[i]),
            G=-torch.eye(m, dtype=torch.float64),
            h=torch.zeros(m, dtype=torch.float64),
            solver="clarabel",
        )
        assert torch.allclose(p[i], sol.x @ Ni, atol=1e-7)
        # KKT of the projection: lam >= 0, N(a - p) <= 0 and complementary
        assert (lam[i] >= 0).all()
        r = Ni @ (a[i] - p[i])
        assert (r <= 1e-10).all() and abs(float(lam[i][:m] @ r)) < 1e-10


def test_cave_closed_form_and_gradient():
    oracle = enum_oracle(torch.eye(2, dtype=torch.float64))  # only its sense and dim are used
    normals = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)  # the quadrant
    c_hat = torch.tensor([[-1.0, 1.0]], dtype=torch.float64, requires_grad=True)  # a = (1, -1)
    loss = CaVE(oracle)(c_hat, normals)
    assert loss.item() == pytest.approx(1 - 1 / math.sqrt(2), abs=1e-12)
    loss.backward()
    # with the target p = (1, 0) held: d/dc_hat [1 - cos(-c_hat, p)]
    p = torch.tensor([1.0, 0.0], dtype=torch.float64)
    for h in (1e-4, 1e-5, 1e-6):
        for j in range(2):
            e = torch.zeros(2, dtype=torch.float64)
            e[j] = h

            def f(c):
                a = -c
                return 1 - (a @ p) / (a.norm() * p.norm())

            fd = (f(c_hat.detach()[0] + e) - f(c_hat.detach()[0] - e)) / (2 * h)
            assert abs(c_hat.grad[0, j] - fd) < 1e-6
    assert CaVE(oracle).cost.forwards == 0


def test_cave_is_zero_exactly_when_the_true_path_is_optimal():
    grid = (3, 3)
    oracle = ShortestPathOracle(grid)
    A, b = flow_conservation(9, grid_graph(*grid), 0, 8)
    gen = torch.Generator().manual_seed(1)
    c = torch.rand(40, oracle.dim, generator=gen, dtype=torch.float64) + 0.1
    x = oracle(c)
    N = binding_normals(x, A=A, b=b, lb=0.0)
    cave = CaVE(oracle, reduction="none")
    assert (cave(c, N) < 1e-10).all()  # -c lies in the normal cone of its own optimum
    c_hat = c + 0.6 * torch.randn(c.shape, generator=gen, dtype=torch.float64)
    loss = cave(c_hat, N)
    same = (oracle(c_hat) == x).all(1)
    assert 5 <= int(same.sum()) <= 35
    assert (loss[same] < 1e-9).all() and (loss[~same] > 1e-6).all()
    assert cave.last_outside == 0 and cave.last_fallbacks == 0  # every projection certified


def test_cave_polar_cone_fallback_and_refusals():
    oracle = enum_oracle(torch.eye(2, dtype=torch.float64))
    normals = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    cave = CaVE(oracle)
    loss = cave(torch.tensor([[1.0, 2.0]], dtype=torch.float64), normals)  # a = (-1, -2)
    assert cave.last_outside == 1
    mean_unit = torch.tensor([1.0, 1.0], dtype=torch.float64) / 2
    a = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    assert loss.item() == pytest.approx(1 - float(a @ mean_unit / (a.norm() * mean_unit.norm())))
    with pytest.raises(ValueError, match="no binding constraint"):
        cave(torch.ones(1, 2, dtype=torch.float64), torch.zeros(1, 2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="tight_ctrs: expected shape"):
        cave(torch.ones(2, 2, dtype=torch.float64), normals)


def test_cave_equals_pyepo_with_a_converged_projection():
    pyepo_func = pytest.importorskip("pyepo.func", reason="pyepo (test-only reference) missing")
    pytest.importorskip("clarabel", reason="PyEPO's CaVE needs clarabel")
    V = subsets(5, 2)
    for sense in ("min", "max"):
        oracle = enum_oracle(V, sense)
        gen = torch.Generator().manual_seed(2)
        c = torch.rand(8, 5, generator=gen, dtype=torch.float64)
        x = oracle(c)
        N = binding_normals(x, A=np.ones((1, 5)), b=np.array([2.0]), lb=0.0, ub=1.0)
        c_hat = torch.randn(8, 5, generator=gen, dtype=torch.float64)
        a, b = c_hat.clone().requires_grad_(True), c_hat.clone().requires_grad_(True)
        ours = CaVE(oracle)(a, N)
        theirs = pyepo_func.CaVE(pyepo_model(oracle), max_iter=200)(b, N)
        ours.backward()
        theirs.backward()
        assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
        assert torch.allclose(a.grad, b.grad.to(a.dtype), atol=1e-5)
