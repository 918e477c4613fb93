"""The result types of the batched torch QP solver (:mod:`dxopt.qp.solvers.torch_driver`).

Owns :class:`TorchQPResult` (the per-sample solution, statuses, residuals and flags, all on
the inputs' device), :class:`PenaltyFactor` (the polish's penalty Cholesky factor that the
backward reuses) and the one table that encodes the shared :class:`dxopt.qp.QPStatus`
(:class:`dxopt._core.Status`) as int codes on the device (:data:`STATUS_CODES`): the iteration
keeps its statuses in an int tensor and never syncs for them; :attr:`TorchQPResult.statuses`
decodes them. Imports nothing of the solver.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from dxopt._core import Status

__all__ = ["STATUS_CODES", "PenaltyFactor", "TorchQPResult", "code", "decode", "status_mask"]

STATUS_CODES: tuple[Status, ...] = (
    Status.SOLVED,
    Status.MAX_ITER,
    Status.INFEASIBLE,
    Status.UNBOUNDED,
    Status.FAILED,
)
"""The device encoding of the per-sample statuses: a status tensor holds the index of each
sample's :class:`~dxopt._core.Status` in this table (``FAILED``: a Newton system could not be
factored or a step left the finite numbers)."""


def code(status: Status) -> int:
    """The int code of ``status`` in a status tensor (:data:`STATUS_CODES`)."""
    return STATUS_CODES.index(status)


def status_mask(codes: Tensor, *statuses: Status) -> Tensor:
    """``(B,)`` bool mask of the samples whose status is one of ``statuses``."""
    out = torch.zeros_like(codes, dtype=torch.bool)
    for status in statuses:
        out = out | (codes == code(status))
    return out


def decode(codes: Tensor) -> tuple[Status, ...]:
    """The :class:`~dxopt._core.Status` of every sample (one host transfer)."""
    return tuple(STATUS_CODES[c] for c in codes.tolist())


class _TorchQPStatus(enum.IntEnum):
    """The int codes of :data:`STATUS_CODES` under their pre-0.2 names (deprecated)."""

    SOLVED = 0
    MAX_ITER = 1
    PRIMAL_INFEASIBLE = 2
    DUAL_INFEASIBLE = 3
    NUMERICAL_ERROR = 4


def deprecated_status_enum(module: str) -> type[enum.IntEnum]:
    """``TorchQPStatus`` for one release, with a DeprecationWarning (module ``__getattr__``)."""
    warnings.warn(
        f"{module}.TorchQPStatus is deprecated and will be removed in the next release: the "
        "torch solver's statuses are dxopt.qp.QPStatus (TorchQPResult.statuses; the int "
        "codes of TorchQPResult.status index dxopt.qp.solvers.torch_types.STATUS_CODES).",
        DeprecationWarning,
        stacklevel=3,
    )
    return _TorchQPStatus


@dataclass(frozen=True)
class PenaltyFactor:
    """Cholesky factor of :math:`P + \\sigma I + G^\\top W_G G + A^\\top W_A A` per sample.

    Attributes:
        L: lower Cholesky factor, ``(B, n, n)``.
        w_ineq: weights :math:`W_G`, ``(B, m)``; zero on inactive rows.
        w_eq: weights :math:`W_A`, ``(B, p)``.
        active: active inequality rows, ``(B, m)`` bool.
        max_refine: the most refinement passes each solve takes.
    """

    L: Tensor
    w_ineq: Tensor
    w_eq: Tensor
    active: Tensor
    max_refine: int


@dataclass(frozen=True)
class TorchQPResult:
    """Solution of a batch of QPs by :func:`~dxopt.qp.autograd.torch_entry.torch_qp_solve`
    (all tensors on the input device).

    Attributes:
        x: primal solutions ``(B, n)`` (differentiable when an input requires grad).
        eq_duals: multipliers :math:`y` of :math:`Ax = b`, ``(B, p)``.
        ineq_duals: multipliers :math:`z \\ge 0` of :math:`Gx \\le h`, ``(B, m)``.
        slacks: :math:`s = h - Gx`, ``(B, m)``.
        status: int64 ``(B,)`` codes of each sample's :class:`dxopt.qp.QPStatus` (indices
            into :data:`STATUS_CODES`; :attr:`statuses` decodes them).
        iterations: interior-point iterations per sample, int64 ``(B,)``.
        primal_residual: :math:`\\max(\\|Ax-b\\|_\\infty, \\max(Gx-h)_+)` per sample.
        dual_residual: :math:`\\|Px + q + A^\\top y + G^\\top z\\|_\\infty` per sample.
        polished: whether the active-set polish was accepted, ``(B,)`` bool.
        factor: the penalty factorization of the polish, reused by the backward.
        regular: ``(B,)`` bool, solved samples whose polished active set is strictly
            complementary and independent with ``P`` positive definite
            (:func:`dxopt.qp.certify.torch_certify.regular`): the exact active-set backward is the
            derivative there; :func:`dxopt.qp.solve` sends the others to the CPU path.
    """

    x: Tensor
    eq_duals: Tensor
    ineq_duals: Tensor
    slacks: Tensor
    status: Tensor
    iterations: Tensor
    primal_residual: Tensor
    dual_residual: Tensor
    polished: Tensor
    factor: PenaltyFactor
    regular: Tensor

    @property
    def solved(self) -> Tensor:
        """``(B,)`` bool: status is ``QPStatus.SOLVED``."""
        return self.status == code(Status.SOLVED)

    @property
    def statuses(self) -> tuple[Status, ...]:
        """Each sample's :class:`dxopt.qp.QPStatus` (one host transfer)."""
        return decode(self.status)
