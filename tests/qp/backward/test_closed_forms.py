"""Closed forms: simplex projection Jacobian, unconstrained and equality-only QPs."""

from __future__ import annotations

import pytest
import torch
from qp_zoo import complementary_qp, simplex_qp, simplex_vjp

import dxopt.qp as dqp


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
@pytest.mark.parametrize("sparse", [False, True])
def test_simplex_projection_vjp(backward: str, sparse: bool) -> None:
    data = simplex_qp(300, seed=1, sparse=sparse)
    q = data.q.clone().requires_grad_()
    b = data.b.clone().requires_grad_()  # type: ignore[union-attr]
    h = data.h.clone().requires_grad_()  # type: ignore[union-attr]
    sol = dqp.solve(data.P, q, A=data.A, b=b, G=data.G, h=h, backward=backward)
    torch.testing.assert_close(sol.x.detach(), data.x, atol=1e-8, rtol=0)
    grad_x = torch.randn(300, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (sol.x @ grad_x).backward()
    expected = simplex_vjp(data.x, grad_x)  # type: ignore[arg-type]
    for name, tensor in (("q", q), ("b", b), ("h", h)):
        err = (tensor.grad - expected[name]).norm() / expected[name].norm()  # type: ignore[operator]
        assert err <= 1e-6, name


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_unconstrained_qp_is_a_linear_solve(backward: str) -> None:
    data = complementary_qp(15, seed=3)
    P = data.P.clone().requires_grad_()
    q = data.q.clone().requires_grad_()
    sol = dqp.solve(P, q, backward=backward)
    P_ref = data.P.clone().requires_grad_()
    q_ref = data.q.clone().requires_grad_()
    x_ref = torch.linalg.solve(0.5 * (P_ref + P_ref.T), -q_ref)
    torch.testing.assert_close(sol.x, x_ref, atol=1e-10, rtol=1e-10)
    w = torch.randn(15, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    (sol.x @ w).backward()
    (x_ref @ w).backward()
    torch.testing.assert_close(q.grad, q_ref.grad, atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(P.grad, P_ref.grad, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_equality_only_qp_matches_kkt_linear_solve(backward: str) -> None:
    data = complementary_qp(12, p=4, seed=5)
    leaves = [t.clone().requires_grad_() for t in (data.P, data.q, data.A, data.b)]  # type: ignore[union-attr]
    sol = dqp.solve(**dict(zip("PqAbGh", leaves)), backward=backward)
    refs = [t.clone().requires_grad_() for t in (data.P, data.q, data.A, data.b)]  # type: ignore[union-attr]
    P, q, A, b = refs
    K = torch.cat([torch.cat([0.5 * (P + P.T), A.T], 1), torch.cat([A, torch.zeros(4, 4)], 1)])
    z = torch.linalg.solve(K, torch.cat([-q, b]))
    x_ref, mu_ref = z[:12], z[12:]
    torch.testing.assert_close(sol.x, x_ref, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(sol.eq_duals, mu_ref, atol=1e-9, rtol=1e-9)
    gen = torch.Generator().manual_seed(6)
    wx, wm = (
        torch.randn(12, generator=gen, dtype=torch.float64),
        torch.randn(4, generator=gen, dtype=torch.float64),
    )
    (sol.x @ wx + sol.eq_duals @ wm).backward()  # type: ignore[operator]
    (x_ref @ wx + mu_ref @ wm).backward()
    for mine, ref in zip(leaves, refs):
        torch.testing.assert_close(mine.grad, ref.grad, atol=1e-9, rtol=1e-7)


def test_large_sparse_simplex_matches_closed_form() -> None:
    """n = 20000 through the sparse path (SuperLU + GMRES refinement) of the penalty backward."""
    data = simplex_qp(20_000, seed=3, sparse=True)
    q = data.q.clone().requires_grad_()
    h = data.h.clone().requires_grad_()  # type: ignore[union-attr]
    sol = dqp.solve(data.P, q, A=data.A, b=data.b, G=data.G, h=h)
    assert sol.info.solver == "piqp"
    grad_x = torch.randn(20_000, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    (sol.x @ grad_x).backward()
    expected = simplex_vjp(data.x, grad_x)  # type: ignore[arg-type]
    assert float((q.grad - expected["q"]).norm() / expected["q"].norm()) <= 1e-6  # type: ignore[operator]
    assert float((h.grad - expected["h"]).norm() / expected["h"].norm()) <= 1e-6  # type: ignore[operator]
    assert sol.info.backward.linear_solver == "splu+gmres"
    assert sol.info.backward.refinement_steps <= 5


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_empty_constraint_blocks_behave_like_absent_ones(backward: str) -> None:
    P = torch.eye(3, dtype=torch.float64)
    q = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    empty_rows, empty = torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    sol = dqp.solve(P, q, A=empty_rows, b=empty, G=empty_rows, h=empty, backward=backward)
    assert sol.ineq_duals is not None and sol.ineq_duals.shape == (0,)
    (grad_q,) = torch.autograd.grad(sol.x.sum(), q)
    torch.testing.assert_close(sol.x.detach(), -q.detach())
    torch.testing.assert_close(grad_q, -torch.ones(3, dtype=torch.float64))
