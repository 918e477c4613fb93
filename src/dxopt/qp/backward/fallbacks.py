"""The module-level pieces of the degenerate policy of :class:`dxopt.qp.BackwardBase`: the
dependent-row counts, the multiplier right-hand side test, the equality rows a
:math:`q`-only adjoint may drop, and the Moore-Penrose adjoint of a singular reduced KKT
matrix (:mod:`dxopt.qp.backward.base`, case 2 of its module docstring)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
from torch import Tensor

from dxopt.linalg.sparse import equilibrate, lstsq_saddle, saddle_matrix
from dxopt.qp.backward.adjoint import kkt_residual
from dxopt.qp.backward.degenerate_rule import dependent_flags_dense, rule_multipliers
from dxopt.qp.backward.notices import note_degenerate
from dxopt.qp.backward.rows import (
    active_rows_sparse,
    dense_rows,
    dependent_rows_sparse,
    scipy_matrix,
)
from dxopt.qp.certify.dependence import count_dependent_dense
from dxopt.qp.certify.tolerances import PINV_NORMAL_LIMIT, PINV_NULL_X_PART, PINV_RANK_TOL
from dxopt.qp.problem.canonical import QPProblem, sparse_positive_definite
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput, AdjointSolution
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = [
    "dependent_counts",
    "dual_rhs",
    "independent_equalities",
    "moore_penrose_saddle",
    "pseudo_inverse_adjoint",
    "range_part",
    "with_rule_multipliers",
    "with_zero_equalities",
    "without_zero_equalities",
]


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


def without_zero_equalities(data: AdjointInput) -> tuple[AdjointInput, Tensor] | None:
    r"""``data`` without the all-zero equality rows of ``A`` (zero in every sample) and the
    mask of the rows kept; ``None`` where there are none.

    A zero row :math:`0^\top x = b_i` is met by every :math:`x` when :math:`b_i = 0` (a
    solved sample has it) and constrains nothing; in the reduced KKT matrix it is a zero row
    and column, which made :math:`K` singular and sent the backward to the Moore-Penrose
    route with the false diagnosis that :math:`P` was singular on the null space of the
    active rows (a large sparse QP: an LSMR adjoint with residual 4.9e-4, a gradient 1-3 %
    off). It is handled as an all-zero row of ``G`` is (never active,
    :mod:`dxopt.qp.certify.active`): left out of the adjoint system, with :math:`w_i = 0`
    and multiplier 0, the minimum-norm choice (perturbing :math:`b_i` makes the problem
    infeasible, so no other value is a derivative either)."""
    problem = data.problem
    A = problem.A
    if A is None or problem.p == 0:
        return None
    if A.layout == torch.sparse_coo:
        nonzero = torch.zeros(problem.p, dtype=torch.bool)
        idx, vals = A.indices(), A.values()
        nonzero[idx[0][vals != 0]] = True
    else:
        flat = A if A.ndim == 2 else A.transpose(0, 1).reshape(problem.p, -1)
        nonzero = (flat != 0).any(-1)
    if bool(nonzero.all()):
        return None
    keep = nonzero
    rows = torch.nonzero(keep).flatten()
    sparse = A.layout == torch.sparse_coo
    sub_A = A.index_select(0, rows).coalesce() if sparse else A[..., rows, :]
    b = problem.b
    assert b is not None
    csr = dict(problem.csr)
    if "A" in csr:
        mat = csr["A"][0][rows.numpy()]
        csr["A"] = (mat, mat.T.tocsr())
    sub = replace(problem, A=sub_A, b=b[..., rows], p=int(rows.numel()), csr=csr)
    reduced = replace(
        data, problem=sub, eq_duals=data.eq_duals[:, keep], grad_eq=data.grad_eq[:, keep],
        factors=None,
    )  # fmt: skip
    return reduced, keep


def with_zero_equalities(out: AdjointSolution, keep: Tensor, p: int) -> AdjointSolution:
    """The adjoint of :func:`without_zero_equalities`'s reduced problem on all ``p``
    equality rows: :math:`w_i = 0` (and the multiplier 0, where the rule chose them) on the
    zero rows."""
    S = out.u.shape[0]
    w_eq = torch.zeros(S, p, dtype=out.w_eq.dtype)
    w_eq[:, keep] = out.w_eq
    eq_duals = out.eq_duals
    if eq_duals is not None:
        full = torch.zeros(S, p, dtype=eq_duals.dtype)
        full[:, keep] = eq_duals
        eq_duals = full
    return replace(out, w_eq=w_eq, eq_duals=eq_duals)


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
    """The Moore-Penrose adjoint :math:`K^+ r` of every solved sample, returned only where it
    solves the adjoint system to ``max_residual`` (module docstring of
    :mod:`dxopt.qp.backward.base`, case 2).

    The multiplier part of :math:`r` is first projected onto the range of the active rows
    :math:`C` (its part in :math:`\\ker C^\top` has no solution; dropping it is the
    minimum-norm multiplier choice). Then :func:`moore_penrose_saddle` solves the
    equilibrated system and the residual that judges is the equilibrated one,
    :math:`\\|D(r - Kz)\\|/\\|Dr\\|` (:func:`dxopt.linalg.sparse.equilibrate`): a least-squares
    solve of the unscaled :math:`K` cut real directions off with its singular values and
    passed its normal-equation test while the adjoint itself was off by 4e-5 (Maros-Meszaros
    QPCBOEI2: a directional derivative 3.5 % wrong). A residual above ``max_residual`` means
    the system has no solution: :math:`P` is singular on the null space of the active rows
    (:math:`x` is not unique) and the cotangent is not constant on that face, so no derivative
    exists and :class:`QPBackwardError` says so (also when the solve merely fails to reach it:
    a wrong adjoint is never returned). The warning names the cause that made :math:`K`
    singular: dependent active rows with :math:`x` unique (then ``dL/dq`` and ``dL/dP`` are
    exact), or a non-unique :math:`x` on whose face the loss is constant."""
    problem = data.problem
    S, n, m, p = data.x.shape[0], problem.n, problem.m, problem.p
    u = torch.zeros(S, n, dtype=torch.float64)
    w_ineq = torch.zeros(S, m, dtype=torch.float64)
    w_eq = torch.zeros(S, p, dtype=torch.float64)
    flagged = [False] * S
    causes: set[str] = set()
    for i in range(S):
        if not bool(data.ok[i]):
            continue
        rows = torch.nonzero(active.used[i]).flatten() if m else torch.zeros(0, dtype=torch.int64)
        P, C = _sample_matrices(problem, active.used, i)
        rhs_c = np.concatenate([data.grad_ineq[i, rows].numpy(), data.grad_eq[i].numpy()])
        rhs = np.concatenate([data.grad_x[i].numpy(), range_part(C, rhs_c)])
        solved = moore_penrose_saddle(P, C, rhs)
        if not solved.residual <= max_residual:
            raise QPBackwardError(_refusal(method, i, solved, max_residual)) from cause
        causes.add(solved.cause)
        flagged[i] = True
        z = solved.z
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
    for found in sorted(causes):
        note_degenerate(_ACCEPTED[found].format(method=method))
    return AdjointSolution(u, w_ineq, w_eq, active, residual)


_ACCEPTED = {
    "dependent": (
        "{method} backward: the reduced KKT matrix is singular because the active constraint "
        "rows are linearly dependent (LICQ fails); x is unique (P is positive definite on the "
        "null space of the active rows), and the Moore-Penrose (minimum-norm) adjoint, which "
        "solves the adjoint system to round-off, is used: dL/dq and dL/dP are exact, the "
        "b/h/A/G gradients are the minimum-norm choice. Per-sample flags: "
        "sol.info.backward.pseudo_inverse."
    ),
    "face": (
        "{method} backward: P is singular on the null space of the active rows, so the "
        "solution x is not unique; this loss is constant on that face to round-off, and the "
        "Moore-Penrose (minimum-norm) adjoint, which solves the adjoint system to round-off, "
        "is used. Per-sample flags: sol.info.backward.pseudo_inverse. Pass degenerate='raise' "
        "to refuse instead."
    ),
    "unique": (
        "{method} backward: the exact solve of the reduced KKT system did not reach its "
        "residual limit (the matrix is ill-conditioned, or singular through dependent active "
        "rows); P is positive definite on the null space of the active rows, so x is unique, "
        "and the least-squares adjoint, which solves the adjoint system to round-off, is "
        "used: dL/dq and dL/dP are exact, the b/h/A/G gradients too where the active rows "
        "are independent (else the minimum-norm choice). Per-sample flags: "
        "sol.info.backward.pseudo_inverse."
    ),
    "singular": (
        "{method} backward: the reduced KKT matrix is singular (dependent active rows, or P "
        "singular on their null space) and the Moore-Penrose (minimum-norm) adjoint, which "
        "solves the adjoint system to round-off, is used. Per-sample flags: "
        "sol.info.backward.pseudo_inverse."
    ),
}


def _refusal(method: str, i: int, solved: MoorePenrose, limit: float) -> str:
    head = (
        f"{method} backward: at batch index {i} the reduced KKT matrix is singular and its "
        "least-squares (Moore-Penrose, pseudo-inverse) adjoint leaves an equilibrated "
        f"relative residual {solved.residual:.3g} (limit {limit:.1g}), so it is no adjoint "
        "and the gradient is refused. "
    )
    if solved.cause == "face":
        return head + (
            "Cause: P is singular on the null space of the active rows, so the solution x is "
            "not unique (a face of solutions) and this loss is not constant on it: no "
            "derivative of x exists. Regularise P (e.g. P + eps I) or make the loss depend on "
            "x only through quantities constant on the face."
        )
    return head + (
        "The solve did not reach round-off (cause undetermined: dependent active rows with "
        "very different scales, or P singular on their null space). Rescale the problem or "
        "regularise P."
    )


@dataclass(frozen=True)
class MoorePenrose:
    r"""One Moore-Penrose solve of :func:`moore_penrose_saddle`: ``z``, the equilibrated
    relative residual and the cause of the singularity: ``"dependent"`` (the null space of
    :math:`K` has no :math:`x` part: only the rows are dependent, :math:`x` is unique),
    ``"unique"`` (:math:`P` positive definite or no null space found: :math:`x` is unique,
    :math:`K` ill-conditioned or its rows dependent),
    ``"face"`` (it has one: :math:`P` singular on :math:`\ker C`) or ``"singular"`` (not
    determined: a sparse system too large for the SVD with a singular :math:`P`)."""

    z: np.ndarray
    residual: float
    cause: str


def range_part(C: Any, v: np.ndarray) -> np.ndarray:
    """The orthogonal projection of ``v`` onto the range of ``C`` (``k`` rows): the part of
    the multiplier right-hand side the adjoint system can meet (the rest lies in
    :math:`\\ker C^\top`, where the multipliers are not determined)."""
    if not v.size or not bool(np.any(v)):
        return v
    if sp.issparse(C):
        t = spla.lsmr(C, v, atol=1e-15, btol=1e-15, maxiter=20 * max(C.shape))[0]
        return np.asarray(C @ t)
    t = np.linalg.lstsq(C, v, rcond=None)[0]
    return C @ t


def moore_penrose_saddle(P: Any, C: Any, rhs: np.ndarray) -> MoorePenrose:
    """:math:`z = K^+ r` for :math:`K = [[P, C^\top], [C, 0]]`, solved on the equilibrated
    matrix :math:`\\hat K = DKD` (:func:`dxopt.linalg.sparse.equilibrate`).

    Up to ``_DENSE_SVD`` unknowns: one SVD of :math:`\\hat K`, the pseudo-inverse solve with
    two refinement steps, then the projection of :math:`z` onto the range of :math:`K` (its
    null space is :math:`D\\ker\\hat K`), so :math:`z` is the Euclidean minimum-norm solution
    wherever the system is consistent. Beyond: :func:`dxopt.linalg.sparse.lstsq_saddle`
    (LSMR). The residual is :math:`\\|D(r - Kz)\\|/\\|Dr\\|`."""
    n = P.shape[0]
    K = saddle_matrix(P, C)
    d = equilibrate(K)
    norm = max(float(np.linalg.norm(d * rhs)), 1e-300)
    N = K.shape[0]
    if N > _DENSE_SVD:
        z, _ = lstsq_saddle(P, C, rhs, target=PINV_NORMAL_LIMIT)
        rel = float(np.linalg.norm(d * (rhs - K @ z))) / norm
        Pc = sp.csc_matrix(P)
        return MoorePenrose(z, rel, "unique" if sparse_positive_definite(Pc) else "singular")
    Kd = K.toarray() if sp.issparse(K) else np.asarray(K)
    Ks = d[:, None] * Kd * d[None, :]
    U, sigma, Vt = np.linalg.svd(Ks)
    keep = sigma > PINV_RANK_TOL * (float(sigma[0]) if sigma.size else 0.0)
    Uk, Vk, inv = U[:, keep], Vt[keep].T, 1.0 / sigma[keep]

    def apply(v: np.ndarray) -> np.ndarray:
        return Vk @ (inv * (Uk.T @ v))

    rhs_s = d * rhs
    y = apply(rhs_s)
    for _ in range(2):  # refinement (the pseudo-inverse of the truncated SVD, re-applied)
        y = y + apply(rhs_s - Ks @ y)
    z = d * y
    null = d[:, None] * Vt[~keep].T  # the null space of K
    cause = "dependent" if null.shape[1] else "unique"
    if null.shape[1]:
        Q, _ = np.linalg.qr(null)
        z = z - Q @ (Q.T @ z)
        if float(np.linalg.norm(Q[:n], axis=0).max()) > PINV_NULL_X_PART:
            cause = "face"
        for _ in range(2):  # the computed null space is exact only to round-off of DKD:
            z = z + d * apply(d * (rhs - Kd @ z))  # restore the residual (the norm moves less)
    rel = float(np.linalg.norm(d * (rhs - Kd @ z))) / norm
    return MoorePenrose(z, rel, cause)


_DENSE_SVD = 3000  # unknowns of K up to which moore_penrose_saddle takes one dense SVD
