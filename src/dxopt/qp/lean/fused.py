"""Compiled calls (numba) of the lean single path that each do what it did in two or more:
:func:`copy_in` reads ``(P, q, A, b, G, h)`` through their data pointers, runs the checks of
:func:`dxopt.qp.solvers.kernels.batch.prepare` on them and returns daqp's layout;
:func:`certify_exact` is :func:`~dxopt.qp.solvers.kernels.certify.certify_point` followed by
:func:`~dxopt.qp.solvers.kernels.certify.may_be_dependent` (an exact working set's point).

A view per input (``Tensor.numpy(force=True)``: a detached alias each) and an array per
output, made one by one in Python, cost more than the copy itself on an n = 10 problem; here
the inputs are read where they lie and the outputs are allocated in the compiled call. Only
inputs that are plain strided contiguous float64 CPU tensors without a negative bit are read
so (:func:`readable`); anything else takes :func:`~dxopt.qp.solvers.kernels.batch.prepare`
through numpy views, same checks, same copies. (These kernels call kernels of other files: numba's
disk cache keeps the callees' old code until this file changes, as the note of
:mod:`dxopt.qp.solvers.kernels` says.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from torch import Tensor

from dxopt.qp.solvers.kernels.batch import prepare
from dxopt.qp.solvers.kernels.certify import certify_point, may_be_dependent

__all__ = ["certify_exact", "copy_in", "readable"]

_F64 = torch.float64
_STRIDED = torch.strided


def _pointer_typing(typingctx: Any, address: Any) -> Any:
    """The ``void*`` of an integer address (for :func:`numba.carray`): its signature and
    code."""
    sig = types.voidptr(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


_pointer: Any = intrinsic(_pointer_typing)


@njit(cache=True, nogil=True)
def _copy_in(
    n: int,
    m: int,
    p: int,
    P_at: int,
    q_at: int,
    A_at: int,
    b_at: int,
    G_at: int,
    h_at: int,
    sym_tol: float,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(status, Pn, qn, C, upper, g_inf)`` of :func:`~dxopt.qp.solvers.kernels.batch.prepare`
    on the C-contiguous float64 arrays at the given addresses (``A``, ``b`` with ``p`` rows,
    ``G``, ``h`` with ``m``; an address of no rows is not read)."""
    f8 = np.float64
    P = carray(_pointer(P_at), (n, n), f8)
    q = carray(_pointer(q_at), (n,), f8)
    A = carray(_pointer(A_at), (p, n), f8)
    b = carray(_pointer(b_at), (p,), f8)
    G = carray(_pointer(G_at), (m, n), f8)
    h = carray(_pointer(h_at), (m,), f8)
    Pn, qn = np.empty((n, n)), np.empty(n)
    C, upper, g_inf = np.empty((m + p, n)), np.empty(m + p), np.zeros(m)
    status = prepare(P, q, A, b, G, h, sym_tol, Pn, qn, C, upper, g_inf)
    return status, Pn, qn, C, upper, g_inf


def readable(t: Tensor) -> bool:
    """Whether :func:`copy_in` may read ``t`` through its data pointer: a strided, contiguous
    float64 tensor without a negative (or conjugate) bit (the caller has checked it is a plain
    CPU tensor)."""
    return (
        t.dtype is _F64
        and t.layout is _STRIDED
        and t.is_contiguous()
        and not t.is_neg()
        and not t.is_conj()
    )


def copy_in(
    P: Tensor,
    q: Tensor,
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    sym_tol: float,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(status, Pn, qn, C, upper, g_inf)`` as :func:`_copy_in` computes them for one small
    problem whose given inputs are all :func:`readable` (``A, b`` and ``G, h`` in pairs,
    shapes consistent: :func:`dxopt.qp.lean.lean_check.small_inputs` holds), else ``None``
    (the caller takes numpy views; an input without storage has none either, and goes to the
    general path). Constraints given without rows are absent ones."""
    if not (readable(P) and readable(q)):
        return None
    n = q.shape[0]
    p = 0 if A is None else A.shape[0]
    m = 0 if G is None else G.shape[0]
    try:  # (a tensor without storage, e.g. a dead torch.func wrapper, has no data pointer)
        at = q.data_ptr()
        A_at = b_at = G_at = h_at = at  # no rows: not read
        if p:
            assert A is not None and b is not None
            if not (readable(A) and readable(b)):
                return None
            A_at, b_at = A.data_ptr(), b.data_ptr()
        if m:
            assert G is not None and h is not None
            if not (readable(G) and readable(h)):
                return None
            G_at, h_at = G.data_ptr(), h.data_ptr()
        P_at = P.data_ptr()
    except RuntimeError:
        return None
    return _copy_in(n, m, p, P_at, at, A_at, b_at, G_at, h_at, sym_tol)


@njit(cache=True, nogil=True)
def certify_exact(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    duals: np.ndarray,
    working: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    x_out: np.ndarray,
    mu_out: np.ndarray,
    nu_out: np.ndarray,
) -> tuple[bool, float, float, bool]:
    """``(ok, primal, dual, dependent)``: :func:`~dxopt.qp.solvers.kernels.certify.certify_point`
    (same arguments, the same copies written into ``x_out, mu_out, nu_out``) and, for a
    certified point with rows, :func:`~dxopt.qp.solvers.kernels.certify.may_be_dependent`
    with the same ``eps_abs`` and ``rel`` (``False`` otherwise)."""
    ok, primal, dual = certify_point(
        P, q, C, upper, m, x, duals, working, g_inf, eps_abs, rel, roundoff, x_out, mu_out,
        nu_out,
    )  # fmt: skip
    dependent = False
    if ok and C.shape[0]:
        dependent = may_be_dependent(C, upper, m, x, duals, eps_abs, rel)
    return ok, primal, dual, dependent
