"""Box bounds lb <= x <= ub are the same as the explicit rows of G, gradients included."""

from __future__ import annotations

import pytest
import torch
from qp_zoo import complementary_qp

import dxopt.qp as dqp

F64 = torch.float64


@pytest.mark.parametrize("sparse", [False, True])
def test_bounds_match_explicit_rows(sparse: bool) -> None:
    data = complementary_qp(8, m=4, p=2, seed=11)
    gen = torch.Generator().manual_seed(0)
    lb = data.x - 0.3 * torch.rand(8, generator=gen, dtype=F64)  # type: ignore[operator]
    ub = data.x + 0.3 * torch.rand(8, generator=gen, dtype=F64)  # type: ignore[operator]
    lb[[1, 5]] = -torch.inf
    ub[[2]] = torch.inf
    q0 = data.q + 2.0 * torch.randn(8, generator=gen, dtype=F64)  # push against the box
    w = torch.randn(8, generator=gen, dtype=F64)

    q, lb_t, ub_t = (
        q0.clone().requires_grad_(),
        lb.clone().requires_grad_(),
        ub.clone().requires_grad_(),
    )
    P = data.P.to_sparse() if sparse else data.P
    G_in = data.G.to_sparse() if sparse else data.G  # type: ignore[union-attr]
    sol = dqp.solve(P, q, A=data.A, b=data.b, G=G_in, h=data.h, lb=lb_t, ub=ub_t, backward="kkt")
    (sol.x @ w).backward()

    lo, hi = torch.isfinite(lb), torch.isfinite(ub)
    eye = torch.eye(8, dtype=F64)
    G = torch.cat([data.G, -eye[lo], eye[hi]])  # type: ignore[list-item]
    q_ref = q0.clone().requires_grad_()
    h_ref = torch.cat([data.h, -lb[lo], ub[hi]]).requires_grad_()  # type: ignore[list-item]
    ref = dqp.solve(data.P, q_ref, A=data.A, b=data.b, G=G, h=h_ref, backward="kkt")
    (ref.x @ w).backward()

    torch.testing.assert_close(sol.x, ref.x)
    assert sol.lb_duals is not None and sol.ub_duals is not None and sol.ineq_duals is not None
    assert sol.ineq_duals.shape == (4,) and sol.lb_duals.shape == (int(lo.sum()),)
    torch.testing.assert_close(sol.lb_duals, ref.ineq_duals[4 : 4 + int(lo.sum())])  # type: ignore[index]
    assert float(torch.cat([sol.lb_duals, sol.ub_duals]).detach().max()) > 0  # a bound is active
    torch.testing.assert_close(q.grad, q_ref.grad)
    grad_h = h_ref.grad
    assert grad_h is not None and lb_t.grad is not None and ub_t.grad is not None
    k = int(lo.sum())
    torch.testing.assert_close(lb_t.grad[lo], -grad_h[4 : 4 + k])
    torch.testing.assert_close(ub_t.grad[hi], grad_h[4 + k :])
    assert torch.equal(lb_t.grad[~lo], torch.zeros(int((~lo).sum()), dtype=F64))


def test_bounds_batched_and_nan_rejected() -> None:
    P = torch.eye(3, dtype=F64)
    q = torch.tensor([[1.0, -2.0, 0.5], [-1.0, 2.0, 0.0]], dtype=F64)
    lb, ub = torch.zeros(3, dtype=F64), torch.ones(2, 3, dtype=F64)
    sol = dqp.solve(P, q, lb=lb, ub=ub)
    expected = (-q).clamp(0.0, 1.0)
    torch.testing.assert_close(sol.x, expected)
    assert sol.ineq_duals is None and sol.ub_duals is not None and sol.ub_duals.shape == (2, 3)
    with pytest.raises(ValueError, match="lb: expected numbers or"):
        dqp.solve(P, q, lb=torch.full((3,), torch.nan, dtype=F64))
    with pytest.raises(ValueError, match="ub: expected the same finite entries"):
        dqp.solve(P, q, ub=torch.tensor([[1.0, torch.inf, 1.0], [1.0, 1.0, 1.0]], dtype=F64))


@pytest.mark.parametrize("backward", ["penalty", "kkt"])
def test_every_entry_rows_match_the_compact_rows(backward: str) -> None:
    """The vmap encoding (one row per entry; an infinite bound the zero row 0'x <= 1, a
    wrong-signed one 0'x <= -1) solved eagerly: the same x, the same duals at the finite
    entries, exact zeros at the infinite ones, the same gradients; lb = +inf is infeasible."""
    from dxopt.qp.api.bounds import append_every_bound

    data = complementary_qp(8, m=4, p=2, seed=12)
    gen = torch.Generator().manual_seed(1)
    lb = data.x - 0.3 * torch.rand(8, generator=gen, dtype=F64)  # type: ignore[operator]
    ub = data.x + 0.3 * torch.rand(8, generator=gen, dtype=F64)  # type: ignore[operator]
    lb[[1, 5]], ub[[2]] = -torch.inf, torch.inf
    q0 = data.q + 2.0 * torch.randn(8, generator=gen, dtype=F64)  # push against the box
    w = torch.randn(8, generator=gen, dtype=F64)
    lb_a, ub_a, q_a = (t.clone().requires_grad_() for t in (lb, ub, q0))
    P, A, b = data.P, data.A, data.b
    ref = dqp.solve(P, q_a, A=A, b=b, G=data.G, h=data.h, lb=lb_a, ub=ub_a, backward=backward)
    (ref.x @ w).backward()
    lb_b, ub_b, q_b = (t.clone().requires_grad_() for t in (lb, ub, q0))
    G, h, k_lb, k_ub = append_every_bound(q_b, data.G, data.h, lb_b, ub_b)
    assert (k_lb, k_ub) == (8, 8) and G is not None and G.shape == (20, 8)
    sol = dqp.solve(data.P, q_b, A=data.A, b=data.b, G=G, h=h, backward=backward)
    (sol.x @ w).backward()
    torch.testing.assert_close(sol.x, ref.x, atol=1e-12, rtol=1e-12)
    nu = sol.ineq_duals
    assert nu is not None and ref.lb_duals is not None and ref.ub_duals is not None
    lo, hi = torch.isfinite(lb), torch.isfinite(ub)
    torch.testing.assert_close(nu[4:12][lo], ref.lb_duals, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(nu[12:][hi], ref.ub_duals, atol=1e-12, rtol=1e-10)
    assert bool((nu[4:12][~lo] == 0).all()) and bool((nu[12:][~hi] == 0).all())
    assert float(torch.cat([ref.lb_duals, ref.ub_duals]).detach().max()) > 1e-3  # active
    for got, want in ((q_b.grad, q_a.grad), (lb_b.grad, lb_a.grad), (ub_b.grad, ub_a.grad)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    bad = lb.clone()
    bad[3] = torch.inf
    G, h, _, _ = append_every_bound(q0, data.G, data.h, bad, ub)
    out = dqp.solve(data.P, q0, A=data.A, b=data.b, G=G, h=h, on_failure="nan")
    assert out.status == (dqp.QPStatus.INFEASIBLE,)
