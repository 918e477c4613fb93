"""Thread control for small linear algebra.

Tiny matrices gain nothing from intra-op parallelism and lose to its synchronisation (a
10 x 10 Cholesky takes about twice as long on 2 torch threads as on one on an idle 2-core
machine, and far longer when the cores are contended). :func:`small_work` runs a block on one
intra-op thread when its arithmetic is below a limit and restores the previous setting afterwards (a
``torch.set_num_threads`` pair costs about a microsecond). :func:`blas_threads` limits the
*other* thread pool, numpy's and scipy's BLAS, for the blocks that call it directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import torch

__all__ = ["SMALL_WORK", "blas_threads", "small_work"]

SMALL_WORK = 4e6  # flops below which one thread is used


@contextmanager
def small_work(flops: float, *, limit: float = SMALL_WORK) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)`` if ``flops < limit`` (restored after).

    Args:
        flops: an estimate of the block's arithmetic (e.g. ``batch * n**3``).
        limit: the threshold; ``0`` disables the switch.
    """
    threads = torch.get_num_threads()
    if threads <= 1 or not flops < limit:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@lru_cache(maxsize=1)
def _controller() -> Any:
    """threadpoolctl's controller of the loaded BLAS libraries, created once (creating one
    scans the loaded libraries, about 1 ms), after scipy's BLAS is loaded (the kernels of
    :mod:`dxopt.linalg.small` call it)."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS before the scan)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@lru_cache(maxsize=1)
def _blas_libraries() -> tuple[Any, ...]:
    """threadpoolctl's controllers of the loaded BLAS libraries (numpy's and scipy's)."""
    return tuple(lib for lib in _controller().lib_controllers if lib.user_api == "blas")


@contextmanager
def blas_threads(limit: int | None = None) -> Iterator[None]:
    """numpy's and scipy's BLAS limited to ``limit`` threads. Default: torch's intra-op thread
    count, but one thread when torch has at most two. On two cores, scipy's OpenBLAS pool and
    torch's OpenMP pool spin-wait against each other after every call. At 2 torch threads the
    n = 1000 backward measured 45-117 ms with a 2-thread OpenBLAS and 38-41 ms with one, and
    torch's own Cholesky right after went from 19-26 ms to 10 ms.

    Each library's count is read and, where it differs, set and restored afterwards through its
    own controller (about a microsecond a call): threadpoolctl's ``limit`` context rebuilds its
    view of every library on each entry, some 20 us, and up to 0.2 ms measured per call inside
    a batch solve."""
    if limit is None:
        threads = torch.get_num_threads()
        limit = 1 if threads <= 2 else threads
    changed = []
    for lib in _blas_libraries():
        old = lib.get_num_threads()
        if old != limit:
            lib.set_num_threads(limit)
            changed.append((lib, old))
    try:
        yield
    finally:
        for lib, old in changed:
            lib.set_num_threads(old)
