"""The regularised Frank-Wolfe layer and its Fenchel-Young loss: the projection onto the simplex
against its closed form (sort and threshold); onto the k-subset polytope against the QP solved
by ``dxopt.qp``, whose exact (KKT) derivative checks the layer's Jacobian; the loss in closed
form, non-negative, its gradient against central differences; PyEPO's RFWO / RFY; max_iter."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tests.dfl._enum import enum_oracle, pyepo_model, subsets

from dxopt import DxoptError, DxoptWarning, Status, qp
from dxopt.dfl import FrankWolfeFenchelYoung, RegularizedFrankWolfe


def _simplex_projection(t):
    u, _ = torch.sort(t, descending=True)
    css = u.cumsum(0)
    j = torch.arange(1, t.numel() + 1, dtype=t.dtype)
    rho = int(torch.nonzero(u - (css - 1) / j > 0).max()) + 1
    return (t - (css[rho - 1] - 1) / rho).clamp_min(0)


@pytest.mark.parametrize("sense", ["min", "max"])
def test_projection_onto_the_simplex_equals_its_closed_form(sense):
    s = 1.0 if sense == "min" else -1.0
    oracle = enum_oracle(torch.eye(6, dtype=torch.float64), sense)
    gen = torch.Generator().manual_seed(0)
    c_hat = torch.randn(10, 6, generator=gen, dtype=torch.float64)
    lambd = 0.7
    layer = RegularizedFrankWolfe(oracle, lambd=lambd)
    y = layer(c_hat)
    for i in range(10):
        assert torch.allclose(y[i], _simplex_projection(-s * c_hat[i] / lambd), atol=1e-9)
    info = layer.last_info
    assert info is not None and all(st is Status.SOLVED for st in info.status)
    assert (info.error_bound < 1e-4).all()


def _kset(k=2, d=5):
    A = torch.ones(1, d, dtype=torch.float64)
    G = torch.cat([torch.eye(d), -torch.eye(d)]).to(torch.float64)
    h = torch.cat([torch.ones(d), torch.zeros(d)]).to(torch.float64)
    return enum_oracle(subsets(d, k)), A, torch.tensor([float(k)], dtype=torch.float64), G, h


def test_layer_and_jacobian_equal_the_qp_on_the_k_subset_polytope():
    oracle, A, b, G, h = _kset()
    gen = torch.Generator().manual_seed(1)
    lambd = 0.8
    c_hat = 0.6 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    w = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    ours = c_hat.clone().requires_grad_(True)
    y = RegularizedFrankWolfe(oracle, lambd=lambd)(ours)
    (y * w).sum().backward()
    ci = c_hat.clone().requires_grad_(True)
    eye = torch.eye(5, dtype=torch.float64).expand(6, 5, 5)
    # min 1/2 |y|^2 + c^T y / lambd = proj(-c / lambd), differentiated exactly (KKT)
    sol = qp.solve(eye, ci / lambd, A=A, b=b, G=G, h=h, solver="clarabel", backward="kkt")
    assert torch.allclose(y.detach(), sol.x, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qp.QPDegenerateWarning)  # x <= 1 and sum rows at 0/1
        (sol.x * w).sum().backward()
    assert torch.allclose(ours.grad, ci.grad, atol=1e-6)
    faces = {int(((x > 1e-6) & (x < 1 - 1e-6)).sum()) for x in sol.x}
    assert max(faces) >= 2  # some projections lie on faces of dimension >= 1


@pytest.mark.parametrize("sense", ["min", "max"])
def test_fenchel_young_loss_closed_form_and_gradient(sense):
    s = 1.0 if sense == "min" else -1.0
    oracle = enum_oracle(torch.eye(5, dtype=torch.float64), sense)
    gen = torch.Generator().manual_seed(2)
    c_hat = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    x_true = torch.eye(5, dtype=torch.float64)[torch.randint(0, 5, (8,), generator=gen)]
    lambd = 1.3
    fy = FrankWolfeFenchelYoung(oracle, lambd=lambd, reduction="none")
    c = c_hat.clone().requires_grad_(True)
    loss = fy(c, x_true)
    y_hat = torch.stack([_simplex_projection(-s * r / lambd) for r in c_hat])
    exact = s * (c_hat * (x_true - y_hat)).sum(1) + lambd / 2 * (
        x_true.square().sum(1) - y_hat.square().sum(1)
    )
    assert torch.allclose(loss.detach(), exact, atol=1e-9)
    assert (loss >= -1e-12).all()
    loss.sum().backward()
    assert torch.allclose(c.grad, s * (x_true - y_hat), atol=1e-8)
    # the loss is C^1 (Danskin): central differences agree at several steps
    for step in (1e-3, 1e-4):
        for j in range(5):
            e = torch.zeros(5, dtype=torch.float64)
            e[j] = step
            fd = (fy(c_hat + e, x_true) - fy(c_hat - e, x_true)) / (2 * step)
            assert torch.allclose(fd, c.grad[:, j], atol=1e-6)


def test_frank_wolfe_equals_pyepo():
    pyepo_func = pytest.importorskip("pyepo.func", reason="pyepo (test-only reference) missing")
    oracle, *_ = _kset(2, 5)
    gen = torch.Generator().manual_seed(3)
    c_hat = 0.6 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    x_true = oracle(torch.rand(6, 5, generator=gen, dtype=torch.float64))
    w = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    model = pyepo_model(oracle)
    a, b = c_hat.clone().requires_grad_(True), c_hat.clone().requires_grad_(True)
    ya = RegularizedFrankWolfe(oracle, lambd=0.8)(a)
    yb = pyepo_func.RFWO(model, lambd=0.8, tol=1e-12, max_iter=20000)(b)
    assert torch.allclose(ya, yb.to(ya.dtype), atol=1e-6)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    assert torch.allclose(a.grad, b.grad.to(a.dtype), atol=1e-4)  # PyEPO adds a 1e-6 ridge
    a.grad = b.grad = None
    la = FrankWolfeFenchelYoung(oracle, lambd=0.8)(a, x_true)
    lb = pyepo_func.RFY(model, lambd=0.8, tol=1e-12, max_iter=20000)(b, x_true)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-7)
    assert torch.allclose(a.grad, b.grad.to(a.dtype), atol=1e-6)


def test_max_iter_is_reported_by_on_failure():
    oracle, *_ = _kset(2, 6)
    c_hat = 0.3 * torch.randn(3, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with pytest.raises(DxoptError, match="max_iter=1"):
        RegularizedFrankWolfe(oracle, max_iter=1)(c_hat)
    layer = RegularizedFrankWolfe(oracle, max_iter=1, on_failure="warn")
    with pytest.warns(DxoptWarning, match="gap"):
        layer(c_hat)
    assert layer.last_info is not None and Status.MAX_ITER in layer.last_info.status
    assert np.isfinite(layer.last_info.gap.numpy()).all()
    with pytest.raises(ValueError, match="on_failure"):
        RegularizedFrankWolfe(oracle, on_failure="nan")


_SQUARE = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)


def test_tied_costs_refuse_the_gradient_where_the_corral_misses_the_face():
    # t = -c/lambda = (1/2, 1/2) inside the unit square: the projection is the identity there
    # (Jacobian -I/lambda in c), but Wolfe stops on the diagonal {(0,0), (1,1)} with gap 0 and
    # the face projector would be rank one: a silently wrong gradient, now refused.
    oracle = enum_oracle(_SQUARE)
    c_tie = torch.tensor([[-0.5, -0.5]], dtype=torch.float64, requires_grad=True)
    with pytest.raises(DxoptError, match="tied"):
        RegularizedFrankWolfe(oracle)(c_tie)
    with pytest.warns(DxoptWarning, match="tied"):
        RegularizedFrankWolfe(oracle, on_failure="warn")(c_tie)
    # without grad nothing is probed, the value is right
    y = RegularizedFrankWolfe(oracle)(c_tie.detach())
    assert torch.allclose(y, torch.tensor([[0.5, 0.5]], dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("c0", [[-0.5, -0.4], [-0.3, -0.8], [-1.6, -0.5], [0.2, -2.0]])
def test_untied_costs_keep_the_gradient_and_it_matches_finite_differences(c0):
    # interior, interior, on the edge x1 = 1, at the vertex (0, 1): away from kinks the
    # projection is smooth and its Jacobian is checked by central differences at two steps
    oracle = enum_oracle(_SQUARE)
    c = torch.tensor([c0], dtype=torch.float64, requires_grad=True)
    layer = RegularizedFrankWolfe(oracle)
    J = torch.stack(
        [torch.autograd.grad(layer(c)[0, k], c)[0][0] for k in range(2)]
    )  # J[k, j] = dy_k / dc_j
    for h in (1e-4, 1e-6):
        fd = torch.empty(2, 2, dtype=torch.float64)
        for j in range(2):
            e = torch.zeros(1, 2, dtype=torch.float64)
            e[0, j] = h
            with torch.no_grad():
                fd[:, j] = ((layer(c + e) - layer(c - e)) / (2 * h))[0]
        assert torch.allclose(J, fd, atol=1e-6)
