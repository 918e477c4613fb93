"""The vertex rule's two-phase simplex as it was before it was compiled (numpy, every pivot
applied to the whole batch as masked array operations): the reference that
:func:`dxopt.qp.backward.vertex_simplex.simplex_batch` must reproduce (test_vertex_batch.py)."""

from __future__ import annotations

import numpy as np

_PIVOT_TOL = 1e-12
_STALL = 8


def reference_simplex(
    M: np.ndarray, b: np.ndarray, cost: np.ndarray, work: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``min cost . z`` s.t. ``M z = b``, ``z >= 0`` for each sample with ``work`` (``M``
    (s, R, K), zero rows allowed; ``b`` (s, R, 1)): the two-phase tableau simplex of
    :func:`_pivots`, pivots batched over the unfinished samples. Returns ``(z, solved)``."""
    s, R, K = M.shape
    sign = np.where(b[..., 0] < 0, -1.0, 1.0)
    T = np.zeros((s, R + 1, K + R + 1))
    T[:, :R, :K] = M * sign[..., None]
    T[:, :R, K : K + R] = np.eye(R)[None]
    T[:, :R, -1] = b[..., 0] * sign
    T[:, R, :K] = -T[:, :R, :K].sum(1)  # phase 1: minimise the sum of the artificials
    T[:, R, -1] = -T[:, :R, -1].sum(1)
    basis = np.broadcast_to(K + np.arange(R), (s, R)).copy()
    budget = 8 * (K + R) + 50
    solved = np.zeros(s, dtype=bool)
    active = work.copy()
    _pivots(T, basis, active, K, budget, solved)  # phase 1
    feasible = np.abs(T[:, R, -1]) <= 1e-9 * np.maximum(np.abs(T[:, :R, -1]).max(-1), 1.0)
    active = work & solved & feasible
    _drive_out(T, basis, active, K)
    # phase 2: the objective row for the cost
    cb = np.where(basis < K, np.take_along_axis(cost, np.minimum(basis, K - 1), 1), 0.0)
    T[:, R, :K] = cost - np.einsum("sr,srk->sk", cb, T[:, :R, :K])
    T[:, R, K:-1] = 0.0
    T[:, R, -1] = -np.einsum("sr,sr->s", cb, T[:, :R, -1])
    solved = np.zeros(s, dtype=bool)
    _pivots(T, basis, active, K, budget, solved)
    z = np.zeros((s, K))
    rows = basis < K
    si, ri = np.nonzero(rows)
    z[si, basis[si, ri]] = T[si, ri, -1]
    return z, solved & work & feasible


def _pivots(
    T: np.ndarray, basis: np.ndarray, active: np.ndarray, K: int, budget: int, solved: np.ndarray
) -> None:
    """Pivots on the z columns of the unfinished ``active`` samples until optimal (``solved``
    set) or the ``budget`` of pivots runs out: Dantzig's rule (the most negative reduced cost),
    and for a sample that made ``_STALL`` degenerate pivots in a row Bland's rule from then on
    (the first improving column, the smallest basic index on ratio ties), which cannot cycle."""
    s, R = basis.shape
    rows = np.arange(s)
    active = active.copy()
    stall = np.zeros(s, dtype=np.int64)
    for _ in range(budget):
        reduced = T[:, R, :K]
        improving = (reduced < -_PIVOT_TOL) & active[:, None]
        has = improving.any(-1)
        solved |= active & ~has
        active &= has
        if not active.any():
            return
        bland = stall >= _STALL
        dantzig = np.where(improving, reduced, np.inf).argmin(-1)
        e = np.where(bland, improving.argmax(-1), dantzig)
        col = T[rows, :R, e]
        pos = col > _PIVOT_TOL
        active &= pos.any(-1)  # unbounded: impossible for a positive cost, left unsolved
        ratio = np.where(pos, T[:, :R, -1] / np.where(pos, col, 1.0), np.inf)
        t = ratio.min(-1, keepdims=True)
        ties = ratio <= t + 1e-15 * (1.0 + np.abs(t))
        leave = np.where(ties, basis, np.iinfo(np.int64).max).argmin(-1)  # Bland
        stall = np.where(active & ((t[:, 0] <= 1e-15) | bland), stall + 1, 0)
        _pivot(T, basis, active, leave, e)


def _drive_out(T: np.ndarray, basis: np.ndarray, active: np.ndarray, K: int) -> None:
    """After phase 1, pivot the artificials still basic (at zero) out on any z column with a
    nonzero entry in their row; rows without one are redundant and keep their artificial."""
    R = basis.shape[1]
    for _ in range(R):
        art = (basis >= K) & active[:, None]
        row_max = np.abs(T[:, :R, :K]).max(-1)
        movable = art & (row_max > 1e-9)
        moving = movable.any(-1)
        if not moving.any():
            return
        leave = movable.argmax(-1)
        e = np.abs(T[np.arange(T.shape[0]), leave, :K]).argmax(-1)
        _pivot(T, basis, moving, leave, e)


def _pivot(
    T: np.ndarray, basis: np.ndarray, active: np.ndarray, leave: np.ndarray, e: np.ndarray
) -> None:
    """One pivot on ``(leave, e)`` (row, column) in the tableau of every ``active`` sample,
    as one masked update of the whole batch."""
    rows = np.arange(T.shape[0])
    pivot = np.where(active, T[rows, leave, e], 1.0)
    row = T[rows, leave] / pivot[:, None]
    col = T[rows, :, e] * active[:, None]
    col[rows, leave] = 0.0
    T -= col[:, :, None] * row[:, None, :]
    a = np.flatnonzero(active)
    T[a, leave[a]] = row[a]
    basis[a, leave[a]] = e[a]
