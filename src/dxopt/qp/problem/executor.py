"""What :func:`dxopt.qp.solve` needs from an ``executor=``: the :class:`QPExecutor` protocol,
and the call's data it receives as one value (:class:`QPData`).

It lives in ``dxopt.qp`` (the caller that defines the contract) and is re-exported as
``dxopt.distributed.QPExecutor``; :mod:`dxopt.distributed` implements it
(:class:`dxopt.distributed.RayExecutor`) and imports ``dxopt.qp``, never the reverse.

May import: ``types`` and ``options`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPSolution

__all__ = ["QPData", "QPExecutor"]


@dataclass(frozen=True, slots=True)
class QPData:
    """The data of one :func:`dxopt.qp.solve` call as the caller gave it (batched or not, bounds
    not yet turned into rows): the problem :math:`\\min_x \\tfrac12 x^\\top Px + q^\\top x` s.t.
    :math:`Ax = b`, :math:`Gx \\le h`, :math:`lb \\le x \\le ub`, and the primal start
    ``warm_start``. One value, so that the executor protocol does not repeat the signature."""

    P: Tensor
    q: Tensor
    A: Tensor | None = None
    b: Tensor | None = None
    G: Tensor | None = None
    h: Tensor | None = None
    lb: Tensor | None = None
    ub: Tensor | None = None
    warm_start: Tensor | None = None

    def tensors(self) -> tuple[Tensor | None, ...]:
        """``(P, q, A, b, G, h, lb, ub, warm_start)``: the order of :func:`dxopt.qp.solve`'s
        arguments."""
        return (self.P, self.q, self.A, self.b, self.G, self.h, self.lb, self.ub, self.warm_start)


@runtime_checkable
class QPExecutor(Protocol):
    """Runs a (batched) :func:`dxopt.qp.solve` call elsewhere and returns the same
    :class:`~dxopt.qp.QPSolution`, differentiable as the local one."""

    def solve(self, data: QPData, *, options: QPOptions) -> QPSolution:
        """Solve ``data`` with the checked ``options`` of the call (``executor=None``) and
        return the same solution as the local :func:`dxopt.qp.solve`."""
        ...
