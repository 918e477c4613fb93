"""The affine parameter map :math:`\\theta_1 \\mapsto M\\theta_1`: a differentiable sparse product.

:class:`SparseLinear` holds a constant CSR matrix :math:`M` (``rows x columns``) and its
transpose; :func:`apply_linear` computes ``Y = Theta M^T`` for a batch ``Theta`` (``B x
columns``) row by row with a compiled CSR loop (``B * nnz(M)`` multiply-adds, no dense
:math:`M`, output written in the batch-major layout the solver reads). The map is linear, so
its vjp is the same product with :math:`M^T` and its jvp the product with :math:`M`; both go
through the one module-level :class:`AffineMap` function, which therefore differentiates any
number of times. Off the CPU the product is ``torch.sparse.mm`` with a CSR copy of
:math:`M` on the device.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from numba import njit
from torch import Tensor

__all__ = ["AffineMap", "SparseLinear", "apply_linear"]


@njit(cache=True, nogil=True)
def _csr_rows(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, theta: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """``out[b, r] = sum_t data[t] * theta[b, indices[t]]`` over row ``r``'s entries."""
    for b in range(theta.shape[0]):
        for r in range(out.shape[1]):
            acc = 0.0
            for t in range(indptr[r], indptr[r + 1]):
                acc += data[t] * theta[b, indices[t]]
            out[b, r] = acc


class SparseLinear:
    """A constant sparse matrix :math:`M` applied to batches of row vectors, with its transpose.

    Args:
        matrix: scipy sparse ``(rows, columns)``.
        transpose: the transposed :class:`SparseLinear`, when already built.
    """

    def __init__(self, matrix: Any, transpose: SparseLinear | None = None) -> None:
        csr = sp.csr_array(matrix)
        csr.sum_duplicates()
        self.shape: tuple[int, int] = (int(csr.shape[0]), int(csr.shape[1]))
        self.indptr = csr.indptr.astype(np.int64)
        self.indices = csr.indices.astype(np.int64)
        self.data = csr.data.astype(np.float64)
        self._csr = csr
        self._transpose = transpose
        self._device: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    @property
    def T(self) -> SparseLinear:
        if self._transpose is None:
            self._transpose = SparseLinear(self._csr.T.tocsr(), transpose=self)
        return self._transpose

    @property
    def nnz(self) -> int:
        return int(self.data.size)

    def on(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """:math:`M` as a torch CSR tensor on ``device`` (cached)."""
        key = (device, dtype)
        if key not in self._device:
            with warnings.catch_warnings():  # torch: "Sparse CSR tensor support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                self._device[key] = torch.sparse_csr_tensor(
                    torch.from_numpy(self.indptr),
                    torch.from_numpy(self.indices),
                    torch.from_numpy(self.data),
                    self.shape,
                    check_invariants=False,
                ).to(device=device, dtype=dtype)
        return self._device[key]


def device_product(theta: Tensor, linear: SparseLinear) -> Tensor:
    """``theta @ M^T`` by ``torch.sparse.mm`` with :math:`M` on ``theta``'s device."""
    return torch.sparse.mm(linear.on(theta.device, theta.dtype), theta.mT).mT.contiguous()


def apply_linear(theta: Tensor, linear: SparseLinear) -> Tensor:
    """``theta @ M^T`` for ``theta`` of shape ``(B, columns)`` (no autograd)."""
    if theta.device.type != "cpu":
        return device_product(theta, linear)
    source = theta.detach().contiguous().numpy()
    out = np.empty((source.shape[0], linear.shape[0]), dtype=source.dtype)
    _csr_rows(linear.indptr, linear.indices, linear.data, source, out)
    return torch.from_numpy(out)


class AffineMap(torch.autograd.Function):
    """``Y = Theta M^T`` with vjp ``bar(Y) M`` and jvp ``dot(Theta) M^T`` (both sparse).

    ``forward`` takes ``ctx`` (no ``setup_context``), as the lean QP path of
    :mod:`dxopt.qp.lean.small_function` does: ``Function.apply`` binds the arguments with
    :func:`inspect.signature` on every call when ``setup_context`` is defined, some 30 us of a
    0.3 ms layer call."""

    @staticmethod
    def forward(ctx: Any, theta: Tensor, linear: SparseLinear) -> Tensor:
        ctx.linear = linear
        return apply_linear(theta, linear)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return AffineMap.apply(grad, ctx.linear.T), None

    @staticmethod
    def jvp(ctx: Any, theta_dot: Tensor, _: None) -> Tensor:
        return AffineMap.apply(theta_dot, ctx.linear)
