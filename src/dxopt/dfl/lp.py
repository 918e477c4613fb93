"""The data of a linear program with a fixed feasible set, parsed and validated once:
:class:`LPData`, read by :class:`~dxopt.dfl.LPOracle`, :class:`~dxopt.dfl.QPTL`,
:class:`~dxopt.dfl.LogBarrierLP` and :func:`~dxopt.dfl.binding_normals`.

The feasible set is :math:`S = \\{x : Ax = b,\\ Gx \\le h,\\ lb \\le x \\le ub\\}`; only the
costs change between calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.dfl._checks import as_array, lp_bounds, lp_dimension, lp_matrix

__all__ = ["LPData"]


@dataclass(frozen=True, eq=False)
class LPData:
    """The constraints :math:`Ax = b`, :math:`Gx \\le h`, :math:`lb \\le x \\le ub` of an LP in
    :attr:`dim` variables, as float64 numpy arrays (build it with :meth:`parse`).

    Attributes:
        dim: the number of variables.
        A, b: ``(p, dim)`` and ``(p,)`` equality rows, or both ``None``.
        G, h: ``(m, dim)`` and ``(m,)`` inequality rows, or both ``None``.
        lb, ub: ``(dim,)`` bounds, ``-inf`` / ``+inf`` where there is none.
    """

    dim: int
    A: np.ndarray | None
    b: np.ndarray | None
    G: np.ndarray | None
    h: np.ndarray | None
    lb: np.ndarray
    ub: np.ndarray

    @classmethod
    def parse(
        cls,
        owner: str,
        *,
        A: Any = None,
        b: Any = None,
        G: Any = None,
        h: Any = None,
        lb: Any = None,
        ub: Any = None,
    ) -> LPData:
        """Validate the LP's data (tensors, arrays, lists; a number for ``lb`` / ``ub`` bounds
        every entry): a matrix comes with its right-hand side, the dimension is fixed by a
        matrix or a bound vector, matrices are 2-D with ``dim`` columns and finite, right-hand
        sides have one entry per row, no NaN, ``lb <= ub``. Errors are ``ValueError`` naming
        the argument (``owner`` names the caller when the arguments disagree)."""
        dim = lp_dimension(owner, A=A, b=b, G=G, h=h, lb=lb, ub=ub)
        A_ = None if A is None else lp_matrix("A", A, dim)
        G_ = None if G is None else lp_matrix("G", G, dim)
        b_ = None if A_ is None else as_array("b", b, (A_.shape[0],))
        h_ = None if G_ is None else as_array("h", h, (G_.shape[0],))
        lb_, ub_ = lp_bounds(lb, ub, dim)
        for arr in (A_, b_, G_, h_, lb_, ub_):
            if arr is not None:
                arr.setflags(write=False)
        return cls(dim, A_, b_, G_, h_, lb_, ub_)

    @property
    def has_lower(self) -> np.ndarray:
        """``(dim,)`` bool: the entries with a finite lower bound."""
        return np.isfinite(self.lb)

    @property
    def has_upper(self) -> np.ndarray:
        """``(dim,)`` bool: the entries with a finite upper bound."""
        return np.isfinite(self.ub)

    def tensors(self, dtype: torch.dtype, device: Any = None) -> dict[str, Tensor | None]:
        """The keyword arguments ``A, b, G, h, lb, ub`` of :func:`dxopt.qp.solve` as tensors
        (``lb`` / ``ub`` ``None`` where every entry is infinite)."""

        def tensor(arr: np.ndarray | None) -> Tensor | None:
            return None if arr is None else torch.tensor(arr, dtype=dtype, device=device)

        return {
            "A": tensor(self.A),
            "b": tensor(self.b),
            "G": tensor(self.G),
            "h": tensor(self.h),
            "lb": tensor(self.lb) if self.has_lower.any() else None,
            "ub": tensor(self.ub) if self.has_upper.any() else None,
        }
