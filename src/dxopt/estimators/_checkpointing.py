"""Activation-checkpointing plans that a model's forward follows through :func:`run_blocks`.

A model written as a chain of blocks calls ``run_blocks(blocks, x)``; the estimator (not the
model) decides how the chain is checkpointed by activating a :class:`CheckpointPlan`:

- ``"none"``: plain forward, every activation saved for backward;
- ``"per_block"``: each block wrapped in :func:`torch.utils.checkpoint.checkpoint`, so only
  the block inputs are kept and each block is recomputed once during backward;
- ``"segments"``: ``segments`` checkpointed segments as in
  :func:`torch.utils.checkpoint.checkpoint_sequential` (the last segment runs normally);
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
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from torch.utils.flop_counter import FlopCounterMode

from dxopt._core import check_choice, check_int
from dxopt._core.torch_compat import TorchDispatchMode, tree_flatten
from dxopt.estimators._memory import note_saved

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
        check_choice("strategy", self.strategy, _STRATEGIES)
        check_int("segments", self.segments)
        for op in self.save_ops:
            if not hasattr(torch.ops.aten, op):
                raise ValueError(
                    f"save_ops: {op!r} is not an aten operator name; use names such as 'mm'."
                )


class _BlockCalls:
    """Counts block evaluations and their FLOPs while a plan is active.

    ``forward_flops`` are the FLOPs of the blocks' forward, ``recompute_flops`` those redone
    during backward (both as :class:`~torch.utils.flop_counter.FlopCounterMode` counts them:
    matrix products and convolutions); ``calls`` counts block calls, forward plus
    recomputation.
    """

    def __init__(self, plan: CheckpointPlan) -> None:
        self.plan = plan
        self.calls = 0
        self.blocks_in_forward = 0
        self.forward_flops = 0
        self.recompute_flops = 0


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
        if _op_name(func) in save:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_name(func: Any) -> str:
    return func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)


class _NoteSaved(TorchDispatchMode):
    """Entered inside a selective checkpoint's forward context: reports the outputs of the
    operators its policy keeps (``MUST_SAVE``) to the running memory trackers, since the
    checkpoint holds them for backward outside autograd's saved-tensor hooks."""

    def __init__(self, save: frozenset[str]) -> None:
        super().__init__()
        self.save = save

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _op_name(func) in self.save:
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    note_saved(t)
        return out


@contextlib.contextmanager
def _selective_forward(fwd: Any, save: frozenset[str]) -> Iterator[None]:
    with fwd, _NoteSaved(save):  # the recorder on top: it sees what the cache keeps
        yield


@contextlib.contextmanager
def _flops_into(
    state: _BlockCalls, attr: str, inner: contextlib.AbstractContextManager | None = None
) -> Iterator[None]:
    """Add the FLOPs run inside to ``state.<attr>``; ``inner`` (a selective-checkpoint mode)
    is entered *after* the counter, so outputs it serves from its cache are not counted."""
    mode = FlopCounterMode(display=False)
    try:
        with mode, inner if inner is not None else contextlib.nullcontext():
            yield
    finally:
        setattr(state, attr, getattr(state, attr) + int(mode.get_total_flops()))


def _contexts(state: _BlockCalls) -> Callable[[], tuple[Any, Any]]:
    """``context_fn`` for :func:`torch.utils.checkpoint.checkpoint` that counts forward and
    recomputed FLOPs (and applies the selective policy for ``"selective"``)."""

    def context_fn() -> tuple[Any, Any]:
        fwd: contextlib.AbstractContextManager | None = None
        rec: contextlib.AbstractContextManager | None = None
        if state.plan.strategy == "selective":
            save = frozenset(state.plan.save_ops)
            fwd, rec = create_selective_checkpoint_contexts(_selective_policy(save))
            fwd = _selective_forward(fwd, save)
        return (
            _flops_into(state, "forward_flops", fwd),
            _flops_into(state, "recompute_flops", rec),
        )

    return context_fn


def _chain(fns: Sequence[Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        for f in fns:
            x = f(x)
        return x

    return run


def run_blocks(blocks: Sequence[Callable[[Tensor], Tensor]], x: Tensor) -> Tensor:
    """Apply ``blocks`` in order to ``x``, checkpointed as the active plan says.

    Outside :func:`checkpointing` (or when no gradient is being recorded) the blocks simply
    run in sequence. ``"segments"`` splits the chain into ``segments`` runs of
    ``len(blocks) // segments`` blocks, checkpoints all but the last (which runs normally and
    holds the remaining blocks), as :func:`torch.utils.checkpoint.checkpoint_sequential` does.
    """
    state = _ACTIVE.get()
    fns = [_counted(b, state) for b in blocks]
    if state is not None:
        state.blocks_in_forward += len(fns)
    strategy = "none" if state is None else state.plan.strategy
    if strategy == "none" or not torch.is_grad_enabled():
        return _chain(fns)(x)
    assert state is not None
    if strategy == "segments":
        segments = min(state.plan.segments, len(fns))
        size = len(fns) // segments
        groups = [fns[i * size : (i + 1) * size] for i in range(segments - 1)]
        last = fns[(segments - 1) * size :]
    else:
        groups, last = [[f] for f in fns], []
    context_fn = _contexts(state)
    for group in groups:
        x = checkpoint(_chain(group), x, use_reentrant=False, context_fn=context_fn)
    if last:
        with _flops_into(state, "forward_flops"):
            x = _chain(last)(x)
    return x
