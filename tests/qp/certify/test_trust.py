"""Silent-wrong-number repros of issue 9: zero rows, solver tolerance leaks, double backward,
polishing and certification, the fallback chain."""

from __future__ import annotations

import pytest
import torch
from qp_zoo import complementary_qp

import dxopt.qp as dqp

F64 = torch.float64


def _exact_vjp(data, grad_x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Reduced-KKT VJP on the known active set (dense solve, independent of dxopt)."""
    n = data.P.shape[0]
    C = data.G[data.active]
    k = C.shape[0]
    K = torch.zeros(n + k, n + k, dtype=F64)
    K[:n, :n], K[:n, n:], K[n:, :n] = data.P, C.T, C
    z = torch.linalg.solve(K, torch.cat([grad_x, torch.zeros(k, dtype=F64)]))
    dh = torch.zeros(data.G.shape[0], dtype=F64)
    dh[data.active] = z[n:]
    return {"q": -z[:n], "h": dh}


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_zero_row_with_roundoff_h_does_not_change_the_gradient(sparse: bool, backward: str):
    data = complementary_qp(16, m=12, seed=3)
    G = torch.cat([torch.zeros(1, 16, dtype=F64), data.G])
    h = torch.cat([torch.tensor([-1e-17], dtype=F64), data.h]).requires_grad_()
    q = data.q.clone().requires_grad_()
    Gs = G.to_sparse() if sparse else G
    P = data.P.to_sparse() if sparse else data.P
    sol = dqp.solve(P, q, G=Gs, h=h, backward=backward)
    assert sol.status == (dqp.QPStatus.SOLVED,)
    grad_x = torch.randn(16, generator=torch.Generator().manual_seed(0), dtype=F64)
    (sol.x @ grad_x).backward()
    ref = _exact_vjp(data, grad_x)
    torch.testing.assert_close(q.grad, ref["q"], rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(h.grad[1:], ref["h"], rtol=1e-7, atol=1e-9)
    assert float(h.grad[0]) == 0.0 and float(sol.ineq_duals[0]) == 0.0  # type: ignore[index]


@pytest.mark.parametrize("sparse", [False, True])
def test_zero_row_with_negative_h_is_infeasible(sparse: bool):
    data = complementary_qp(6, m=4, seed=1)
    G = torch.cat([torch.zeros(1, 6, dtype=F64), data.G])
    h = torch.cat([torch.tensor([-1e-3], dtype=F64), data.h])
    sol = dqp.solve(
        data.P.to_sparse() if sparse else data.P,
        data.q,
        G=G.to_sparse() if sparse else G,
        h=h,
        on_failure="nan",
    )
    assert sol.status == (dqp.QPStatus.INFEASIBLE,)
    assert torch.isnan(sol.x).all()


@pytest.mark.parametrize("solver", ["daqp", "piqp", "clarabel"])
def test_solver_tolerance_does_not_leak_into_the_active_set(solver: str):
    P = torch.eye(3, dtype=F64)
    q = -torch.tensor([0.5, -0.3, 0.2], dtype=F64)
    G = torch.tensor([[1.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.499999], dtype=F64, requires_grad=True)
    sol = dqp.solve(P, q, G=G, h=h, solver=solver, fallback=False)
    assert sol.status == (dqp.QPStatus.SOLVED,)
    assert float(sol.x[0]) <= 0.499999 + 1e-12
    torch.testing.assert_close(sol.ineq_duals.detach(), torch.tensor([1e-6], dtype=F64))  # type: ignore[union-attr]
    sol.x[0].backward()
    torch.testing.assert_close(h.grad, torch.tensor([1.0], dtype=F64))


@pytest.mark.parametrize("solver", ["daqp", "piqp"])
@pytest.mark.parametrize("s", [1e-3, 1e-6])
def test_tolerance_leak_at_small_scale(s: float, solver: str):
    """The same problem scaled down: the polished active set is exact at round-off level,
    whatever the (default, absolute) tolerance."""
    P = torch.eye(3, dtype=F64)
    q = -s * torch.tensor([0.5, -0.3, 0.2], dtype=F64)
    G = torch.tensor([[1.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.499999 * s], dtype=F64, requires_grad=True)
    sol = dqp.solve(P, q, G=G, h=h, solver=solver)
    assert float(sol.x[0]) <= h.item() * (1 + 1e-10)
    sol.x[0].backward()
    torch.testing.assert_close(h.grad, torch.tensor([1.0], dtype=F64))


def test_solved_status_never_outside_tolerance():
    """A backend whose point violates the requested tolerance is not reported SOLVED as is."""
    P = torch.eye(3, dtype=F64)
    q = -torch.tensor([0.5, -0.3, 0.2], dtype=F64)
    G = torch.tensor([[1.0, 0.0, 0.0]], dtype=F64)
    h = torch.tensor([0.499999], dtype=F64)
    # daqp stopping at 1e-5 returns x0 = 0.5; unpolished, the certificate must refuse it
    sol = dqp.solve(
        P,
        q,
        G=G,
        h=h,
        solver="daqp",
        solver_options={"primal_tol": 1e-5},
        fallback=False,
        polish=False,
        on_failure="nan",
    )
    assert sol.status == (dqp.QPStatus.INACCURATE,)  # a point that misses eps_abs
    # with polishing the same backend output is repaired and certified
    sol = dqp.solve(P, q, G=G, h=h, solver="daqp", solver_options={"primal_tol": 1e-5})
    assert sol.status == (dqp.QPStatus.SOLVED,) and sol.info.polished == (True,)
    assert float(sol.x[0]) <= 0.499999 + 1e-12


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_double_backward_raises_instead_of_dropping_the_second_order_term(backward: str):
    data = complementary_qp(4, m=3, seed=0)
    q = data.q.clone().requires_grad_()
    sol = dqp.solve(data.P, q, G=data.G, h=data.h, backward=backward)
    loss = (sol.x**2).sum() + (q**3).sum()  # g depends on q through another path too
    (g,) = torch.autograd.grad(loss, q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        torch.autograd.grad(g.sum(), q)


def test_fallback_chain_records_the_solver_and_can_be_turned_off():
    data = complementary_qp(8, m=6, seed=2)
    # osqp at its default settings stops far from 1e-9: polish or fallback repairs it
    sol = dqp.solve(data.P, data.q, G=data.G, h=data.h, solver="osqp")
    assert sol.status == (dqp.QPStatus.SOLVED,)
    assert sol.info.sample_solvers[0] in ("osqp", "piqp", "clarabel", "daqp")
    torch.testing.assert_close(sol.x.detach(), data.x, rtol=0, atol=1e-8)
    sol = dqp.solve(
        data.P,
        data.q,
        G=data.G,
        h=data.h,
        solver="osqp",
        fallback=False,
        polish=False,
        on_failure="nan",
        solver_options={"eps_abs": 1e-2, "eps_rel": 1e-2, "polishing": False},
    )
    assert sol.status == (dqp.QPStatus.INACCURATE,)  # a point that misses eps_abs
    assert sol.info.sample_solvers == ("",)


@pytest.mark.parametrize("alpha", [1e-8, 1e8])
@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_tiny_and_huge_norm_row_give_the_same_gradient(alpha: float, backward: str) -> None:
    # scaling one active row (G_i, h_i) by alpha is the same problem: x and dL/dq are unchanged
    # and dL/dh_i scales by 1/alpha (no threshold on the row norm may change the active set)
    P = torch.eye(3, dtype=torch.float64)
    q = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64)
    G = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    h = torch.tensor([0.5, 0.8], dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    grads = []
    for s in (1.0, alpha):
        scale = torch.tensor([s, 1.0], dtype=torch.float64)
        qq, hh = q.clone().requires_grad_(True), (h * scale).requires_grad_(True)
        sol = dqp.solve(P, qq, G=G * scale[:, None], h=hh, backward=backward)
        (w * sol.x).sum().backward()
        assert qq.grad is not None and hh.grad is not None
        grads.append((sol.x.detach(), qq.grad, hh.grad * scale))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-9, rtol=0)
    torch.testing.assert_close(grads[1][1], grads[0][1], atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(grads[1][2], grads[0][2], atol=1e-7, rtol=1e-7)
    assert grads[0][2].abs().min() > 0.1  # both rows active: a real check
