"""Exact gradients by reverse mode, optionally with activation checkpointing."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from dxopt._core.replay import replayed_forwards
from dxopt.estimators._accounting import flop_scope
from dxopt.estimators._api import (
    Cost,
    Estimate,
    LossFn,
    check_scalar_loss,
    raise_unused,
    split_trainable,
    write_grads,
)
from dxopt.estimators._checkpointing import CheckpointPlan, _BlockCalls, checkpointing


class Backprop:
    """Backpropagation: :math:`g = \\nabla_\\theta \\ell(\\theta)`, exactly.

    With ``checkpoint`` set, models that chain their blocks through
    :func:`~dxopt.estimators.run_blocks` keep only the block inputs (or the outputs of the
    operators a selective plan names) and recompute the rest during the backward pass:
    the same gradient for roughly one extra forward of the checkpointed blocks.

    Cost: one forward, one backward (≈ 2 forwards of FLOPs), plus
    ``recomputed_forwards`` when checkpointing: the FLOPs redone during backward over the
    FLOPs of the blocks' forward (matrix products, as
    :class:`~torch.utils.flop_counter.FlopCounterMode` counts them), so a selective plan that
    keeps every product's output reports 0. A plan set on a loss that never calls
    :func:`~dxopt.estimators.run_blocks` warns (nothing would be checkpointed). Module buffers
    (BatchNorm statistics) are updated once per estimate: by the forward, not again by the
    checkpoint's recomputation (:mod:`dxopt._core.replay`). Parameters with
    ``requires_grad=False`` are frozen (:func:`~dxopt.estimators._api.split_trainable`).

    Args:
        checkpoint: a :class:`CheckpointPlan`, or ``None`` for plain backpropagation.

    Example:
        >>> import torch
        >>> from dxopt.estimators import Backprop
        >>> w = torch.tensor([1.0, 2.0])
        >>> est = Backprop().estimate(lambda p, x: (p["w"] * x).sum() ** 2, {"w": w}, torch.ones(2))
        >>> est.grads["w"].tolist()
        [6.0, 6.0]
    """

    def __init__(self, *, checkpoint: CheckpointPlan | None = None) -> None:
        if checkpoint is not None and not isinstance(checkpoint, CheckpointPlan):
            raise TypeError(
                f"checkpoint: expected a CheckpointPlan or None, got {type(checkpoint).__name__}."
            )
        self.checkpoint = checkpoint

    def estimate(
        self,
        loss_fn: LossFn,
        params: Mapping[str, Tensor],
        batch: Any,
        *,
        count_flops: bool = False,
    ) -> Estimate:
        """Compute the exact gradient, write it to ``.grad`` and return it with its cost."""
        params, loss_of = split_trainable(loss_fn, params)
        leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
        with (
            replayed_forwards(loss_of) as forward,  # the recomputation leaves buffers as is
            flop_scope(count_flops) as tally,
            checkpointing(self.checkpoint) as calls,
            torch.enable_grad(),
        ):
            loss = check_scalar_loss(forward(leaves, batch))
            forward_calls = calls.calls
            if self.checkpoint is not None and calls.blocks_in_forward == 0:
                _warn_no_blocks(self.checkpoint)
            if not loss.requires_grad:
                raise_unused(list(params))
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        raise_unused([n for n, g in zip(leaves, grads) if g is None])
        grad_map = {n: g for n, g in zip(leaves, grads) if g is not None}
        write_grads(params, grad_map)
        cost = Cost(
            forwards=1,
            backwards=1,
            recomputed_forwards=_recomputed(calls, forward_calls),
            flops=tally.flops,
        )
        return Estimate(grads=grad_map, loss=float(loss.detach()), cost=cost, info={})


def _warn_no_blocks(plan: CheckpointPlan) -> None:
    if plan.strategy != "none":
        warnings.warn(
            f"checkpoint: a CheckpointPlan(strategy={plan.strategy!r}) is set but loss_fn never "
            "called dxopt.estimators.run_blocks, so nothing was checkpointed (plain backprop "
            "memory). Chain the model's blocks through run_blocks(blocks, x), or drop the plan.",
            UserWarning,
            stacklevel=3,
        )


def _recomputed(calls: _BlockCalls, forward_calls: int) -> float:
    """Recomputed block work in units of the blocks' forward: recomputed FLOPs over forward
    FLOPs of the blocks, or recomputed block calls over blocks when the blocks have no
    counted FLOPs (elementwise only)."""
    if calls.forward_flops > 0:
        return calls.recompute_flops / calls.forward_flops
    return (calls.calls - forward_calls) / max(calls.blocks_in_forward, 1)
