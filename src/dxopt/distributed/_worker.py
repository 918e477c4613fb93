"""The long-lived worker (a Ray actor once wrapped by :class:`~dxopt.distributed.RayExecutor`).

A plain class, so that importing it never imports Ray. Each worker solves its chunks with the
local :func:`dxopt.qp.solve` (the black box) on ``requires_grad`` copies of the inputs and
keeps the autograd graph of every chunk it solved, keyed by ``(call_id, chunk)``, until the
chunk's backward arrives (then ``torch.autograd.grad`` runs on that graph and frees it), the
driver releases the call, or the graph is evicted by the per-worker cap (least recently stored
first). Warnings raised while solving are recorded and sent back to the driver.
"""

from __future__ import annotations

import os
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

import dxopt.qp as dqp
from dxopt.distributed._chunks import WarningRecord, from_wire, to_wire
from dxopt.qp.api.solve import solve_with
from dxopt.qp.problem.options import QPOptions

__all__ = [
    "ChunkGrads",
    "ChunkOutput",
    "QPWorker",
    "chunk_grads",
    "solve_and_backward",
    "solve_chunk",
]


@dataclass(frozen=True)
class ChunkOutput:
    """What a worker returns for one solved chunk (arrays from
    :func:`~dxopt.distributed._chunks.to_wire`)."""

    x: Any
    eq_duals: Any
    ineq_duals: Any
    lb_duals: Any
    ub_duals: Any
    status: tuple[dqp.QPStatus, ...]
    solver: str
    primal_residual: tuple[float, ...]
    dual_residual: tuple[float, ...]
    warnings: tuple[WarningRecord, ...]

    @property
    def outputs(self) -> tuple[Any, ...]:
        return (self.x, self.eq_duals, self.ineq_duals, self.lb_duals, self.ub_duals)


@dataclass(frozen=True)
class ChunkGrads:
    """Gradients of one chunk for the differentiable inputs (wire arrays; ``None`` where not
    needed)."""

    grads: tuple[Any, ...]
    diagnostics: dqp.BackwardDiagnostics
    warnings: tuple[WarningRecord, ...]


@dataclass
class _Stored:
    leaves: tuple[Tensor | None, ...]
    outputs: tuple[Tensor | None, ...]
    diagnostics: dqp.BackwardDiagnostics


def _records(caught: list[warnings.WarningMessage]) -> tuple[WarningRecord, ...]:
    return tuple((w.category, str(w.message)) for w in caught)


def solve_chunk(
    inputs: tuple[Any, ...],
    needs_grad: tuple[bool, ...],
    options: QPOptions,
    keep: bool,
) -> tuple[ChunkOutput, _Stored | None]:
    """Solve one chunk with :func:`dxopt.qp.solve` on fresh leaves (the graph is kept in the
    returned record when ``keep``); warnings are recorded, not shown."""
    leaves: list[Tensor | None] = []
    for a, grad in zip(inputs[:8], needs_grad):
        t = from_wire(a)  # a fresh tensor: a leaf of this process's graph
        if t is not None:
            t.requires_grad_(keep and grad)
        leaves.append(t)
    P, q, A, b, G, h, lb, ub = leaves
    assert P is not None and q is not None
    with warnings.catch_warnings(record=True) as caught, torch.set_grad_enabled(keep):
        warnings.simplefilter("always")
        sol = solve_with(P, q, A, b, G, h, lb, ub, from_wire(inputs[8]), options)
    outs = (sol.x, sol.eq_duals, sol.ineq_duals, sol.lb_duals, sol.ub_duals)
    x, eq, ineq, lbd, ubd = (to_wire(t) for t in outs)
    out = ChunkOutput(
        x=x,
        eq_duals=eq,
        ineq_duals=ineq,
        lb_duals=lbd,
        ub_duals=ubd,
        status=sol.status,
        solver=sol.info.solver,
        primal_residual=sol.info.primal_residual,
        dual_residual=sol.info.dual_residual,
        warnings=_records(caught),
    )
    stored = _Stored(tuple(leaves), outs, sol.info.backward) if keep else None
    return out, stored


def chunk_grads(stored: _Stored, cotangents: tuple[Any, ...]) -> ChunkGrads:
    """Vector-Jacobian product of one chunk through its kept graph (warnings recorded)."""
    pairs = [
        (o, g)
        for o, g in zip(stored.outputs, (from_wire(a) for a in cotangents))
        if o is not None and g is not None and o.requires_grad
    ]
    wrt = [t for t in stored.leaves if t is not None and t.requires_grad]
    grads: list[Tensor | None] = [None] * len(stored.leaves)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if pairs and wrt:
            got = torch.autograd.grad(
                [o for o, _ in pairs],
                wrt,
                [g.to(o.dtype) for o, g in pairs],
                allow_unused=True,
            )
            it = iter(got)
            for i, t in enumerate(stored.leaves):
                if t is not None and t.requires_grad:
                    grads[i] = next(it)
    wire = tuple(to_wire(g) for g in grads)
    return ChunkGrads(wire, replace(stored.diagnostics), _records(caught))


def solve_and_backward(
    needs_grad: tuple[bool, ...],
    options: QPOptions,
    cotangents: tuple[Any, ...],
    *inputs: Any,
) -> tuple[ChunkOutput, ChunkGrads]:
    """Re-solve a chunk whose graph is gone and run its backward at once (nothing kept): on a
    worker, or in the driver after the executor was shut down."""
    out, stored = solve_chunk(inputs, needs_grad, options, True)
    assert stored is not None
    return out, chunk_grads(stored, cotangents)


class QPWorker:
    """Solves chunks with :func:`dxopt.qp.solve` and keeps their graphs for the backward.

    Args:
        torch_threads: ``torch.set_num_threads`` in this worker process.
        max_stored: most chunk graphs kept at once; the oldest is evicted beyond it (its
            backward then re-solves the chunk, see :class:`~dxopt.distributed.RayExecutor`).
    """

    def __init__(self, torch_threads: int, max_stored: int) -> None:
        torch.set_num_threads(torch_threads)
        self._max_stored = max_stored
        self._graphs: OrderedDict[tuple[str, int], _Stored] = OrderedDict()
        self.evicted = 0

    def describe(self) -> dict[str, Any]:
        """Process id, session, Linux autogroup, the imported dxopt and the torch thread count
        (for checks and logs)."""
        import dxopt

        try:
            with open("/proc/self/autogroup") as fh:
                autogroup = fh.read().strip()
        except OSError:
            autogroup = ""
        return {
            "pid": os.getpid(),
            "sid": os.getsid(0),
            "autogroup": autogroup,
            "dxopt": dxopt.__file__,
            "threads": torch.get_num_threads(),
        }

    def cpu_time(self) -> float:
        """CPU seconds this worker process has used (for benchmarks)."""
        return time.process_time()

    def stored(self) -> int:
        """Number of chunk graphs held now."""
        return len(self._graphs)

    def forward(
        self,
        key: tuple[str, int],
        keep: bool,
        needs_grad: tuple[bool, ...],
        options: QPOptions,
        crash: bool,
        *inputs: Any,
    ) -> ChunkOutput:
        """Solve one chunk; keep its graph under ``key`` if ``keep``.

        ``crash`` ends this worker process at once (fault injection for the tests of the
        executor's retry path; the driver then sees a real dead actor).
        """
        if crash:
            os._exit(1)
        out, stored = solve_chunk(inputs, needs_grad, options, keep)
        if stored is not None:
            self._graphs[key] = stored
            while len(self._graphs) > self._max_stored:
                self._graphs.popitem(last=False)
                self.evicted += 1
        return out

    def backward(self, key: tuple[str, int], cotangents: tuple[Any, ...]) -> ChunkGrads | None:
        """Vector-Jacobian product through the stored graph of ``key`` (then freed);
        ``None`` if that graph is not held (released or evicted)."""
        stored = self._graphs.pop(key, None)
        if stored is None:
            return None
        return chunk_grads(stored, cotangents)

    def solve_and_backward(
        self,
        needs_grad: tuple[bool, ...],
        options: QPOptions,
        cotangents: tuple[Any, ...],
        *inputs: Any,
    ) -> tuple[ChunkOutput, ChunkGrads]:
        """Re-solve a chunk whose graph is gone and run its backward at once (nothing kept)."""
        return solve_and_backward(needs_grad, options, cotangents, *inputs)

    def release(self, call_id: str) -> int:
        """Drop every graph of ``call_id``; returns how many were dropped."""
        keys = [k for k in self._graphs if k[0] == call_id]
        for k in keys:
            del self._graphs[k]
        return len(keys)
