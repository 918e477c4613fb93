"""The vertex rule for dependent active rows (``degenerate="auto"``/``"vertex"``).

With :math:`C = [G_J; A]` dependent, the optimal multipliers form the polyhedron
:math:`\\Lambda = \\{\\lambda: C^\\top\\lambda = -(Px + q),\\ \\lambda_J \\ge 0\\}`; the
rule reduces :math:`J` to the support of one of its vertices, the one minimising
:func:`vertex_cost` (the l1 norm of the normalised multipliers, ties broken by row order), so
the gradient is the derivative of one affine piece of the solution map and depends on
:math:`\\Lambda` only, not on the multipliers a backend returned. Dense problems: all small
samples at once by a batched two-phase simplex (:mod:`dxopt.qp.backward.vertex_batch`); a sample
it does not settle, and the small samples of sparse problems: Carathéodory's reduction of the
backend's multipliers to some vertex, then the primal simplex to the minimising one
(:func:`vertex_rows`); samples too big for a dense null space: the same linear program by
HiGHS (:func:`lp_vertex`). The support is completed in row order to a basis of the
active rows (:func:`complete_basis`), so the rows kept span the same space.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt.linalg.sparse import FactorizationError, kkt_factor
from dxopt.qp.backward.degenerate_rule import RuleFactor
from dxopt.qp.backward.vertex_batch import vertex_cost, vertex_rows_batched
from dxopt.qp.certify.dependence import DEPENDENT_TOL, count_dependent_sparse, sample_matrix
from dxopt.qp.problem.canonical import QPProblem

__all__ = [
    "BASIS_CHUNK",
    "MAX_VERTEX_ENTRIES",
    "complete_basis",
    "lp_vertex",
    "vertex_cost",
    "vertex_rows",
]

MAX_VERTEX_ENTRIES = 1e5  # dense entries of [G_J; A] above which the sparse LP branch (HiGHS) runs


def vertex_rows(
    problem: QPProblem,
    used: Tensor,
    ineq_duals: Tensor,
    eq_duals: Tensor,
    skip: Tensor,
    *,
    keep_parallel: bool = False,
    batched: bool = True,
    counted: bool = False,
    factor: RuleFactor | tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, ...]:
    """Drop dependent active inequality rows until the rest are independent, keeping the
    multipliers feasible: the ``degenerate="vertex"`` policy.

    With :math:`C = [G_J; A]` dependent, the optimal multipliers form the polyhedron
    :math:`\\Lambda = \\{(z_J, y): C^\\top (z_J, y) = -(Px + q),\\ z_J \\ge 0\\}`. Starting
    from the solver's multipliers, each step moves along a null vector :math:`\\nu` of
    :math:`C^\\top` with a positive inequality entry by the ratio test
    :math:`t = \\min_{\\nu_i > 0} z_i/\\nu_i` and drops the row that reaches zero
    (Carathéodory's reduction). The end point is a vertex of :math:`\\Lambda`; from it the
    primal simplex moves to the vertex minimising :func:`vertex_cost` (the l1 norm of the
    normalised multipliers, ties broken by row order), whose support is completed in row
    order to a basis (:func:`_min_cost_vertex`): a function of :math:`\\Lambda` alone, so the
    choice does not depend on the backend's multipliers. Its support
    :math:`B` has independent rows and nonnegative multipliers, so the derivative of the
    QP restricted to :math:`B` (the other rows inactive) is the derivative of one of the
    affine pieces of the solution map at this point, an element of its B-subdifferential
    (Clarke's generalised gradient contains it). The minimum-norm multiplier adjoint
    need not be one: with three active rows :math:`e_1, e_2, e_1 + e_2` it can lie outside
    the hull of the one-sided derivatives.

    Equality rows are never dropped (a dependency among the equality rows alone is left to
    the minimum-norm adjoint). ``keep_parallel=True`` (``degenerate="auto"``) also leaves
    unchanged the samples whose only dependencies are parallel copies of rows (duplicated or
    opposite rows): there the minimum-norm adjoint splits the multiplier adjoint equally
    between the copies, the symmetric element of Clarke's hull, and does not depend on which
    multipliers the backend returned. Samples in ``skip`` are left unchanged; samples too big
    for a dense null space (more than ``MAX_VERTEX_ENTRIES`` entries in :math:`[G_J; A]`) get
    the minimum-l1 multiplier vertex of :func:`lp_vertex` instead. Returns the new ``used``
    mask (S, m) and the per-sample number of dropped rows. ``batched`` (dense problems):
    the samples of the dense branch are first solved together
    (:func:`~dxopt.qp.backward.vertex_batch.vertex_rows_batched`, the same rule), and only
    those it does not settle run through the per-sample loop below. ``counted``: a third
    element, per sample whose rows the batch changed the number of dependent rows left among
    them (-1 where not known: the caller counts them). ``factor``: the caller's
    :func:`~dxopt.qp.backward.degenerate_rule.dependent_flags_factor` of
    :func:`~dxopt.qp.backward.degenerate_rule.stacked_rows` of ``used`` (all samples), or a
    :class:`~dxopt.qp.backward.degenerate_rule.RuleFactor` of those rows in another order,
    reused by the batch instead of factoring again.
    """
    out = used.clone()
    dropped = torch.zeros(used.shape[0], dtype=torch.int64)
    left = torch.full((used.shape[0],), -1, dtype=torch.int64)
    if batched and not problem.any_sparse and problem.G is not None:
        p = problem.p if problem.A is not None else 0
        small = (used.sum(-1) + p) * problem.n <= MAX_VERTEX_ENTRIES
        out, dropped, done, left = vertex_rows_batched(
            problem, used, ineq_duals, eq_duals, ~skip & small, keep_parallel=keep_parallel,
            factor=factor,
        )  # fmt: skip
        skip = skip | done
    for i in torch.nonzero(~skip).flatten().tolist():
        act = torch.nonzero(used[i]).flatten().numpy()
        if act.size == 0:
            continue
        blocks = [sample_matrix(problem, "G", i)[act]]
        has_eq = problem.A is not None and bool(problem.p)
        if has_eq:
            blocks.append(sample_matrix(problem, "A", i))
        rows = sum(b.shape[0] for b in blocks)
        k = act.size
        if rows * blocks[0].shape[1] > MAX_VERTEX_ENTRIES:
            eq = eq_duals[i].numpy() if has_eq else np.zeros(0)
            keep_ineq = lp_vertex(blocks, ineq_duals[i, act].numpy(), eq, keep_parallel)
            if keep_ineq is not None:
                gone = act[~keep_ineq]
                out[i, torch.from_numpy(gone)] = False
                dropped[i] = gone.size
            continue
        C = np.vstack([b.toarray() if sp.issparse(b) else np.asarray(b) for b in blocks])
        norms = np.linalg.norm(C, axis=1)
        Cn = C / np.where(norms > 0, norms, 1.0)[:, None]
        lam = (
            np.concatenate(
                [ineq_duals[i, act].numpy(), eq_duals[i].numpy() if has_eq else np.zeros(0)]
            )
            * norms
        )  # multipliers of the normalised rows
        lam[:k] = np.maximum(lam[:k], 0.0)
        _, sigma, Vt = np.linalg.svd(Cn.T, full_matrices=True)
        rank = int((sigma > 1e-8 * max(float(sigma.max(initial=0.0)), 1e-300)).sum())
        if keep_parallel and rank == _parallel_groups(Cn):
            continue  # only duplicated/opposite rows: the minimum-norm split stays
        keep, independent = _support_basis(Cn, k, lam, rank)
        # a support (positive multipliers, equality rows) that is independent is a vertex
        # already (completed by zero-multiplier rows): Carathéodory's reduction only otherwise
        N = Vt[rank:].T if not independent else np.zeros((C.shape[0], 0))  # null of Cn^T
        if not independent:
            keep = np.ones(C.shape[0], dtype=bool)
        while N.shape[1]:
            ineq = np.abs(N[:k]) * keep[:k, None]
            col = int(np.argmax(ineq.max(0)))
            if ineq[:, col].max() <= 1e-9:
                break  # what is left is a dependency among the equality rows
            nu = N[:, col] * keep
            if not (nu[:k] > 1e-9).any():
                nu = -nu
            pos = np.nonzero((nu[:k] > 1e-9) & keep[:k])[0]
            j = int(pos[np.argmin(lam[pos] / nu[pos])])
            lam = lam - (lam[j] / nu[j]) * nu
            lam[j] = 0.0
            lam[:k] = np.maximum(lam[:k], 0.0)
            keep[j] = False
            # the null space of the kept rows: vectors of N with a zero entry j
            piv = N[j] / N[j, col]
            N = N - np.outer(N[:, col], piv)
            N = np.delete(N, col, axis=1)
            if N.shape[1]:
                q, _ = np.linalg.qr(N)
                N = q
        keep = _min_cost_vertex(Cn, k, lam, keep, rank)
        gone = act[~keep[:k]]
        out[i, torch.from_numpy(gone)] = False
        dropped[i] = gone.size
    return (out, dropped, left) if counted else (out, dropped)


def _min_cost_vertex(
    Cn: np.ndarray, k: int, lam: np.ndarray, keep: np.ndarray, rank: int
) -> np.ndarray:
    """From the vertex ``keep`` (a basis of the rows of the row-normalised ``Cn``, first ``k``
    inequality rows, multipliers ``lam`` >= 0 on them) to the vertex that minimises
    :func:`vertex_cost` over the multiplier set (primal simplex, Bland's rule), then the
    canonical basis of that vertex: its support completed in row order. The result depends on
    the multiplier set only, not on the starting vertex (the backend's multipliers)."""
    cost = np.concatenate([vertex_cost(k), np.zeros(Cn.shape[0] - k)])
    keep, lam = keep.copy(), lam.copy()
    for _ in range(4 * Cn.shape[0] + 20):
        B = np.flatnonzero(keep)
        N = np.flatnonzero(~keep[:k])
        if N.size == 0:
            break
        T = sla.lstsq(Cn[B].T, Cn[N].T, lapack_driver="gelsy", check_finite=False)[
            0
        ]  # c_j = sum_B T_ij c_i
        reduced = cost[N] - cost[B] @ T
        enter = np.flatnonzero(reduced < -1e-12)
        if enter.size == 0:
            break
        e = int(enter[0])  # Bland: the first improving row
        alpha = T[:, e]
        pos = np.flatnonzero((alpha > 1e-12) & np.less(B, k))
        if pos.size == 0:
            break  # (unbounded: impossible for a cost > 0 on the inequality rows)
        ratios = lam[B[pos]] / alpha[pos]
        t = float(ratios.min())
        leave = int(B[pos[ratios <= t + 1e-15 * (1.0 + abs(t))]].min())
        lam[B] -= t * alpha
        lam[N[e]] = t
        lam[leave] = 0.0
        lam[:k] = np.maximum(lam[:k], 0.0)
        keep[leave], keep[N[e]] = False, True
    lam = np.where(keep, lam, 0.0)
    return _support_basis(Cn, k, lam, rank)[0]


def _support_basis(Cn: np.ndarray, k: int, lam: np.ndarray, rank: int) -> tuple[np.ndarray, bool]:
    """The equality rows and the inequality rows with a positive multiplier ``lam``,
    completed in row order by inequality rows until they span the ``rank``-dimensional row
    space of ``Cn``; and whether those support rows are independent modulo the equality rows
    (then the support is a vertex of the multiplier set)."""
    scale = max(float(lam[:k].max(initial=0.0)), 1e-300)
    canon = np.zeros(Cn.shape[0], dtype=bool)
    canon[k:] = True
    q_eq = _orthonormal(Cn[canon])
    canon[:k] = lam[:k] > 1e-9 * scale
    q = _orthonormal(Cn[canon])
    independent = q.shape[1] == q_eq.shape[1] + int(canon[:k].sum())
    for i in range(k):
        if q.shape[1] >= rank:
            break
        if canon[i]:
            continue
        v = Cn[i] - q @ (q.T @ Cn[i])
        v = v - q @ (q.T @ v)
        d = float(v @ v)
        if d > DEPENDENT_TOL:
            canon[i] = True
            q = np.column_stack([q, v / np.sqrt(d)])
    return canon, independent


def _orthonormal(rows: np.ndarray) -> np.ndarray:
    """An orthonormal basis (columns) of the span of ``rows`` (rank cut 1e-8, relative)."""
    if rows.shape[0] == 0:
        return np.zeros((rows.shape[1], 0))
    U, sigma, _ = np.linalg.svd(rows.T, full_matrices=False)
    return U[:, sigma > 1e-8 * max(float(sigma.max(initial=0.0)), 1e-300)]


def lp_vertex(
    blocks: list[Any], z: np.ndarray, y: np.ndarray, keep_parallel: bool
) -> np.ndarray | None:
    """The sparse branch of :func:`vertex_rows` (samples too big for a dense null space):
    a vertex of the multiplier set by linear programming.

    With the rows normalised, :math:`\\hat c_i = c_i/\\|c_i\\|`, the multiplier set is
    :math:`\\{(\\hat z, y): \\hat G_J^\\top \\hat z + A^\\top y = r,\\ \\hat z \\ge 0\\}` with
    :math:`r` the stationarity residual the backend's multipliers give. A basic optimal
    solution of :math:`\\min \\sum_i \\hat z_i` over it (HiGHS dual simplex through
    :func:`scipy.optimize.linprog`) is a vertex, and its support has linearly independent rows:
    the rows outside the support are dropped (the *minimum-l1 multiplier vertex*, a
    deterministic choice that does not depend on the backend's multipliers). ``blocks`` are
    ``[G_J]`` or ``[G_J, A]`` (scipy sparse or dense), ``z``/``y`` the backend's multipliers.
    Returns the mask of kept inequality rows, or ``None`` (leave the sample unchanged: the LP
    failed, its support is not independent to round-off, or with ``keep_parallel`` the only
    dependencies are parallel copies).
    """
    from scipy.optimize import linprog

    Cs = sp.vstack([sp.csr_matrix(b) for b in blocks], format="csr")
    k = blocks[0].shape[0]
    norms = np.sqrt(np.asarray(Cs.multiply(Cs).sum(1)).ravel())
    if not (norms[:k] > 0).all():
        return None
    Cn = sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ Cs
    dependent = count_dependent_sparse(Cn)
    if dependent == 0:
        return None
    if keep_parallel and dependent == Cn.shape[0] - _parallel_groups_sparse(Cn):
        return None
    lam = np.concatenate([np.maximum(z, 0.0), y]) * norms
    r = Cn.T @ lam
    cost = np.concatenate([vertex_cost(k), np.zeros(Cn.shape[0] - k)])
    bounds = [(0.0, None)] * k + [(None, None)] * (Cn.shape[0] - k)
    # HiGHS' presolve declares this feasible-by-construction system infeasible when the rows
    # are dependent (its redundancy test has absolute tolerances); the simplex alone does not
    res = linprog(cost, A_eq=sp.csc_matrix(Cn.T), b_eq=r / max(float(np.abs(lam).max()), 1e-300),
                  bounds=bounds, method="highs-ds", options={"presolve": False})  # fmt: skip
    if res.status != 0 or res.x is None:
        return None
    zv = res.x[:k]
    keep = zv > 1e-9 * max(float(zv.max(initial=0.0)), 1e-300)
    kept = sp.vstack([Cn[:k][keep], Cn[k:]], format="csr")
    if count_dependent_sparse(kept) > 0:
        return None  # not a clean vertex (round-off): keep the minimum-norm adjoint
    # a degenerate vertex (a basic multiplier at 0) has a support of fewer rows than the rank:
    # complete it to a basis with rows of largest multiplier first (each one kept if it is
    # independent of the rows kept so far); the piece with that basis active is adjacent
    # (its multipliers are those of the vertex, >= 0). Only a complete basis spans the row
    # space of C, so that P is positive definite on the null space of the kept rows whenever
    # it is on ker C (an incomplete one can leave x undetermined: Maros-Meszaros STADAT2)
    missing = Cn.shape[0] - dependent - kept.shape[0]
    if missing > 0:
        order = np.flatnonzero(~keep).astype(np.int64)  # row order, as the dense branch
        for j in complete_basis(kept, Cn[:k], order, missing):
            keep[j] = True
    return keep


BASIS_CHUNK = 256  # complete_basis: candidate rows tested per block


def complete_basis(
    kept: sp.csr_matrix, rows: sp.csr_matrix, order: np.ndarray, missing: int
) -> list[int]:
    """Up to ``missing`` rows of ``rows``, taken greedily in ``order``, each linearly
    independent of ``kept`` and of those taken before it (rows normalised to unit norm).

    Per block of ``BASIS_CHUNK`` candidates :math:`R`: the Schur complement
    :math:`S = RR^\\top - RB^\\top (BB^\\top)^{-1} BR^\\top` of the Gram matrix of
    :math:`[B; R]` (:math:`B` the rows kept so far) is the Gram matrix of the candidates
    projected off :math:`\\operatorname{span} B`; a Cholesky of :math:`S` in ``order``
    that skips each candidate whose pivot (its squared distance to the span of ``kept`` and
    of the candidates taken) is below ``DEPENDENT_TOL`` takes exactly the independent ones, by
    the criterion of :func:`count_dependent_sparse`.
    """
    taken: list[int] = []
    base = sp.csr_matrix(kept)
    for start in range(0, order.size, BASIS_CHUNK):
        if missing <= 0:
            break
        idx = order[start : start + BASIS_CHUNK]
        R = sp.csr_matrix(rows[idx])
        S = (R @ R.T).toarray()
        if base.shape[0]:
            BR = (base @ R.T).toarray()
            k_base = base.shape[0]
            try:  # regularised and refined: SuperLU never sees a singular Gram matrix
                gram = kkt_factor(base @ base.T, sp.csr_matrix((0, k_base)))
            except FactorizationError:
                break  # the kept rows are dependent to round-off: no completion
            solved = np.column_stack([gram.solve(BR[:, j]) for j in range(BR.shape[1])])
            S = S - BR.T @ solved
        chosen: list[int] = []
        L = np.zeros((idx.size, idx.size))
        for a in range(idx.size):
            s_ = len(chosen)
            col = S[chosen, a]
            ell = sla.solve_triangular(L[:s_, :s_], col, lower=True) if s_ else col
            pivot = S[a, a] - float(ell @ ell)
            if pivot > DEPENDENT_TOL:
                L[s_, :s_], L[s_, s_] = ell, np.sqrt(pivot)
                chosen.append(a)
                if len(chosen) == missing:
                    break
        taken += [int(j) for j in idx[chosen]]
        missing -= len(chosen)
        if chosen:
            base = sp.vstack([base, R[chosen]], format="csr")
    return taken


def _parallel_groups_sparse(Cn: sp.csr_matrix) -> int:
    """:func:`_parallel_groups` for a sparse row-normalised matrix, without a loop over rows:
    each row, signed so that its largest entry (the first on ties) is positive and rounded to
    9 decimals, is hashed (two sums of mixed (column, value) pairs); rows with equal hashes are
    then compared entry by entry with one row of their group, and only a hash collision (a
    mismatch) falls back to an exact set of row tuples."""
    C = sp.csr_matrix(Cn, copy=True)
    C.eliminate_zeros()
    C.sort_indices()
    k = C.shape[0]
    counts = np.diff(C.indptr)
    row_of = np.repeat(np.arange(k), counts)
    starts = C.indptr[:-1][counts > 0]
    order = np.lexsort((-np.abs(C.data), row_of))  # stable: per row, largest |value| first
    sign = np.ones(k)
    sign[counts > 0] = np.sign(C.data[order[starts]])
    vals = np.round(C.data * sign[row_of], 9) + 0.0  # + 0.0: no negative zeros
    mix = C.indices.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ vals.view(np.uint64)
    h1, h2 = np.zeros(k, dtype=np.uint64), np.zeros(k, dtype=np.uint64)
    if starts.size:  # modular uint64 sums (wrap-around is intended)
        h1[counts > 0] = np.add.reduceat(mix * np.uint64(0xBF58476D1CE4E5B9), starts)
        h2[counts > 0] = np.add.reduceat((mix ^ (mix >> np.uint64(31))) * np.uint64(3), starts)
    by_key = np.lexsort((h2, h1, counts))
    new = np.ones(k, dtype=bool)
    new[1:] = (np.diff(counts[by_key]) != 0) | (np.diff(h1[by_key]) != 0)
    new[1:] |= np.diff(h2[by_key]) != 0
    group = np.empty(k, dtype=np.int64)
    group[by_key] = np.cumsum(new) - 1
    first = by_key[new]  # one row of each group
    rep = first[group][row_of]  # the group's row, per entry
    pos = np.arange(row_of.size)
    rpos = C.indptr[rep] + pos - C.indptr[row_of]
    if bool(((C.indices != C.indices[rpos]) | (vals != vals[rpos])).any()):
        return len(
            {
                (tuple(C.indices[lo:hi].tolist()), tuple(vals[lo:hi].tolist()))
                for lo, hi in zip(C.indptr[:-1], C.indptr[1:])
            }
        )
    return int(first.size)


def _parallel_groups(Cn: np.ndarray) -> int:
    """Number of distinct rows of the row-normalised ``Cn`` up to sign (parallel copies, such
    as a duplicated row or ``a x <= h`` next to ``-a x <= -h``, count once)."""
    lead = np.argmax(np.abs(Cn), axis=1)
    signs = np.sign(Cn[np.arange(Cn.shape[0]), lead])
    canon = np.round(Cn * np.where(signs == 0, 1.0, signs)[:, None], 9) + 0.0
    return int(np.unique(canon, axis=0).shape[0])
