"""The cone-program data ``(P, q, A, b)`` of one front-end call, from the affine map's entries.

``entries[:, k]`` is the value of the flat ``(P, q, A, b)`` position ``rows[k]``
(:mod:`dxopt.frontend._compile`). A block whose parameters are not batched is the same for
every sample and is built once; a shared ``P`` or ``A`` with more than :data:`SPARSE_FROM`
dense entries is built as a sparse COO matrix holding only the map's entries (its gradient
keeps that pattern, :mod:`dxopt.conic.sparse`), so the call never allocates the dense
``B x (n^2 + mn)`` flat vector; the rest is written densely.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["SPARSE_FROM", "conic_blocks"]

SPARSE_FROM = 1_000_000
"""Dense entries (``n^2`` for ``P``, ``mn`` for ``A``) above which a shared block is sparse."""


def _block(
    entries: Tensor,
    rows: np.ndarray,
    lo: int,
    shape: tuple[int, ...],
    shared: bool,
    sparse_from: int,
) -> Tensor:
    size = int(np.prod(shape))
    keep = np.nonzero((rows >= lo) & (rows < lo + size))[0]
    local = torch.from_numpy(rows[keep] - lo)
    vals = entries[:, torch.from_numpy(keep)]
    if shared and len(shape) == 2 and size > sparse_from:
        idx = torch.stack([local // shape[1], local % shape[1]])
        return torch.sparse_coo_tensor(idx, vals[0], shape, is_coalesced=True)
    B = 1 if shared else entries.shape[0]
    dense = entries.new_zeros(B, size)
    dense = dense.index_put((torch.arange(B)[:, None], local[None, :]), vals[:B])
    dense = dense.reshape(B, *shape)
    return dense[0] if shared else dense


def conic_blocks(
    c: Any, entries: Tensor, batched: set[int], *, sparse_from: int = SPARSE_FROM
) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
    """``(P, q, A, b)`` for :func:`dxopt.conic.solve_with` (shared blocks without a batch
    axis; ``P`` ``None`` when the objective is linear)."""
    n, m = c.n, c.m
    rows = np.asarray(c.rows)

    def shared(name: str) -> bool:
        return not (c.block_params[name] & batched)

    P = _block(entries, rows, 0, (n, n), shared("P"), sparse_from) if c.has_P else None
    q = _block(entries, rows, n * n, (n,), shared("q"), sparse_from)
    A = _block(entries, rows, n * n + n, (m, n), shared("A"), sparse_from)
    b = _block(entries, rows, n * n + n + m * n, (m,), shared("b"), sparse_from)
    return P, q, A, b
