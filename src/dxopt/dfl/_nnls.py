"""Batched non-negative least squares for the cone projections of CaVE: one compiled call
solves :math:`\\min_{\\lambda \\ge 0} \\|N_s^\\top \\lambda - a_s\\|_2` for every sample ``s``
and certifies each answer by its KKT conditions.

**Method**: block principal pivoting (Júdice & Pires, "A block principal pivoting algorithm
for large-scale strictly monotone linear complementarity problems", Computers & OR 21(5),
1994; for NNLS: Portugal, Júdice & Vicente, Math. Comp. 63(208), 1994; Kim & Park, SIAM J.
Sci. Comput. 33(6), 2011, algorithm 2). With the passive set :math:`F`, :math:`\\lambda_F`
solves the least-squares problem on the generators :math:`N_F` (Cholesky of the Gram matrix
:math:`N_F N_F^\\top`, one step of iterative refinement on the residual), :math:`\\lambda_i = 0`
off :math:`F`, and :math:`w = N(a - N^\\top\\lambda)` is the negative gradient. The infeasible
set is :math:`V = \\{i \\in F: \\lambda_i < 0\\} \\cup \\{i \\notin F: w_i > \\tau_i\\}`; all
of :math:`V` is exchanged while :math:`|V|` keeps shrinking (three further tries after it
stops), else only its largest index (Murty's rule, which makes the method finite). The start
is :math:`F = \\{i: n_i^\\top a > 0\\}`, exact when the generators are orthogonal (a
box's bound rows) and a few exchanges from the answer when a few rows are not.

**Certificate** (status 0): the last iterate has :math:`\\lambda \\ge 0`,
:math:`w_i \\le \\tau_i` for every generator and :math:`|w_i| \\le \\tau_i` on :math:`F`, with
:math:`\\tau_i =` ``tol`` :math:`\\|n_i\\|\\,\\|a\\|`; with :math:`F` empty the test is
:math:`w_i = n_i^\\top a \\le 0` exactly (``tol`` is not used), so :math:`\\lambda = 0` is
returned exactly when :math:`a` lies in the polar cone. Any other sample reports why it is
not certified (1: ``max_iter`` exchanges, 2: the Gram matrix of :math:`F` not positive
definite, dependent generators, 3: the stationarity on :math:`F` missed), for the caller's
fallback. Zero rows of ``N`` are padding: they are not generators and get :math:`\\lambda = 0`.
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
def _solve_passive(
    Ns: np.ndarray,
    a: np.ndarray,
    rows: np.ndarray,
    passive: np.ndarray,
    x: np.ndarray,
    r: np.ndarray,
    dependent: float,
) -> None:
    """``x[:nf]`` = the least-squares coefficients of ``a`` on the passive generators
    ``Ns[rows[i]]`` (``passive[i]``, in order) and ``r`` = the residual. A generator whose
    Cholesky pivot is at most ``dependent`` times its squared norm (it lies in the span of
    the passive ones before it, up to that squared sine) leaves the passive set."""
    d = a.shape[0]
    f = np.flatnonzero(passive)
    nf = f.shape[0]
    L = np.zeros((nf, nf))
    kept = np.empty(nf, np.int64)
    nk = 0
    for p in range(nf):  # left-looking Cholesky of the Gram matrix, skipping dependent rows
        u = Ns[rows[f[p]]]
        for q in range(nk):
            L[nk, q] = dot(u, Ns[rows[kept[q]]])
        lower_solve_inplace(L, L[nk], nk)
        diag = dot(u, u)
        pivot = diag - dot(L[nk, :nk], L[nk, :nk])
        if pivot > dependent * diag:
            L[nk, nk] = math.sqrt(pivot)
            kept[nk] = f[p]
            nk += 1
        else:
            L[nk, :] = 0.0
            passive[f[p]] = False
    r[:] = a
    corr = np.empty(nk)
    x[:nk] = 0.0
    for _ in range(2):  # the solve, then one step of iterative refinement
        for p in range(nk):
            corr[p] = dot(Ns[rows[kept[p]]], r)
        lower_solve_inplace(L, corr, nk)
        lower_transpose_solve_inplace(L, corr, nk)
        for p in range(nk):
            x[p] += corr[p]
        r[:] = a
        for p in range(nk):
            u, xp = Ns[rows[kept[p]]], x[p]
            for j in range(d):
                r[j] -= xp * u[j]


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
    scale = np.empty(m)
    w = np.empty(m)
    passive = np.zeros(m, np.bool_)
    flip = np.zeros(m, np.bool_)
    x = np.empty(m)
    r = np.empty(d)
    for s in range(B):
        Ns, a = N[s], A[s]
        k = 0
        for i in range(m):
            if np.any(Ns[i] != 0.0):
                rows[k] = i
                k += 1
        anorm = math.sqrt(dot(a, a))
        for i in range(k):
            u = Ns[rows[i]]
            scale[i] = tol * math.sqrt(dot(u, u)) * anorm
            w[i] = dot(u, a)
            passive[i] = w[i] > 0.0
        ninf, tries, code = k + 1, 3, MAX_ITER
        for it in range(max_iter):
            iters[s] = it + 1
            _solve_passive(Ns, a, rows, passive[:k], x, r, DEPENDENT)
            nf = int(passive[:k].sum())
            for i in range(k):
                w[i] = dot(Ns[rows[i]], r)
            # V: passive with a negative coefficient, or active with w above its tolerance
            # (above 0 while F is empty: a is then certified in the polar cone exactly)
            nviol, last, p = 0, -1, 0
            for i in range(k):
                if passive[i]:
                    flip[i] = x[p] < 0.0
                    p += 1
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
            p = 0
            for i in range(k):
                if passive[i]:
                    lam[s, rows[i]] = x[p]
                    p += 1


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
