"""Reused host memory: large numpy buffers handed out again once nothing uses them.

A fresh multi-megabyte array page-faults on first touch: the kernel zeroes and maps every page
(4 KB at a time, or 2 MB huge pages that numpy asks for, which may first have to be
assembled). Neither numpy nor torch's CPU allocator keeps freed blocks of that size: glibc
returns them to the system, so a loop that frees its buffers and asks for the same sizes
again pays the faults on every call. Measured on the dense n = 2000 QP backward (1 and 2 torch
threads, gradients of ``P, A, G``: 96 MB): calls that got fresh memory took 60-150 ms, calls
that got memory back from the heap 35-45 ms.

:func:`host_buffers` keeps the buffers it hands out and hands a set out again when none of its
arrays is referenced outside the pool. That test is CPython's reference count: a tensor made
with :func:`torch.from_numpy` holds its array until the tensor's storage is freed (views
included), and a numpy view holds its base, so memory that any tensor, view or variable still
reaches is never handed out twice. What the pool keeps is bounded: sets of at most
:data:`MAX_SET_BYTES`, :data:`SETS_PER_SHAPE` per list of shapes, :data:`MAX_BYTES` in all
(the lists of shapes used longest ago are dropped first; dropping only forgets them, users keep
theirs). :func:`release_host_buffers` drops everything.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "MAX_BYTES",
    "MAX_SET_BYTES",
    "MIN_POOLED_BYTES",
    "SETS_PER_SHAPE",
    "held_bytes",
    "host_array",
    "host_buffers",
    "release_host_buffers",
]

MAX_BYTES = 256 << 20
"""Bytes the pool keeps in all."""
MAX_SET_BYTES = 64 << 20
"""The largest set the pool keeps (larger ones are handed out fresh and not kept)."""
SETS_PER_SHAPE = 2
"""Sets kept per list of shapes (a loop that holds the previous call's results while it makes
the next call uses two)."""

MIN_POOLED_BYTES = 1 << 20
"""The smallest array :func:`host_array` takes from the pool (smaller blocks come back from the
heap without page faults)."""

Spec = tuple[tuple[int, ...], Any]  # (shape, dtype)

_LOCK = threading.Lock()
_SETS: OrderedDict[tuple[Spec, ...], list[list[np.ndarray]]] = OrderedDict()


def _max_refs(arrays: list[np.ndarray]) -> int:
    """The largest reference count among ``arrays`` (as seen from here)."""
    return max((sys.getrefcount(a) for a in arrays), default=0)


# the count of an array that only a pool list holds, measured through the same code (so that
# it holds whatever references the interpreter's calling convention adds)
_IDLE_REFS = _max_refs([np.empty(0)])


def _nbytes(specs: Sequence[Spec]) -> int:
    return sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in specs)


def _held() -> int:
    """Bytes the pool keeps (the caller holds the lock)."""
    return sum(_nbytes(k) * len(v) for k, v in _SETS.items())


def host_buffers(specs: Sequence[Spec]) -> tuple[np.ndarray, ...]:
    """Uninitialized C-contiguous numpy arrays of the given ``(shape, dtype)`` pairs: a set
    the pool handed out before when none of its arrays is referenced any more, else new ones
    (kept for later when the set and the pool's limits allow; module docstring).

    The caller must hold the arrays themselves (or views, or tensors made from them) for as long
    as it uses them: holding only the returned tuple keeps them referenced too, but a copy of
    the data pointer does not."""
    key = tuple((tuple(int(s) for s in shape), np.dtype(dtype)) for shape, dtype in specs)
    with _LOCK:
        sets = _SETS.get(key)
        if sets is not None:
            for arrays in sets:
                if _max_refs(arrays) <= _IDLE_REFS:
                    _SETS.move_to_end(key)
                    return tuple(arrays)  # a new tuple: it holds the arrays while it lives
        fresh = [np.empty(shape, dtype) for shape, dtype in key]
        size = _nbytes(key)
        if size <= MAX_SET_BYTES and (sets is None or len(sets) < SETS_PER_SHAPE):
            _SETS.setdefault(key, []).append(fresh)
            _SETS.move_to_end(key)
            held = _held()
            while held > MAX_BYTES:  # the lists of shapes used longest ago go first
                old_key, old = _SETS.popitem(last=False)
                held -= _nbytes(old_key) * len(old)
        return tuple(fresh)


def host_array(shape: tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    """An uninitialized array: from the pool (:func:`host_buffers`, a set of one) when it has
    at least :data:`MIN_POOLED_BYTES`, else ``np.empty``."""
    if math.prod(shape) * np.dtype(dtype).itemsize >= MIN_POOLED_BYTES:
        return host_buffers([(shape, dtype)])[0]
    return np.empty(shape, dtype)


def release_host_buffers() -> None:
    """Drop every set the pool keeps (arrays still in use stay valid: their users hold them)."""
    with _LOCK:
        _SETS.clear()


def held_bytes() -> int:
    """Bytes the pool keeps now."""
    with _LOCK:
        return _held()
