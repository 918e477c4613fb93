"""Small batched tensor helpers of the device path, written once: the torch certificate
(:mod:`dxopt.qp.certify.torch_certify`), the torch interior point
(:mod:`dxopt.qp.solvers.torch_ipm`, :mod:`dxopt.qp.solvers.torch_driver`) and its KKT solves
(:mod:`dxopt.qp.solvers.torch_kkt`) all read their residuals through them. Matrices are
``(B, r, n)``, vectors ``(B, r)``."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["amax", "dot", "mv", "rmv", "wide"]


def mv(M: Tensor, v: Tensor) -> Tensor:
    """:math:`Mv` per sample."""
    # row-vector form: torch's batched matrix-vector product (M @ v[..., None]) is about 3x
    # slower on the CPU than the same product as a (1, n) x (n, r) batched matmul
    return (v.unsqueeze(-2) @ M.mT).squeeze(-2)


def rmv(M: Tensor, w: Tensor) -> Tensor:
    """:math:`M^\\top w` per sample."""
    return (w.unsqueeze(-2) @ M).squeeze(-2)


def amax(v: Tensor) -> Tensor:
    """:math:`\\|v\\|_\\infty` per sample (0 for a vector without entries)."""
    return v.abs().amax(-1) if v.shape[-1] else v.new_zeros(v.shape[:-1])


def dot(u: Tensor, v: Tensor) -> Tensor:
    """:math:`u^\\top v` per sample."""
    return (u * v).sum(-1)


def wide(*ts: Tensor) -> tuple[Tensor, ...]:
    """float32 tensors as float64 (exact), others unchanged."""
    return tuple(t.double() if t.dtype == torch.float32 else t for t in ts)
