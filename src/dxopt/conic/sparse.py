"""Sparse ``P`` and ``A`` for :func:`dxopt.conic.solve`: accepted, and their gradients keep
the input's sparsity pattern.

A sparse COO or CSR matrix (2-D: shared by the batch, as in :mod:`dxopt.qp`) is expanded to a
dense one by :class:`Scatter`, the one autograd Function here, whose backward gathers the
dense gradient at the input's stored entries: the gradient is a sparse tensor of the input's
layout, indices and shape, holding :math:`\\partial L / \\partial M_{ij}` for each stored
:math:`(i, j)` (the derivative with respect to the stored values; entries outside the pattern
are not parameters). The dense route works on the dense matrices (its Jacobian is
:math:`(n + m)^2`, :mod:`dxopt.conic.kkt`), so this keeps the pattern of the result, not the
memory of a large problem; large problems take the sparse route instead
(:mod:`dxopt.conic.sparse_route`, never densified), whose gradients have the same layout and
pattern.
"""

from __future__ import annotations

from typing import Any, overload

import torch
from torch import Tensor

__all__ = ["Scatter", "check_sparse_matrix", "densify"]

_SPARSE = (torch.sparse_coo, torch.sparse_csr)


def _coo_parts(M: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(rows, cols, crow)`` of the stored entries (``crow`` only for CSR)."""
    if M.layout == torch.sparse_csr:
        crow, col = M.crow_indices(), M.col_indices()
        counts = crow[1:] - crow[:-1]
        rows = torch.repeat_interleave(torch.arange(M.shape[0], device=M.device), counts)
        return rows, col, crow
    idx = M._indices()
    return idx[0], idx[1], None


class Scatter(torch.autograd.Function):
    """``M`` sparse (COO or CSR, 2-D) ``->`` its dense matrix; the backward returns the dense
    gradient's entries at ``M``'s stored positions, in ``M``'s layout and indices."""

    @staticmethod
    def forward(M: Tensor) -> Tensor:
        rows, cols, _ = _coo_parts(M)
        values = M.values() if M.layout == torch.sparse_csr else M._values()
        dense = torch.zeros(M.shape, dtype=M.dtype, device=M.device)
        return dense.index_put_((rows, cols), values, accumulate=True)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        (M,) = inputs
        rows, cols, crow = _coo_parts(M)
        ctx.save_for_backward(rows, cols, crow if crow is not None else rows.new_zeros(0))
        ctx.layout, ctx.shape = M.layout, M.shape
        ctx.coo_indices = M._indices() if M.layout == torch.sparse_coo else None

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Any:
        rows, cols, crow = ctx.saved_tensors
        values = grad[rows, cols]
        if ctx.layout == torch.sparse_csr:
            return torch.sparse_csr_tensor(crow, cols, values, ctx.shape, check_invariants=False)
        return torch.sparse_coo_tensor(
            ctx.coo_indices, values, ctx.shape, is_coalesced=True, check_invariants=False
        )


@overload
def densify(name: str, M: Tensor) -> Tensor: ...
@overload
def densify(name: str, M: None) -> None: ...
def densify(name: str, M: Tensor | None) -> Tensor | None:
    """``M`` itself if dense (or ``None``), else :class:`Scatter` of it after checking it.

    Raises:
        TypeError: a sparse layout other than COO/CSR, or a non-float dtype.
        ValueError: a sparse tensor that is not 2-D (batched sparse inputs are not taken:
            pass one sparse matrix shared by the batch, or a dense batch).
    """
    if M is None or not isinstance(M, Tensor) or M.layout == torch.strided:
        return M
    if M.layout not in _SPARSE:
        raise TypeError(
            f"{name}: expected a dense, sparse COO or sparse CSR tensor, got layout "
            f"{M.layout}; convert it with .to_sparse_coo() or .to_dense()"
        )
    check_sparse_matrix(name, M)
    if M.layout == torch.sparse_coo and not M.is_coalesced():
        M = M.coalesce()
    return Scatter.apply(M)


def check_sparse_matrix(name: str, M: Tensor) -> None:
    """A sparse ``P`` or ``A`` must be one 2-D float32/float64 matrix shared by the batch (the
    one check of both routes: :func:`densify` and the sparse route's validation)."""
    if M.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"{name}: expected dtype float32 or float64, got {M.dtype}; cast it with .double()"
        )
    if M.ndim != 2 or M.dense_dim() != 0:
        raise ValueError(
            f"{name}: expected a 2-D sparse matrix shared by the batch, got a sparse tensor of "
            f"shape {tuple(M.shape)} ({M.dense_dim()} dense dimensions); pass one sparse "
            "matrix, or a dense (B, ...) batch"
        )
