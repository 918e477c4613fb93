"""Exact implicit differentiation of the reduced KKT system on the active set (qp.md section 4).

Solves :math:`K[u; w_J; w_E] = [\\bar x; \\bar\\nu_J; \\bar\\mu]` with
:math:`K = [[P, G_J^\\top, A^\\top], [G_J, 0, 0], [A, 0, 0]]` (Amos & Kolter, OptNet,
arXiv 1703.00443; Magoon et al., dQP, arXiv 2410.06324). Dense problems are solved for the whole
batch at once: the inactive rows of each sample are masked out by replacing them with identity
rows, so one batched LU (``torch.linalg.solve_ex``) handles per-sample active sets. Sparse
problems build the symmetric indefinite :math:`K` in scipy and factor it with SuperLU per sample.
Samples whose active rows are linearly dependent (LICQ fails, :math:`K` singular) are detected
first and get the minimum-norm multiplier adjoint of :mod:`dxopt.qp._degenerate`, the same
choice as :class:`~dxopt.qp.PenaltyBackward` makes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from dxopt.linalg.sparse import FactorizationError, splu
from dxopt.qp._active import ActiveSet, compress_rows, gather_rows
from dxopt.qp._adjoint import AdjointInput, AdjointSolution, kkt_residual
from dxopt.qp._backward_base import BackwardBase
from dxopt.qp._degenerate import (
    count_dependent_dense,
    count_dependent_sparse,
    min_norm_dense,
    min_norm_sparse,
    record_degenerate,
)
from dxopt.qp._problem import QPProblem
from dxopt.qp._types import BackwardDiagnostics, QPBackwardError

_PIVOT_RATIO = 1e-10  # LU pivots below this (relative) trigger the dependent-row test

__all__ = [
    "KKTBackward",
    "active_rows_sparse",
    "check_residual",
    "dependent_rows_sparse",
    "scipy_matrix",
    "solve_sparse",
]


def scipy_matrix(problem: QPProblem, name: str, i: int) -> sp.csr_matrix:
    """Parameter ``name`` of sample ``i`` as a scipy CSR matrix."""
    t = getattr(problem, name)
    if t.layout == torch.sparse_coo:
        return problem.csr[name][0]
    return sp.csr_matrix((t[i] if t.ndim == 3 else t).numpy())


def check_residual(residual: Tensor, limit: float, what: str) -> None:
    """Raise :class:`QPBackwardError` naming the samples whose relative residual is too big."""
    bad = torch.nonzero(~(residual <= limit)).flatten().tolist()
    if bad:
        worst = float(residual[bad].max())
        raise QPBackwardError(
            f"{what}: the adjoint KKT system was solved only to relative residual {worst:.3g} "
            f"(limit {limit:.1g}) at batch indices {bad}; the gradient would be wrong. The "
            "active constraints are likely degenerate (LICQ fails) or P is singular on their "
            "null space; try weak_policy='inactive', a tighter solver tolerance or a "
            "regularised P."
        )


@dataclass(frozen=True, kw_only=True)
class KKTBackward(BackwardBase):
    """Exact reduced-KKT backward (the accuracy reference).

    Args:
        linear_solver: ``"auto"`` (batched dense LU for dense problems, SuperLU for sparse
            ones), ``"dense"`` or ``"sparse"``.
        active_tol: normalised-slack threshold of the active set; ``None`` uses the forward's
            certified active set (see :mod:`dxopt.qp._active`).
        weak_policy: treatment of weakly active rows: ``"inactive"``, ``"active"``, ``"raise"``.
        max_residual: largest accepted relative residual of the adjoint system; beyond it the
            ``degenerate`` policy applies.
        degenerate: ``"auto"`` (default: dependent active rows dropped to a vertex of the
            multiplier set except for duplicated/opposite rows, which get the minimum-norm
            split; a singular reduced KKT matrix gets the pseudo-inverse adjoint; flagged and
            warned; see :mod:`dxopt.qp._backward_base`), ``"min_norm"`` (minimum-norm
            multiplier adjoint for every dependency), ``"vertex"`` (dependent active rows
            dropped to a vertex of the multiplier set, a B-subdifferential element;
            :func:`dxopt.qp._degenerate.vertex_rows`) or
            ``"raise"`` (:class:`~dxopt.qp.QPBackwardError`).
    """

    @property
    def name(self) -> str:
        return "kkt"

    def _adjoint(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """Solve the adjoint system for every sample (see module docstring)."""
        if self.use_sparse(data.problem):
            u, w_ineq, w_eq, dependent = solve_sparse(data, active.used)
            diagnostics.linear_solver = "splu"
        else:
            u, w_ineq, w_eq, dependent = _solve_dense(data, active.used)
            diagnostics.linear_solver = "lu"
        record_degenerate(diagnostics, dependent, "kkt")
        *_, residual = kkt_residual(data, active, u, w_ineq, w_eq)
        diagnostics.method = "kkt"
        diagnostics.residual = float(residual.max()) if residual.numel() else 0.0
        diagnostics.n_active = active.n_active
        diagnostics.n_weak = active.n_weak
        check_residual(residual, self.max_residual, "kkt backward")
        return AdjointSolution(u, w_ineq, w_eq, active, residual)


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
    suspect = ((info != 0) | (diag.amin(-1) <= _PIVOT_RATIO * diag.amax(-1))) & data.ok
    dependent = torch.zeros(S, dtype=torch.int64)
    if bool(suspect.any()):
        dependent[suspect] = count_dependent_dense(K[suspect, n:, :n])
    degenerate = dependent > 0
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


def active_rows_sparse(problem: QPProblem, used: Tensor, i: int) -> sp.csr_matrix | None:
    """The stacked active rows :math:`C = [G_J; A]` of sample ``i`` (``None`` if empty)."""
    cons = []
    if problem.m:
        rows = torch.nonzero(used[i]).flatten().numpy()
        if rows.size:
            cons.append(scipy_matrix(problem, "G", i)[rows])
    if problem.p:
        cons.append(scipy_matrix(problem, "A", i))
    return sp.vstack(cons, format="csr") if cons else None


def dependent_rows_sparse(data: AdjointInput, used: Tensor) -> Tensor:
    """Per-sample number of dependent active rows of a sparse problem (0 for failed ones)."""
    out = torch.zeros(data.x.shape[0], dtype=torch.int64)
    for i in range(data.x.shape[0]):
        C = active_rows_sparse(data.problem, used, i) if bool(data.ok[i]) else None
        out[i] = 0 if C is None else count_dependent_sparse(C)
    return out


def solve_sparse(data: AdjointInput, used: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample SuperLU of the reduced KKT matrix (minimum-norm multiplier adjoint where
    the active rows are dependent); returns ``(u, w_J, w_E, dependent row counts)``."""
    problem = data.problem
    S, n, m, p = data.x.shape[0], problem.n, problem.m, problem.p
    u = torch.zeros(S, n, dtype=torch.float64)
    w_ineq = torch.zeros(S, m, dtype=torch.float64)
    w_eq = torch.zeros(S, p, dtype=torch.float64)
    dependent = torch.zeros(S, dtype=torch.int64)
    for i in range(S):
        if not bool(data.ok[i]):
            continue
        rows = torch.nonzero(used[i]).flatten().numpy() if m else np.zeros(0, dtype=np.int64)
        P = scipy_matrix(problem, "P", i)
        rhs = np.concatenate(
            [data.grad_x[i].numpy(), data.grad_ineq[i].numpy()[rows], data.grad_eq[i].numpy()]
        )
        C = active_rows_sparse(problem, used, i)
        dependent[i] = 0 if C is None else count_dependent_sparse(C)
        try:
            if C is not None and int(dependent[i]):
                z = min_norm_sparse(P, C, rhs)
            elif C is not None:
                z = splu(sp.bmat([[P, C.T], [C, None]], format="csc"), what="KKT").solve(rhs)
            else:
                z = splu(P, what="KKT").solve(rhs)
        except (FactorizationError, QPBackwardError) as err:
            raise QPBackwardError(
                f"kkt backward: sparse LU of the reduced KKT matrix failed at batch index {i} "
                f"({err}); P is singular on the null space of the active rows, so the "
                "solution is not differentiable."
            ) from err
        u[i] = torch.from_numpy(z[:n])
        k = int(rows.size)
        if k:
            w_ineq[i, torch.from_numpy(rows)] = torch.from_numpy(z[n : n + k])
        if p:
            w_eq[i] = torch.from_numpy(z[n + k :])
    return u, w_ineq, w_eq, dependent
