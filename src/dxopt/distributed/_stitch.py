"""Stitching per-chunk results of a distributed call back together (pure torch, no Ray).

The outputs of the chunks are concatenated in chunk order (a chunk lost with its workers
becomes NaN with status ``FAILED``); the gradients of batched inputs are concatenated and
those of broadcast inputs summed over chunks; a chunk re-solved for its backward must
reproduce the forward's point.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dxopt.distributed._chunks import DIFF_NAMES, from_wire, to_wire
from dxopt.distributed._errors import DistributedError
from dxopt.distributed._function import DistributedCall
from dxopt.distributed._worker import ChunkGrads, ChunkOutput
from dxopt.qp import QPStatus

__all__ = ["assemble_grads", "check_same_point", "lost_chunk", "stitch_outputs"]


def stitch_outputs(
    results: list[ChunkOutput | None],
    bounds: list[tuple[int, int]],
    batch: int | None,
    inputs: tuple[Tensor | None, ...],
    solver: str,
) -> tuple[
    tuple[Tensor | None, ...], tuple[QPStatus, ...], tuple[float, ...], tuple[float, ...], str
]:
    """The call's five outputs (``x``, duals; ``None`` where absent), per-sample status,
    primal and dual residuals and solver name, from its chunks (``None``: lost)."""
    template = next((r for r in results if r is not None), None)
    if template is None:  # every chunk lost: shapes and dtype from the inputs
        template = lost_chunk(inputs, batch is not None, solver)
        results = [template] if batch is None else [None] * len(bounds)
    if batch is None:
        r = results[0]
        assert r is not None
        outs = tuple(from_wire(a) for a in r.outputs)
        return outs, r.status, r.primal_residual, r.dual_residual, r.solver
    outputs: list[Tensor | None] = []
    for k in range(5):
        ref = from_wire(template.outputs[k])
        if ref is None:
            outputs.append(None)
            continue
        parts = []
        for c, (s, e) in enumerate(bounds):
            r = results[c]
            t = from_wire(r.outputs[k]) if r is not None else None
            if t is None:
                t = torch.full((e - s, *ref.shape[1:]), float("nan"), dtype=ref.dtype)
            parts.append(t)
        outputs.append(torch.cat(parts))
    status: list[QPStatus] = []
    primal: list[float] = []
    dual: list[float] = []
    for c, (s, e) in enumerate(bounds):
        r = results[c]
        if r is None:
            status += [QPStatus.FAILED] * (e - s)
            primal += [float("nan")] * (e - s)
            dual += [float("nan")] * (e - s)
        else:
            status += r.status
            primal += r.primal_residual
            dual += r.dual_residual
    return tuple(outputs), tuple(status), tuple(primal), tuple(dual), template.solver


def check_same_point(call: DistributedCall, c: int, solved: ChunkOutput) -> None:
    """Refuse (``RuntimeError``) a re-solve of chunk ``c`` whose status or ``x`` (beyond
    1e-10 relative) differs from the forward's: its gradient would be taken elsewhere."""
    s, e = call.bounds[c]
    status = call.status[s:e] if call.batch is not None else call.status
    x_then = call.outputs[0]
    assert x_then is not None
    if call.batch is not None:
        x_then = x_then[s:e]
    x_now = from_wire(solved.x)
    assert x_now is not None
    ok = torch.tensor([st.ok for st in status])
    scale = 1.0 + float(torch.nan_to_num(x_then).abs().max()) if x_then.numel() else 1.0
    diff = (x_now - x_then).abs()
    if call.batch is not None:
        diff = diff[ok]
    elif not bool(ok.all()):
        diff = diff[:0]
    if solved.status != status or (diff.numel() and float(diff.max()) > 1e-10 * scale):
        raise DistributedError(
            f"RayExecutor: re-solving samples {s}..{e - 1} for the backward (their worker "
            "died or dropped the graph, or the executor was shut down) did not reproduce "
            "the forward's solution (status or x differ), so their gradient would be taken "
            "at another point; none is returned. Use a deterministic solver, or "
            "backpropagate inside the executor's `with` block while its workers live."
        )


def assemble_grads(
    call: DistributedCall, grads: dict[int, ChunkGrads]
) -> tuple[Tensor | None, ...]:
    """Gradients of the eight differentiable inputs: concatenated over chunks for batched
    inputs, summed for broadcast ones (zero for chunks lost with their workers)."""
    result: list[Tensor | None] = []
    for i, name in enumerate(DIFF_NAMES):
        t = call.inputs[i]
        if t is None or not call.needs_grad[i]:
            result.append(None)
            continue
        total = torch.zeros_like(t)
        for c, g in grads.items():
            part = from_wire(g.grads[i])
            if part is None:
                continue
            if call.batched[i] and call.batch is not None:
                s, e = call.bounds[c]
                total[s:e] = part
            else:
                total += part
        if total.shape != t.shape:  # pragma: no cover - guarded by the workers
            raise DistributedError(f"{name}: gradient shape {total.shape} != {t.shape}.")
        result.append(total.to(call.device))
    return tuple(result)


def lost_chunk(inputs: tuple[Tensor | None, ...], batched: bool, solver: str) -> ChunkOutput:
    """A one-sample all-NaN ``FAILED`` chunk shaped like the call's outputs (used when no
    chunk came back to copy the shapes from)."""
    _, q, A, _, G, _, lb, ub, _ = inputs
    assert q is not None
    n = q.shape[-1]

    def finite(bound: Tensor | None) -> int | None:
        return None if bound is None else int(torch.isfinite(bound.reshape(-1, n)[0]).sum())

    widths = (n, None if A is None else A.shape[-2], None if G is None else G.shape[-2])
    nan = float("nan")
    x, eq, ineq, lbd, ubd = (
        None if w is None else to_wire(torch.full((1, w) if batched else (w,), nan, dtype=q.dtype))
        for w in (*widths, finite(lb), finite(ub))
    )
    return ChunkOutput(
        x=x,
        eq_duals=eq,
        ineq_duals=ineq,
        lb_duals=lbd,
        ub_duals=ubd,
        status=(QPStatus.FAILED,),
        solver=solver,
        primal_residual=(nan,),
        dual_residual=(nan,),
        warnings=(),
    )
