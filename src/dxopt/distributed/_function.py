"""The module-level :class:`torch.autograd.Function` of the distributed QP path.

As in the local path, solving is kept apart from differentiating: the executor runs the
distributed forward first (every chunk solved on a worker, which keeps the chunk's graph) and
records it in a :class:`DistributedCall`; this Function only hands the stitched outputs out and,
in ``backward``, asks the executor to send each chunk's output cotangents to the worker that
owns the chunk's graph and to assemble the input gradients (concatenated for batched inputs,
summed over chunks for broadcast ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from dxopt.qp import BackwardDiagnostics, QPStatus
from dxopt.qp.problem.options import QPOptions

__all__ = ["DistributedCall", "RayQPFunction"]


class _Backend(Protocol):
    def backward_call(
        self, call: DistributedCall, cotangents: tuple[Tensor | None, ...]
    ) -> tuple[Tensor | None, ...]: ...


@dataclass
class DistributedCall:
    """One distributed forward: where each chunk was solved and what it returned.

    Attributes:
        call_id: unique id; workers key the stored graphs by ``(call_id, chunk)``.
        backend: the executor that ran the call (dispatches the backward).
        bounds: ``[start, stop)`` of each chunk.
        owners: the worker holding each chunk's graph (``None``: not kept, or the chunk failed).
        worker_failed: chunks whose workers died on both attempts (samples marked ``FAILED``).
        batch: batch size, ``None`` for an unbatched call.
        batched: which of the nine inputs carry the batch dimension.
        inputs: the inputs, detached and on the CPU (for a re-solve in the backward).
        needs_grad: which differentiable inputs require a gradient.
        options: the checked options each worker passes to :func:`dxopt.qp.solve`.
        outputs: the five stitched outputs on the CPU (``x``, duals), ``None`` where absent.
        status: per-sample status.
        diagnostics: filled in by the backward (the object in ``sol.info.backward``).
    """

    call_id: str
    backend: _Backend
    bounds: list[tuple[int, int]]
    owners: list[Any]
    worker_failed: set[int]
    batch: int | None
    batched: tuple[bool, ...]
    inputs: tuple[Tensor | None, ...]
    needs_grad: tuple[bool, ...]
    options: QPOptions
    outputs: tuple[Tensor | None, ...]
    status: tuple[QPStatus, ...]
    diagnostics: BackwardDiagnostics
    device: torch.device


class RayQPFunction(torch.autograd.Function):
    """``(call, P, q, A, b, G, h, lb, ub) -> (x, eq, ineq, lb_duals, ub_duals)``.

    Absent outputs are returned as empty placeholders (the caller maps them back to ``None``).
    """

    @staticmethod
    def forward(ctx: Any, call: DistributedCall, *inputs: Tensor | None) -> tuple[Tensor, ...]:
        ctx.call = call
        outs = []
        for t in call.outputs:
            if t is None:
                t = torch.empty(0)
                ctx.mark_non_differentiable(t)
                outs.append(t)
            else:
                outs.append(t.to(call.device, copy=True))
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        call: DistributedCall = ctx.call
        cotangents = tuple(None if o is None else g for o, g in zip(call.outputs, grads))
        return (None, *call.backend.backward_call(call, cotangents))
