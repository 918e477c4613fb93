"""Exact implicit differentiation of the reduced KKT system on the active set (OptNet;
Amos & Kolter, arXiv 1703.00443).

Solves :math:`K[u; w_J; w_E] = [\\bar x; \\bar\\nu_J; \\bar\\mu]` with
:math:`K = [[P, G_J^\\top, A^\\top], [G_J, 0, 0], [A, 0, 0]]` (Amos & Kolter, OptNet,
arXiv 1703.00443; Magoon et al., dQP, arXiv 2410.06324). Dense problems are solved for the whole
batch at once, the active rows of each sample compressed to the front (padding rows zero):

- :math:`P` positive definite (its batched Cholesky succeeds, and the refinement converges):
  block elimination of :math:`P`
  (:func:`dxopt.linalg.schur_factor`: Cholesky of :math:`P`, :math:`Y = L^{-1}C^\\top` and the
  Cholesky of the :math:`k\\times k` Schur complement :math:`CP^{-1}C^\\top`, then iterative
  refinement against :math:`K`), about :math:`n^3/3 + n^2k + nk^2 + k^3/3` flops instead of the
  :math:`2(n + k)^3/3` of an LU of :math:`K`. Linear dependence of the active rows is read off
  the Schur complement's Cholesky (scale-invariant squared pivots, :mod:`dxopt.linalg.schur`),
  so no separate Gram test runs. When every solved sample is regular this way (no dependent
  row, refined residual within ``max_residual``), the regular-adjoint ladder shared with the
  penalty method (:mod:`dxopt.qp.backward.regular`) returns the adjoint straight away,
  before any degenerate policy (the common case: batched factorizations of up to three
  groups of samples with similar active counts, so little padding is factored; no
  per-sample work; the system is assembled and refined in numpy, and a single small system
  is factored by LAPACK directly).
- one large system (:math:`n \\ge 256`, at most four samples) whose active rows are certified
  independent: the float32 augmented matrix :math:`P + C^\\top WC` as the preconditioner of
  float64 GMRES on :math:`K` (:mod:`dxopt.qp.backward.dense_large`; about :math:`n^2k + n^3/3`
  float32 flops instead of the block elimination's float64 ones), tried first; anything it
  cannot certify or solve goes to the block elimination above.
- otherwise one batched LU of :math:`K` (``torch.linalg.lu_factor_ex``; inactive rows replaced by
  identity rows), with the exact Gram test
  (:func:`~dxopt.qp.certify.dependence.count_dependent_dense`)
  on the samples whose LU pivots look singular.

Sparse problems factor :math:`K` per sample (:class:`dxopt.linalg.sparse.KKTFactor`): the
distinct unit rows of :math:`C = [G_J; A]` (bounds :math:`\\pm x_j \\le h_j`) are eliminated
exactly and SuperLU factors the rest, :math:`[[P_{FF}, R^\\top], [R, 0]]` on the free
coordinates :math:`F` and the other rows; the rows of :math:`C` are independent iff those of
:math:`R` are, so the Gram test for dependent rows
(:func:`~dxopt.qp.certify.dependence.count_dependent_sparse`) runs on :math:`R` only. Samples whose
active rows are linearly dependent (LICQ fails, :math:`K` singular) get the minimum-norm
multiplier adjoint of :mod:`dxopt.qp.certify.dependence`, the same choice as
:class:`~dxopt.qp.PenaltyBackward` makes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dxopt.linalg.schur import SchurFactor, schur_factor
from dxopt.qp.backward.adjoint import kkt_residual
from dxopt.qp.backward.base import BackwardBase
from dxopt.qp.backward.regular import RegularBudget, check_residual, schur_refine
from dxopt.qp.backward.rows import (
    DenseRows,
    compress_rows,
    dense_rows,
    gather_rows,
    sparse_factor,
    sparse_rows,
)
from dxopt.qp.certify.dependence import (
    DEPENDENT_TOL,
    count_dependent_dense,
    min_norm_dense,
    min_norm_sparse,
    record_degenerate,
)
from dxopt.qp.certify.tolerances import KKT_PIVOT_RATIO, KKT_REFINE_STEPS, KKT_REFINE_TOL
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput, AdjointSolution
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = ["KKTBackward", "solve_sparse"]


@dataclass(frozen=True, kw_only=True)
class KKTBackward(BackwardBase):
    """Exact reduced-KKT backward (the accuracy reference).

    Args:
        linear_solver: ``"auto"`` (batched dense LU for dense problems, SuperLU for sparse
            ones), ``"dense"`` or ``"sparse"``.
        active_tol: normalised-slack threshold of the active set; ``None`` uses the forward's
            certified active set (see :mod:`dxopt.qp.certify.active`).
        weak_policy: treatment of weakly active rows: ``"inactive"``, ``"active"``, ``"raise"``.
        max_residual: largest accepted relative residual of the adjoint system; beyond it the
            ``degenerate`` policy applies.
        degenerate: the policy for dependent active rows and a singular reduced KKT matrix:
            ``"auto"`` (default), ``"min_norm"``, ``"vertex"`` or ``"raise"``, as in
            :class:`~dxopt.qp.BackwardBase` (:mod:`dxopt.qp.backward.base`).
    """

    @property
    def name(self) -> str:
        return "kkt"

    def regular_budget(self) -> RegularBudget:
        return RegularBudget(KKT_REFINE_TOL, KKT_REFINE_STEPS, self.max_residual)

    def _adjoint(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """Solve the adjoint system for every sample (see module docstring)."""
        residual: Tensor | None = None
        if self.use_sparse(data.problem):
            u, w_ineq, w_eq, dependent = solve_sparse(data, active.used)
            diagnostics.linear_solver = "splu"
        else:
            rows = dense_rows(data, active.used)
            factor = schur_factor(rows.P, rows.C)
            if factor is not None:  # P positive definite: block elimination of P
                u, w_ineq, w_eq, dependent, residual = _solve_schur(data, rows, factor)
                diagnostics.linear_solver = "schur"
                # a Cholesky of a nearly singular P can be too inaccurate for the refinement
                # to converge: then the LU of K decides
                if residual is not None and bool((residual > self.max_residual).any()):
                    factor = None
            if factor is None:
                u, w_ineq, w_eq, dependent = _solve_dense(data, active.used)
                diagnostics.linear_solver = "lu"
                residual = None
        record_degenerate(diagnostics, dependent, "kkt")
        if residual is None:
            *_, residual = kkt_residual(data, active, u, w_ineq, w_eq)
        diagnostics.method = "kkt"
        diagnostics.residual = float(residual.max()) if residual.numel() else 0.0
        diagnostics.n_active = active.n_active
        diagnostics.n_weak = active.n_weak
        check_residual(residual, self.max_residual, "kkt backward")
        return AdjointSolution(u, w_ineq, w_eq, active, residual)


def _solve_schur(
    data: AdjointInput, rows: DenseRows, factor: SchurFactor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Exact adjoint by block elimination of :math:`P` (:mod:`dxopt.linalg.schur`); samples
    whose rows the factorization reads as dependent get the minimum-norm adjoint. Returns
    ``(u, w_J, w_E, dependent row counts, relative residual or None if not final)``."""
    S, m = data.x.shape[0], data.problem.m
    dependent = factor.dependent(DEPENDENT_TOL) * data.ok
    u, w, residual, _ = schur_refine(
        rows, factor, data.grad_x, data.ok, KKT_REFINE_STEPS, KKT_REFINE_TOL
    )
    degenerate = dependent > 0
    final: Tensor | None = residual
    if bool(degenerate.any()):
        final = None
        P = rows.P if rows.P.ndim == 3 else rows.P.expand(S, -1, -1)
        u_d, w_d, *_ = min_norm_dense(
            P[degenerate], rows.C[degenerate], data.grad_x[degenerate], rows.rhs2[degenerate]
        )
        u, w = u.clone(), w.clone()
        u[degenerate], w[degenerate] = u_d, w_d
    k = rows.k
    w_ineq = torch.zeros(S, m, dtype=torch.float64)
    if k:
        w_ineq.scatter_(1, rows.index, w[:, :k] * rows.mask)
    return u, w_ineq, w[:, k:], dependent, final


def _solve_dense(data: AdjointInput, used: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    problem = data.problem
    S, n, m, p = data.x.shape[0], problem.n, problem.m, problem.p
    index, valid = compress_rows(used)  # active rows first: K is (n + k + p) square
    k = index.shape[1]
    N = n + k + p
    K = torch.zeros(S, N, N, dtype=torch.float64)
    K[:, :n, :n] = problem.P
    rhs = torch.zeros(S, N, dtype=torch.float64)
    rhs[:, :n] = data.grad_x
    if k:
        mask = valid.to(torch.float64)
        GJ = gather_rows(problem.G, index) * mask[..., None]  # type: ignore[arg-type]
        K[:, n : n + k, :n] = GJ
        K[:, :n, n : n + k] = GJ.transpose(-1, -2)
        K[:, n : n + k, n : n + k] = torch.diag_embed(1.0 - mask)
        rhs[:, n : n + k] = data.grad_ineq.gather(1, index) * mask
    if p:
        K[:, n + k :, :n] = problem.A  # type: ignore[assignment]
        K[:, :n, n + k :] = problem.A.transpose(-1, -2)  # type: ignore[union-attr]
        rhs[:, n + k :] = data.grad_eq
    eye = torch.eye(N, dtype=torch.float64)
    if not bool(data.ok.all()):
        K = torch.where(data.ok[:, None, None], K, eye)
    LU, pivots, info = torch.linalg.lu_factor_ex(K)
    # dependent rows make K exactly singular, so LU has a (near-)zero pivot: only such
    # samples get the exact Gram test (most batches never pay for it)
    diag = LU.diagonal(dim1=-2, dim2=-1).abs()
    suspect = ((info != 0) | (diag.amin(-1) <= KKT_PIVOT_RATIO * diag.amax(-1))) & data.ok
    dependent = torch.zeros(S, dtype=torch.int64)
    if bool(suspect.any()):
        dependent[suspect] = count_dependent_dense(K[suspect, n:, :n])
    degenerate = dependent > 0
    flat = (suspect & ~degenerate).nonzero().flatten().tolist()
    if flat:  # independent rows and a (near-)zero pivot: P singular on ker C, or nearly so;
        # LU's solution of a consistent singular system is arbitrary along the null space
        raise QPBackwardError(
            f"kkt backward: the reduced KKT matrix is singular or nearly so at batch indices "
            f"{flat} although the active rows are independent (P is singular on their null "
            "space, or nearly: x is not unique); its LU solve is not trusted."
        )
    if bool(degenerate.any() or (info != 0).any()):  # refactor with those samples masked
        C = K[degenerate, n:, :n]
        sol, info = torch.linalg.solve_ex(torch.where(degenerate[:, None, None], eye, K), rhs)
        P = problem.P if problem.P.ndim == 3 else problem.P.expand(S, n, n)
        if bool(degenerate.any()):
            u, w, *_ = min_norm_dense(P[degenerate], C, rhs[degenerate, :n], rhs[degenerate, n:])
            sol[degenerate] = torch.cat([u, w], 1)
    else:
        sol = torch.linalg.lu_solve(LU, pivots, rhs.unsqueeze(-1)).squeeze(-1)
    singular = torch.nonzero(info != 0).flatten().tolist()
    if singular:
        raise QPBackwardError(
            f"kkt backward: the reduced KKT matrix is singular at batch indices {singular} "
            "(P is singular on the null space of the active rows, so x is not differentiable). "
            "Regularise P or check the problem."
        )
    w_ineq = torch.zeros(S, m, dtype=torch.float64)
    if k:
        w_ineq.scatter_(1, index, sol[:, n : n + k] * valid)
    return sol[:, :n], w_ineq, sol[:, n + k :], dependent


def solve_sparse(data: AdjointInput, used: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample exact solve of the reduced KKT system (unit rows eliminated, SuperLU of the
    rest; the minimum-norm multiplier adjoint where the active rows are dependent); returns
    ``(u, w_J, w_E, dependent row counts)``."""
    problem = data.problem
    S, n, m, p = data.x.shape[0], problem.n, problem.m, problem.p
    u, w_ineq, w_eq = np.zeros((S, n)), np.zeros((S, m)), np.zeros((S, p))
    dependent = torch.zeros(S, dtype=torch.int64)
    for i in np.flatnonzero(data.ok.numpy()).tolist():
        sample = sparse_rows(problem, used, i)
        dependent[i] = sample.dependent
        rhs = sample.rhs(data, i)
        if sample.C is not None and sample.dependent:
            try:
                z = min_norm_sparse(sample.P, sample.C, rhs)
            except QPBackwardError as err:
                raise QPBackwardError(
                    f"kkt backward: sparse LU of the reduced KKT matrix failed at batch index "
                    f"{i} ({err}); P is singular on the null space of the active rows, so the "
                    "solution is not differentiable."
                ) from err
        else:
            z = sparse_factor(sample, i, "kkt backward").solve(rhs)
        k = sample.rows.size
        u[i], w_ineq[i, sample.rows], w_eq[i] = z[:n], z[n : n + k], z[n + k :]
    return torch.from_numpy(u), torch.from_numpy(w_ineq), torch.from_numpy(w_eq), dependent
