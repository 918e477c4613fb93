"""The regular adjoint of a large dense QP (one or a few samples) near one factorization.

For :math:`n \\ge` ``LARGE_N`` the block elimination of :math:`P`
(:func:`dxopt.qp.backward.kkt.regular_dense_adjoint`) costs
:math:`n^3/3 + n^2k + nk^2 + k^3/3` flops, about 5.4 Cholesky factorizations of :math:`P`
at :math:`k = 0.75n` active rows. This path instead, per sample,

1. certifies that the active rows :math:`C = [G_J; A]` are linearly independent
   (:func:`dxopt.linalg.augmented.certify_independent_rows`: every squared pivot of the
   row-normalised Gram test is at least ``100 * DEPENDENT_TOL``, with rigorous round-off
   margins; :math:`k^2n + k^3/3` flops in float64);
2. solves the exact reduced KKT system by flexible GMRES in float64, preconditioned with the
   float32 Cholesky factor of the augmented matrix :math:`P + C^\\top WC`
   (:func:`dxopt.linalg.augmented.augmented_solve`; :math:`(n^2k + n^3/3)` float32 flops plus
   a few :math:`O(n^2)` iterations), and checks the true float64 residual.

Anything it cannot certify or solve (rows dependent or nearly so, a zero row, no row at all,
the float32 factorization failing, a final relative residual above ``max_residual``, the
block elimination's acceptance test too) returns ``None``, and the caller's exact path (block
elimination, with its own dependence test and degenerate policy) runs as before.
The dependence test here is the Euclidean Gram test of
:func:`~dxopt.qp.certify.dependence.count_dependent_dense`, not the :math:`P^{-1}`-metric pivots of
:mod:`dxopt.linalg.schur`: rows independent in one metric and nearly dependent (pivot below
``DEPENDENT_TOL``) in the other can only occur for a very ill-conditioned :math:`P`; this
path then solves the nonsingular system exactly and reports its residual.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dxopt.linalg.augmented import augmented_solve, certify_independent_rows
from dxopt.linalg.threads import blas_threads
from dxopt.qp.backward.rows import dense_rows
from dxopt.qp.certify.dependence import DEPENDENT_TOL
from dxopt.qp.certify.tolerances import GRAM_EIGEN_FLOOR
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput

__all__ = ["LARGE_N", "MAX_BATCH", "large_dense_adjoint", "reused_dense_adjoint"]

LARGE_N = 256  # from this n the augmented path is tried (smaller: the batched Schur path)
MAX_BATCH = 4  # at most this many samples (each is factored on its own)


def large_dense_adjoint(
    data: AdjointInput, active: ActiveSet, *, tol: float, max_residual: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, int] | None:
    """``(u, w_J, w_E, relative residual, GMRES iterations)`` of a large dense batch in which
    every solved sample is certified regular (module docstring), else ``None``."""
    problem = data.problem
    S = data.x.shape[0]
    if problem.n < LARGE_N or S > MAX_BATCH:
        return None
    rows = dense_rows(data, active.used)
    P, C, rhs2 = rows.P.numpy(), rows.C.numpy(), rows.rhs2.numpy()
    g, ok, mask = data.grad_x.numpy(), data.ok.numpy(), rows.mask.numpy()
    k, rows_total = rows.k, C.shape[1]
    if rows_total == 0:
        return None
    u = np.zeros((S, problem.n))
    w = np.zeros((S, rows_total))
    residual = np.zeros(S)
    steps = 0
    with blas_threads():
        for i in np.flatnonzero(ok).tolist():
            keep = np.ones(rows_total, dtype=bool)
            keep[:k] = mask[i]
            C_i = C[i] if keep.all() else C[i][keep]
            if C_i.shape[0] == 0 or not certify_independent_rows(C_i, floor=GRAM_EIGEN_FLOOR):
                return None
            solved = augmented_solve(P if P.ndim == 2 else P[i], C_i, g[i], rhs2[i][keep], tol=tol)
            if solved is None or not solved.residual <= max_residual:
                return None
            u[i], w[i, keep], residual[i] = solved.u, solved.w, solved.residual
            steps = max(steps, solved.iterations)
    w_t = torch.from_numpy(w)
    return (
        torch.from_numpy(u),
        rows.scatter(w_t, problem.m),
        w_t[:, k:],
        torch.from_numpy(residual),
        steps,
    )


def reused_dense_adjoint(
    data: AdjointInput, active: ActiveSet, *, tol: float, max_residual: float, max_steps: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, int] | None:
    """``(u, w_J, w_E, relative residual, refinement steps)`` by block elimination from the
    forward's factors (``data.factors``, :class:`~dxopt.qp.problem.contracts.ForwardFactors`:
    the Cholesky factor :math:`L` of ``P`` and the rows :math:`L^{-1}c_r` of ``[G; A]``, from
    the compiled solver of :mod:`dxopt.qp.solvers.dual_active_set`), else ``None``.

    With :math:`P` already factored and every row already transformed, the Schur complement
    :math:`S = Y_J^\\top Y_J` of the rows :math:`J` the backward uses is the solver's own
    factor of its final working set when :math:`J` is that set (no factorization at all: the
    backward is a few triangular solves, :math:`O(n^2 + nk)`), else one ``dsyrk``
    (:math:`k^2n` flops) and one ``dpotrf`` (:math:`k^3/3`): about 2 Cholesky factorizations
    of ``P`` at :math:`k = 0.75n`, where factoring ``P`` again costs 5.4 (block elimination)
    or 3-4 (the augmented path above). The dependence test is the block elimination's own
    (squared pivots of :math:`S` against ``DEPENDENT_TOL``, :mod:`dxopt.linalg.schur`);
    any sample it does not pass, or a residual above ``max_residual``, returns ``None`` and
    the paths above decide."""
    from dxopt.linalg.small import lapack_kernels
    from dxopt.qp.solvers.kernels.adjoint import reused_adjoint_rows

    problem = data.problem
    if data.factors is None or problem.any_sparse:
        return None
    n, m, p = problem.n, problem.m, problem.p

    def stacked(name: str, rows: int) -> np.ndarray:  # (1 or S, rows, n), float64 views
        if getattr(problem, name) is None:
            return np.zeros((1, rows, n))
        M = problem.array(name)
        return np.ascontiguousarray(M[None] if M.ndim == 2 else M, dtype=np.float64)

    factors = data.factors
    with blas_threads(1):
        status, u, w_ineq, w_eq, residual, steps = reused_adjoint_rows(
            stacked("P", n), stacked("G", m), stacked("A", p), active.used.numpy(),
            data.grad_x.numpy(), data.grad_ineq.numpy(), data.grad_eq.numpy(), data.ok.numpy(),
            factors.chol_P, factors.rows, factors.working_set, factors.schur_chol,
            lapack_kernels(), max_steps, tol, DEPENDENT_TOL,
        )  # fmt: skip
    ok = data.ok.numpy()
    if (status[ok] != 0).any() or not bool((residual[ok] <= max_residual).all()):
        return None
    return (
        torch.from_numpy(u),
        torch.from_numpy(w_ineq),
        torch.from_numpy(w_eq),
        torch.from_numpy(residual),
        int(steps.max(initial=0)),
    )
