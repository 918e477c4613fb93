"""The batched vertex rule as it was before issue 30's row-gradient work: the two-phase
simplex in numpy (every pivot applied to the whole batch as masked array operations) and the
equality multipliers eliminated by an SVD. The reference that
:func:`dxopt.qp.backward.vertex_simplex.simplex_batch` and
:func:`dxopt.qp.backward.vertex_batch.vertex_rows_batched` must reproduce
(test_vertex_compiled.py)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.backward.degenerate_rule import dependent_flags_dense
from dxopt.qp.backward.rows import compress_rows, gather_rows
from dxopt.qp.backward.vertex_batch import _equality_rows, vertex_cost
from dxopt.qp.certify.tolerances import RULE_RANK_CUT as _RANK_CUT
from dxopt.qp.certify.tolerances import VERTEX_FEASIBLE_TOL as _FEASIBLE_TOL
from dxopt.qp.problem.canonical import QPProblem

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


def reference_vertex_rows_batched(
    problem: QPProblem,
    used: Tensor,
    ineq_duals: Tensor,
    eq_duals: Tensor,
    samples: Tensor,
    *,
    keep_parallel: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The old batched rule (numpy simplex, SVD elimination of y) of the dense
    ``samples`` (S,) in one batch (module docstring). Returns ``(used, dropped, done)``:
    the new mask (S, m) (unchanged off ``done``), the per-sample number of dropped rows and
    ``done`` (S,), the samples settled here (the others go to the per-sample loop)."""
    S = used.shape[0]
    out, dropped = used.clone(), torch.zeros(S, dtype=torch.int64)
    done = torch.zeros(S, dtype=torch.bool)
    chosen = torch.nonzero(samples & used.any(-1)).flatten()
    if chosen.numel() == 0 or problem.G is None:
        return out, dropped, done
    sub = used[chosen]
    index, valid = compress_rows(sub)
    G = problem.G.to_dense() if problem.G.layout != torch.strided else problem.G
    G = G.to(torch.float64)
    G = G[chosen] if G.ndim == 3 else G
    Gk = gather_rows(G, index).numpy() * valid.numpy()[..., None]  # (s, K, n), zero padding
    z0 = ineq_duals[chosen].gather(1, index).numpy() * valid.numpy()
    _, K, n = Gk.shape
    norms = np.linalg.norm(Gk, axis=-1)
    Gn = Gk / np.where(norms > 0, norms, 1.0)[..., None]
    z0 = np.maximum(z0 * norms, 0.0)  # multipliers of the normalised rows
    An, Ua = _equality_rows(problem, chosen, n)
    C = torch.from_numpy(np.concatenate([An, Gn], 1))  # equality rows first
    flags = dependent_flags_dense(C).numpy()
    nonzero = np.concatenate([np.linalg.norm(An, axis=-1) > 0, norms > 0], 1)
    rank = (nonzero & ~flags).sum(-1)
    work = np.asarray(flags.any(-1))  # only dependent samples change
    if keep_parallel:
        work &= rank != _parallel_groups(C.numpy(), nonzero)
    # 1. eliminate y: the rows projected onto the complement of range A^T
    B = Gn - (Gn @ Ua) @ np.swapaxes(Ua, -1, -2) if Ua.shape[-1] else Gn
    U, sigma, _ = np.linalg.svd(B, full_matrices=False)  # U (s, K, min(K, n))
    rho = (sigma > _RANK_CUT * np.maximum(sigma.max(-1, keepdims=True), 1e-300)).sum(-1)
    M = np.swapaxes(U, 1, 2) * (np.arange(U.shape[2])[None, :] < rho[:, None])[..., None]
    cost = np.where(valid.numpy(), vertex_cost(K)[None, :], 1.0)
    z, solved = reference_simplex(M, M @ z0[..., None], cost, work)
    # 2. checks: a feasible vertex (nonnegative, same constraints as z0)
    scale = np.maximum(np.abs(z0).max(-1), 1e-300)
    resid = np.linalg.norm((M @ (z - z0)[..., None])[..., 0], axis=-1)
    ok = solved & (z.min(-1) >= -_FEASIBLE_TOL * scale) & (resid <= _FEASIBLE_TOL * scale)
    # 3. the support, completed in row order: [A; support rows; other rows] in row order
    support = (z > 1e-9 * np.maximum(z.max(-1, keepdims=True), 1e-300)) & valid.numpy()
    order = np.argsort(~support, axis=1, kind="stable")  # support first, each in row order
    Go = np.take_along_axis(Gn, order[..., None], 1)
    flags_o = dependent_flags_dense(torch.from_numpy(np.concatenate([An, Go], 1))).numpy()
    dep = np.zeros_like(support)
    np.put_along_axis(dep, order, flags_o[:, An.shape[1] :], 1)
    keep = valid.numpy() & ~dep
    ok &= ~(dep & support).any(-1)  # the support of a vertex is independent
    eq_rank = (np.linalg.norm(An, axis=-1) > 0).sum(-1) - flags_o[:, : An.shape[1]].sum(-1)
    ok &= keep.sum(-1) + eq_rank == rank  # the kept rows span the row space
    settled = ok | ~work
    gone = torch.from_numpy(valid.numpy() & ~keep & (ok & work)[:, None])
    rows_gone = torch.zeros_like(sub)
    rows_gone.scatter_(1, index, gone)
    out[chosen] = sub & ~rows_gone
    dropped[chosen] = gone.sum(-1)
    done[chosen] = torch.from_numpy(settled)
    return out, dropped, done


def _parallel_groups(C: np.ndarray, nonzero: np.ndarray) -> np.ndarray:
    """Per sample, the number of distinct nonzero unit rows of ``C`` (s, k, n) up to sign
    (duplicated or opposite rows count once): rows with no earlier parallel row."""
    gram = np.abs(C @ np.swapaxes(C, 1, 2))
    parallel = (1.0 - gram <= 1e-12) & nonzero[:, None, :] & nonzero[:, :, None]
    earlier = np.tril(np.ones(gram.shape[1:], dtype=bool), -1)
    has_earlier = (parallel & earlier[None]).any(-1)
    return (nonzero & ~has_earlier).sum(-1)
