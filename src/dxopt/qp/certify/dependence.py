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
``DEPENDENCE_DELTA_LADDER`` (:math:`10^{-8}, 10^{-11}, 10^{-13}` times
:math:`\\max_i\\|c_i\\|^2/\\bar P_{ii}`), each rung refining the previous point, whose
multiplier part stays in :math:`\\operatorname{range} C`, so the limit is unchanged. The
multiplier cotangents must lie in :math:`\\operatorname{range} C` (the multipliers themselves
are not unique otherwise); if the refined residual stays large the caller raises
:class:`~dxopt.qp.QPBackwardError`.

Caveat: on duplicated rows :math:`w^\\star` splits the adjoint equally (a convex combination
of the one-sided derivatives), but for general dependent rows it need not be an element of
Clarke's generalised gradient (e.g. active rows :math:`e_1, e_2, e_1 + e_2`; see
``tests/qp/test_degenerate_vertex.py``). ``degenerate="vertex"``
(:func:`dxopt.qp.backward.vertex.vertex_rows`) returns the derivative of one affine piece instead.

Detection: the Cholesky pivots of the row-normalised Gram matrix :math:`\\hat C\\hat C^\\top`
are the squared distances of each row to the span of the previous ones; a pivot below
``DEPENDENT_TOL`` marks a dependent row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from dxopt.linalg.sparse import FactorizationError, UnitRows, splu, unit_rows
from dxopt.qp.certify.tolerances import (
    DEPENDENCE_DELTA_LADDER,
    DEPENDENCE_MAX_STEPS,
    DEPENDENCE_REFINE_TOL,
    DEPENDENCE_STALL_FLOOR,
    DEPENDENT_TOL,
)
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = [
    "DEPENDENT_TOL",
    "count_dependent_dense",
    "count_dependent_sparse",
    "dependent_weak_rows",
    "min_norm_dense",
    "min_norm_sparse",
    "record_degenerate",
    "refine_schur",
    "sample_matrix",
]

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
    follows the ladder ``DEPENDENCE_DELTA_LADDER`` while the refinement stalls above round-off."""
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
    for rung, relative_delta in enumerate(DEPENDENCE_DELTA_LADDER):
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
        du, dw, _, k = refine_schur(
            P, C, D, L, r1, r2, ok, DEPENDENCE_MAX_STEPS, DEPENDENCE_REFINE_TOL
        )
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
        if float(rel.max()) <= DEPENDENCE_STALL_FLOOR:
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
    :math:`\\delta` down the ladder ``DEPENDENCE_DELTA_LADDER`` while the refinement stalls)."""
    k = C.shape[0]
    diag = np.abs(P.diagonal())
    c_P = float(diag.mean()) if diag.size and diag.mean() > 0 else 1.0
    row_sq = float(np.asarray(C.multiply(C).sum(1)).max()) if k else 1.0
    K = sp.bmat([[P, C.T], [C, None]], format="csc")
    z = np.zeros_like(rhs)
    norm = max(float(np.linalg.norm(rhs)), 1e-300)
    best = 1.0  # relative residual of z
    for rung, relative_delta in enumerate(DEPENDENCE_DELTA_LADDER):
        delta = relative_delta * max(row_sq, 1e-300) / c_P
        # both blocks regularised (quasi-definite): SuperLU crashes the process on a singular
        # [[P, C'], [C, -delta I]]; the refinement against K keeps the minimum-norm solution
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
        last = rung == len(DEPENDENCE_DELTA_LADDER) - 1
        trial, prev = z, best
        for _ in range(DEPENDENCE_MAX_STEPS):
            trial = trial + lu.solve(rhs - K @ trial)
            rel = float(np.linalg.norm(rhs - K @ trial)) / norm
            if rel < best:
                z, best = trial, rel
            if best <= DEPENDENCE_REFINE_TOL or (
                rel > 0.5 * prev and best < DEPENDENCE_STALL_FLOOR
            ):
                break  # converged, or stalled at round-off
            if rel > 0.9 * prev and not last:
                break  # slow contraction (or divergence): the next rung of the ladder
            prev = rel
        if best <= DEPENDENCE_STALL_FLOOR:
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
        G_i = sample_matrix(problem, "G", i)
        act = torch.nonzero(active[i]).flatten().numpy()
        if act.size:
            blocks.append(G_i[act])
        if problem.A is not None and problem.p:
            blocks.append(sample_matrix(problem, "A", i))
        if not blocks:
            continue
        if sum(B.shape[0] for B in blocks) * problem.n > 4e6:
            continue  # too big for a dense least-squares test (never densified: 0.8 GB and
            # 2 s of the backward on Maros-Meszaros LISWET8)
        C = sp.vstack(blocks, format="csr") if sp.issparse(blocks[0]) else np.vstack(blocks)
        W = G_i[rows.numpy()]
        Cd = C.toarray() if sp.issparse(C) else C  # type: ignore[union-attr]
        Wd = W.toarray() if sp.issparse(W) else W
        coef = np.linalg.lstsq(Cd.T, Wd.T, rcond=None)[0]
        resid = np.linalg.norm(Cd.T @ coef - Wd.T, axis=0) ** 2
        norm = np.linalg.norm(Wd, axis=1) ** 2
        dep = resid <= DEPENDENT_TOL * np.maximum(norm, 1e-300)
        out[i, rows[torch.from_numpy(dep)]] = True
    return out


def sample_matrix(problem: QPProblem, name: str, i: int) -> Any:
    t = getattr(problem, name)
    if t.layout == torch.sparse_coo:
        return problem.csr[name][0]
    return (t[i] if t.ndim == 3 else t).numpy()
