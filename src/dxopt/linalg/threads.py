"""Thread control for small dense linear algebra.

Torch's LAPACK/BLAS calls run on its intra-op thread pool. For small matrices the work is a
few microseconds, and waking a second thread costs more than it saves: on the shared 2-core
machine under load, one 10 x 10 Cholesky took 0.84 ms at 2 threads against 6 us at 1 (issue 10).
:func:`small_threads` runs a block at one thread when the matrices are small and restores the
previous count afterwards.

``torch.set_num_threads`` is process-wide: while the block runs, other Python threads that call
torch also run at one thread (correct results, at most slower). Nested blocks are fine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["SMALL_MATRIX", "small_threads"]

SMALL_MATRIX = 64
"""Largest matrix dimension treated as small by :func:`small_threads`."""


@contextmanager
def small_threads(size: int, *, limit: int = SMALL_MATRIX) -> Iterator[None]:
    """Run the block at one torch thread if ``size`` (the matrix dimension) is at most
    ``limit``; otherwise leave the thread count alone.

    Example:
        >>> import torch
        >>> from dxopt.linalg import small_threads
        >>> with small_threads(10):
        ...     L = torch.linalg.cholesky(torch.eye(10, dtype=torch.float64))
    """
    if size > limit:
        yield
        return
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
