"""Per-sample statuses, QPSolveError with indices, on_failure='nan', weak rows, zero multipliers."""

from __future__ import annotations

import pickle

import pytest
import torch
from qp_zoo import complementary_qp, weakly_active_qp

import dxopt.qp as dqp

F64 = torch.float64


def _batch_with_infeasible() -> tuple[torch.Tensor, ...]:
    """Three 2-D QPs ``x <= h_hi, -x <= h_lo``; sample 1 has an empty box."""
    P = torch.eye(2, dtype=F64)
    q = torch.tensor([[1.0, -1.0], [0.5, 0.5], [-2.0, 0.0]], dtype=F64)
    G = torch.cat([torch.eye(2), -torch.eye(2)]).to(F64)
    h = torch.tensor([[1.0, 1, 1, 1], [1.0, 1, -2, 1], [1.0, 1, 1, 1]], dtype=F64)
    return P, q, G, h


def test_infeasible_sample_raises_with_indices() -> None:
    P, q, G, h = _batch_with_infeasible()
    with pytest.raises(dqp.QPSolveError, match="infeasible") as info:
        dqp.solve(P, q, G=G, h=h)
    assert info.value.failed_indices == (1,)
    assert info.value.status[1] is dqp.QPStatus.INFEASIBLE
    assert info.value.status[0] is dqp.QPStatus.SOLVED
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.failed_indices == (1,)


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_on_failure_nan_keeps_other_samples(backward: str) -> None:
    P, q, G, h = _batch_with_infeasible()
    q = q.clone().requires_grad_()
    h = h.clone().requires_grad_()
    sol = dqp.solve(P, q, G=G, h=h, on_failure="nan", backward=backward)
    assert sol.status[1] is dqp.QPStatus.INFEASIBLE
    assert torch.isnan(sol.x[1]).all() and torch.isnan(sol.ineq_duals[1]).all()  # type: ignore[index]
    torch.testing.assert_close(sol.x[0].detach(), torch.tensor([-1.0, 1.0], dtype=F64))
    torch.testing.assert_close(sol.x[2].detach(), torch.tensor([1.0, 0.0], dtype=F64))
    sol.x[[0, 2]].sum().backward()
    assert torch.equal(q.grad[1], torch.zeros(2, dtype=F64))  # failed sample: zero gradient
    assert torch.equal(h.grad[1], torch.zeros(4, dtype=F64))
    # sample 2: x0 = 1 is pinned by x0 <= 1 (d/dh0 = 1), x1 = 0 free (d/dq1 = -1)
    torch.testing.assert_close(q.grad[2], torch.tensor([0.0, -1.0], dtype=F64))
    torch.testing.assert_close(h.grad[2], torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64))


def test_unbounded_status() -> None:
    P = torch.zeros(2, 2, dtype=F64)
    q = torch.tensor([-1.0, 0.0], dtype=F64)
    G, h = -torch.eye(2, dtype=F64), torch.zeros(2, dtype=F64)
    sol = dqp.solve(P, q, G=G, h=h, on_failure="nan", solver="clarabel")
    assert sol.status == (dqp.QPStatus.UNBOUNDED,)
    assert torch.isnan(sol.x).all()
    with pytest.raises(dqp.QPSolveError, match="unbounded"):
        dqp.solve(P, q, G=G, h=h, solver="clarabel")


def _kkt_reference(data, rows: torch.Tensor, grad_x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """d(grad_x . x)/dq with the rows ``rows`` of G and all of A held as equalities."""
    C = torch.cat([data.G[rows], data.A])
    k = C.shape[0]
    K = torch.cat([torch.cat([data.P, C.T], 1), torch.cat([C, torch.zeros(k, k, dtype=F64)], 1)])
    rhs = torch.cat([grad_x, torch.zeros(k, dtype=F64)])
    return -torch.linalg.solve(K, rhs)[: data.P.shape[0]]


@pytest.mark.parametrize("backward", [dqp.KKTBackward, dqp.PenaltyBackward])
def test_weakly_active_rows_follow_policy(backward: type) -> None:
    data = weakly_active_qp(seed=0)
    slack = data.h - data.G @ data.x  # type: ignore[operator]
    weak = (slack == 0) & (data.ineq_duals == 0)  # type: ignore[operator]
    assert int(weak.sum()) == 3
    grad_x = torch.randn(12, generator=torch.Generator().manual_seed(3), dtype=F64)
    for policy, rows in (("inactive", data.active), ("active", data.active | weak)):  # type: ignore[operator]
        q = data.q.clone().requires_grad_()
        sol = dqp.solve(
            data.P, q, A=data.A, b=data.b, G=data.G, h=data.h, backward=backward(weak_policy=policy)
        )
        (sol.x @ grad_x).backward()
        expected = _kkt_reference(data, rows, grad_x)  # type: ignore[arg-type]
        assert float((q.grad - expected).norm() / expected.norm()) <= 1e-6, policy  # type: ignore[operator]
        assert sol.info.backward.n_weak == (3,)
    q = data.q.clone().requires_grad_()
    sol = dqp.solve(
        data.P, q, A=data.A, b=data.b, G=data.G, h=data.h, backward=backward(weak_policy="raise")
    )
    with pytest.raises(dqp.QPBackwardError, match="weakly active rows"):
        sol.x.sum().backward()


@pytest.mark.parametrize("backward", [dqp.KKTBackward, dqp.PenaltyBackward])
def test_all_zero_multipliers(backward: type) -> None:
    """Projection of y onto {x <= y}: every row has zero slack and zero multiplier."""
    y = torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=F64)
    P, G = torch.eye(6, dtype=F64), torch.eye(6, dtype=F64)
    grad_x = torch.randn(6, generator=torch.Generator().manual_seed(1), dtype=F64)
    expectations = {  # (dL/dq, dL/dh)
        "inactive": (-grad_x, torch.zeros(6, dtype=F64)),
        "active": (torch.zeros(6, dtype=F64), grad_x),
    }
    for policy, (dq, dh) in expectations.items():
        q, h = (-y).clone().requires_grad_(), y.clone().requires_grad_()
        sol = dqp.solve(P, q, G=G, h=h, backward=backward(weak_policy=policy))
        assert torch.equal(sol.ineq_duals.detach(), torch.zeros(6, dtype=F64))  # type: ignore[union-attr]
        (sol.x @ grad_x).backward()
        torch.testing.assert_close(q.grad, dq, atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(h.grad, dh, atol=1e-9, rtol=1e-9)


def test_sparse_infeasible_is_classified_without_densifying() -> None:
    """x >= 1 and 1'x = 1 (n = 20000) is infeasible; the classification stays sparse."""
    n = 20_000
    idx = torch.arange(n).repeat(2, 1)
    P = torch.sparse_coo_tensor(idx, torch.ones(n, dtype=F64), (n, n))
    G = torch.sparse_coo_tensor(idx, -torch.ones(n, dtype=F64), (n, n))
    A = torch.ones(1, n, dtype=F64).to_sparse()
    q, h, b = torch.zeros(n, dtype=F64), -torch.ones(n, dtype=F64), torch.ones(1, dtype=F64)
    sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, on_failure="nan")
    assert sol.status == (dqp.QPStatus.INFEASIBLE,)
    assert torch.isnan(sol.x).all()


@pytest.mark.filterwarnings("ignore::dxopt.qp.QPDegenerateWarning")
def test_licq_failure_both_backwards_are_right() -> None:
    """A duplicated active row (LICQ fails, multiplier split by an interior-point solver):
    the exact KKT matrix is singular; both backwards detect it, report it in the diagnostics
    and give the q gradient of the problem without the duplicate, and the same h gradient
    (minimum norm: the duplicate rows share the multiplier adjoint equally)."""
    data = complementary_qp(8, m=6, p=2, seed=0)
    j = int(torch.nonzero(data.active)[0])  # type: ignore[arg-type]
    G = torch.cat([data.G, data.G[j : j + 1]])  # type: ignore[index]
    grad_x = torch.randn(8, generator=torch.Generator().manual_seed(1), dtype=F64)
    q_ref, h_ref = data.q.clone().requires_grad_(), data.h.clone().requires_grad_()  # type: ignore[union-attr]
    ref = dqp.solve(data.P, q_ref, A=data.A, b=data.b, G=data.G, h=h_ref, backward="kkt")
    (ref.x @ grad_x).backward()
    grads = {}
    for backward in ("kkt", "penalty"):
        q = data.q.clone().requires_grad_()
        h = torch.cat([data.h, data.h[j : j + 1]]).requires_grad_()  # type: ignore[index]
        sol = dqp.solve(
            data.P, q, A=data.A, b=data.b, G=G, h=h, backward=backward, solver="clarabel"
        )
        assert float(sol.ineq_duals[j]) > 0.1 and float(sol.ineq_duals[-1]) > 0.1  # type: ignore[index]
        (sol.x @ grad_x).backward()
        assert sol.info.backward.dependent_rows == (1,)
        torch.testing.assert_close(q.grad, q_ref.grad, atol=1e-7, rtol=1e-6)
        assert h.grad is not None and h_ref.grad is not None
        torch.testing.assert_close(h.grad[j], h.grad[-1], atol=1e-9, rtol=0)
        torch.testing.assert_close(h.grad[j] + h.grad[-1], h_ref.grad[j], atol=1e-7, rtol=1e-6)
        grads[backward] = h.grad
    torch.testing.assert_close(grads["kkt"], grads["penalty"], atol=1e-8, rtol=0)
