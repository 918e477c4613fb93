"""Compiled two-phase tableau simplex of the batched vertex rule (numba), one sample at a time.

:func:`simplex_batch` solves, for every sample ``s`` with ``work[s]``, the standard-form linear
program

.. math:: \\min_z\\ c_s^\\top z \\quad \\text{s.t.}\\quad M_s z = b_s,\\ z \\ge 0,

by the two-phase tableau simplex (Dantzig, *Linear Programming and Extensions*, 1963): phase 1
minimises the sum of one artificial variable per row (rows with :math:`b_{s,r} < 0` negated
first), the artificials still basic at zero are driven out on any structural column with a
nonzero entry in their row, phase 2 minimises the cost. The entering column is the most
negative reduced cost (Dantzig's rule); a sample that made ``_STALL`` degenerate pivots in a
row switches to Bland's rule (the first improving column; Bland, Math. Oper. Res. 2(2), 1977:
no cycling). The leaving row is the ratio test's minimum, ties (to ``1e-15`` relative) broken
by the smallest basic index.

These are exactly the rules and tolerances of the earlier array version (every pivot applied
to the whole batch as masked numpy operations, one Python iteration per pivot); here each
sample runs its own loop in compiled code, so a batch costs the sum of its pivots, not the
largest pivot count times the Python overhead of a batched pivot. Only the order of the sums
of the phase-2 objective row differs (round-off).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = ["parallel_groups", "simplex_batch"]

_jit: Any = njit(cache=True, nogil=True)

_PIVOT_TOL = 1e-12  # entries and reduced costs below this are zero
_STALL = 8  # degenerate pivots in a row after which a sample pivots by Bland's rule
_RATIO_TIE = 1e-15  # relative: ratios within this of the minimum tie (smallest basic index)
_DRIVE_OUT_TOL = 1e-9  # an artificial's row with no entry above this is redundant
_FEASIBLE_TOL = 1e-9  # relative: phase 1's optimum below this is zero (a feasible program)


@_jit
def _pivot(T: np.ndarray, basis: np.ndarray, leave: int, e: int) -> None:
    """One pivot on ``(leave, e)`` (row, column) of the tableau ``T`` (R + 1, K + R + 1)."""
    rows, cols = T.shape
    pivot = T[leave, e]
    row = np.empty(cols)
    for j in range(cols):
        row[j] = T[leave, j] / pivot
    for i in range(rows):
        if i == leave:
            continue
        f = T[i, e]
        for j in range(cols):
            T[i, j] -= f * row[j]
    for j in range(cols):
        T[leave, j] = row[j]
    basis[leave] = e


@_jit
def _pivots(T: np.ndarray, basis: np.ndarray, K: int, budget: int) -> int:
    """Pivots on the z columns until optimal: 1 solved, 0 budget spent, -1 unbounded (no
    positive entry in the entering column; impossible for a positive cost)."""
    R = basis.shape[0]
    last = T.shape[1] - 1
    stall = 0
    for _ in range(budget):
        bland = stall >= _STALL
        e = -1
        best = np.inf
        for k in range(K):
            r = T[R, k]
            if r < -_PIVOT_TOL:
                if bland:
                    e = k
                    break
                if r < best:
                    best = r
                    e = k
        if e < 0:
            return 1
        t = np.inf
        for i in range(R):
            c = T[i, e]
            if c > _PIVOT_TOL:
                ratio = T[i, last] / c
                if ratio < t:
                    t = ratio
        if t == np.inf:
            return -1
        leave = -1
        low = np.iinfo(np.int64).max
        for i in range(R):
            c = T[i, e]
            if c > _PIVOT_TOL:
                ratio = T[i, last] / c
                if ratio <= t + _RATIO_TIE * (1.0 + abs(t)) and basis[i] < low:
                    low = basis[i]
                    leave = i
        stall = stall + 1 if (t <= _RATIO_TIE or bland) else 0
        _pivot(T, basis, leave, e)
    return 0


@_jit
def _drive_out(T: np.ndarray, basis: np.ndarray, K: int) -> None:
    """Pivot the artificials still basic (at zero) out on the z column of largest magnitude
    in their row; rows without an entry above ``_DRIVE_OUT_TOL`` keep their artificial."""
    R = basis.shape[0]
    for _ in range(R):
        leave = -1
        for i in range(R):
            if basis[i] >= K:
                big = 0.0
                for k in range(K):
                    big = max(big, abs(T[i, k]))
                if big > _DRIVE_OUT_TOL:
                    leave = i
                    break
        if leave < 0:
            return
        e = 0
        big = -1.0
        for k in range(K):
            a = abs(T[leave, k])
            if a > big:
                big = a
                e = k
        _pivot(T, basis, leave, e)


@_jit
def simplex_batch(
    M: np.ndarray, b: np.ndarray, cost: np.ndarray, work: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(z (s, K), solved (s,))``: :math:`\\min c^\\top z` s.t. :math:`Mz = b`, :math:`z \\ge
    0` for each sample with ``work`` (``M`` (s, R, K), zero rows allowed; ``b`` (s, R);
    ``cost`` (s, K) positive); ``solved`` False where the program is infeasible to
    ``_FEASIBLE_TOL``, the pivot budget ran out or the sample is not in ``work`` (z zero)."""
    s, R, K = M.shape
    z = np.zeros((s, K))
    solved = np.zeros(s, dtype=np.bool_)
    budget = 8 * (K + R) + 50
    cols = K + R + 1
    for si in range(s):
        if not work[si]:
            continue
        T = np.zeros((R + 1, cols))
        basis = np.empty(R, dtype=np.int64)
        for r in range(R):
            sign = -1.0 if b[si, r] < 0 else 1.0
            for k in range(K):
                T[r, k] = M[si, r, k] * sign
            T[r, K + r] = 1.0
            T[r, cols - 1] = b[si, r] * sign
            basis[r] = K + r
        for j in range(K):  # phase 1: minimise the sum of the artificials
            acc = 0.0
            for r in range(R):
                acc += T[r, j]
            T[R, j] = -acc
        acc = 0.0
        for r in range(R):
            acc += T[r, cols - 1]
        T[R, cols - 1] = -acc
        if _pivots(T, basis, K, budget) != 1:
            continue
        scale = 1.0
        for r in range(R):
            scale = max(scale, abs(T[r, cols - 1]))
        if not abs(T[R, cols - 1]) <= _FEASIBLE_TOL * scale:
            continue
        _drive_out(T, basis, K)
        for j in range(cols):  # phase 2: the objective row of the cost
            T[R, j] = 0.0
        for k in range(K):
            acc = 0.0
            for r in range(R):
                if basis[r] < K:
                    acc += cost[si, basis[r]] * T[r, k]
            T[R, k] = cost[si, k] - acc
        acc = 0.0
        for r in range(R):
            if basis[r] < K:
                acc += cost[si, basis[r]] * T[r, cols - 1]
        T[R, cols - 1] = -acc
        if _pivots(T, basis, K, budget) != 1:
            continue
        for r in range(R):
            if basis[r] < K:
                z[si, basis[r]] = T[r, cols - 1]
        solved[si] = True
    return z, solved


@_jit
def parallel_groups(gram: np.ndarray, nonzero: np.ndarray) -> np.ndarray:
    r"""Per sample, the number of distinct nonzero unit rows up to sign (duplicated or opposite
    rows count once): the nonzero rows with no earlier nonzero row at
    :math:`1 - |g_{ij}| \le 10^{-12}` in the Gram matrix ``gram`` (s, k, k) of the unit rows
    (its diagonal is not read); ``nonzero`` (s, k). For the batched vertex rule
    (:mod:`dxopt.qp.backward.vertex_batch`): its samples whose only dependencies are
    parallel copies keep the minimum-norm adjoint."""
    s, k = nonzero.shape
    out = np.zeros(s, dtype=np.int64)
    for si in range(s):
        count = 0
        for i in range(k):
            if not nonzero[si, i]:
                continue
            has_earlier = False
            for j in range(i):
                if nonzero[si, j] and 1.0 - abs(gram[si, i, j]) <= 1e-12:
                    has_earlier = True
                    break
            if not has_earlier:
                count += 1
        out[si] = count
    return out
