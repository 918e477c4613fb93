"""The lean single path's backward (:func:`small_backward`, :mod:`dxopt.qp.lean.small`'s module
docstring): the compiled adjoint of :mod:`dxopt.qp.solvers.kernels.adjoint` at the forward's
certified point, with the requested method's refinement settings (:func:`regular_settings`) and
the general path's diagnostics (:func:`record_diagnostics`); the batch path
(:mod:`dxopt.qp.lean.small_batch`) shares those helpers."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.backward.penalty import PenaltyBackward
from dxopt.qp.certify.tolerances import (
    DEPENDENT_TOL,
    KKT_REFINE_STEPS,
    KKT_REFINE_TOL,
    LEAN_MARGIN_FLOOR,
)
from dxopt.qp.lean.records import SmallPoint
from dxopt.qp.problem.types import BackwardDiagnostics
from dxopt.qp.solvers.kernels.adjoint import lean_adjoint

__all__ = ["cotangent_array", "record_diagnostics", "regular_settings", "small_backward"]

_NEEDS: dict[tuple[bool, ...], np.ndarray] = {}  # needs_input_grad -> the kernel's flags
_ZEROS: dict[Any, np.ndarray] = {}  # shape -> zeros (a missing cotangent; nothing writes it)
_ZEROS_KEPT = 4096  # entries up to which such zeros are kept for the next call


class _Regular(NamedTuple):
    """What a method's regular dense path uses: refinement limits, the residual bound, and for
    the penalty method its fixed :math:`\\beta` (or ``None``) and :math:`\\beta_{min}`; the
    same numbers as the lean kernel's ``settings`` array."""

    steps: int
    tol: float
    max_residual: float
    penalty: bool
    beta: float | None
    beta_min: float
    settings: np.ndarray  # the kernel's: (steps, tol, max_residual, DEPENDENT_TOL, margin floor)
    name: str = ""  # the method's name (BackwardDiagnostics.method)


_REGULAR: dict[int, tuple[Any, _Regular]] = {}  # id(method) -> (method, settings)


def regular_settings(method: Any) -> _Regular:
    """The :class:`_Regular` settings of a method
    :func:`~dxopt.qp.lean.lean_check.lean_method` accepts (cached per method object: a frozen
    dataclass's hash would hash every field on each call)."""
    cached = _REGULAR.get(id(method))
    if cached is not None and cached[0] is method:
        return cached[1]
    if isinstance(method, PenaltyBackward):
        steps, tol, beta, beta_min = (
            method.max_refinement,
            method.refine_tol,
            method.beta,
            method.beta_min,
        )
        penalty = True
    else:
        steps, tol, beta, beta_min, penalty = KKT_REFINE_STEPS, KKT_REFINE_TOL, None, 0.0, False
    settings = np.array(
        [steps, tol, method.max_residual, DEPENDENT_TOL, LEAN_MARGIN_FLOOR], dtype=np.float64
    )
    regular = _Regular(
        steps, tol, method.max_residual, penalty, beta, beta_min, settings, method.name
    )
    if len(_REGULAR) > 256:
        _REGULAR.clear()
    _REGULAR[id(method)] = (method, regular)  # keeps method alive: its id is not reused
    return regular


def cotangent_array(t: Tensor | None, shape: int | tuple[int, ...]) -> np.ndarray:
    """A cotangent as contiguous float64 numpy of ``shape`` (zeros for ``None``, the same
    array on every call for small shapes: the kernels only read it). One problem's and a
    batch's backward take theirs here."""
    if t is None:
        zeros = _ZEROS.get(shape)
        if zeros is None:
            zeros = np.zeros(shape)
            if zeros.size <= _ZEROS_KEPT and len(_ZEROS) < 256:
                _ZEROS[shape] = zeros
        return zeros
    return np.ascontiguousarray((t.detach() if t.requires_grad else t).numpy(), dtype=np.float64)


_E1, _E2 = np.zeros(0), np.zeros((0, 0))  # for gradients not asked for (nothing writes them)


def small_backward(
    point: SmallPoint,
    method: Any,
    grad_x: Tensor | None,
    grad_eq: Tensor | None,
    grad_ineq: Tensor | None,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...] | None:
    """The gradients for ``(P, q, A, b, G, h)`` by the lean backward (module docstring;
    :func:`dxopt.qp.solvers.kernels.adjoint.lean_adjoint`, which writes the arrays allocated
    here for the gradients ``needs`` asks for), or ``None`` where the general path must decide."""
    regular = regular_settings(method)
    C, m, x = point.C, point.g_inf.shape[0], point.x
    n, p = x.shape[0], C.shape[0] - m
    needed = _NEEDS.get(needs)
    if needed is None:
        needed = _NEEDS[needs] = np.array(needs)
    empty = np.empty
    gP = empty((n, n)) if needs[0] else _E2
    gq = empty(n) if needs[1] else _E1
    gA = empty((p, n)) if needs[2] else _E2
    gb = empty(p) if needs[3] else _E1
    gG = empty((m, n)) if needs[4] else _E2
    gh = empty(m) if needs[5] else _E1
    status, residual, steps, k, accuracy = lean_adjoint(
        point.P, point.q, C, point.upper, m, x, point.duals, point.working, point.g_inf,
        cotangent_array(grad_x, n), cotangent_array(grad_ineq, m), cotangent_array(grad_eq, p),
        regular.settings, needed, gP, gq, gA, gb, gG, gh,
    )  # fmt: skip
    if status:
        return None
    _record_one(point.diagnostics, residual, steps, k, accuracy, regular)
    # absent constraints get None; constraints given without rows get empty gradients
    eq, ineq = point.given
    out = (gP if needs[0] else None, gq if needs[1] else None,
           gA if needs[2] and eq else None, gb if needs[3] and eq else None,
           gG if needs[4] and ineq else None, gh if needs[5] and ineq else None)  # fmt: skip
    from_numpy = torch.from_numpy
    if point.dtype is torch.float64:
        return tuple([None if a is None else from_numpy(a) for a in out])
    return tuple([None if a is None else from_numpy(a).to(point.dtype) for a in out])


_ONE = {
    "linear_solver": "schur", "dependent_rows": (0,), "licq": True, "n_weak": (0,),
    "pseudo_inverse": (False,), "vertex_dropped": (0,), "dropped_rows": ((),),
    "weak_kept": False,
}  # fmt: skip
"""The fields :func:`record_diagnostics` sets alike for every one-sample call."""


def _record_one(
    diagnostics: BackwardDiagnostics,
    residual: float,
    steps: int,
    k: int,
    accuracy: float,
    regular: _Regular,
) -> None:
    """:func:`record_diagnostics` for one sample (the same fields and values, written by two
    ``dict.update`` calls instead of a ``setattr`` each: the dataclass has no ``__slots__``
    and no ``__setattr__`` of its own)."""
    fields = diagnostics.__dict__
    fields.update(_ONE)
    fields.update(method=regular.name, residual=residual, n_active=(k,))
    if regular.penalty:  # its fixed beta, or max(10 eps, beta_min) (PenaltyBackward._beta)
        beta = regular.beta
        fields.update(
            jitter=0.0,
            refinement_steps=steps,
            beta=(max(10.0 * accuracy, regular.beta_min),) if beta is None else (beta,),
        )


def record_diagnostics(
    diagnostics: BackwardDiagnostics,
    method: Any,
    residual: float,
    steps: int,
    k: tuple[int, ...],
    accuracy: tuple[float, ...],
    regular: _Regular,
) -> None:
    """The diagnostics the general path's regular dense route records for a batch of
    ``len(k)`` samples (the largest residual and step count; per sample the active rows and
    the penalty method's :math:`\\beta`)."""
    size = len(k)
    diagnostics.method = method.name
    diagnostics.linear_solver = "schur"
    diagnostics.dependent_rows = (0,) * size
    diagnostics.licq = True
    diagnostics.residual = residual
    diagnostics.n_active = k
    diagnostics.n_weak = (0,) * size
    diagnostics.pseudo_inverse = (False,) * size
    diagnostics.vertex_dropped = (0,) * size
    diagnostics.dropped_rows = ((),) * size
    diagnostics.weak_kept = False
    if regular.penalty:  # its fixed beta, or max(10 eps, beta_min) (PenaltyBackward._beta)
        diagnostics.jitter = 0.0
        diagnostics.refinement_steps = steps
        beta, beta_min = regular.beta, regular.beta_min
        diagnostics.beta = (
            tuple([max(10.0 * a, beta_min) for a in accuracy]) if beta is None else (beta,) * size
        )
