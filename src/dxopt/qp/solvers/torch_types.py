"""The records of the batched torch QP solver (:mod:`dxopt.qp.solvers.torch_driver`).

Owns :class:`TorchOptions` (the solver's options, one checked record for every entry),
:class:`TorchQPResult` (the per-sample solution, statuses, residuals and flags, all on the
inputs' device; :meth:`TorchQPResult.outputs` and :meth:`TorchQPResult.from_outputs` flatten it
for the autograd Function and rebuild it), :class:`PenaltyFactor` (the polish's penalty
Cholesky factor that the backward reuses) and the one table that encodes the shared
:class:`dxopt.qp.QPStatus` (:class:`dxopt._core.Status`) as int codes on the device
(:data:`STATUS_CODES`): the iteration keeps its statuses in an int tensor and never syncs for
them; :attr:`TorchQPResult.statuses` decodes them. Imports nothing of the solver.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dxopt._core import Status, check_int, check_positive, renamed_kwargs

__all__ = [
    "RENAMED_OPTIONS",
    "STATUS_CODES",
    "PenaltyFactor",
    "TorchOptions",
    "TorchQPResult",
    "code",
    "decode",
    "status_mask",
]


RENAMED_OPTIONS = {"max_refine": "max_refinement", "refine_steps": "max_refinement"}
"""The deprecated names of :class:`TorchOptions`' ``max_refinement`` (one release)."""


@renamed_kwargs(**RENAMED_OPTIONS)
@dataclass(frozen=True, kw_only=True)
class TorchOptions:
    """The options of the batched torch solver, checked when built (``ValueError`` naming the
    option): ``eps_abs``, ``eps_rel`` (stopping tolerances; the polished point's certificate),
    ``eps_inf`` (the infeasibility certificates), ``max_iter`` (interior-point iterations),
    ``check_every`` (iterations between convergence checks, each one host sync), ``polish``
    and ``max_refinement`` (refinement passes of each KKT solve, the name
    :class:`dxopt.qp.PenaltyBackward` uses too; ``None``:
    :data:`~dxopt.qp.certify.tolerances.TORCH_REFINE_STEPS`; ``max_refine`` and
    ``refine_steps`` are its deprecated names, a DeprecationWarning for one release). What
    each one does: :func:`dxopt.qp.autograd.torch_entry.torch_qp_solve`."""

    eps_abs: float = 1e-9
    eps_rel: float = 0.0
    eps_inf: float = 1e-7
    max_iter: int = 50
    check_every: int = 4
    polish: bool = True
    max_refinement: int | None = None

    SOLVER_OPTIONS: ClassVar[tuple[str, ...]] = (
        "eps_inf",
        "max_iter",
        "check_every",
        "max_refinement",
    )
    """The options ``dxopt.qp.solve(..., solver="torch")`` takes in ``solver_options``."""

    def __post_init__(self) -> None:
        check_positive("eps_abs", self.eps_abs, allow_zero=True)
        check_positive("eps_rel", self.eps_rel, allow_zero=True)
        check_positive("eps_inf", self.eps_inf, allow_zero=True)
        check_int("max_iter", self.max_iter)
        check_int("check_every", self.check_every)
        if self.max_refinement is not None:
            check_int("max_refinement", self.max_refinement, minimum=0)

    @classmethod
    def of(
        cls,
        solver_options: Mapping[str, Any] | None,
        *,
        eps_abs: float,
        eps_rel: float,
        polish: bool,
    ) -> TorchOptions:
        """The record of a ``solve(..., solver="torch")`` call: its tolerances and polish,
        and the ``solver_options`` (only :data:`SOLVER_OPTIONS`; the old names ``max_refine``
        and ``refine_steps`` of ``max_refinement`` warn, for one release)."""
        opts = dict(solver_options or {})
        unknown = sorted(set(opts) - set(cls.SOLVER_OPTIONS) - set(RENAMED_OPTIONS))
        if unknown:
            raise ValueError(
                f"solver_options: the torch solver takes {list(cls.SOLVER_OPTIONS)}, got the "
                f"unknown options {unknown}. Remove them (tolerances go through "
                "eps_abs/eps_rel)."
            )
        return cls(eps_abs=eps_abs, eps_rel=eps_rel, polish=polish, **opts)


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

    def outputs(self) -> tuple[Tensor, ...]:
        """The result as a flat tuple of tensors, in field order with the factor's tensors
        last (what :class:`dxopt.qp.autograd.torch_function.TorchQPFunction` returns);
        :meth:`from_outputs` is the inverse."""
        f = self.factor
        return (self.x, self.eq_duals, self.ineq_duals, self.slacks, self.status,
                self.iterations, self.primal_residual, self.dual_residual, self.polished,
                self.regular, f.L, f.w_ineq, f.w_eq, f.active)  # fmt: skip

    @classmethod
    def from_outputs(cls, outputs: tuple[Tensor, ...], max_refine: int) -> TorchQPResult:
        """The result of :meth:`outputs` (``max_refine``: the factor's refinement passes)."""
        x, y, z, slacks, status, iters, pres, dres, polished, regular, L, w_ineq, w_eq, active = (
            outputs
        )
        factor = PenaltyFactor(L, w_ineq, w_eq, active, max_refine)
        return cls(x, y, z, slacks, status, iters, pres, dres, polished, factor, regular)

    @property
    def solved(self) -> Tensor:
        """``(B,)`` bool: status is ``QPStatus.SOLVED``."""
        return self.status == code(Status.SOLVED)

    @property
    def statuses(self) -> tuple[Status, ...]:
        """Each sample's :class:`dxopt.qp.QPStatus` (one host transfer)."""
        return decode(self.status)
