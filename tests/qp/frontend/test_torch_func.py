"""torch.func through the CVXPY front ends: jacrev against float64 finite differences, vmap
against a loop, the affine map's own vmap rule, and the conic engine's clear refusal."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

pytest.importorskip("cvxpy")

import cvxpy as cp

from dxopt.frontend import CvxpyLayer
from dxopt.qp import CvxpyQPLayer
from dxopt.qp.frontend._affine import SparseLinear, affine_map

from ._central import central_quotient
from ._problems import box_least_squares, mpc

F64 = torch.float64


@pytest.mark.parametrize("sparse", [False, True])
def test_jacrev_through_the_layer_matches_finite_differences(sparse: bool) -> None:
    """d x*/d g of box least squares (F, g parameters; x* with entries at both bounds) by
    torch.func.jacrev, column by column against kink-aware central differences."""
    case = box_least_squares(n=5, k=8, seed=3)
    layer = CvxpyQPLayer(
        case.problem, case.parameters, case.outputs[:1], backward="kkt", sparse=sparse
    )
    F, g = case.values

    def x_of(gv: torch.Tensor) -> torch.Tensor:
        return layer(F, gv)[0]

    jac = torch.func.jacrev(x_of)(g)
    assert jac.shape == (5, 8)
    rng = np.random.default_rng(0)
    checked = 0
    for row in range(5):
        w = rng.standard_normal(8)
        f = lambda gv, row=row: float(x_of(torch.from_numpy(gv))[row])  # noqa: E731
        fd = central_quotient(f, g.numpy(), w)
        if fd is None:
            continue
        checked += 1
        assert abs(float(jac[row] @ torch.from_numpy(w)) - fd) <= 1e-6 * (1 + abs(fd))
    assert checked >= 3  # the free entries are smooth (the two at a bound have slope 0)
    # and the Jacobian of the entries at a bound is exactly zero (strictly active)
    assert float(jac[:2].abs().max()) <= 1e-9


def test_jacrev_with_respect_to_a_matrix_parameter_and_an_eliminated_chain() -> None:
    """MPC with the dynamics matrix a parameter (the defining rows depend on it, so the
    elimination runs in torch per call): jacrev of a weighted sum of U* w.r.t. A equals
    autograd's gradient and kink-aware central differences."""
    case = mpc(horizon=3, dynamics_parameter=True, seed=2)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs[:1], backward="kkt")
    x0, A = case.values
    weights = torch.randn(2, 3, dtype=F64, generator=torch.Generator().manual_seed(3))

    def loss(a: torch.Tensor) -> torch.Tensor:
        return (layer(x0, a)[0] * weights).sum()

    jac = torch.func.jacrev(loss)(A)
    a = A.clone().requires_grad_()
    (ref,) = torch.autograd.grad(loss(a), a)
    assert torch.allclose(jac, ref, atol=1e-10, rtol=0)
    w = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    fd = central_quotient(lambda v: float(loss(torch.from_numpy(v))), A.numpy(), w.numpy())
    assert fd is not None  # the drawn point is smooth
    assert abs(float((jac * w).sum()) - fd) <= 1e-6 * (1 + abs(fd))


@pytest.mark.parametrize("sparse", [False, True])
def test_vmap_through_the_layer_equals_a_loop(sparse: bool) -> None:
    """vmap over a batch of initial states (and over a batch of batches) = one call each."""
    case = mpc(horizon=4, batch=6, seed=5)
    layer = CvxpyQPLayer(case.problem, case.parameters, case.outputs[:2], sparse=sparse)
    (x0,) = case.values
    U, X = torch.func.vmap(layer)(x0)
    for i in range(6):
        u, x = layer(x0[i])
        assert torch.allclose(U[i], u, atol=1e-9, rtol=0)
        assert torch.allclose(X[i], x, atol=1e-9, rtol=0)
    nested = torch.func.vmap(lambda b: layer(b)[0])(x0.reshape(2, 3, 3))
    assert torch.allclose(nested.reshape(6, *U.shape[1:]), U, atol=1e-9, rtol=0)
    # vmap of the gradient = the gradient per sample
    grads = torch.func.vmap(torch.func.grad(lambda b: layer(b)[0].square().sum()))(x0)
    for i in range(6):
        xi = x0[i].clone().requires_grad_()
        (gi,) = torch.autograd.grad(layer(xi)[0].square().sum(), xi)
        assert torch.allclose(grads[i], gi, atol=1e-9, rtol=0)


def test_the_affine_map_under_vmap_jacrev_and_jacfwd() -> None:
    """The map's vmap rule (the vmapped dimension at any position) and its Jacobians equal the
    dense product's."""
    M = sp.random(7, 5, density=0.4, random_state=np.random.default_rng(0), format="csr")
    linear, dense = SparseLinear(M), torch.tensor(M.toarray())
    theta = torch.randn(4, 3, 5, dtype=F64)
    for dim in (0, 1):
        out = torch.func.vmap(lambda t: affine_map(t, linear), in_dims=dim)(theta.movedim(0, dim))
        assert torch.allclose(out, theta @ dense.T)
    one = theta[0]
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        J = jac(lambda t: affine_map(t, linear))(one)
        assert torch.allclose(J, torch.einsum("ab,ij->aibj", torch.eye(3, dtype=F64), dense))
    # second order through vmap(jacrev): the map is linear, so the Hessian of a square is 2 M'M
    H = torch.func.hessian(lambda t: affine_map(t.unsqueeze(0), linear).square().sum())(one[0])
    assert torch.allclose(H, 2 * dense.T @ dense)


def test_cvxpy_layer_qp_supports_torch_func_and_a_conic_problem_is_refused() -> None:
    x, y = cp.Variable(3), cp.Parameter(3)
    qp = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.sum(x) == 1, x >= 0])
    v = torch.tensor([0.5, 0.2, -1.0], dtype=F64)
    qp_layer = CvxpyLayer(qp, parameters=[y], variables=[x])
    J = torch.func.jacrev(lambda t: qp_layer(t)[0])(v)
    expected = torch.zeros(3, 3, dtype=F64)
    expected[:2, :2] = torch.tensor([[0.5, -0.5], [-0.5, 0.5]], dtype=F64)  # simplex support
    assert torch.allclose(J, expected, atol=1e-9, rtol=0)
    socp = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), [cp.norm(x) <= 1])
    layer = CvxpyLayer(socp, parameters=[y], variables=[x])
    with pytest.raises(TypeError, match=r"dxopt\.conic does not run under torch\.func"):
        torch.func.vmap(layer)(v.expand(2, 3))
    (out,) = layer(v)  # plain calls still work
    assert abs(float(out.norm()) - 1.0) <= 1e-7
