"""Penalty (dXPP) backward against the exact reduced-KKT backward."""

from __future__ import annotations

import pytest
import torch
from qp_zoo import complementary_qp, dense_random_qp

import dxopt.qp as dqp


def _all_gradients(data, backward, duals=True) -> tuple[list[torch.Tensor], dqp.QPSolution]:  # type: ignore[no-untyped-def]
    inputs = [None if t is None else t.clone().requires_grad_() for t in data.args()]
    sol = dqp.solve(**dict(zip("PqAbGh", inputs)), backward=backward)
    gen = torch.Generator().manual_seed(7)
    loss = sol.x @ torch.randn(sol.x.shape[-1], generator=gen, dtype=torch.float64)
    for lam in (sol.eq_duals, sol.ineq_duals) if duals else ():
        if lam is not None:
            loss = loss + lam @ torch.randn(lam.shape[-1], generator=gen, dtype=torch.float64)
    loss.backward()
    return [t.grad for t in inputs if t is not None], sol  # type: ignore[misc]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize(
    ("n", "m", "p", "seed"),
    [(20, 20, 5, 0), (60, 40, 20, 1), (120, 100, 0, 2), (200, 200, 100, 3), (200, 0, 90, 4)],
)
def test_penalty_matches_kkt_strictly_complementary(n: int, m: int, p: int, seed: int) -> None:
    data = complementary_qp(n, m=m, p=p, seed=seed)
    kkt, _ = _all_gradients(data, "kkt")
    pen, sol = _all_gradients(data, "penalty")
    for g_pen, g_kkt in zip(pen, kkt):
        assert _rel(g_pen, g_kkt) <= 1e-6
    assert sol.info.backward.method == "penalty"
    assert sol.info.backward.residual <= 1e-8


def test_penalty_matches_kkt_on_dqp_generator() -> None:
    data = dense_random_qp(100, seed=0)
    kkt, _ = _all_gradients(data, "kkt")
    pen, sol = _all_gradients(data, "penalty")
    assert max(sol.info.backward.n_active) > 0
    for g_pen, g_kkt in zip(pen, kkt):
        assert _rel(g_pen, g_kkt) <= 1e-6


def test_plain_dxpp_error_is_order_beta_and_refinement_removes_it() -> None:
    data = complementary_qp(40, m=30, p=10, seed=5)
    kkt, _ = _all_gradients(data, "kkt")
    errors = []
    for beta in (1e-3, 1e-5):
        plain, sol = _all_gradients(data, dqp.PenaltyBackward(beta=beta, max_refinement=0))
        errors.append(_rel(plain[1], kkt[1]))
        assert sol.info.backward.refinement_steps == 0
    assert errors[1] < errors[0] / 30  # O(beta): 100x smaller beta, much smaller error
    refined, sol = _all_gradients(data, dqp.PenaltyBackward(beta=1e-4))
    # refining (against the exact KKT matrix, from the exact Schur factor when P is positive
    # definite, else from the penalty Cholesky) removes the O(beta) bias
    assert sol.info.backward.residual <= 1e-12
    assert _rel(refined[1], kkt[1]) <= 1e-9


def test_row_scaling_does_not_change_gradients() -> None:
    data = complementary_qp(30, m=20, p=5, seed=6)
    scale = torch.logspace(-3, 3, 20, dtype=torch.float64)
    scaled = data._replace(G=data.G * scale[:, None], h=data.h * scale)  # type: ignore[operator]
    method = dqp.PenaltyBackward(max_refinement=0, beta=1e-6)
    base, _ = _all_gradients(data, method, duals=False)
    other, _ = _all_gradients(scaled, method, duals=False)
    # the same problem: gradient for q must agree (row-normalised weights)
    assert _rel(other[1], base[1]) <= 1e-6
