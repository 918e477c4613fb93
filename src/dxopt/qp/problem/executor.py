"""What :func:`dxopt.qp.solve` needs from an ``executor=``: the :class:`QPExecutor` protocol.

It lives in ``dxopt.qp`` (the caller that defines the contract) and is re-exported as
``dxopt.distributed.QPExecutor``; :mod:`dxopt.distributed` implements it
(:class:`dxopt.distributed.RayExecutor`) and imports ``dxopt.qp``, never the reverse.

May import: ``types`` and ``options`` only.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPSolution

__all__ = ["QPExecutor"]


@runtime_checkable
class QPExecutor(Protocol):
    """Runs a (batched) :func:`dxopt.qp.solve` call elsewhere and returns the same
    :class:`~dxopt.qp.QPSolution`, differentiable as the local one."""

    def solve(
        self,
        P: Tensor,
        q: Tensor,
        A: Tensor | None = None,
        b: Tensor | None = None,
        G: Tensor | None = None,
        h: Tensor | None = None,
        *,
        lb: Tensor | None = None,
        ub: Tensor | None = None,
        warm_start: Tensor | None = None,
        options: QPOptions,
    ) -> QPSolution:
        """Solve with the checked ``options`` of the call (``executor=None``) and return the
        same solution as the local :func:`dxopt.qp.solve`."""
        ...
