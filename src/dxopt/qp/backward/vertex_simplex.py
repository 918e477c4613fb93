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

from dxopt.qp.certify.tolerances import (
    DEPENDENT_TOL,
    RULE_GRAM_SHIFT,
    SIMPLEX_DRIVE_OUT_TOL,
    SIMPLEX_PIVOT_TOL,
    SIMPLEX_RATIO_TIE,
    SIMPLEX_SUPPORT_TOL,
    VERTEX_FEASIBLE_TOL,
)

__all__ = ["parallel_groups", "range_basis", "simplex_batch", "vertex_from_factor"]

_jit: Any = njit(cache=True, nogil=True)

_STALL = 8  # degenerate pivots in a row after which a sample pivots by Bland's rule


@_jit
def _pivot(T: np.ndarray, basis: np.ndarray, leave: int, e: int, skip: int) -> None:
    """One pivot on ``(leave, e)`` (row, column) of the tableau ``T`` (R + 1, K + R + 1); the
    ``skip`` columns before the last are left as they are (the artificials once phase 1 is
    over: nothing reads them then)."""
    rows, cols = T.shape
    pivot = T[leave, e]
    last = cols - 1 - skip  # columns [last, cols - 1) are skipped
    for j in range(cols):  # the pivot row scaled in place (no scratch row)
        if j < last or j == cols - 1:
            T[leave, j] /= pivot
    for i in range(rows):
        if i == leave:
            continue
        f = T[i, e]
        for j in range(last):
            T[i, j] -= f * T[leave, j]
        T[i, cols - 1] -= f * T[leave, cols - 1]
    basis[leave] = e


@_jit
def _pivots(T: np.ndarray, basis: np.ndarray, K: int, budget: int, skip: int) -> int:
    """Pivots on the z columns until optimal: 1 solved, 0 budget spent, -1 unbounded (no
    positive entry in the entering column; impossible for a positive cost); ``skip``: as
    :func:`_pivot`."""
    R = basis.shape[0]
    last = T.shape[1] - 1
    stall = 0
    for _ in range(budget):
        bland = stall >= _STALL
        e = -1
        best = np.inf
        for k in range(K):
            r = T[R, k]
            if r < -SIMPLEX_PIVOT_TOL:
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
            if c > SIMPLEX_PIVOT_TOL:
                ratio = T[i, last] / c
                if ratio < t:
                    t = ratio
        if t == np.inf:
            return -1
        leave = -1
        low = np.iinfo(np.int64).max
        for i in range(R):
            c = T[i, e]
            if c > SIMPLEX_PIVOT_TOL:
                ratio = T[i, last] / c
                if ratio <= t + SIMPLEX_RATIO_TIE * (1.0 + abs(t)) and basis[i] < low:
                    low = basis[i]
                    leave = i
        stall = stall + 1 if (t <= SIMPLEX_RATIO_TIE or bland) else 0
        _pivot(T, basis, leave, e, skip)
    return 0


@_jit
def _drive_out(T: np.ndarray, basis: np.ndarray, K: int, skip: int) -> None:
    """Pivot the artificials still basic (at zero) out on the z column of largest magnitude
    in their row; rows without an entry above ``SIMPLEX_DRIVE_OUT_TOL`` keep their artificial."""
    R = basis.shape[0]
    for _ in range(R):
        leave = -1
        for i in range(R):
            if basis[i] >= K:
                big = 0.0
                for k in range(K):
                    big = max(big, abs(T[i, k]))
                if big > SIMPLEX_DRIVE_OUT_TOL:
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
        _pivot(T, basis, leave, e, skip)


@_jit
def _simplex_one(
    M: np.ndarray, b: np.ndarray, cost: np.ndarray, budget: int, z: np.ndarray
) -> bool:
    """One sample of :func:`simplex_batch`: ``M`` (R, K), ``b`` (R,), ``cost`` (K,); the
    minimiser is written into ``z`` (K,, zero on entry). Returns whether it was solved."""
    R, K = M.shape
    cols = K + R + 1
    T = np.zeros((R + 1, cols))
    basis = np.empty(R, dtype=np.int64)
    for r in range(R):
        sign = -1.0 if b[r] < 0 else 1.0
        for k in range(K):
            T[r, k] = M[r, k] * sign
        T[r, K + r] = 1.0
        T[r, cols - 1] = b[r] * sign
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
    if _pivots(T, basis, K, budget, 0) != 1:
        return False
    scale = 1.0
    for r in range(R):
        scale = max(scale, abs(T[r, cols - 1]))
    if not abs(T[R, cols - 1]) <= VERTEX_FEASIBLE_TOL * scale:
        return False
    _drive_out(T, basis, K, R)  # from here on the artificial columns are not updated
    for j in range(cols):  # phase 2: the objective row of the cost
        T[R, j] = 0.0
    for k in range(K):
        acc = 0.0
        for r in range(R):
            if basis[r] < K:
                acc += cost[basis[r]] * T[r, k]
        T[R, k] = cost[k] - acc
    acc = 0.0
    for r in range(R):
        if basis[r] < K:
            acc += cost[basis[r]] * T[r, cols - 1]
    T[R, cols - 1] = -acc
    if _pivots(T, basis, K, budget, R) != 1:
        return False
    for r in range(R):
        if basis[r] < K:
            z[basis[r]] = T[r, cols - 1]
    return True


@_jit
def simplex_batch(
    M: np.ndarray, b: np.ndarray, cost: np.ndarray, work: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(z (s, K), solved (s,))``: :math:`\\min c^\\top z` s.t. :math:`Mz = b`, :math:`z \\ge
    0` for each sample with ``work`` (``M`` (s, R, K), zero rows allowed; ``b`` (s, R);
    ``cost`` (s, K) positive); ``solved`` False where the program is infeasible to
    ``VERTEX_FEASIBLE_TOL``, the pivot budget ran out or the sample is not in ``work`` (z zero)."""
    s, R, K = M.shape
    z = np.zeros((s, K))
    solved = np.zeros(s, dtype=np.bool_)
    budget = 8 * (K + R) + 50
    for si in range(s):
        if work[si]:
            solved[si] = _simplex_one(M[si], b[si], cost[si], budget, z[si])
    return z, solved


@_jit
def _orthogonalise(v: np.ndarray, basis: np.ndarray, count: int) -> float:
    """``v`` minus its part in the span of the first ``count`` orthonormal rows of ``basis``
    (twice: Gram-Schmidt with reorthogonalisation), in place; returns its squared norm."""
    for _ in range(2):
        for j in range(count):
            d = 0.0
            for c in range(v.shape[0]):
                d += basis[j, c] * v[c]
            for c in range(v.shape[0]):
                v[c] -= d * basis[j, c]
    d = 0.0
    for c in range(v.shape[0]):
        d += v[c] * v[c]
    return d


@_jit
def range_basis(
    W: np.ndarray, independent: np.ndarray, perm: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    r"""``(W_c (K, rho), M (rho, K))``: the ``independent`` columns (K,) of ``W[perm][:,
    perm]`` (``W`` (k, k), ``perm`` (K,) positions in it; read in place) and an
    orthonormal basis of their range as rows (Gram-Schmidt, twice; the columns are
    independent: ``W`` is a block of a Cholesky factor and the pivot of each such column is
    above ``DEPENDENT_TOL``). With ``W`` the ``G`` block of the factor of the unit Gram
    matrix of :math:`[\hat A; \hat G_J]`, ``M`` spans the range of :math:`\hat G_J\Pi`
    (:mod:`dxopt.qp.backward.vertex_batch`)."""
    K = perm.shape[0]
    rho = 0
    for k in range(K):
        if independent[k]:
            rho += 1
    Wc = np.empty((K, rho))
    c = 0
    for k in range(K):
        if independent[k]:
            for i in range(K):
                Wc[i, c] = W[perm[i], perm[k]]
            c += 1
    M = np.zeros((rho, K))
    v = np.empty(K)
    for c in range(rho):
        for i in range(K):
            v[i] = Wc[i, c]
        d = _orthogonalise(v, M, c)
        scale = 1.0 / np.sqrt(d) if d > 0.0 else 1.0
        for i in range(K):
            M[c, i] = v[i] * scale
    return Wc, M


@_jit
def vertex_from_factor(
    W: np.ndarray,
    perm: np.ndarray,
    independent: np.ndarray,
    valid: np.ndarray,
    z0: np.ndarray,
    cost: np.ndarray,
    work: np.ndarray,
    budget: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""``(z (s, K), ok (s,), keep (s, K))``: the batched vertex rule's linear program, checks
    and completion (:mod:`dxopt.qp.backward.vertex_batch`, steps 1-3) for each sample with
    ``work``, from the Cholesky factor ``W`` (s, k, k) of the unit Gram matrix of
    :math:`[\hat A; \hat G_J]` (its ``G`` block is read), ``perm`` (s, K) the position in it
    of each ``G`` row in row order (the factor's rows may come in another order: a symmetric
    permutation of a factor serves as well, see
    :class:`~dxopt.qp.backward.degenerate_rule.RuleFactor`) and the ``independent`` rows
    (s, K, row order).

    With :math:`W_c` those columns, :math:`\hat G_J\Pi = W_c Q` (:math:`Q` orthonormal
    rows), so (1) the constraint rows of the program are an orthonormal basis of the range of
    :math:`W_c` (Gram-Schmidt, twice, on its columns: independent by the triangular structure),
    the program :math:`\min c^\top z`, :math:`Mz = Mz_0`, :math:`z \ge 0` solved by
    :func:`_simplex_one`; (2) the vertex must be feasible to ``VERTEX_FEASIBLE_TOL`` (relative to
    :math:`\|z_0\|_\infty`); (3) the squared distance of unit row :math:`\hat g_k` to the
    span of :math:`\hat A` and rows taken before it is the squared distance of row ``k`` of
    :math:`W_c` to the span of those rows of :math:`W_c`: the rows are taken greedily,
    support first then the others, each in row order, where that distance (plus the factor's
    shift ``RULE_GRAM_SHIFT``) is at least ``DEPENDENT_TOL`` (the pivots of the Gram factor of
    the completion, without refactoring). ``ok``: solved, feasible, the support independent
    and the kept rows of full rank; ``keep`` is meaningful where ``ok``."""
    s, K = valid.shape
    z = np.zeros((s, K))
    ok = np.zeros(s, dtype=np.bool_)
    keep = np.zeros((s, K), dtype=np.bool_)
    for si in range(s):
        if not work[si]:
            continue
        Wc, M = range_basis(W[si], independent[si], perm[si])  # 1. the program's constraint rows
        rho = M.shape[0]
        b = np.zeros(rho)
        for r in range(rho):
            for k in range(K):
                b[r] += M[r, k] * z0[si, k]
        zs = z[si]
        if not _simplex_one(M, b, cost[si], budget, zs):
            continue
        scale = 1e-300  # 2. a feasible vertex
        for k in range(K):
            scale = max(scale, abs(z0[si, k]))
        feasible = True
        resid = 0.0
        for r in range(rho):
            acc = 0.0
            for k in range(K):
                acc += M[r, k] * (zs[k] - z0[si, k])
            resid += acc * acc
        for k in range(K):
            if zs[k] < -VERTEX_FEASIBLE_TOL * scale:
                feasible = False
        if not feasible or np.sqrt(resid) > VERTEX_FEASIBLE_TOL * scale:
            continue
        top = 1e-300
        for k in range(K):
            top = max(top, zs[k])
        basis = np.zeros((max(rho, 1), rho))  # 3. support first, then the rest, row order
        v = np.empty(rho)
        taken = 0
        good = True
        for support_pass in (True, False):
            for k in range(K):
                if not valid[si, k] or (zs[k] > SIMPLEX_SUPPORT_TOL * top) != support_pass:
                    continue
                d = 0.0
                if taken < rho:
                    for c in range(rho):
                        v[c] = Wc[k, c]
                    d = _orthogonalise(v, basis, taken)
                if taken >= rho or d + RULE_GRAM_SHIFT < DEPENDENT_TOL:
                    good = good and not support_pass  # a dependent support: no vertex
                    continue
                scale = 1.0 / np.sqrt(d)
                for c in range(rho):
                    basis[taken, c] = v[c] * scale
                taken += 1
                keep[si, k] = True
        ok[si] = good and taken == rho
    return z, ok, keep


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
