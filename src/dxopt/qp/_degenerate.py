"""Degenerate active sets (LICQ fails): detection and the minimum-norm multiplier adjoint.

With the stacked active rows :math:`C = [G_J; A]` linearly dependent, the reduced KKT matrix
:math:`K = [[P, C^\\top], [C, 0]]` is singular. If :math:`P` is positive definite on
:math:`\\ker C`, the primal part :math:`u` of the adjoint is still unique (so
:math:`\\partial L/\\partial q = -u` and :math:`\\partial L/\\partial P` are exact), but the
multiplier part :math:`w` is defined only up to :math:`\\ker C^\\top`. Both backward methods
then return the same documented choice, the **minimum-norm multiplier adjoint**

.. math:: w^\\star = \\arg\\min \\{\\|w\\|_2 : K[u; w] = [\\bar x; \\bar\\nu_J; \\bar\\mu]\\},

so the gradients for :math:`b, h` (:math:`w^\\star` itself) and the :math:`w`-part of those for
:math:`A, G` are the minimum-norm elements. It is computed with the quasi-definite
regularisation :math:`K_\\delta = [[P, C^\\top], [C, -\\delta I]]` (a proximal
method-of-multipliers step) and iterative refinement against the exact :math:`K` from
:math:`z_0 = 0`: every update :math:`\\Delta w = (C\\Delta u - r_2)/\\delta` lies in
:math:`\\operatorname{range} C`, so the limit is the solution with :math:`w \\perp \\ker C^\\top`.
Dense samples are finally projected onto :math:`\\operatorname{range} C` (SVD) to remove
round-off in :math:`\\ker C^\\top`. The refinement contracts a multiplier mode of singular
value :math:`\\sigma` of :math:`C` by about :math:`\\delta p/(\\sigma^2 + \\delta p)` per step
(:math:`p` the curvature of :math:`P` along it), so it stalls where :math:`C` has singular values
far below its largest row norm (rows of very different norms; a long chain of difference rows,
as on Maros-Meszaros STADAT2/3); :math:`\\delta` then steps down the ladder
``_DELTA_LADDER`` (:math:`10^{-8}, 10^{-11}, 10^{-13}` times
:math:`\\max_i\\|c_i\\|^2/\\bar P_{ii}`), each rung refining the previous point, whose
multiplier part stays in :math:`\\operatorname{range} C`, so the limit is unchanged. The
multiplier cotangents must lie in :math:`\\operatorname{range} C` (the multipliers themselves
are not unique otherwise); if the refined residual stays large the caller raises
:class:`~dxopt.qp.QPBackwardError`.

Caveat: on duplicated rows :math:`w^\\star` splits the adjoint equally (a convex combination
of the one-sided derivatives), but for general dependent rows it need not be an element of
Clarke's generalised gradient (e.g. active rows :math:`e_1, e_2, e_1 + e_2`; see
``tests/qp/test_degenerate_vertex.py``). ``degenerate="vertex"`` (:func:`vertex_rows`) returns
the derivative of one affine piece instead.

Detection: the Cholesky pivots of the row-normalised Gram matrix :math:`\\hat C\\hat C^\\top`
are the squared distances of each row to the span of the previous ones; a pivot below
``DEPENDENT_TOL`` marks a dependent row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from dxopt.linalg.sparse import FactorizationError, UnitRows, kkt_factor, splu, unit_rows
from dxopt.qp._problem import QPProblem
from dxopt.qp._types import BackwardDiagnostics, QPBackwardError

__all__ = [
    "DEPENDENT_TOL",
    "complete_basis",
    "count_dependent_dense",
    "count_dependent_sparse",
    "dependent_weak_rows",
    "lp_vertex",
    "min_norm_dense",
    "min_norm_sparse",
    "record_degenerate",
    "refine_schur",
    "vertex_rows",
]

DEPENDENT_TOL = 1e-10
_RELATIVE_DELTA = 1e-8
#: the relative regularisations tried in turn while the refinement stalls (module docstring)
_DELTA_LADDER = (_RELATIVE_DELTA, 1e-11, 1e-13)
_STALL_FLOOR = 1e-12  # relative residual below which a stalled refinement is at round-off
_MAX_STEPS = 60
_TOL = 1e-14
_DENSE_GRAM = 300  # sparse C with more rows: SuperLU of the Gram matrix


def count_dependent_dense(C: Tensor) -> Tensor:
    """Per-sample number of rows of ``C`` (S, k, n) dependent on earlier ones (zero rows, used
    as padding, are not counted)."""
    S, k, _ = C.shape
    if k == 0:
        return torch.zeros(S, dtype=torch.int64)
    norms = torch.linalg.vector_norm(C, dim=-1)
    nonzero = norms > 0
    Cn = C / norms.clamp_min(torch.finfo(C.dtype).tiny)[..., None]
    gram = torch.bmm(Cn, Cn.mT)
    gram.diagonal(dim1=-2, dim2=-1).add_((~nonzero).to(C.dtype) + 1e-14)
    L, info = torch.linalg.cholesky_ex(gram)
    pivots = L.diagonal(dim1=-2, dim2=-1).pow(2)
    count = ((pivots < DEPENDENT_TOL) & nonzero).sum(-1)
    failed = info != 0
    if bool(failed.any()):  # fall back to the SVD rank
        rank = torch.linalg.matrix_rank(Cn[failed], rtol=1e-8)
        count[failed] = nonzero[failed].sum(-1) - rank
    return count


def count_dependent_sparse(C: sp.csr_matrix, split: UnitRows | None = None) -> int:
    """Number of rows of the scipy matrix ``C`` dependent on earlier ones (zero rows are not
    counted).

    The pivots are those of the row-normalised Gram matrix with the distinct unit rows first
    (the order does not change the count of an exactly dependent set; SuperLU's ordering
    permutes it anyway): a unit row's pivot is 1, and the pivots of the other rows are those of
    the Gram matrix of their normalised rows restricted to the columns no unit row covers
    (the unit rows span exactly their columns; :mod:`dxopt.linalg.sparse`). So only that
    restriction is factored; ``split`` is :func:`~dxopt.linalg.sparse.unit_rows` of ``C``
    when the caller has it.
    """
    C = sp.csr_matrix(C)
    if C.shape[0] == 0:
        return 0
    s = unit_rows(C) if split is None else split
    if s.other.size == 0:
        return 0
    norms = s.norms[s.other]
    nonzero = norms > 0
    R = s.R.copy()
    R.data /= np.repeat(np.where(nonzero, norms, 1.0), np.diff(R.indptr))
    return _count_gram(R, nonzero)


def _count_gram(Cn: sp.csr_matrix, nonzero: np.ndarray) -> int:
    """Rows of the (already normalised, possibly restricted) ``Cn`` whose Gram pivot, the
    squared distance to the span of the rows before them, is below ``DEPENDENT_TOL``."""
    k = Cn.shape[0]
    shift = np.where(nonzero, 1e-14, 1.0)
    if k <= _DENSE_GRAM:
        gram = (Cn @ Cn.T).toarray()
        gram[np.diag_indices(k)] += shift
        try:
            pivots = np.diag(np.linalg.cholesky(gram)) ** 2
        except np.linalg.LinAlgError:
            rank = int(np.linalg.matrix_rank(Cn.toarray(), rtol=1e-8)) if Cn.shape[1] else 0
            return int(nonzero.sum()) - rank
    else:
        # symmetric mode with diagonal pivots: the pivots are those of the Cholesky factor
        lu = spla.splu(
            (Cn @ Cn.T).tocsc() + sp.diags(shift, format="csc"),
            permc_spec="COLAMD",  # MMD orderings take seconds on arrow-shaped Grams (1ᵀx = b rows)
            diag_pivot_thresh=0.0,
            options={"SymmetricMode": True},
        )
        pivots = np.abs(lu.U.diagonal())
    return int(((pivots < DEPENDENT_TOL) & nonzero).sum())


def refine_schur(
    P: Tensor,
    C: Tensor,
    D: Tensor,
    L: Tensor,
    grad_x: Tensor,
    rhs2: Tensor,
    ok: Tensor,
    max_steps: int,
    tol: float,
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Solve :math:`[[P, C^\\top], [C, 0]][u; w] = [\\bar x; r]` by refinement with the
    preconditioner :math:`[[P, C^\\top], [C, -D^{-1}]]`, applied through the Cholesky factor
    ``L`` of :math:`P + C^\\top DC`. Returns ``(u, w, relative residual, steps)``."""
    Ct = C.transpose(-1, -2)
    PCt = torch.cat([P, Ct], -1)  # one product gives the change of r1 = xbar - Pu - C'w
    u = torch.zeros_like(grad_x)
    w = torch.zeros_like(rhs2)
    r1, r2 = grad_x, rhs2
    norm = (grad_x.pow(2).sum(-1) + rhs2.pow(2).sum(-1)).sqrt().clamp_min(1e-300)
    steps, best = 0, float("inf")
    while True:
        t = r1 + torch.bmm(Ct, (D * r2).unsqueeze(-1)).squeeze(-1)
        du = torch.cholesky_solve(t.unsqueeze(-1), L).squeeze(-1)
        Cdu = torch.bmm(C, du.unsqueeze(-1)).squeeze(-1)
        dw = D * (Cdu - r2)
        u, w = u + du, w + dw
        r1 = r1 - torch.bmm(PCt, torch.cat([du, dw], -1).unsqueeze(-1)).squeeze(-1)
        r2 = r2 - Cdu
        rel = (r1.pow(2).sum(-1) + r2.pow(2).sum(-1)).sqrt() / norm
        rel = torch.where(ok, rel, torch.zeros_like(rel))
        worst = float(rel.max()) if rel.numel() else 0.0
        # stop at the tolerance, at the step limit, or once round-off stalls the refinement
        if steps >= max_steps or worst <= tol or (worst > 0.5 * best and worst < 1e-12):
            return u, w, rel, steps
        best = min(best, worst)
        steps += 1


def min_norm_dense(
    P: Tensor, C: Tensor, grad_x: Tensor, rhs2: Tensor
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Minimum-norm multiplier adjoint of dense samples (module docstring): ``P`` (s, n, n),
    ``C`` (s, k, n) (zero rows allowed), cotangents (s, n) and (s, k). The regularisation
    follows the ladder ``_DELTA_LADDER`` while the refinement stalls above round-off."""
    s = grad_x.shape[0]
    c_P = P.diagonal(dim1=-2, dim2=-1).abs().mean(-1)
    c_P = torch.where(c_P > 0, c_P, torch.ones_like(c_P))
    row_sq = C.pow(2).sum(-1).amax(-1).clamp_min(torch.finfo(C.dtype).tiny)
    ok = torch.ones(s, dtype=torch.bool)
    u, w = torch.zeros_like(grad_x), torch.zeros_like(rhs2)
    r1, r2 = grad_x, rhs2
    rel = torch.full((s,), torch.inf, dtype=grad_x.dtype)
    norm = (grad_x.pow(2).sum(-1) + rhs2.pow(2).sum(-1)).sqrt().clamp_min(1e-300)
    steps = 0
    for rung, relative_delta in enumerate(_DELTA_LADDER):
        D = (c_P / (relative_delta * row_sq))[:, None].expand(s, C.shape[1]).contiguous()
        H = torch.baddbmm(P, C.mT, D[..., None] * C)
        L, info = torch.linalg.cholesky_ex(H)
        if bool((info != 0).any()):
            if rung:  # a smaller delta lost positive definiteness: keep the previous point
                break
            raise QPBackwardError(
                "backward: the active rows are linearly dependent and P is singular on their "
                "null space, so the solution is not differentiable (the regularised KKT matrix "
                "is singular). Regularise P or remove the redundant constraints."
            )
        # the correction of the current point: its multiplier part stays in range C
        du, dw, _, k = refine_schur(P, C, D, L, r1, r2, ok, _MAX_STEPS, _TOL)
        steps += k
        u_t, w_t = u + du, w + dw
        r1_t = grad_x - torch.bmm(P, u_t.unsqueeze(-1)).squeeze(-1)
        r1_t = r1_t - torch.bmm(w_t.unsqueeze(-2), C).squeeze(-2)
        r2_t = rhs2 - torch.bmm(C, u_t.unsqueeze(-1)).squeeze(-1)
        rel_t = (r1_t.pow(2).sum(-1) + r2_t.pow(2).sum(-1)).sqrt() / norm
        better = rel_t < rel  # per sample: a rung that diverged keeps the previous point
        u, w = torch.where(better[:, None], u_t, u), torch.where(better[:, None], w_t, w)
        r1, r2 = torch.where(better[:, None], r1_t, r1), torch.where(better[:, None], r2_t, r2)
        rel = torch.where(better, rel_t, rel)
        if float(rel.max()) <= _STALL_FLOOR:
            break
    U, sigma, _ = torch.linalg.svd(C, full_matrices=True)
    keep = torch.zeros(s, C.shape[1], dtype=C.dtype)
    r = sigma.shape[-1]
    keep[:, :r] = (sigma > 1e-10 * sigma.amax(-1, keepdim=True)).to(C.dtype)
    w = torch.bmm(U, (keep * torch.bmm(U.mT, w.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1))
    return u, w.squeeze(-1), rel, steps


def min_norm_sparse(P: sp.spmatrix, C: sp.csr_matrix, rhs: np.ndarray) -> np.ndarray:
    """Minimum-norm multiplier adjoint of one sparse sample: ``z = [u; w]`` for
    :math:`K = [[P, C^\\top], [C, 0]]` (SuperLU of the quasi-definite :math:`K_\\delta`,
    refinement against K,
    :math:`\\delta` down the ladder ``_DELTA_LADDER`` while the refinement stalls)."""
    k = C.shape[0]
    diag = np.abs(P.diagonal())
    c_P = float(diag.mean()) if diag.size and diag.mean() > 0 else 1.0
    row_sq = float(np.asarray(C.multiply(C).sum(1)).max()) if k else 1.0
    K = sp.bmat([[P, C.T], [C, None]], format="csc")
    z = np.zeros_like(rhs)
    norm = max(float(np.linalg.norm(rhs)), 1e-300)
    best = 1.0  # relative residual of z
    for rung, relative_delta in enumerate(_DELTA_LADDER):
        delta = relative_delta * max(row_sq, 1e-300) / c_P
        # quasi-definite (both blocks regularised): SuperLU never sees a singular matrix (with
        # P singular on the null space of C, [[P, C'], [C, -delta I]] is, and SuperLU crashed
        # the process on it at random: Maros-Meszaros QFORPLAN); the refinement against K
        # still converges to the minimum-norm solution (module docstring of linalg.sparse)
        n = P.shape[0]
        M = sp.bmat(
            [[P + relative_delta * c_P * sp.eye(n), C.T], [C, -delta * sp.eye(k)]], format="csc"
        )
        try:
            lu = splu(M, what="regularised KKT matrix")
        except FactorizationError as err:
            if rung:  # a smaller delta is singular to working precision: keep z
                break
            raise QPBackwardError(
                f"backward: the active rows are linearly dependent and the regularised KKT "
                f"matrix is singular ({err}): P is singular on the null space of the active rows."
            ) from err
        last = rung == len(_DELTA_LADDER) - 1
        trial, prev = z, best
        for _ in range(_MAX_STEPS):
            trial = trial + lu.solve(rhs - K @ trial)
            rel = float(np.linalg.norm(rhs - K @ trial)) / norm
            if rel < best:
                z, best = trial, rel
            if best <= _TOL or (rel > 0.5 * prev and best < _STALL_FLOOR):
                break  # converged, or stalled at round-off
            if rel > 0.9 * prev and not last:
                break  # slow contraction (or divergence): the next rung of the ladder
            prev = rel
        if best <= _STALL_FLOOR:
            break
    return z


def record_degenerate(diagnostics: BackwardDiagnostics, counts: Tensor, method: str) -> None:
    """Store the per-sample dependent-row counts (the warning is issued once, by the
    degenerate rule of :class:`~dxopt.qp.BackwardBase`, which knows what it chose)."""
    diagnostics.dependent_rows = tuple(counts.tolist())
    diagnostics.licq = not any(diagnostics.dependent_rows)


MAX_WEAK_TESTED = 64  # weak rows tested per sample for dependence on the active rows


def dependent_weak_rows(problem: QPProblem, active: Tensor, weak: Tensor) -> Tensor:
    """Weakly active rows (zero slack, zero multiplier) that lie in the span of the strongly
    active rows and the equality rows, ``(S, m)``.

    Such a row is part of the same face (e.g. a duplicated row, whose multiplier an active-set
    backend such as daqp puts entirely on one copy, while an interior-point backend splits it),
    so it is treated as active and counted as a dependent row: LICQ detection and the
    minimum-norm multiplier adjoint then do not depend on the backend. A row counts as
    dependent when its least-squares distance to that span is below ``DEPENDENT_TOL`` (relative,
    squared). At most ``MAX_WEAK_TESTED`` weak rows per sample are tested (the rest keep the
    weak policy).
    """
    out = torch.zeros_like(weak)
    for i in range(weak.shape[0]):
        rows = torch.nonzero(weak[i]).flatten()[:MAX_WEAK_TESTED]
        if rows.numel() == 0:
            continue
        blocks = []
        G_i = _matrix(problem, "G", i)
        act = torch.nonzero(active[i]).flatten().numpy()
        if act.size:
            blocks.append(G_i[act])
        if problem.A is not None and problem.p:
            blocks.append(_matrix(problem, "A", i))
        if not blocks:
            continue
        C = sp.vstack(blocks, format="csr") if sp.issparse(blocks[0]) else np.vstack(blocks)
        W = G_i[rows.numpy()]
        Cd = C.toarray() if sp.issparse(C) else C  # type: ignore[union-attr]
        Wd = W.toarray() if sp.issparse(W) else W
        if Cd.shape[0] * Cd.shape[1] > 4e6:  # too big for a dense least-squares test
            continue
        coef = np.linalg.lstsq(Cd.T, Wd.T, rcond=None)[0]
        resid = np.linalg.norm(Cd.T @ coef - Wd.T, axis=0) ** 2
        norm = np.linalg.norm(Wd, axis=1) ** 2
        dep = resid <= DEPENDENT_TOL * np.maximum(norm, 1e-300)
        out[i, rows[torch.from_numpy(dep)]] = True
    return out


def _matrix(problem: QPProblem, name: str, i: int) -> Any:
    t = getattr(problem, name)
    if t.layout == torch.sparse_coo:
        return problem.csr[name][0]
    return (t[i] if t.ndim == 3 else t).numpy()


#: dense entries of [G_J; A] above which a sample whose adjoint already failed is not retried
#: at a vertex (``retry=True``): there the failure is usually P singular on the null space,
#: which no vertex cures, and the retry would only add its cost to the pseudo-inverse's
MAX_RETRY_ENTRIES = 1e6
MAX_VERTEX_ENTRIES = 4e6  # dense entries of [G_J; A] above which ``vertex_rows`` skips a sample


def vertex_rows(
    problem: QPProblem,
    used: Tensor,
    ineq_duals: Tensor,
    eq_duals: Tensor,
    skip: Tensor,
    *,
    keep_parallel: bool = False,
    retry: bool = False,
) -> tuple[Tensor, Tensor]:
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
    mask (S, m) and the per-sample number of dropped rows. ``retry=True`` (the adjoint of the
    full active set already failed its residual check) skips samples above
    ``MAX_RETRY_ENTRIES``.
    """
    out = used.clone()
    dropped = torch.zeros(used.shape[0], dtype=torch.int64)
    for i in range(used.shape[0]):
        if bool(skip[i]):
            continue
        act = torch.nonzero(used[i]).flatten().numpy()
        if act.size == 0:
            continue
        blocks = [_matrix(problem, "G", i)[act]]
        has_eq = problem.A is not None and bool(problem.p)
        if has_eq:
            blocks.append(_matrix(problem, "A", i))
        rows = sum(b.shape[0] for b in blocks)
        k = act.size
        if retry and rows * blocks[0].shape[1] > MAX_RETRY_ENTRIES:
            continue
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
        N = Vt[rank:].T  # null space of Cn^T, (rows, d)
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
        keep = _min_cost_vertex(Cn, k, lam, keep)
        gone = act[~keep[:k]]
        out[i, torch.from_numpy(gone)] = False
        dropped[i] = gone.size
    return out, dropped


def vertex_cost(k: int) -> np.ndarray:
    """The linear cost whose minimising vertex of the multiplier set the vertex rule picks:
    the l1 norm of the normalised inequality multipliers, :math:`c_i = 1 + 10^{-6} i/k`
    (the tie-break by row order makes the minimiser unique where copies tie)."""
    return 1.0 + 1e-6 * np.arange(k) / max(k, 1)


def _min_cost_vertex(Cn: np.ndarray, k: int, lam: np.ndarray, keep: np.ndarray) -> np.ndarray:
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
        T = np.linalg.lstsq(Cn[B].T, Cn[N].T, rcond=None)[0]  # c_j = sum_B T_ij c_i
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
    target = int(keep[:k].sum())  # inequality rows of a basis
    scale = max(float(lam[:k].max(initial=0.0)), 1e-300)
    canon = np.zeros_like(keep)
    canon[k:] = keep[k:]
    canon[:k] = keep[:k] & (lam[:k] > 1e-9 * scale)
    q = np.zeros((Cn.shape[1], 0))
    if canon.any():  # an orthonormal basis of the support's span (equality rows may depend)
        U, sigma, _ = np.linalg.svd(Cn[canon].T, full_matrices=False)
        q = U[:, sigma > 1e-8 * max(float(sigma.max(initial=0.0)), 1e-300)]
    for i in range(k):
        if int(canon[:k].sum()) >= target:
            break
        if canon[i]:
            continue
        v = Cn[i] - q @ (q.T @ Cn[i])
        v = v - q @ (q.T @ v)
        d = float(v @ v)
        if d > DEPENDENT_TOL:
            canon[i] = True
            q = np.column_stack([q, v / np.sqrt(d)])
    return canon


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
