"""The vertex rule of :func:`dxopt.qp.backward.vertex.vertex_rows` for a batch of small dense
samples at once (decision-focused QPs such as QPTL, where every sample is degenerate).

The rule picks the vertex of the multiplier set :math:`\\Lambda = \\{(z, y): \\hat G_J^\\top z
+ \\hat A^\\top y = r,\\ z \\ge 0\\}` (rows normalised) that minimises the cost
:math:`c^\\top z` of :func:`~dxopt.qp.backward.vertex.vertex_cost`, then completes its support
in row order to a basis of the active rows. Both steps are functions of :math:`\\Lambda` alone,
so any exact method gives the per-sample loop's answer. Everything comes from one batched
Cholesky factor of the Gram matrix of :math:`[\\hat A; \\hat G_J]` (the one that also flags the
dependent rows; the caller's when it has it), whose ``G`` block :math:`W` restricted to the
columns of the independent ``G`` rows gives :math:`\\hat G_J\\Pi = W_c Q` (:math:`\\Pi` the
projector onto the orthogonal complement of :math:`\\operatorname{range}\\hat A^\\top`,
:math:`Q` with orthonormal rows); the rest runs compiled, one sample at a time
(:func:`dxopt.qp.backward.vertex_simplex.vertex_from_factor`):

1. the equality multipliers are eliminated: with :math:`U_\\rho` an orthonormal basis of the
   range of :math:`W_c` (Gram-Schmidt, :func:`~dxopt.qp.backward.vertex_simplex.range_basis`),
   :math:`(z, y) \\in \\Lambda` for some :math:`y` iff :math:`U_\\rho^\\top z = U_\\rho^\\top
   z_0` and :math:`z \\ge 0` (:math:`z_0` the backend's multipliers, which define :math:`r`),
   a standard-form linear program with orthonormal constraint rows;
2. that program is solved by the two-phase tableau simplex (Dantzig, *Linear Programming and
   Extensions*, 1963), Dantzig's pivot rule switching to Bland's (Bland, Math. Oper. Res.
   2(2), 1977: no cycling) after a run of degenerate pivots (the minimiser is unique, so the
   pivot rule does not change it);
3. the support of the optimal vertex is completed in row order: the squared distance of a
   unit row to the span of :math:`\\hat A` and the rows taken before it (the Cholesky pivot of
   the Gram matrix of :math:`[\\hat A; \\hat G_{\\text{support}}; \\hat G_{\\text{rest}}]`;
   below ``DEPENDENT_TOL`` the row is dependent) is the distance of its row of :math:`W_c` to
   the span of theirs, so no second factorization is needed.

Each sample's result is checked (the vertex is feasible to round-off, its support independent
and the kept rows of full rank); a sample that fails a check, or whose simplex does not finish
within its pivot budget, is left to the per-sample loop (``done`` False). Samples whose factor
failed (LAPACK ``info``, round-off) take the thin SVD of :math:`\\hat G_J\\Pi` and a new factor
for the completion (:func:`_vertex_by_svd`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dxopt.qp.backward.degenerate_rule import (
    RuleFactor,
    dependent_flags_dense,
    dependent_flags_factor,
)
from dxopt.qp.backward.rows import compress_rows, gather_rows
from dxopt.qp.backward.vertex_simplex import parallel_groups, simplex_batch, vertex_from_factor
from dxopt.qp.certify.tolerances import RULE_RANK_CUT, VERTEX_FEASIBLE_TOL
from dxopt.qp.problem.canonical import QPProblem

__all__ = ["vertex_cost", "vertex_rows_batched"]

_SQRT2 = 2.0**0.5


def vertex_cost(k: int) -> np.ndarray:
    """The linear cost whose minimising vertex of the multiplier set the vertex rule picks:
    the l1 norm of the normalised inequality multipliers, :math:`c_i = 1 + 10^{-6}(i +
    \\tfrac12\\{\\sqrt2\\, i^2\\})/k` (:math:`\\{\\cdot\\}` the fractional part). The
    tie-break increases with the row index (of two copies the earlier row is kept), and its
    irrational part makes the minimiser unique also where an exchange of several rows balances
    in the index alone: QPTL's two pairs of bound rows ``(7, 8)`` and ``(31, 32)`` on a path
    tied under :math:`1 + 10^{-6} i/k` (``7 - 8 - 31 + 32 = 0``), leaving the choice to the
    simplex path, but not here (``7^2 - 8^2 - 31^2 + 32^2 \\ne 0``)."""
    i = np.arange(k, dtype=np.float64)
    return 1.0 + 1e-6 * (i + 0.5 * np.modf(i * i * _SQRT2)[0]) / max(k, 1)


def vertex_rows_batched(
    problem: QPProblem,
    used: Tensor,
    ineq_duals: Tensor,
    eq_duals: Tensor,
    samples: Tensor,
    *,
    keep_parallel: bool,
    factor: RuleFactor | tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The vertex rule (:func:`~dxopt.qp.backward.vertex.vertex_rows`) of the dense
    ``samples`` (S,) in one batch (module docstring). Returns ``(used, dropped, done,
    left)``: the new mask (S, m) (unchanged off ``done``), the per-sample number of dropped
    rows, ``done`` (S,), the samples settled here (the others go to the per-sample loop), and
    for the samples whose rows changed the number of dependent rows left among the new rows
    (the dependencies among the equality rows alone; -1 elsewhere). ``factor``:
    :func:`~dxopt.qp.backward.degenerate_rule.dependent_flags_factor` of
    :func:`~dxopt.qp.backward.degenerate_rule.stacked_rows` of ``used`` (all S samples) when
    the caller has it (the same rows, normalised the same way), or a
    :class:`~dxopt.qp.backward.degenerate_rule.RuleFactor` of them in another order."""
    S = used.shape[0]
    out, dropped = used.clone(), torch.zeros(S, dtype=torch.int64)
    done = torch.zeros(S, dtype=torch.bool)
    left = torch.full((S,), -1, dtype=torch.int64)
    chosen = torch.nonzero(samples & used.any(-1)).flatten()
    if chosen.numel() == 0 or problem.G is None:
        return out, dropped, done, left
    sub = used[chosen]
    index, valid = compress_rows(sub)
    G = problem.G.to_dense() if problem.G.layout != torch.strided else problem.G
    G = G.to(torch.float64)
    G = G[chosen] if G.ndim == 3 else G
    valid_np = valid.numpy()
    z0 = ineq_duals[chosen].gather(1, index).numpy() * valid_np
    K, n = index.shape[1], G.shape[-1]
    if G.ndim == 2:  # shared rows: their norms once, gathered (the unit rows only if needed)
        norms = np.linalg.norm(G.numpy(), axis=-1)[index.numpy()] * valid_np
    else:
        norms = np.linalg.norm(gather_rows(G, index).numpy() * valid_np[..., None], axis=-1)
    z0 = np.maximum(z0 * norms, 0.0)  # multipliers of the normalised rows
    An = _unit_equality_rows(problem, chosen, n)
    p = An.shape[1]
    perm = np.broadcast_to(np.arange(K), (len(z0), K))  # factor row of each row, G block
    order = factor[4] if factor is not None and len(factor) > 4 else None
    if factor is None:  # equality rows first
        flags_t, L_t, info_t, gram_t = dependent_flags_factor(
            torch.from_numpy(np.concatenate([An, _unit_rows(G, index, valid_np, norms)], 1))
        )
    elif order is None:  # the caller's factor of all samples: these samples, padding cut
        k = p + K
        flags_t, L_t, info_t, gram_t = (
            factor[0][chosen, :k], factor[1][chosen, :k, :k], factor[2][chosen],
            factor[3][chosen, :k, :k],
        )  # fmt: skip
    else:  # the caller's factor in its own row order (RuleFactor.order)
        every = chosen.numel() == S  # (no copies of the factor then)
        flags_t, L_t, info_t, gram_t = (f if every else f[chosen] for f in factor[:4])
        perm = (order if every else order[chosen])[:, :K].numpy()
    nonzero = np.concatenate([np.linalg.norm(An, axis=-1) > 0, norms > 0], 1)
    nonzero_f = nonzero  # in the factor's order
    flags = flags_t.numpy()
    if order is not None:
        rows = np.arange(len(z0))[:, None]
        nonzero_f = np.zeros(flags.shape, dtype=bool)
        nonzero_f[:, :p] = nonzero[:, :p]
        nonzero_f[rows, p + perm] = nonzero[:, p:]
        flags = np.concatenate([flags[:, :p], flags[:, p:][rows, perm]], 1)
    rank = (nonzero & ~flags).sum(-1)
    work = np.asarray(flags.any(-1))  # only dependent samples change
    if keep_parallel:
        work &= rank != parallel_groups(np.ascontiguousarray(gram_t.numpy()), nonzero_f)
    cost = np.where(valid_np, vertex_cost(K)[None, :], 1.0)
    independent = nonzero[:, p:] & ~flags[:, p:]
    failed = info_t.numpy() != 0
    budget = 8 * (K + int(independent.sum(-1).max(initial=0))) + 50
    # 1-3 from the Gram factor (compiled, one sample at a time): the program, its checks and
    # the completion of the support in row order
    _, ok, keep = vertex_from_factor(
        L_t.numpy(), np.ascontiguousarray(perm + p), independent, valid_np, z0, cost,
        work & ~failed, budget,
    )  # fmt: skip
    if (work & failed).any():  # the factor failed (round-off): the SVD and a new factor
        redo = work & failed
        Gn = _unit_rows(G, index, valid_np, norms)
        ok[redo], keep[redo] = _vertex_by_svd(
            Gn[redo], An[redo], z0[redo], cost[redo], valid_np[redo], rank[redo]
        )
    eq_left = flags[:, :p].sum(-1)  # the dependencies among the equality rows alone
    settled = ok | ~work
    gone = torch.from_numpy(valid_np & ~keep & (ok & work)[:, None])
    rows_gone = torch.zeros_like(sub)
    rows_gone.scatter_(1, index, gone)
    out[chosen] = sub & ~rows_gone
    dropped[chosen] = gone.sum(-1)
    done[chosen] = torch.from_numpy(settled)
    left[chosen] = torch.from_numpy(np.where(ok & work, eq_left, -1).astype(np.int64))
    return out, dropped, done, left


def _unit_rows(G: Tensor, index: Tensor, valid: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """The rows ``index`` (s, K) of ``G`` normalised (``norms``: theirs, zero on padding),
    (s, K, n), zero on padding."""
    Gk = gather_rows(G, index).numpy() * valid[..., None]
    return Gk / np.where(norms > 0, norms, 1.0)[..., None]


def _projected_range_svd(Gn: np.ndarray, Ua: np.ndarray) -> np.ndarray:
    r"""``M`` (s, r, K): orthonormal rows spanning the range of :math:`\hat G_J\Pi` by its
    thin SVD (``Ua``: an orthonormal basis of range :math:`\hat A^\top`), zero rows beyond
    each sample's rank (cut relative at ``RULE_RANK_CUT``): for the samples whose Gram factor
    failed (round-off)."""
    B = Gn - (Gn @ Ua) @ np.swapaxes(Ua, -1, -2) if Ua.shape[-1] else Gn
    U, sigma, _ = np.linalg.svd(B, full_matrices=False)  # U (s, K, min(K, n))
    rho = (sigma > RULE_RANK_CUT * np.maximum(sigma.max(-1, keepdims=True), 1e-300)).sum(-1)
    return np.swapaxes(U, 1, 2) * (np.arange(U.shape[2])[None, :] < rho[:, None])[..., None]


def _pad_rows(M: np.ndarray, rows: int) -> np.ndarray:
    """``M`` (s, r, K) with zero rows appended up to ``rows``."""
    if M.shape[1] >= rows:
        return M
    return np.concatenate([M, np.zeros((M.shape[0], rows - M.shape[1], M.shape[2]))], 1)


def _vertex_by_svd(
    Gn: np.ndarray,
    An: np.ndarray,
    z0: np.ndarray,
    cost: np.ndarray,
    valid: np.ndarray,
    rank: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``(ok, keep)`` of :func:`~dxopt.qp.backward.vertex_simplex.vertex_from_factor` for
    samples whose Gram factor failed (round-off): the constraint rows by the thin SVD
    (:func:`_projected_range_svd`) and the completion by a new factor of :math:`[\\hat A;
    \\hat G_{\\text{support}}; \\hat G_{\\text{rest}}]` (``rank``: of :math:`[\\hat A;
    \\hat G_J]`)."""
    M = _projected_range_svd(Gn, _equality_basis(An))
    z, solved = simplex_batch(
        np.ascontiguousarray(M), (M @ z0[..., None])[..., 0], cost, np.ones(len(z0), bool)
    )
    scale = np.maximum(np.abs(z0).max(-1), 1e-300)
    resid = np.linalg.norm((M @ (z - z0)[..., None])[..., 0], axis=-1)
    ok = (
        solved
        & (z.min(-1) >= -VERTEX_FEASIBLE_TOL * scale)
        & (resid <= VERTEX_FEASIBLE_TOL * scale)
    )
    support = (z > 1e-9 * np.maximum(z.max(-1, keepdims=True), 1e-300)) & valid
    order = np.argsort(~support, axis=1, kind="stable")  # support first, each in row order
    Go = np.take_along_axis(Gn, order[..., None], 1)
    flags_o = dependent_flags_dense(torch.from_numpy(np.concatenate([An, Go], 1))).numpy()
    dep = np.zeros_like(support)
    np.put_along_axis(dep, order, flags_o[:, An.shape[1] :], 1)
    keep = valid & ~dep
    ok &= ~(dep & support).any(-1)  # the support of a vertex is independent
    eq_rank = (np.linalg.norm(An, axis=-1) > 0).sum(-1) - flags_o[:, : An.shape[1]].sum(-1)
    ok &= keep.sum(-1) + eq_rank == rank  # the kept rows span the row space
    return ok, keep


def _unit_equality_rows(problem: QPProblem, chosen: Tensor, n: int) -> np.ndarray:
    """The normalised equality rows of the ``chosen`` samples, (s, p, n)."""
    s = int(chosen.numel())
    if problem.A is None or not problem.p:
        return np.zeros((s, 0, n))
    A_t = problem.A.to_dense() if problem.A.layout != torch.strided else problem.A
    A = A_t.to(torch.float64).numpy()
    A = A[chosen.numpy()] if A.ndim == 3 else A
    norms = np.linalg.norm(A, axis=-1)
    An = A / np.where(norms > 0, norms, 1.0)[..., None]
    return An if An.ndim == 3 else np.broadcast_to(An, (s, *An.shape))


def _equality_basis(An: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the span of each sample's rows ``An`` (s, p, n): (s, n, r),
    padded with zero columns (rank cut ``RULE_RANK_CUT``, relative)."""
    if An.shape[1] == 0:
        return np.zeros((An.shape[0], An.shape[2], 0))
    U, sigma, _ = np.linalg.svd(np.swapaxes(An, -1, -2), full_matrices=False)
    big = sigma > RULE_RANK_CUT * np.maximum(sigma.max(-1, keepdims=True), 1e-300)
    return U * big[:, None, :]


def _equality_rows(problem: QPProblem, chosen: Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(An, Ua)``: :func:`_unit_equality_rows` and :func:`_equality_basis` (used by the
    old rule kept as a test reference)."""
    An = _unit_equality_rows(problem, chosen, n)
    return An, _equality_basis(An)
