"""The result types of the batched torch QP solver (:mod:`dxopt.qp.solvers.torch_driver`).

Owns :class:`TorchQPResult` (the per-sample solution, statuses, residuals and flags, all on
the inputs' device), :class:`PenaltyFactor` (the polish's penalty Cholesky factor that the
backward reuses) and the solver's per-sample status codes. Imports nothing of the solver.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from torch import Tensor

__all__ = ["PenaltyFactor", "TorchQPResult", "TorchQPStatus"]


class TorchQPStatus(enum.IntEnum):
    """Per-sample outcome codes of :func:`~dxopt.qp.autograd.torch_entry.torch_qp_solve`
    (stored as an int tensor)."""

    SOLVED = 0
    MAX_ITER = 1
    PRIMAL_INFEASIBLE = 2
    DUAL_INFEASIBLE = 3
    NUMERICAL_ERROR = 4


@dataclass(frozen=True)
class PenaltyFactor:
    """Cholesky factor of :math:`P + \\sigma I + G^\\top W_G G + A^\\top W_A A` per sample.

    Attributes:
        L: lower Cholesky factor, ``(B, n, n)``.
        w_ineq: weights :math:`W_G`, ``(B, m)``; zero on inactive rows.
        w_eq: weights :math:`W_A`, ``(B, p)``.
        active: active inequality rows, ``(B, m)`` bool.
        steps: refinement steps each solve takes.
    """

    L: Tensor
    w_ineq: Tensor
    w_eq: Tensor
    active: Tensor
    steps: int


@dataclass(frozen=True)
class TorchQPResult:
    """Solution of a batch of QPs by :func:`~dxopt.qp.autograd.torch_entry.torch_qp_solve`
    (all tensors on the input device).

    Attributes:
        x: primal solutions ``(B, n)`` (differentiable when an input requires grad).
        eq_duals: multipliers :math:`y` of :math:`Ax = b`, ``(B, p)``.
        ineq_duals: multipliers :math:`z \\ge 0` of :math:`Gx \\le h`, ``(B, m)``.
        slacks: :math:`s = h - Gx`, ``(B, m)``.
        status: :class:`TorchQPStatus` codes, int64 ``(B,)``.
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
        """``(B,)`` bool: status is :attr:`TorchQPStatus.SOLVED`."""
        return self.status == TorchQPStatus.SOLVED
