"""Thread control for small batched linear algebra on the CPU.

Batched factorizations and solves of many small matrices (say ``128 x 50x50``) do not gain
from intra-op threads: each matrix is too small to split, and torch's thread pool then costs
more in wake-ups and synchronisation than it saves, badly so when the cores are shared with
other work (oversubscription). Measured by the torch QP solver's benchmark on the shared
2-core machine (``dxopt bench qp_torch``, batch 128, n = 50): 0.62 s forward+backward at
1 torch thread, 7.0 s at 2 threads (load average about 10). :func:`limit_threads` runs a block
at a given thread count and restores the caller's setting afterwards, so a solver can keep its
small-matrix work at one thread without changing the process-wide default for everything else.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["limit_threads"]

_LOCK = threading.Lock()


@contextlib.contextmanager
def limit_threads(
    num_threads: int = 1, *, device: torch.device | str | None = None
) -> Iterator[int]:
    """Run the block with at most ``num_threads`` torch intra-op threads.

    Args:
        num_threads: the thread cap (a positive int). Nothing changes when the current
            ``torch.get_num_threads()`` is already at or below it.
        device: if given and not a CPU device, nothing changes (GPU kernels do not use the
            CPU thread pool).

    Yields the thread count in effect inside the block. The previous count is restored on
    exit, also when the block raises. ``torch.set_num_threads`` is process-wide: two Python
    threads entering the block at once both see the cap, and the last one to leave restores
    the count it found; keep such blocks short (one solve), as dxopt does.
    """
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(
            f"limit_threads: num_threads must be a positive int, got {num_threads!r}; "
            "pass 1 for small batched linear algebra"
        )
    if device is not None and torch.device(device).type != "cpu":
        yield torch.get_num_threads()
        return
    with _LOCK:
        before = torch.get_num_threads()
        if before > num_threads:
            torch.set_num_threads(num_threads)
    try:
        yield min(before, num_threads)
    finally:
        if before > num_threads:
            with _LOCK:
                torch.set_num_threads(before)
