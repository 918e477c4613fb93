"""The module-level pieces of the degenerate policy of :class:`dxopt.qp.BackwardBase`: the
dependent-row counts, the multiplier right-hand side test, the equality rows a
:math:`q`-only adjoint may drop, and the Moore-Penrose adjoint of a singular reduced KKT
matrix (:mod:`dxopt.qp.backward.base`, case 2 of its module docstring)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt.linalg.sparse import lstsq_saddle
from dxopt.qp.backward.adjoint import kkt_residual
from dxopt.qp.backward.degenerate_rule import dependent_flags_dense, rule_multipliers
from dxopt.qp.backward.notices import note_degenerate
from dxopt.qp.backward.regular import equilibration
from dxopt.qp.backward.rows import (
    active_rows_sparse,
    dense_rows,
    dependent_rows_sparse,
    scipy_matrix,
)
from dxopt.qp.certify.active import ActiveSet
from dxopt.qp.certify.dependence import count_dependent_dense
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import AdjointInput, AdjointSolution
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = [
    "dependent_counts",
    "dual_rhs",
    "independent_equalities",
    "pseudo_inverse_adjoint",
    "with_rule_multipliers",
]

_NORMAL_LIMIT = 1e-9  # relative residual of the normal equations accepted for K^+ r
_SCALED_RANK_TOL = 1e-12  # sigma_min/sigma_max of the equilibrated K below which K is singular


def independent_equalities(data: AdjointInput) -> tuple[AdjointInput, Tensor] | None:
    """``data`` without the equality rows of a shared dense ``A`` that depend on the rows
    before them, and the mask of the rows kept (``None``: nothing to drop, or ``A`` batched
    or sparse). Only for an adjoint whose multiplier part is not used (the row space, hence
    :math:`u`, is unchanged)."""
    problem = data.problem
    A, b = problem.A, problem.b
    if A is None or b is None or A.layout != torch.strided or A.ndim != 2:
        return None
    flags = dependent_flags_dense(A.to(torch.float64)[None])[0]
    if not bool(flags.any()):
        return None
    keep = ~flags
    sub = replace(problem, A=A[keep], b=b[..., keep], p=int(keep.sum()))
    return replace(
        data, problem=sub, eq_duals=data.eq_duals[:, keep], grad_eq=data.grad_eq[:, keep],
        factors=None,
    ), keep  # fmt: skip


def with_rule_multipliers(data: AdjointInput, out: AdjointSolution) -> AdjointSolution:
    """``out`` with the rule's multipliers (minimum-norm on its rows) where those rows are
    dependent and none were chosen yet (the fallbacks: weak rows kept, pseudo-inverse)."""
    if not (data.needs_rows and data.needs_matrices) or out.ineq_duals is not None:
        return out  # (the multipliers enter only the A and G gradients)
    counts = dependent_counts(data, out.active.used)
    if not bool((counts > 0).any()):
        return out
    nu, mu = rule_multipliers(
        data.problem, data.x, out.active.used, (counts > 0) & data.ok, data.ineq_duals,
        data.eq_duals,
    )  # fmt: skip
    return replace(out, ineq_duals=nu, eq_duals=mu)


def dual_rhs(data: AdjointInput, used: Tensor) -> Tensor:
    """Per sample, True where the multiplier cotangents on the rows ``used`` are nonzero."""
    out = (data.grad_eq != 0).any(-1)
    if data.grad_ineq.shape[1]:
        out = out | ((data.grad_ineq != 0) & used).any(-1)
    return out


def dependent_counts(data: AdjointInput, used: Tensor, samples: Tensor | None = None) -> Tensor:
    """Per-sample number of dependent rows of ``[G_used; A]`` (0 for failed samples and, with
    ``samples``, for the samples not in it)."""
    ok = data.ok if samples is None else data.ok & samples
    if data.problem.any_sparse:
        return dependent_rows_sparse(replace(data, ok=ok), used)
    rows = dense_rows(replace(data, ok=ok), used)
    return count_dependent_dense(rows.C) * ok


def _sample_matrices(problem: QPProblem, used: torch.Tensor, i: int) -> tuple[Any, Any]:
    P = scipy_matrix(problem, "P", i)
    C = active_rows_sparse(problem, used, i)
    if not problem.any_sparse:
        P = P.toarray()
        C = np.zeros((0, problem.n)) if C is None else C.toarray()
    elif C is None:
        import scipy.sparse as sp

        C = sp.csr_matrix((0, problem.n))
    return P, C


def pseudo_inverse_adjoint(
    data: AdjointInput,
    active: ActiveSet,
    diagnostics: BackwardDiagnostics,
    method: str,
    cause: Exception | None = None,
    *,
    max_residual: float = 1e-8,
) -> AdjointSolution:
    """The Moore-Penrose adjoint :math:`K^+ r` of every solved sample (module docstring).

    A dense sample whose equilibrated matrix :math:`DKD`
    (:func:`dxopt.qp.backward.regular.equilibration`) is nonsingular must get the exact
    adjoint: its relative residual :math:`\\|D(r - Kz)\\|/\\|Dr\\|` must be within
    ``max_residual``, or :class:`QPBackwardError` is raised (the SVD's cut-off on the unscaled
    :math:`K` of an objective scaled by 1e-6 and rows by 1e6 once dropped a direction and
    returned a residual of 0.18 as a gradient)."""
    problem = data.problem
    S, n, m, p = data.x.shape[0], problem.n, problem.m, problem.p
    u = torch.zeros(S, n, dtype=torch.float64)
    w_ineq = torch.zeros(S, m, dtype=torch.float64)
    w_eq = torch.zeros(S, p, dtype=torch.float64)
    flagged = [False] * S
    for i in range(S):
        if not bool(data.ok[i]):
            continue
        rows = torch.nonzero(active.used[i]).flatten() if m else torch.zeros(0, dtype=torch.int64)
        P, C = _sample_matrices(problem, active.used, i)
        rhs = np.concatenate(
            [
                data.grad_x[i].numpy(),
                data.grad_ineq[i, rows].numpy(),
                data.grad_eq[i].numpy(),
            ]
        )
        z, normal = lstsq_saddle(P, C, rhs, target=_NORMAL_LIMIT)
        if not normal <= _NORMAL_LIMIT:
            raise QPBackwardError(
                f"{method} backward: the reduced KKT matrix is singular or nearly so at batch "
                f"index {i} and even its least-squares (pseudo-inverse) adjoint is inaccurate "
                f"(normal-equation residual {normal:.3g}, limit {_NORMAL_LIMIT:.0e}; a large "
                "sparse system stops once LSMR stalls, see dxopt.linalg.lstsq_saddle), so the "
                "gradient is refused. Regularise P, remove nearly dependent constraint rows or "
                "check the problem."
            ) from cause
        if not problem.any_sparse:
            _check_regular_residual(P, C, rhs, z, max_residual, f"{method} backward", i, cause)
        flagged[i] = True
        u[i] = torch.from_numpy(z[:n])
        k = int(rows.numel())
        if k:
            w_ineq[i, rows] = torch.from_numpy(z[n : n + k])
        if p:
            w_eq[i] = torch.from_numpy(z[n + k :])
    *_, residual = kkt_residual(data, active, u, w_ineq, w_eq)
    diagnostics.method = method
    diagnostics.linear_solver = "pseudo-inverse"
    diagnostics.residual = float(residual.max()) if residual.numel() else 0.0
    diagnostics.n_active = active.n_active
    diagnostics.n_weak = active.n_weak
    diagnostics.pseudo_inverse = tuple(flagged)
    note_degenerate(
        f"{method} backward: the reduced KKT matrix is singular (P is singular on the null "
        "space of the active rows, so the solution is not unique); the Moore-Penrose "
        "(minimum-norm least-squares) adjoint is used. Per-sample flags: "
        "sol.info.backward.pseudo_inverse. Pass degenerate='raise' to refuse instead."
    )
    return AdjointSolution(u, w_ineq, w_eq, active, residual)


def _check_regular_residual(
    P: np.ndarray,
    C: np.ndarray,
    rhs: np.ndarray,
    z: np.ndarray,
    limit: float,
    what: str,
    index: int,
    cause: Exception | None,
) -> None:
    """Refuse a least-squares adjoint ``z`` of the dense saddle-point system that leaves a
    residual beyond ``limit`` (equilibrated, relative) although the equilibrated matrix is
    nonsingular (``sigma_min >= _SCALED_RANK_TOL sigma_max``): there the adjoint is unique
    and ``z`` is not it."""
    n = P.shape[0]
    d_x, d_c = equilibration(P, C[None])
    d = np.concatenate([d_x[0], d_c[0]])
    r = rhs - np.concatenate([P @ z[:n] + C.T @ z[n:], C @ z[:n]])
    rel = float(np.linalg.norm(d * r)) / max(float(np.linalg.norm(d * rhs)), 1e-300)
    if rel <= limit:
        return
    K = np.block([[P, C.T], [C, np.zeros((C.shape[0], C.shape[0]))]])
    sigma = np.linalg.svd(d[:, None] * K * d[None, :], compute_uv=False)
    if sigma.size and float(sigma[-1]) < _SCALED_RANK_TOL * float(sigma[0]):
        return  # singular: the residual is the part of r outside the range of K
    raise QPBackwardError(
        f"{what}: the least-squares (pseudo-inverse) adjoint at batch index {index} leaves a "
        f"relative residual {rel:.3g} (limit {limit:.1g}, equilibrated) although the reduced "
        f"KKT matrix is nonsingular once its rows and columns are equilibrated (condition "
        f"{float(sigma[0] / sigma[-1]):.3g}); the gradient would be wrong, so it is refused. "
        "Rescale the problem (objective and constraint rows of similar magnitude) or pass "
        "backward='penalty'."
    ) from cause
