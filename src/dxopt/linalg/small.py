"""Compiled kernels for one small dense system (``n, k <= 64``): Cholesky factorization,
triangular solves and the block elimination of :mod:`dxopt.linalg.schur`.

For a 10 x 10 system the arithmetic of a factorization and a solve is a few hundred
floating-point operations; through numpy or torch every one of the dozen array operations
it takes costs 0.5-5 us of dispatch, through LAPACK's wrappers about 1 us per call. These
kernels are compiled once by numba (``cache=True``: to disk, reused by later processes) and
run the whole factorization in one call. Every inner loop is a row-wise ``axpy`` on
contiguous memory (vectorised by LLVM without reassociation, so results do not depend on
the CPU's vector width), which keeps them near LAPACK's speed up to ``n = 64``.

**Cholesky** (:func:`cholesky_lower`): the right-looking (outer-product) algorithm on the
upper factor :math:`U` (:math:`A = U^\\top U`, Golub & Van Loan, *Matrix Computations*, 4th
ed., algorithm 4.2.2 transposed), returned as :math:`L = U^\\top` in C order. It stops at the
first pivot that is not positive (or not finite) and reports its 1-based position, as
LAPACK's ``dpotrf`` does.

**Block elimination** (:func:`schur_factor_small`, :func:`schur_solve_small`): the
factorization of :func:`dxopt.linalg.schur.schur_factor` for one system,
:math:`P = LL^\\top`, :math:`Y = L^{-1}C^\\top`, :math:`S = Y^\\top Y`, the shifted
:math:`S' = S + \\text{shift}\\,D_s` (a unit diagonal on zero rows) and its factor :math:`L_S`,
with the squared pivots :math:`\\pi_j = (L_S)_{jj}^2/S_{jj}` of the row dependence test (see
that module).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np
from numba import njit

__all__ = [
    "BLAS_GRAM",
    "LapackKernels",
    "cholesky_lapack",
    "cholesky_lower",
    "dot",
    "gram_rows",
    "gram_rows_blas",
    "lapack_kernels",
    "lower_solve",
    "lower_solve_inplace",
    "lower_solve_rows_lapack",
    "lower_transpose_solve",
    "lower_transpose_solve_inplace",
    "matvec",
    "schur_complement_rows",
    "schur_complement_small",
    "schur_factor_small",
    "schur_solve_indexed",
    "schur_solve_rows",
    "schur_solve_small",
]

_jit: Any = njit(cache=True, nogil=True)


class LapackKernels(NamedTuple):
    """scipy's LAPACK ``dpotrf`` and BLAS ``dtrsm``, ``dsyrk`` (``scipy.linalg.cython_lapack`` /
    ``cython_blas``, LP64) as ctypes functions of ``void*`` arguments, for the kernels that
    take them as arguments: numba calls them without the GIL or Python, and caches a kernel
    only when C function pointers come in as arguments (as globals they are not cacheable)."""

    potrf: Any
    trsm: Any
    syrk: Any


@lru_cache(maxsize=1)
def lapack_kernels() -> LapackKernels:
    """The :class:`LapackKernels` of the loaded scipy (built once)."""
    import ctypes

    from numba.extending import get_cython_function_address

    def function(module: str, name: str, count: int) -> Any:
        address = get_cython_function_address(f"scipy.linalg.cython_{module}", name)
        return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * count))(address)

    return LapackKernels(
        function("lapack", "dpotrf", 5), function("blas", "dtrsm", 11),
        function("blas", "dsyrk", 10),
    )  # fmt: skip


@_jit
def cholesky_lapack(A: np.ndarray, potrf: Any) -> int:
    """In place: the symmetric C-ordered ``A`` (n, n) (its lower triangle read) becomes its
    lower Cholesky factor (strict upper triangle zeroed) by LAPACK's ``dpotrf``; returns its
    ``info`` (0, or the 1-based position of the first pivot that is not positive)."""
    n = A.shape[0]
    if n == 0:
        return 0
    chars = np.empty(1, np.uint8)
    chars[0] = ord("U")  # C order's lower triangle is Fortran's upper
    ints = np.empty(2, np.int32)
    ints[0], ints[1] = n, 0
    potrf(chars.ctypes, ints.ctypes, A.ctypes, ints.ctypes, ints[1:].ctypes)
    for i in range(n):
        for j in range(i + 1, n):
            A[i, j] = 0.0
    return int(ints[1])


@_jit
def lower_solve_rows_lapack(L: np.ndarray, B: np.ndarray, trsm: Any) -> None:
    """In place: every row :math:`b_r` of the C-ordered ``B`` (r, n) becomes
    :math:`L^{-1}b_r` (``B`` becomes :math:`(L^{-1}B^\\top)^\\top`) for the C-ordered lower
    triangular ``L`` (n, n), by BLAS ``dtrsm`` (B is Fortran's :math:`B^\\top`, L Fortran's
    upper :math:`L^\\top`, solved transposed)."""
    n, r = L.shape[0], B.shape[0]
    if n == 0 or r == 0:
        return
    chars = np.empty(4, np.uint8)
    chars[0], chars[1], chars[2], chars[3] = ord("L"), ord("U"), ord("T"), ord("N")
    ints = np.empty(2, np.int32)
    ints[0], ints[1] = n, r
    one = np.ones(1)
    trsm(chars.ctypes, chars[1:].ctypes, chars[2:].ctypes, chars[3:].ctypes, ints.ctypes,
         ints[1:].ctypes, one.ctypes, L.ctypes, ints.ctypes, B.ctypes, ints.ctypes)  # fmt: skip


@_jit
def cholesky_lower(A: np.ndarray) -> tuple[np.ndarray, int]:
    """``(L, info)``: the lower Cholesky factor of the symmetric ``A`` (only its lower
    triangle is read) in C order, ``info = 0``; or ``info = j + 1`` for the first pivot ``j``
    that is not positive (``L`` then holds the partial factor)."""
    n = A.shape[0]
    U = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            U[i, j] = A[j, i]
    info = 0
    for j in range(n):
        d = U[j, j]
        if not d > 0.0 or not math.isfinite(d):
            info = j + 1
            break
        d = math.sqrt(d)
        U[j, j] = d
        inv = 1.0 / d
        for c in range(j + 1, n):
            U[j, c] *= inv
        for i in range(j + 1, n):
            f = U[j, i]
            for c in range(i, n):
                U[i, c] -= f * U[j, c]
    return np.ascontiguousarray(U.T), info


@_jit
def lower_solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """:math:`L^{-1}B` for the lower triangular ``L`` (n, n) and ``B`` (n, r): row-wise
    forward substitution (a new array)."""
    n, r = B.shape
    Y = B.copy()
    for i in range(n):
        for j in range(i):
            f = L[i, j]
            for c in range(r):
                Y[i, c] -= f * Y[j, c]
        inv = 1.0 / L[i, i]
        for c in range(r):
            Y[i, c] *= inv
    return Y


@_jit
def _lower_vector(L: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:math:`L^{-1}b` for a vector ``b``."""
    n = b.shape[0]
    y = b.copy()
    for j in range(n):
        y[j] /= L[j, j]
        f = y[j]
        for i in range(j + 1, n):
            y[i] -= f * L[i, j]
    return y


@_jit
def lower_transpose_solve(L: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:math:`L^{-\\top}b` for the lower triangular ``L`` and a vector ``b`` (back
    substitution sweeping the rows of ``L``; a new array)."""
    y = b.copy()
    lower_transpose_solve_inplace(L, y, b.shape[0])
    return y


_jit_rows: Any = njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


@_jit_rows
def dot(a: np.ndarray, b: np.ndarray) -> float:
    """:math:`a^\\top b` of two vectors by a compiled loop (vectorised). numba's ``a @ b``
    calls BLAS ``ddot``: 39 against 4 ns for a row of n = 50."""
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


MATVEC_BLAS = 128 * 128  # entries of M from which matvec calls BLAS


@_jit_rows
def matvec(M: np.ndarray, v: np.ndarray) -> np.ndarray:
    """:math:`Mv` for the C-ordered ``M`` (r, n): dot products on its rows (:func:`dot`), or
    BLAS ``dgemv`` (numba's ``M @ v``) from :data:`MATVEC_BLAS` entries on (below it the call
    costs more than the product: 0.30 against 0.23 us at 50 x 50)."""
    if M.shape[0] * M.shape[1] >= MATVEC_BLAS:
        return M @ v
    out = np.empty(M.shape[0])
    for i in range(M.shape[0]):
        out[i] = dot(M[i], v)
    return out


@_jit_rows
def lower_solve_inplace(L: np.ndarray, b: np.ndarray, k: int) -> None:
    """In place: ``b[:k]`` becomes :math:`L_k^{-1}b_k` for the leading ``k x k`` block of
    the lower triangular ``L`` (dot products on its contiguous rows, vectorised)."""
    for i in range(k):
        s = b[i]
        for j in range(i):
            s -= L[i, j] * b[j]
        b[i] = s / L[i, i]


@_jit_rows
def lower_transpose_solve_inplace(L: np.ndarray, b: np.ndarray, k: int) -> None:
    """In place: ``b[:k]`` becomes :math:`L_k^{-\\top}b_k` for the leading ``k x k`` block of
    the lower triangular ``L`` (``axpy`` on its contiguous rows)."""
    for j in range(k - 1, -1, -1):
        b[j] /= L[j, j]
        f = b[j]
        for i in range(j):
            b[i] -= f * L[j, i]


@_jit
def schur_factor_small(
    P: np.ndarray, C: np.ndarray, shift: float
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
           np.ndarray, int]:  # fmt: skip
    """``(info_P, L, Y, S', inv_scale, nonzero, L_S, pivots, info_S)`` (of :math:`S'` only the
    lower triangle is formed) of ``P`` (n, n)
    positive definite and ``C`` (k, n) (module docstring). ``info_P != 0``: the Cholesky
    factorization of ``P`` failed (the other arrays are then empty). ``info_S != 0``: that of
    :math:`S'` broke down at that 1-based column (its pivots from there on are 0, counted
    dependent)."""
    n = P.shape[0]
    L, info_p = cholesky_lower(P)
    if info_p != 0:
        e = np.zeros(0)
        return (info_p, L, np.zeros((n, 0)), np.zeros((0, 0)), e, np.zeros(0, np.bool_),
                np.zeros((0, 0)), e, 0)  # fmt: skip
    Y = lower_solve(L, np.ascontiguousarray(C.T))
    S, inv_scale, nonzero, LS, pivots, info_s = schur_complement_small(Y, shift)
    return 0, L, Y, S, inv_scale, nonzero, LS, pivots, info_s


@_jit
def schur_complement_small(
    Y: np.ndarray, shift: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(S', inv_scale, nonzero, L_S, pivots, info_S)``: the second half of
    :func:`schur_factor_small` from :math:`Y = L^{-1}C^\\top` (n, k), for a caller that holds
    the factor of ``P`` and :math:`Y` already."""
    n, k = Y.shape
    S = np.zeros((k, k))  # its lower triangle (all that the factorization reads)
    for i in range(n):
        for a in range(k):
            f = Y[i, a]
            for c in range(a + 1):
                S[a, c] += f * Y[i, c]
    scale, inv_scale, nonzero = _shift_diagonal(S, shift)
    LS, info_s = cholesky_lower(S)
    return S, inv_scale, nonzero, LS, _pivots(LS, scale, info_s), info_s


@_jit
def _shift_diagonal(S: np.ndarray, shift: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(scale, inv_scale, nonzero)``: :math:`S_{jj}` (1 on zero rows), its inverse square
    root and which rows are not zero; ``S``'s diagonal becomes :math:`S_{jj}(1 + \\text{shift})`
    (1 on zero rows)."""
    k = S.shape[0]
    nonzero = np.zeros(k, np.bool_)
    scale = np.ones(k)
    inv_scale = np.ones(k)
    for j in range(k):
        d = S[j, j]
        if d > 0.0:
            nonzero[j] = True
            scale[j] = d
            inv_scale[j] = 1.0 / math.sqrt(d)
            S[j, j] = d * (1.0 + shift)
        else:
            S[j, j] = 1.0
    return scale, inv_scale, nonzero


@_jit
def _pivots(LS: np.ndarray, scale: np.ndarray, info: int) -> np.ndarray:
    """The squared pivots :math:`(L_S)_{jj}^2/S_{jj}` (0 from a failed column on)."""
    k = LS.shape[0]
    pivots = np.zeros(k)
    last = k if info == 0 else info - 1
    for j in range(last):
        pivots[j] = LS[j, j] * LS[j, j] / scale[j]
    return pivots


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _gram_rows_lower(Yt: np.ndarray) -> np.ndarray:
    """The lower triangle of :math:`Y^\\top Y` from the rows of ``Yt`` (k, n) (each entry one
    dot product of contiguous rows, vectorised; its summation order is the CPU's)."""
    k, n = Yt.shape
    S = np.zeros((k, k))
    for a in range(k):
        for c in range(a + 1):
            s = 0.0
            for i in range(n):
                s += Yt[a, i] * Yt[c, i]
            S[a, c] = s
    return S


@_jit
def gram_rows_blas(Yt: np.ndarray, syrk: Any) -> np.ndarray:
    """The lower triangle (strict upper zero) of :math:`Y^\\top Y` from the rows of ``Yt``
    (k, n) by BLAS ``dsyrk`` (C-ordered ``Yt`` is Fortran's :math:`Y`, (n, k); Fortran's
    upper triangle of :math:`Y^\\top Y` is C order's lower)."""
    k, n = Yt.shape
    S = np.zeros((k, k))
    if k == 0 or n == 0:
        return S
    chars = np.empty(2, np.uint8)
    chars[0], chars[1] = ord("U"), ord("T")
    ints = np.empty(2, np.int32)
    ints[0], ints[1] = k, n
    one, zero = np.ones(1), np.zeros(1)
    syrk(chars.ctypes, chars[1:].ctypes, ints.ctypes, ints[1:].ctypes, one.ctypes, Yt.ctypes,
         ints[1:].ctypes, zero.ctypes, S.ctypes, ints.ctypes)  # fmt: skip
    return S


BLAS_GRAM = 32 * 32 * 32  # k^2 n above which the Gram matrix is one dsyrk call


@_jit
def gram_rows(Yt: np.ndarray, lapack: Any) -> np.ndarray:
    """The lower triangle of :math:`Y^\\top Y` from the rows of ``Yt`` (k, n): compiled dot
    products, or for :math:`k^2n` above :data:`BLAS_GRAM` one BLAS ``dsyrk`` (the faster of the
    two on either side; ``lapack`` a :class:`LapackKernels`)."""
    k, n = Yt.shape
    return gram_rows_blas(Yt, lapack[2]) if k * k * n > BLAS_GRAM else _gram_rows_lower(Yt)


@_jit
def schur_complement_rows(
    Yt: np.ndarray, shift: float, lapack: Any
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(L_S, pivots, info_S)`` of :func:`schur_complement_small` from :math:`Y^\\top`
    (k, n) (the rows :math:`L^{-1}c_j`), with LAPACK's ``dpotrf`` (and, for a large Gram
    matrix, BLAS ``dsyrk``; ``lapack`` a :class:`LapackKernels`) for :math:`S'`: for a caller
    holding the rows already (the compiled forward's)."""
    S = gram_rows(Yt, lapack)
    scale, _, _ = _shift_diagonal(S, shift)
    info = cholesky_lapack(S, lapack[0])
    return S, _pivots(S, scale, info), info


@_jit
def schur_solve_small(
    L: np.ndarray, Y: np.ndarray, LS: np.ndarray, r1: np.ndarray, r2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(u, w)`` solving :math:`[[P, C^\\top], [C, 0]][u; w] = [r_1; r_2]` with the factors of
    :func:`schur_factor_small` (:math:`S'` for :math:`S`):
    :math:`t = L^{-1}r_1`, :math:`S'w = Y^\\top t - r_2`, :math:`u = L^{-\\top}(t - Yw)`."""
    n, k = Y.shape
    t = _lower_vector(L, r1)
    if k == 0:
        return lower_transpose_solve(L, t), np.zeros(0)
    rhs = -r2.copy()
    for i in range(n):
        f = t[i]
        for a in range(k):
            rhs[a] += f * Y[i, a]
    w = lower_transpose_solve(LS, _lower_vector(LS, rhs))
    for i in range(n):
        s = 0.0
        for a in range(k):
            s += Y[i, a] * w[a]
        t[i] -= s
    return lower_transpose_solve(L, t), w


@_jit_rows
def schur_solve_rows(
    L: np.ndarray, Yt: np.ndarray, LS: np.ndarray, r1: np.ndarray, r2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`schur_solve_small` from :math:`Y^\\top` (k, n) instead of :math:`Y`
    (:func:`schur_solve_indexed` on all of its rows)."""
    return schur_solve_indexed(L, Yt, np.arange(Yt.shape[0]), LS, r1, r2)


@_jit_rows
def schur_solve_indexed(
    L: np.ndarray,
    Y_all: np.ndarray,
    rows: np.ndarray,
    LS: np.ndarray,
    r1: np.ndarray,
    r2: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`schur_solve_rows` with the rows :math:`L^{-1}c_j` read in place from
    ``Y_all[rows]`` (no gathered copy; for thousands of long rows the copy is the cost)."""
    k, n = rows.shape[0], L.shape[0]
    t = r1.copy()
    lower_solve_inplace(L, t, n)
    w = np.empty(k)
    for a in range(k):
        y = Y_all[rows[a]]
        s = -r2[a]
        for i in range(n):
            s += y[i] * t[i]
        for c in range(a):
            s -= LS[a, c] * w[c]
        w[a] = s / LS[a, a]
    lower_transpose_solve_inplace(LS, w, k)
    for a in range(k):
        f = w[a]
        y = Y_all[rows[a]]
        for i in range(n):
            t[i] -= f * y[i]
    lower_transpose_solve_inplace(L, t, n)
    return t, w
