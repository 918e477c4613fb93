"""Batching: broadcast parameters get gradients summed over the batch (compared with a loop)."""

from __future__ import annotations

import pytest
import torch
from qp_zoo import complementary_qp

import dxopt.qp as dqp


@pytest.mark.parametrize("backward", ["kkt", "penalty"])
def test_broadcast_gradients_are_summed(backward: str) -> None:
    base = complementary_qp(10, m=8, p=3, seed=0)
    B = 4
    gen = torch.Generator().manual_seed(1)
    qs = base.q + 0.1 * torch.randn(B, 10, generator=gen, dtype=torch.float64)
    hs = base.h + 0.05 * torch.rand(B, 8, generator=gen, dtype=torch.float64)  # type: ignore[operator]
    weights = torch.randn(B, 10, generator=gen, dtype=torch.float64)
    shared = [t.clone().requires_grad_() for t in (base.P, base.A, base.b, base.G)]  # type: ignore[union-attr]
    q, h = qs.clone().requires_grad_(), hs.clone().requires_grad_()
    P, A, b, G = shared
    sol = dqp.solve(P, q, A=A, b=b, G=G, h=h, backward=backward)
    assert sol.x.shape == (B, 10) and sol.ineq_duals.shape == (B, 8)  # type: ignore[union-attr]
    assert len(sol.status) == B
    (sol.x * weights).sum().backward()

    loop = [t.clone().requires_grad_() for t in (base.P, base.A, base.b, base.G)]  # type: ignore[union-attr]
    q_loop, h_loop = qs.clone().requires_grad_(), hs.clone().requires_grad_()
    for i in range(B):
        s = dqp.solve(
            loop[0], q_loop[i], A=loop[1], b=loop[2], G=loop[3], h=h_loop[i], backward=backward
        )
        torch.testing.assert_close(s.x, sol.x[i])
        (s.x * weights[i]).sum().backward()
    for mine, ref in zip([*shared, q, h], [*loop, q_loop, h_loop]):
        torch.testing.assert_close(mine.grad, ref.grad, atol=1e-9, rtol=1e-8)


def test_batched_matrices_and_threads_agree_with_serial() -> None:
    problems = [complementary_qp(8, m=6, p=2, seed=s) for s in range(6)]
    stacked = [
        torch.stack([getattr(d, k) for d in problems]) for k in ("P", "q", "A", "b", "G", "h")
    ]
    serial = dqp.solve(**dict(zip("PqAbGh", stacked)))
    threaded = dqp.solve(**dict(zip("PqAbGh", stacked)), max_workers=2)
    torch.testing.assert_close(serial.x, threaded.x)
    for i, d in enumerate(problems):
        torch.testing.assert_close(serial.x[i], d.x, atol=1e-9, rtol=0)  # type: ignore[arg-type]
        torch.testing.assert_close(serial.ineq_duals[i], d.ineq_duals, atol=1e-9, rtol=0)  # type: ignore[index, arg-type]


def test_float32_and_layer_module() -> None:
    data = complementary_qp(8, m=6, p=2, seed=2).to(torch.float32)
    layer = dqp.QPLayer(backward="kkt")
    q = data.q.clone().requires_grad_()
    sol = layer(data.P, q, A=data.A, b=data.b, G=data.G, h=data.h)
    assert sol.x.dtype == torch.float32 and sol.eq_duals.dtype == torch.float32  # type: ignore[union-attr]
    sol.x.sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32
    ref = dqp.solve(
        **dict(zip("PqAbGh", complementary_qp(8, m=6, p=2, seed=2).args())), backward="kkt"
    )
    torch.testing.assert_close(sol.x.double(), ref.x, atol=1e-5, rtol=1e-5)


def test_warm_start_per_sample_reaches_the_same_solution() -> None:
    problems = [complementary_qp(10, m=8, p=3, seed=s) for s in range(3)]
    stacked = [
        torch.stack([getattr(d, k) for d in problems]) for k in ("P", "q", "A", "b", "G", "h")
    ]
    cold = dqp.solve(**dict(zip("PqAbGh", stacked)), solver="proxqp")
    warm = dqp.solve(
        **dict(zip("PqAbGh", stacked)),
        solver="proxqp",
        warm_start=torch.stack([d.x for d in problems]),
    )  # type: ignore[misc]
    torch.testing.assert_close(warm.x, cold.x, atol=1e-7, rtol=0)
    for i, d in enumerate(problems):
        torch.testing.assert_close(warm.x[i], d.x, atol=1e-7, rtol=0)  # type: ignore[arg-type]
