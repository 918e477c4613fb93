"""Batched non-negative least squares for the cone projections of CaVE: one compiled call
solves :math:`\\min_{\\lambda \\ge 0} \\|N_s^\\top \\lambda - a_s\\|_2` for every sample ``s``
and certifies each answer by its KKT conditions.

**Method**: block principal pivoting (Júdice & Pires, "A block principal pivoting algorithm
for large-scale strictly monotone linear complementarity problems", Computers & OR 21(5),
1994; for NNLS: Portugal, Júdice & Vicente, Math. Comp. 63(208), 1994; Kim & Park, SIAM J.
Sci. Comput. 33(6), 2011, algorithm 2). With the passive set :math:`F`, :math:`\\lambda_F`
solves the least-squares problem on the generators :math:`N_F`, :math:`\\lambda_i = 0` off
:math:`F`, and :math:`w = N(a - N^\\top\\lambda)` is the negative gradient. The infeasible set
is :math:`V = \\{i \\in F: \\lambda_i < 0\\} \\cup \\{i \\notin F: w_i > \\tau_i\\}`; all of
:math:`V` is exchanged while :math:`|V|` keeps shrinking (three further tries after it stops),
else only its largest index (Murty's rule, which makes the method finite). The start is
:math:`F = \\{i: n_i^\\top a > 0\\}`, exact when the generators are orthogonal (a box's bound
rows) and a few exchanges from the answer when a few rows are not.

**Least squares on F**: the generators are held sparse (their non-zeros), and those with one
non-zero, :math:`v_i e_{j_i}` (the bound rows of a solution, most of CaVE's normals), are
eliminated: with :math:`J` the coordinates of the passive ones, the residual vanishes on
:math:`J`, the other passive generators :math:`u_g` solve the least-squares problem on the
coordinates outside :math:`J` (Cholesky of their Gram matrix there, one step of iterative
refinement on the residual), and :math:`\\lambda_i = (a - \\sum_g x_g u_g)_{j_i} / v_i`. A
generator that is (numerically) in the span of the passive ones before it, its squared sine
to that span at most :data:`DEPENDENT` (a second unit row on a coordinate of :math:`J`, a
duplicate row), leaves :math:`F` with :math:`\\lambda_i = 0`: the span, hence the residual,
is the same.

**Certificate** (status 0): the last iterate has :math:`\\lambda \\ge 0`,
:math:`w_i \\le \\tau_i` for every generator and :math:`|w_i| \\le \\tau_i` on :math:`F`, with
:math:`\\tau_i =` ``tol`` :math:`\\|n_i\\|\\,\\|a\\|`; with :math:`F` empty the test is
:math:`w_i = n_i^\\top a \\le 0` exactly (``tol`` is not used), so :math:`\\lambda = 0` is
returned exactly when :math:`a` lies in the polar cone. Any other sample reports why it is
not certified (1: ``max_iter`` solves, 2: the stationarity on :math:`F` missed), for the
caller's fallback. Zero rows of ``N`` are padding: not generators, :math:`\\lambda = 0`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from dxopt.linalg.small import dot, lower_solve_inplace, lower_transpose_solve_inplace

__all__ = ["CERTIFIED", "nnls_batch"]

CERTIFIED = 0
MAX_ITER, NOT_STATIONARY = 1, 2
#: a passive generator is dependent when its squared sine to the span before it is below this
DEPENDENT = 1e-10

_jit: Any = njit(cache=True, nogil=True)


@_jit
def _sdot(ptr: np.ndarray, col: np.ndarray, val: np.ndarray, i: int, v: np.ndarray) -> float:
    """The sparse generator ``i`` times the dense ``v``."""
    s = 0.0
    for t in range(ptr[i], ptr[i + 1]):
        s += val[t] * v[col[t]]
    return s


@_jit
def _solve_passive(
    ptr: np.ndarray,
    col: np.ndarray,
    val: np.ndarray,
    unit: np.ndarray,
    passive: np.ndarray,
    a: np.ndarray,
    coef: np.ndarray,
    r: np.ndarray,
    work: np.ndarray,
    in_j: np.ndarray,
) -> None:
    """``coef`` = the least-squares coefficients of ``a`` on the passive generators (0 on
    the others, and on those found dependent, which leave ``passive``), ``r`` = the residual
    (module docstring). ``work`` is a zero ``(d,)`` scratch vector, left zero."""
    k, d = passive.shape[0], a.shape[0]
    in_j[:] = False
    for i in range(k):
        coef[i] = 0.0
        if passive[i] and unit[i] >= 0:
            if in_j[unit[i]]:
                passive[i] = False  # a second unit row on the coordinate: dependent
            else:
                in_j[unit[i]] = True
    gen = np.flatnonzero(passive & (unit < 0))
    ng = gen.shape[0]
    L = np.zeros((ng, ng))
    kept = np.empty(ng, np.int64)
    nk = 0
    for p in range(ng):  # left-looking Cholesky off J, skipping dependent generators
        i = gen[p]
        full, diag = 0.0, 0.0
        for t in range(ptr[i], ptr[i + 1]):
            v = val[t]
            full += v * v
            if not in_j[col[t]]:
                work[col[t]] = v
                diag += v * v
        for q in range(nk):
            L[nk, q] = _sdot(ptr, col, val, kept[q], work)
        for t in range(ptr[i], ptr[i + 1]):
            work[col[t]] = 0.0
        lower_solve_inplace(L, L[nk], nk)
        pivot = diag - dot(L[nk, :nk], L[nk, :nk])
        if pivot > DEPENDENT * full:
            L[nk, nk] = math.sqrt(pivot)
            kept[nk] = i
            nk += 1
        else:
            L[nk, :] = 0.0
            passive[i] = False
    x = np.zeros(nk)
    corr = np.empty(nk)
    for j in range(d):
        r[j] = 0.0 if in_j[j] else a[j]
    for rep in range(2 if nk > 0 else 0):  # the solve, then one step of refinement
        for p in range(nk):
            corr[p] = _sdot(ptr, col, val, kept[p], r)  # r is 0 on J: the dot is off J
        lower_solve_inplace(L, corr, nk)
        lower_transpose_solve_inplace(L, corr, nk)
        for p in range(nk):
            x[p] += corr[p]
        for p in range(nk):  # work = sum_g x_g u_g on every coordinate
            i = kept[p]
            for t in range(ptr[i], ptr[i + 1]):
                work[col[t]] += x[p] * val[t]
        for j in range(d):
            r[j] = 0.0 if in_j[j] else a[j] - work[j]
        if rep == 1:
            for i in range(k):
                if passive[i] and unit[i] >= 0:
                    coef[i] = (a[unit[i]] - work[unit[i]]) / val[ptr[i]]
        work[:] = 0.0
    if nk == 0:
        for i in range(k):
            if passive[i] and unit[i] >= 0:
                coef[i] = a[unit[i]] / val[ptr[i]]
    for p in range(nk):
        coef[kept[p]] = x[p]


@_jit
def _nnls_kernel(
    N: np.ndarray,
    A: np.ndarray,
    tol: float,
    max_iter: int,
    lam: np.ndarray,
    status: np.ndarray,
    iters: np.ndarray,
) -> None:
    B, m, d = N.shape
    rows = np.empty(m, np.int64)
    ptr = np.empty(m + 1, np.int64)
    col = np.empty(m * d, np.int64)
    val = np.empty(m * d)
    unit = np.empty(m, np.int64)
    scale = np.empty(m)
    w = np.empty(m)
    coef = np.empty(m)
    passive = np.zeros(m, np.bool_)
    flip = np.zeros(m, np.bool_)
    r = np.empty(d)
    work = np.zeros(d)
    in_j = np.zeros(d, np.bool_)
    for s in range(B):
        Ns, a = N[s], A[s]
        k, nnz = 0, 0
        for i in range(m):  # the generators' non-zeros (zero rows: padding)
            start = nnz
            for j in range(d):
                if Ns[i, j] != 0.0:
                    col[nnz], val[nnz] = j, Ns[i, j]
                    nnz += 1
            if nnz > start:
                rows[k], ptr[k] = i, start
                k += 1
        ptr[k] = nnz
        anorm = math.sqrt(dot(a, a))
        for i in range(k):
            unit[i] = col[ptr[i]] if ptr[i + 1] - ptr[i] == 1 else -1
            sq = 0.0
            for t in range(ptr[i], ptr[i + 1]):
                sq += val[t] * val[t]
            scale[i] = tol * math.sqrt(sq) * anorm
            passive[i] = _sdot(ptr, col, val, i, a) > 0.0
        ninf, tries, code = k + 1, 3, MAX_ITER
        for it in range(max_iter):
            iters[s] = it + 1
            _solve_passive(ptr[: k + 1], col, val, unit[:k], passive[:k], a, coef, r, work, in_j)
            nf = int(passive[:k].sum())
            for i in range(k):
                w[i] = _sdot(ptr, col, val, i, r)
            # V: passive with a negative coefficient, or active with w above its tolerance
            # (above 0 while F is empty: a is then certified in the polar cone exactly)
            nviol, last = 0, -1
            for i in range(k):
                if passive[i]:
                    flip[i] = coef[i] < 0.0
                else:
                    flip[i] = w[i] > (scale[i] if nf > 0 else 0.0)
                if flip[i]:
                    nviol += 1
                    last = i
            if nviol == 0:
                code = CERTIFIED
                for i in range(k):
                    if passive[i] and abs(w[i]) > scale[i]:
                        code = NOT_STATIONARY
                break
            if nviol < ninf:
                ninf, tries = nviol, 3
            elif tries > 0:
                tries -= 1
            else:  # Murty's rule: the largest index only
                flip[:k] = False
                flip[last] = True
            for i in range(k):
                if flip[i]:
                    passive[i] = not passive[i]
        status[s] = code
        lam[s, :] = 0.0
        if code == CERTIFIED:
            for i in range(k):
                if passive[i]:
                    lam[s, rows[i]] = coef[i]


def nnls_batch(
    N: np.ndarray, A: np.ndarray, *, tol: float = 1e-12, max_iter: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lam, status, iters)``: for each sample of ``N`` (B, m, d) and ``A`` (B, d) (float64)
    the non-negative least-squares coefficients ``lam`` (B, m), ``status`` (B,) (0:
    certified, see the module docstring; ``lam`` is 0 on uncertified samples) and the least
    squares solves it took. ``max_iter`` caps the solves per sample (default ``3 m + 10``)."""
    N = np.ascontiguousarray(N, dtype=np.float64)
    A = np.ascontiguousarray(A, dtype=np.float64)
    B, m = N.shape[0], N.shape[1]
    lam = np.zeros((B, m))
    status = np.zeros(B, np.int64)
    iters = np.zeros(B, np.int64)
    cap = 3 * m + 10 if max_iter is None else int(max_iter)
    _nnls_kernel(N, A, float(tol), cap, lam, status, iters)
    return lam, status, iters
