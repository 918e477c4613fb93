"""What the lean routes take: the input check of one small dense CPU problem
(:func:`small_inputs`) and the backward methods the lean kernels compute (:func:`lean_method`);
which backends it takes is their ``lean`` field in :mod:`dxopt.qp.solvers.backends`.
:func:`dxopt.qp.api.route.plan` reads these; the lean single path itself is
:mod:`dxopt.qp.lean.small`."""

from __future__ import annotations

import torch
from torch import Tensor

from dxopt.qp.backward.kkt import KKTBackward
from dxopt.qp.backward.penalty import PenaltyBackward
from dxopt.qp.problem.canonical import SYMMETRY_FACTOR

__all__ = ["SMALL_MAX_N", "SYMMETRY_TOL", "lean_method", "small_inputs"]

SMALL_MAX_N = 64
"""Largest ``n`` of the lean path: up to here a problem's arithmetic is cheaper than the
general path's dispatches."""

_DTYPES = (torch.float64, torch.float32)
SYMMETRY_TOL = {t: SYMMETRY_FACTOR * float(torch.finfo(t).eps) for t in _DTYPES}
"""``P``'s asymmetry accepted by the lean kernels, relative, per dtype: the general path's
(:data:`dxopt.qp.problem.canonical.SYMMETRY_FACTOR`)."""


def small_inputs(P: object, q: object, A: object, b: object, G: object, h: object) -> bool:
    """Whether ``(P, q, A, b, G, h)`` is one small dense CPU problem the lean path takes:
    plain CPU tensors (no subclass), one float dtype (float64 or float32), unbatched,
    consistent shapes with ``1 <= n <= SMALL_MAX_N``, ``A, b`` and ``G, h`` in pairs, and no
    forward-mode AD level open (its dual tensors need the general path's ``jvp``). Anything
    else, bad input included, is left to the general path and its error messages. (The
    layout is not read here: a sparse or mkldnn tensor has no numpy view, and
    :func:`dxopt.qp.lean.small.small_forward` hands such a problem to the general path.)"""
    if type(q) is not Tensor or type(P) is not Tensor:
        return False
    dtype = q.dtype
    if dtype not in _DTYPES or P.dtype is not dtype or q.ndim != 1 or not (q.is_cpu and P.is_cpu):
        return False
    n = q.shape[0]
    if not (0 < n <= SMALL_MAX_N and P.shape == (n, n)):
        return False
    if not (_pair(A, b, n, dtype) and _pair(G, h, n, dtype)):
        return False
    level = getattr(torch.autograd.forward_ad, "_current_level", None)
    return level is not None and level < 0  # an open dual level (or unknown): the general path


def _pair(M: object, v: object, n: int, dtype: torch.dtype) -> bool:
    """``M, v`` both absent, or plain CPU tensors of ``dtype`` shaped ``(k, n)`` and ``(k,)``."""
    if M is None:
        return v is None
    return (
        type(M) is Tensor and type(v) is Tensor and M.dtype is dtype and v.dtype is dtype
        and M.ndim == 2 and v.ndim == 1 and M.shape[1] == n and v.shape[0] == M.shape[0]
        and M.is_cpu and v.is_cpu
    )  # fmt: skip


def lean_method(method: object) -> bool:
    """Whether the lean backward computes what ``method`` would on a regular problem: a
    :class:`~dxopt.qp.PenaltyBackward` (refined) or :class:`~dxopt.qp.KKTBackward` itself (no
    subclass), dense linear algebra, the forward's active set (``active_tol=None``). The
    degenerate and weak-row policies only act where the lean path declines (the general path
    then runs this same method)."""
    if type(method) is KKTBackward:
        return method.active_tol is None and method.linear_solver != "sparse"
    if type(method) is PenaltyBackward:
        return (
            method.active_tol is None
            and method.linear_solver != "sparse"
            and method.max_refinement > 0
        )
    return False
