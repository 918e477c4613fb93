"""Backprop and checkpointed backprop: exact gradients, recompute counts."""

import pytest
import torch

from dxopt.estimators import Backprop, CheckpointPlan

from ._problems import quadratic, residual_mlp

PLANS = [
    CheckpointPlan(strategy="per_block"),
    CheckpointPlan(strategy="segments", segments=2),
    CheckpointPlan(strategy="segments", segments=3),
    CheckpointPlan(strategy="selective", save_ops=("mm",)),
]


def test_backprop_matches_closed_form_and_writes_grad():
    loss_fn, params, batch, exact = quadratic()
    est = Backprop().estimate(loss_fn, params, batch)
    for name in params:
        torch.testing.assert_close(est.grads[name], exact[name])
        torch.testing.assert_close(params[name].grad, exact[name])
    assert est.cost.forwards == 1 and est.cost.backwards == 1 and est.cost.jvps == 0


def test_backprop_matches_finite_differences():
    loss_fn, params, batch = residual_mlp()
    est = Backprop().estimate(loss_fn, params, batch)
    gen = torch.Generator().manual_seed(1)
    for name, p in params.items():
        v = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        h = 1e-6
        plus = {**params, name: p + h * v}
        minus = {**params, name: p - h * v}
        fd = (loss_fn(plus, batch) - loss_fn(minus, batch)) / (2 * h)
        torch.testing.assert_close(
            float((est.grads[name] * v).sum()), float(fd), rtol=1e-6, atol=1e-9
        )


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"{p.strategy}-{p.segments}")
def test_checkpointed_gradients_equal_backprop(plan):
    loss_fn, params, batch = residual_mlp()
    ref = Backprop().estimate(loss_fn, params, batch)
    est = Backprop(checkpoint=plan).estimate(loss_fn, params, batch)
    for name in params:
        torch.testing.assert_close(est.grads[name], ref.grads[name], rtol=0, atol=1e-14)


def test_recomputed_forwards_are_counted():
    loss_fn, params, batch = residual_mlp(n_blocks=4)
    assert Backprop().estimate(loss_fn, params, batch).cost.recomputed_forwards == 0.0
    per_block = Backprop(checkpoint=CheckpointPlan(strategy="per_block"))
    assert per_block.estimate(loss_fn, params, batch).cost.recomputed_forwards == 1.0
    # checkpoint_sequential leaves its last segment un-checkpointed: 2 of 4 blocks recomputed.
    segments = Backprop(checkpoint=CheckpointPlan(strategy="segments", segments=2))
    assert segments.estimate(loss_fn, params, batch).cost.recomputed_forwards == 0.5
