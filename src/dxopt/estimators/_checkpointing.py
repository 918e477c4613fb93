"""Activation-checkpointing plans that a model's forward follows through :func:`run_blocks`.

A model written as a chain of blocks calls ``run_blocks(blocks, x)``; the estimator (not the
model) decides how the chain is checkpointed by activating a :class:`CheckpointPlan`:

- ``"none"``: plain forward, every activation saved for backward;
- ``"per_block"``: each block wrapped in :func:`torch.utils.checkpoint.checkpoint`, so only
  the block inputs are kept and each block is recomputed once during backward;
- ``"segments"``: :func:`torch.utils.checkpoint.checkpoint_sequential` with ``segments``
  segments (the last segment runs normally);
- ``"selective"``: per block, but the outputs of the operators in ``save_ops`` are kept and
  only the rest recomputed (:func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`).

Reference: Chen et al., "Training Deep Nets with Sublinear Memory Cost", arXiv 1604.06174.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

Strategy = Literal["none", "per_block", "segments", "selective"]
_STRATEGIES = ("none", "per_block", "segments", "selective")


@dataclass(frozen=True)
class CheckpointPlan:
    """How :func:`run_blocks` checkpoints a chain of blocks.

    Attributes:
        strategy: ``"none"``, ``"per_block"``, ``"segments"`` or ``"selective"``.
        segments: number of segments for ``"segments"``.
        save_ops: aten operator names (e.g. ``("mm", "addmm")``) whose outputs ``"selective"``
            keeps; everything else in a block is recomputed.
    """

    strategy: Strategy = "per_block"
    segments: int = 2
    save_ops: tuple[str, ...] = ("mm", "addmm", "bmm")

    def __post_init__(self) -> None:
        if self.strategy not in _STRATEGIES:
            raise ValueError(f"strategy: expected one of {_STRATEGIES}, got {self.strategy!r}.")
        if isinstance(self.segments, bool) or not isinstance(self.segments, int):
            raise ValueError(f"segments: expected an integer >= 1, got {self.segments!r}.")
        if self.segments < 1:
            raise ValueError(f"segments: expected an integer >= 1, got {self.segments!r}.")
        for op in self.save_ops:
            if not hasattr(torch.ops.aten, op):
                raise ValueError(
                    f"save_ops: {op!r} is not an aten operator name; use names such as 'mm'."
                )


class _BlockCalls:
    """Counts block evaluations while a plan is active (forward plus recomputation)."""

    def __init__(self, plan: CheckpointPlan) -> None:
        self.plan = plan
        self.calls = 0
        self.blocks_in_forward = 0


_ACTIVE: contextvars.ContextVar[_BlockCalls | None] = contextvars.ContextVar(
    "dxopt_checkpoint_plan", default=None
)


@contextlib.contextmanager
def checkpointing(plan: CheckpointPlan | None) -> Iterator[_BlockCalls]:
    """Activate ``plan`` for every :func:`run_blocks` call inside (``None`` = no plan)."""
    state = _BlockCalls(plan or CheckpointPlan(strategy="none"))
    token = _ACTIVE.set(state)
    try:
        yield state
    finally:
        _ACTIVE.reset(token)


def _counted(block: Callable[[Tensor], Tensor], state: _BlockCalls | None) -> Callable:
    @functools.wraps(block)
    def run(x: Tensor) -> Tensor:
        if state is not None:
            state.calls += 1
        return block(x)

    return run


def _selective_policy(save: frozenset[str]) -> Callable:
    def policy(ctx, func, *args, **kwargs):
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if name in save:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def run_blocks(blocks: Sequence[Callable[[Tensor], Tensor]], x: Tensor) -> Tensor:
    """Apply ``blocks`` in order to ``x``, checkpointed as the active plan says.

    Outside :func:`checkpointing` (or when no gradient is being recorded) the blocks simply
    run in sequence.
    """
    state = _ACTIVE.get()
    fns = [_counted(b, state) for b in blocks]
    if state is not None:
        state.blocks_in_forward += len(fns)
    strategy = "none" if state is None else state.plan.strategy
    if strategy == "none" or not torch.is_grad_enabled():
        for f in fns:
            x = f(x)
        return x
    assert state is not None
    if strategy == "segments":
        segments = min(state.plan.segments, len(fns))
        return checkpoint_sequential(fns, segments, x, use_reentrant=False)
    context_fn = None
    if strategy == "selective":
        context_fn = functools.partial(
            create_selective_checkpoint_contexts, _selective_policy(frozenset(state.plan.save_ops))
        )
    for f in fns:
        if context_fn is None:
            x = checkpoint(f, x, use_reentrant=False)
        else:
            x = checkpoint(f, x, use_reentrant=False, context_fn=context_fn)
    return x
