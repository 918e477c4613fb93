"""Thread control for small linear algebra.

Tiny matrices gain nothing from intra-op parallelism and lose to its synchronisation (a
10 x 10 Cholesky takes about twice as long on 2 torch threads as on one on an idle 2-core
machine, and far longer when the cores are contended). :func:`small_work` runs a block on one
intra-op thread when its arithmetic is below a limit and restores the previous setting afterwards (a
``torch.set_num_threads`` pair costs about a microsecond).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["SMALL_WORK", "small_work"]

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
