"""Where a constraint's dual sits in the cone program's dual ``y``, in CVXPY's convention.

A user constraint becomes one canonical constraint of the ``ParamConeProg`` whose rows
``[row, row + size)`` of :math:`Ax + s = b` carry its multiplier :math:`y` (CVXPY's Clarabel
interface returns Clarabel's ``z`` there and the chain's inversion hands it to the user
constraint's ``save_dual_value``). :func:`dual_layout` mirrors that inversion as index arrays
into ``y``, one per dual variable of the constraint, each of the dual variable's shape:

- zero / nonnegative rows: the rows in Fortran order (CVXPY stacks expressions column-major);
- ``cp.SOC(t, X, axis)``: the rows are ``num`` cones of ``cone_size`` entries, the first of
  each the ``t`` part; the ``X`` part is transposed for ``axis=0``
  (``SOC.save_dual_value``);
- ``cp.ExpCone(x, y, z)`` and ``cp.PowCone3D(x, y, z, alpha)``: the rows are triples
  :math:`(x_i, y_i, z_i)` over the elements in Fortran order (``ExpCone.save_dual_value``);
- ``X >> 0`` (``cp.PSD``): the rows are the upper triangle of each matrix, column by column,
  off-diagonal entries scaled by :math:`\\sqrt 2` (Clarabel's ``PSDTriangleConeT``); the dual is
  the symmetric matrix with entries :math:`y_k` on the diagonal and :math:`y_k/\\sqrt 2` off it
  (CVXPY's ``tri_to_full`` with ``sqrt2_scaling``), so each entry is an index and a factor.

Gathering ``y[..., index] * scale`` is differentiable, so the duals are layer outputs with
gradients like the primal ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DualPart", "dual_layout", "fortran_index"]


@dataclass(frozen=True)
class DualPart:
    """One dual variable: ``y[..., index] * scale`` (``scale`` ``None``: factor 1)."""

    index: np.ndarray  # int64, the dual variable's shape
    scale: np.ndarray | None


def fortran_index(start: int, shape: tuple[int, ...]) -> np.ndarray:
    """Positions ``start + k`` laid out in ``shape`` column-major (CVXPY's ``vec``)."""
    size = math.prod(shape)
    return (start + np.arange(size, dtype=np.int64)).reshape(shape, order="F")


def _soc(constraint: Any, rows: np.ndarray) -> list[DualPart]:
    t_var, x_var = constraint.dual_variables
    X = constraint.args[1]
    cone_size = int(constraint._cone_size())
    block = rows.reshape(-1, cone_size)
    t_idx = block[:, 0].reshape(t_var.shape)
    x_idx = block[:, 1:]
    if len(X.shape) == 0:
        x_idx = x_idx[0, 0]
    elif constraint.axis == 0:
        x_idx = x_idx.T
    return [DualPart(t_idx, None), DualPart(np.asarray(x_idx).reshape(x_var.shape), None)]


def _exp(constraint: Any, rows: np.ndarray) -> list[DualPart]:
    block = rows.reshape(-1, 3)
    return [
        DualPart(block[:, j].reshape(dv.shape, order="F"), None)
        for j, dv in enumerate(constraint.dual_variables)
    ]


def _psd(constraint: Any, rows: np.ndarray) -> list[DualPart]:
    shape = tuple(constraint.args[0].shape)
    k = shape[-1]
    tri = k * (k + 1) // 2
    num = rows.size // tri
    index = np.empty((num, k, k), dtype=np.int64)
    p = 0
    for j in range(k):  # the upper triangle, column by column
        for i in range(j + 1):
            index[:, i, j] = index[:, j, i] = rows.reshape(num, tri)[:, p]
            p += 1
    scale = np.full((k, k), 1.0 / math.sqrt(2.0))
    np.fill_diagonal(scale, 1.0)
    scale = np.broadcast_to(scale, (num, k, k))
    (dv,) = constraint.dual_variables
    return [DualPart(index.reshape(dv.shape), np.ascontiguousarray(scale).reshape(dv.shape))]


def dual_layout(constraint: Any, canonical: str, row: int, size: int) -> list[DualPart] | None:
    """The dual variables of the user ``constraint`` whose canonical constraint is a
    ``canonical`` (``"Zero"``, ``"NonNeg"``, ``"SOC"``, ``"ExpCone"``, ``"PowCone3D"``,
    ``"SvecPSD"``) on the
    rows ``[row, row + size)``; ``None`` where dxopt does not know CVXPY's layout (the caller
    refuses the output)."""
    import cvxpy as cp

    rows = np.arange(row, row + size, dtype=np.int64)
    if canonical in ("Zero", "NonNeg"):
        if size != constraint.size or len(constraint.dual_variables) != 1:
            return None
        return [DualPart(fortran_index(row, tuple(constraint.shape)), None)]
    if canonical == "SOC" and isinstance(constraint, cp.SOC):
        return _soc(constraint, rows)
    if canonical == "ExpCone" and isinstance(constraint, cp.constraints.ExpCone):
        return _exp(constraint, rows)
    if canonical == "PowCone3D" and isinstance(constraint, cp.constraints.PowCone3D):
        return _exp(constraint, rows)  # the same (x_i, y_i, z_i) triples
    if canonical == "SvecPSD" and isinstance(constraint, cp.constraints.PSD):
        return _psd(constraint, rows)
    return None
