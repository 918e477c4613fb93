"""warm_start= of dxopt.conic.solve: certified as a cold answer, a bad start changes nothing."""

from __future__ import annotations

import pytest
import torch

import dxopt.conic as dc

from ._problems import F64, ball_rows


def _ball_batch(c: torch.Tensor):
    """The points of the unit ball (plus x >= -0.5 rows) nearest to each ``c``."""
    A_ball, b_ball = ball_rows(2)
    A = torch.cat([A_ball, -torch.eye(2, dtype=F64)])
    b = torch.cat([b_ball, torch.full((2,), 0.5, dtype=F64)])
    cones = [dc.SecondOrderCone(3), dc.NonnegCone(2)]
    return torch.eye(2, dtype=F64), -c, A, b, cones


def test_a_nearby_warm_start_skips_the_backend_and_agrees_with_cold():
    c = torch.tensor([[3.0, 4.0], [0.2, 0.1], [-2.0, 1.0]], dtype=F64)
    P, q, A, b, cones = _ball_batch(c)
    prev = dc.solve(P, q, A, b, cones=cones)
    P2, q2, A2, b2, _ = _ball_batch(c + 1e-3)
    cold = dc.solve(P2, q2, A2, b2, cones=cones)
    warm = dc.solve(P2, q2, A2, b2, cones=cones, warm_start=prev)
    assert warm.info.warm == (True, True, True)
    assert warm.info.solvers == ("warm",) * 3 and warm.info.cost.forwards == 0
    assert cold.info.warm == ()
    # closed form: the nearest point of the ball (sample 0) and c itself inside (sample 1)
    c0 = c[0] + 1e-3
    torch.testing.assert_close(warm.x[0], c0 / c0.norm(), atol=1e-10, rtol=0)
    torch.testing.assert_close(warm.x[1], c[1] + 1e-3, atol=1e-10, rtol=0)
    torch.testing.assert_close(warm.x, cold.x, atol=1e-10, rtol=0)
    torch.testing.assert_close(warm.y, cold.y, atol=1e-9, rtol=0)
    for i in range(3):  # certified to the same tolerances as a cold answer
        assert warm.info.primal_residual[i] <= 1e-8 and warm.info.dual_residual[i] <= 1e-8
        assert warm.status[i] is cold.status[i]


def test_a_wrong_warm_start_gives_the_cold_answer_bit_for_bit():
    c = torch.tensor([[3.0, 4.0], [0.2, 0.1]], dtype=F64)
    P, q, A, b, cones = _ball_batch(c)
    cold = dc.solve(P, q, A, b, cones=cones)
    wrong = (torch.full((2, 2), 7.0, dtype=F64), torch.ones(2, 5, dtype=F64),
             torch.full((2, 5), float("nan"), dtype=F64))  # fmt: skip
    warm = dc.solve(P, q, A, b, cones=cones, warm_start=wrong)
    assert warm.info.warm == (False, False)
    assert warm.info.solvers == cold.info.solvers
    for name in ("x", "y", "s"):
        assert torch.equal(getattr(warm, name), getattr(cold, name))


def test_gradients_from_a_warm_start_are_the_cold_ones():
    c = torch.tensor([[3.0, 4.0], [0.2, 0.1]], dtype=F64)
    P, q, A, b, cones = _ball_batch(c)
    prev = dc.solve(P, q, A, b, cones=cones)
    grads = []
    for warm_start in (None, prev):
        qq = (q + 1e-4).clone().requires_grad_()
        sol = dc.solve(P, qq, A, b, cones=cones, warm_start=warm_start)
        (sol.x * torch.tensor([1.0, -2.0], dtype=F64)).sum().backward()
        grads.append(qq.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-8, rtol=0)


def test_an_unbatched_layer_takes_the_previous_solution():
    P, q, A, b, cones = _ball_batch(torch.tensor([3.0, 4.0], dtype=F64))
    layer = dc.ConicLayer(cones=cones)
    first = layer(P, q, A, b)
    again = layer(P, q + 1e-6, A, b, warm_start=first)
    assert again.info.warm == (True,)
    torch.testing.assert_close(again.x, first.x, atol=1e-5, rtol=0)


def test_bad_warm_starts_are_refused_by_name():
    P, q, A, b, cones = _ball_batch(torch.tensor([3.0, 4.0], dtype=F64))
    with pytest.raises(TypeError, match="warm_start"):
        dc.solve(P, q, A, b, cones=cones, warm_start=[1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"warm_start: expected y of shape \(5,\)"):
        dc.solve(P, q, A, b, cones=cones,
                 warm_start=(torch.zeros(2, dtype=F64), torch.zeros(4, dtype=F64),
                             torch.zeros(5, dtype=F64)))  # fmt: skip
