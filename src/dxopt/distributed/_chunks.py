"""Splitting a QP batch into chunks and stitching per-chunk results back together.

Pure torch, no Ray: the executor slices the batched inputs along their leading dimension and
sends unbatched (broadcast) inputs whole to every chunk; outputs and the gradients of batched
inputs are concatenated in chunk order, gradients of broadcast inputs are summed over chunks
(as the local path sums them over the batch).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import fields
from itertools import chain
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.distributed._errors import DistributedTypeError, DistributedValueError
from dxopt.qp import BackwardDiagnostics

__all__ = [
    "DIFF_NAMES",
    "INPUT_NAMES",
    "Layout",
    "chunk_bounds",
    "from_wire",
    "layout_of",
    "merge_diagnostics",
    "reemit_warnings",
    "slice_chunk",
    "to_wire",
]

#: Differentiable inputs of :func:`dxopt.qp.solve`, in the order the executor passes them.
DIFF_NAMES = ("P", "q", "A", "b", "G", "h", "lb", "ub")
#: All tensor inputs: the differentiable ones and ``warm_start``.
INPUT_NAMES = (*DIFF_NAMES, "warm_start")
_BASE_NDIM = {"P": 2, "q": 1, "A": 2, "b": 1, "G": 2, "h": 1, "lb": 1, "ub": 1, "warm_start": 1}

WarningRecord = tuple[type[Warning], str]


class Layout:
    """Which inputs carry the batch dimension, and the batch size (``None``: unbatched call)."""

    def __init__(self, batch: int | None, batched: tuple[bool, ...]) -> None:
        self.batch = batch
        self.batched = batched


def layout_of(inputs: tuple[Tensor | None, ...]) -> Layout:
    """Find the batched inputs (one more dimension than the unbatched form) and the batch size.

    Raises:
        TypeError: an input is neither a tensor nor ``None``.
        ValueError: a sparse input (not supported by the executor) or inconsistent batch sizes.
    """
    sizes: dict[str, int] = {}
    batched = []
    for name, t in zip(INPUT_NAMES, inputs):
        if t is None:
            batched.append(False)
            continue
        if not isinstance(t, Tensor):
            raise DistributedTypeError(
                f"{name}: expected a torch.Tensor or None, got {type(t).__name__}."
            )
        if t.layout != torch.strided:
            raise DistributedValueError(
                f"{name}: the executor takes dense tensors, got layout {t.layout}. Pass "
                f"{name}.to_dense(), or solve sparse problems locally (executor=None)."
            )
        is_batched = t.ndim == _BASE_NDIM[name] + 1
        batched.append(is_batched)
        if is_batched:
            sizes[name] = int(t.shape[0])
    if len(set(sizes.values())) > 1:
        raise DistributedValueError(
            f"batch sizes: batched inputs must share the leading dimension, got {sizes}. "
            "Give every batched input the same batch size (unbatched inputs are broadcast)."
        )
    batch = next(iter(sizes.values())) if sizes else None
    return Layout(batch, tuple(batched))


def chunk_bounds(batch: int | None, chunk_size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each chunk; one chunk ``(0, 1)`` for an unbatched call."""
    if batch is None:
        return [(0, 1)]
    return [(s, min(s + chunk_size, batch)) for s in range(0, batch, chunk_size)]


def slice_chunk(
    t: Tensor | None, batched: bool, batch: int | None, start: int, stop: int
) -> Tensor | None:
    """The chunk's part of ``t``: a contiguous slice if ``t`` is batched, else ``t`` itself."""
    if t is None or not batched or batch is None:
        return t
    return t[start:stop].contiguous()


def to_wire(t: Tensor | None) -> Any:
    """What crosses a process boundary: a contiguous numpy array (Ray moves these without
    pickling their data), or the tensor itself for dtypes numpy lacks."""
    if t is None:
        return None
    t = t.detach().cpu()
    try:
        return np.ascontiguousarray(t.numpy())
    except (TypeError, RuntimeError):
        return t.contiguous()


def from_wire(a: Any) -> Tensor | None:
    """A fresh, writable tensor from :func:`to_wire`'s output (Ray hands out read-only views)."""
    if a is None:
        return None
    if isinstance(a, Tensor):
        return a.clone()
    return torch.from_numpy(np.array(a))


def _nanmax(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else float("nan")


def merge_diagnostics(target: BackwardDiagnostics, parts: list[BackwardDiagnostics]) -> None:
    """Write the merge of the chunks' diagnostics into ``target`` (in place, chunk order).

    Per-sample tuples are concatenated, numbers take their maximum (NaN ignored), flags their
    conjunction, strings the distinct values joined by ``"+"``.
    """
    if not parts:
        return
    for f in fields(target):
        values = [getattr(p, f.name) for p in parts]
        first = values[0]
        if isinstance(first, tuple):
            merged: object = tuple(chain.from_iterable(values))
        elif isinstance(first, bool):
            merged = all(values)
        elif isinstance(first, (int, float)):
            merged = _nanmax([float(v) for v in values])
            if isinstance(first, int):
                merged = int(merged) if not math.isnan(merged) else 0
        elif isinstance(first, str):
            merged = "+".join(dict.fromkeys(v for v in values if v))
        else:
            merged = first
        setattr(target, f.name, merged)


def reemit_warnings(records: tuple[WarningRecord, ...], start: int, stop: int) -> None:
    """Re-raise on the driver the warnings a worker caught while solving samples
    ``start..stop-1`` (batch indices inside the message are relative to ``start``)."""
    for category, message in records:
        warnings.warn(
            f"[samples {start}..{stop - 1}, solved on a Ray worker; batch indices in this "
            f"message count from {start}] {message}",
            category,
            stacklevel=4,
        )
