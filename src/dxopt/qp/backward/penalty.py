"""Penalty backward (dXPP, Linghu, Liu & Deng, arXiv 2602.14154) with per-row weights.

The solver's :math:`x^\\star` is treated as a root of the gradient of the smoothed exact
penalty :math:`F_\\beta(x) = \\tfrac12 x^\\top Px + q^\\top x
+ \\sum_{i\\in J}\\rho_i\\beta\\,\\mathrm{sp}(s_i/\\beta)
+ \\sum_j \\rho^E_j\\beta[\\mathrm{sp}(r_j/\\beta) + \\mathrm{sp}(-r_j/\\beta)]`
(:math:`s = Gx - h`, :math:`r = Ax - b`, :math:`\\mathrm{sp}(t) = \\log(1 + e^t)`), whose
Hessian is the SPD matrix

.. math:: H = P + G_J^\\top W G_J + A^\\top W_E A,\\qquad
    w_i = \\frac{\\rho_i}{\\beta}\\sigma(s_i/\\beta)(1 - \\sigma(s_i/\\beta)).

Solving :math:`Hv = \\bar x + G_J^\\top W\\bar\\nu_J + A^\\top W_E\\bar\\mu` and setting
:math:`w_J = W(G_J v - \\bar\\nu_J)`, :math:`w_E = W_E(Av - \\bar\\mu)` is exactly the solve of
the *regularised* adjoint system :math:`[[P, G_J^\\top, A^\\top], [G_J, -W^{-1}, 0],
[A, 0, -W_E^{-1}]]`, i.e. dXPP's gradient, with error :math:`O(\\beta)` against the exact
reduced KKT. Beyond the reference:

- **Per-row weights**, row-normalised:
  :math:`\\rho_i\\|g_i\\|^2 = c_P\\max(\\hat\\nu_i/\\hat\\nu_{ref}, \\text{floor})` with
  :math:`\\hat\\nu_i = \\nu_i\\|g_i\\|`, :math:`\\hat\\nu_{ref}` the largest normalised
  multiplier and :math:`c_P` the mean :math:`|P_{ii}|`; so every row's curvature is
  commensurate with :math:`P` whatever the row scaling and the multiplier magnitudes (the
  reference's global :math:`\\rho = 10\\|\\nu\\|_1` makes cond(H) grow with the active count).
- **All-zero multipliers** (:math:`\\hat\\nu_{ref} = 0`): every used row gets the floor weight;
  nothing drops out of :math:`H` discontinuously.
- **β from the achieved accuracy**: :math:`\\beta = \\max(10\\,\\varepsilon, \\beta_{min})`
  with :math:`\\varepsilon` the solver's achieved primal/complementarity error
  (:mod:`dxopt.qp.certify.active`), so :math:`|s_i|/\\beta \\le 0.1` and the weights do not depend
  on
  the solver's noise.
- **Iterative refinement** against the exact reduced KKT: the regularised system is reused as
  a preconditioner (a proximal method-of-multipliers step) until the exact adjoint residual is
  below ``refine_tol`` (error :math:`O(\\beta^{k+1})` after :math:`k` steps, same factorisation);
  ``max_refinement=0`` gives the plain dXPP gradient. The final residual is always checked.
- **Dependent active rows** (LICQ fails): the per-row weights would select a
  :math:`W^{-1}`-weighted multiplier adjoint; such samples instead get the minimum-norm one of
  :mod:`dxopt.qp.certify.dependence`, identical to :class:`~dxopt.qp.KKTBackward`'s.
- **Weakly active rows** follow ``weak_policy`` (see :mod:`dxopt.qp.certify.active`).
- Dense problems with a positive definite :math:`P`, refined (``max_refinement > 0``): the
  refinement converges to the exact reduced-KKT adjoint whatever the preconditioner, so the
  regularisation :math:`W^{-1}` is taken to 0 and the exact block elimination of :math:`P`
  serves (:func:`dxopt.linalg.schur_factor`: Cholesky of :math:`P` and of the
  :math:`k\\times k` Schur complement :math:`CP^{-1}C^\\top`); the refinement typically
  stops after the first solve (an ill-conditioned :math:`P`: after one step, once the residual
  is at the round-off of its evaluation, :data:`~dxopt.qp.certify.tolerances.REFINE_ROUNDOFF`,
  though its relative size stays above ``refine_tol``), and the linear dependence of the
  active rows is read off the same factorization (a batch in which every sample is regular
  this way returns at once: :func:`dxopt.qp.backward.regular.regular_adjoint`, shared with
  the KKT method). One
  large system (:math:`n \\ge 256`, at most four samples) with certified independent active
  rows is first solved exactly by float64 GMRES preconditioned with the float32 augmented
  matrix :math:`P + C^\\top WC` (:mod:`dxopt.qp.backward.dense_large`, also shared).
  Otherwise (``P`` singular or too ill-conditioned for the refinement to converge, or plain
  dXPP with ``max_refinement=0``) one batched Cholesky of :math:`H`
  (``torch.linalg.cholesky_ex`` on (B, n, n)), with a reported jitter if it fails, and the
  Gram test for dependent rows. Sparse problems, refined: likewise the exact reduced KKT
  matrix is the preconditioner of the GMRES refinement (bound-like unit rows eliminated
  exactly, SuperLU of the rest; :class:`~dxopt.qp.backward.penalty_sparse.SparseKKTSolve`), and the
  dependence of the active rows is read off the same unit-row split. Plain dXPP, or where the
  rest is larger than the penalty matrix or its factorization fails: the equality rows are
  kept *exactly* in the saddle-point matrix :math:`[[P + G_J^\\top W G_J, A^\\top], [A, 0]]`
  (the :math:`W_E \\to \\infty` limit), factored by SuperLU with partial pivoting: a dense
  row such as :math:`1^\\top x = 1` neither fills :math:`H` nor slows the refinement (its
  penalty curvature would be spread over all :math:`n` entries while only the support feels
  it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from dxopt.linalg.schur import schur_factor
from dxopt.qp.backward.adjoint import kkt_residual
from dxopt.qp.backward.base import BackwardBase
from dxopt.qp.backward.kkt import KKTBackward, solve_sparse
from dxopt.qp.backward.penalty_sparse import SparseKKTSolve, SparsePenaltySolve, gmres_refine
from dxopt.qp.backward.regular import RegularAdjoint, RegularBudget, check_residual, schur_refine
from dxopt.qp.backward.rows import compress_rows, dense_rows, dependent_rows_sparse, gather_rows
from dxopt.qp.certify.dependence import (
    DEPENDENT_TOL,
    count_dependent_dense,
    min_norm_dense,
    record_degenerate,
    refine_schur,
)
from dxopt.qp.certify.tolerances import PENALTY_PRECONDITIONER_BETA
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput, AdjointSolution
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = ["PenaltyBackward"]


@dataclass(frozen=True, kw_only=True)
class PenaltyBackward(BackwardBase):
    """dXPP penalty backward with per-row weights, accuracy-derived β and refinement.

    Args:
        beta: smoothing :math:`\\beta`; ``None`` derives it per sample from the accuracy the
            solver reached, :math:`\\max(10\\varepsilon, \\beta_{min})`.
        beta_min: lower bound of the derived β.
        active_tol: normalised-slack threshold of the active set; ``None`` uses the forward's
            certified active set.
        weak_policy: ``"inactive"`` (default), ``"active"`` or ``"raise"`` for rows with zero
            slack and zero multiplier.
        weight_floor: floor of the relative per-row weight
            :math:`\\hat\\nu_i/\\hat\\nu_{ref}`.
        linear_solver: ``"auto"`` (batched Cholesky for dense problems, SuperLU on the
            saddle-point matrix with exact equality rows plus GMRES for sparse ones),
            ``"dense"`` or ``"sparse"``.
        max_refinement: most refinement steps against the exact reduced KKT (0: plain dXPP).
        refine_tol: refinement stops once the relative adjoint residual is below this (the
            block elimination's also once the residual is at the round-off of its evaluation,
            :data:`~dxopt.qp.certify.tolerances.REFINE_ROUNDOFF`).
        max_residual: if the final relative residual of the exact adjoint system exceeds this,
            the ``degenerate`` policy applies. With ``max_refinement=0`` the check is skipped
            (plain dXPP has an O(β) residual by design).
        degenerate: ``"auto"`` (default), ``"min_norm"``, ``"vertex"`` or ``"raise"``: what
            dependent active rows and a singular reduced KKT matrix get, the same policy as
            :class:`~dxopt.qp.KKTBackward`'s (:class:`~dxopt.qp.BackwardBase`).
    """

    beta: float | None = None
    beta_min: float = 1e-8
    weight_floor: float = 1e-2
    max_refinement: int = 25
    refine_tol: float = 1e-13

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"beta: expected a positive float or None, got {self.beta!r}.")
        if self.max_refinement < 0:
            raise ValueError(f"max_refinement: expected >= 0, got {self.max_refinement}.")

    @property
    def name(self) -> str:
        return "penalty"

    def _beta(self, data: AdjointInput, active: ActiveSet) -> Tensor:
        if self.beta is None:
            return torch.clamp(10.0 * active.accuracy, min=self.beta_min)
        return torch.full((data.x.shape[0],), self.beta, dtype=torch.float64)

    def weights(
        self, data: AdjointInput, active: ActiveSet, *, beta_floor: float = 0.0
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-sample β (S,), inequality weights W (S, m) (zero off J) and W_E (S, p);
        ``beta_floor`` bounds β below (the weights above) when the penalty matrix is only the
        refinement's preconditioner."""
        problem = data.problem
        S = data.x.shape[0]
        beta = self._beta(data, active).clamp_min(beta_floor)
        if problem.is_sparse("P"):
            idx, val = problem.P.indices(), problem.P.values()
            c_P = (val[idx[0] == idx[1]].abs().sum() / problem.n).expand(S)
        else:
            c_P = problem.P.diagonal(dim1=-2, dim2=-1).abs().mean(-1).expand(S)
        c_P = torch.where(c_P > 0, c_P, torch.ones_like(c_P))
        used = active.used.to(torch.float64)
        nu_hat = data.ineq_duals * active.g_norm * used if active.g_norm is not None else None
        mu_hat = data.eq_duals.abs() * active.a_norm if active.a_norm is not None else None
        ref = torch.zeros(S, dtype=torch.float64)
        if nu_hat is not None and nu_hat.shape[-1]:
            ref = torch.maximum(ref, nu_hat.amax(-1))
        if mu_hat is not None and mu_hat.shape[-1]:
            ref = torch.maximum(ref, mu_hat.amax(-1))
        ref = torch.where(ref > 0, ref, torch.ones_like(ref))
        W = torch.zeros(S, problem.m, dtype=torch.float64)
        W_E = torch.zeros(S, problem.p, dtype=torch.float64)
        if nu_hat is not None and problem.G is not None and active.g_norm is not None:
            rho = c_P[:, None] * torch.clamp(nu_hat / ref[:, None], min=self.weight_floor)
            s = -active.slack if active.slack is not None else torch.zeros_like(W)
            sig = torch.sigmoid(s / beta[:, None])
            W = rho * sig * (1 - sig) / beta[:, None] / active.g_norm**2
            W = torch.where(active.used, W, torch.zeros_like(W))  # zero rows: 0 * inf
        if mu_hat is not None and problem.A is not None and active.a_norm is not None:
            rho_e = c_P[:, None] * torch.clamp(mu_hat / ref[:, None], min=self.weight_floor)
            r = active.eq_residual if active.eq_residual is not None else torch.zeros_like(W_E)
            sp_, sm = torch.sigmoid(r / beta[:, None]), torch.sigmoid(-r / beta[:, None])
            W_E = rho_e * (sp_ * (1 - sp_) + sm * (1 - sm)) / beta[:, None] / active.a_norm**2
        return beta, W, W_E

    def regular_budget(self) -> RegularBudget | None:
        if self.max_refinement == 0:  # plain dXPP keeps the penalty matrix
            return None
        return RegularBudget(self.refine_tol, self.max_refinement, self.max_residual)

    def exact_fallback(self) -> BackwardBase | None:
        return KKTBackward(linear_solver=self.linear_solver, max_residual=self.max_residual)

    def _record_regular(
        self,
        data: AdjointInput,
        active: ActiveSet,
        solved: RegularAdjoint,
        diagnostics: BackwardDiagnostics,
    ) -> None:
        diagnostics.jitter = 0.0
        diagnostics.refinement_steps = solved.steps
        diagnostics.beta = tuple(self._beta(data, active).tolist())

    def _adjoint(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """Factor the penalty system once, then refine against the exact reduced KKT."""
        problem = data.problem
        if not self.use_sparse(problem):
            return self._dense_adjoint(data, active, diagnostics)
        # sparse branch (owner: task "sparse"): refined, the exact reduced KKT matrix is the
        # preconditioner (the refinement's limit does not depend on it); else the penalty one
        exact = SparseKKTSolve(data, active.used) if self.max_refinement > 0 else None
        if exact is not None and exact.error is not None:
            # the exact reduced KKT matrix of these rows is singular: the refinement against
            # it cannot reach round-off either, so no penalty matrix is factored for it (on
            # Maros-Meszaros CVXQP3_L a second 27 s LU); the caller's fallbacks take over
            raise exact.error
        if exact is not None:
            dependent = exact.dependent
        else:
            dependent = dependent_rows_sparse(data, active.used)
        record_degenerate(diagnostics, dependent, "penalty")
        degenerate = dependent > 0
        regular = replace(data, ok=data.ok & ~degenerate)
        solve: SparseKKTSolve | SparsePenaltySolve
        if exact is not None and exact.usable:
            beta, solve = self._beta(data, active), exact
        else:
            # refined, the penalty matrix only preconditions GMRES: weights up to about 2.5e5
            # times P's scale keep it factorable (at beta = 1e-8 the regularised SuperLU
            # factor's refinement stalled on chains at n = 1e5 and the exact KKT fallback
            # factored a second, larger matrix: 0.48 s against 0.23 s)
            floor = PENALTY_PRECONDITIONER_BETA if self.max_refinement > 0 else 0.0
            beta, W, W_E = self.weights(data, active, beta_floor=floor)
            solve = SparsePenaltySolve(regular, active, W, W_E)
        diagnostics.linear_solver, diagnostics.jitter = solve.name, 0.0
        u, w_ineq, w_eq, steps = gmres_refine(
            regular, active, solve, tol=self.refine_tol, max_iterations=self.max_refinement
        )
        if bool(degenerate.any()):  # the minimum-norm adjoint, shared with KKTBackward
            u_d, wi_d, we_d, _ = solve_sparse(replace(data, ok=degenerate), active.used)
            col = degenerate[:, None]
            u, w_ineq = torch.where(col, u_d, u), torch.where(col, wi_d, w_ineq)
            w_eq = torch.where(col, we_d, w_eq)
        *_, residual = kkt_residual(data, active, u, w_ineq, w_eq)
        return self._finish(data, active, beta, u, w_ineq, w_eq, residual, steps, diagnostics)

    def _dense_adjoint(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """Dense batch: block elimination of a positive definite :math:`P` with refinement
        (:mod:`dxopt.linalg.schur`), else the Cholesky of :math:`H` (module docstring);
        dependent rows get the minimum-norm adjoint."""
        problem = data.problem
        S = data.x.shape[0]
        rows = dense_rows(data, active.used)
        # plain dXPP (no refinement) keeps the penalty matrix H itself
        factor = schur_factor(rows.P, rows.C) if self.max_refinement > 0 else None
        solved = None
        if factor is not None:
            u, w, residual, steps = schur_refine(
                rows, factor, data.grad_x, data.ok, self.max_refinement, self.refine_tol
            )
            dependent = factor.dependent(DEPENDENT_TOL) * data.ok
            # a Cholesky of a nearly singular P can be too inaccurate for the refinement to
            # converge: then the penalty matrix H (better conditioned) is factored instead
            if not bool(((residual > self.max_residual) & (dependent == 0)).any()):
                solved = (u, w, residual, steps, dependent)
                beta = self._beta(data, active)
                diagnostics.linear_solver, diagnostics.jitter = "schur", 0.0
        if solved is None:
            beta, W, W_E = self.weights(data, active)
            dense = _DenseSolve(data, active, W, W_E)
            diagnostics.linear_solver, diagnostics.jitter = dense.name, dense.jitter
            u, w, residual, steps = dense.refine(
                data.grad_x, rows.rhs2, data.ok, self.max_refinement, self.refine_tol
            )
            dependent = count_dependent_dense(dense.C) * data.ok
        else:
            u, w, residual, steps, dependent = solved
        record_degenerate(diagnostics, dependent, "penalty")
        degenerate = dependent > 0
        k = rows.k
        if bool(degenerate.any()):
            P = rows.P if rows.P.ndim == 3 else rows.P.expand(S, -1, -1)
            u_d, w_d, *_ = min_norm_dense(
                P[degenerate],
                rows.C[degenerate],
                data.grad_x[degenerate],
                rows.rhs2[degenerate],
            )
            u, w = u.clone(), w.clone()
            u[degenerate], w[degenerate] = u_d, w_d
        w_ineq = torch.zeros(S, problem.m, dtype=torch.float64)
        if k:
            w_ineq.scatter_(1, rows.index, w[:, :k] * rows.mask)
        if bool(degenerate.any()):
            *_, residual = kkt_residual(data, active, u, w_ineq, w[:, k:])
        return self._finish(data, active, beta, u, w_ineq, w[:, k:], residual, steps, diagnostics)

    def _finish(
        self,
        data: AdjointInput,
        active: ActiveSet,
        beta: Tensor,
        u: Tensor,
        w_ineq: Tensor,
        w_eq: Tensor,
        residual: Tensor,
        steps: int,
        diagnostics: BackwardDiagnostics,
    ) -> AdjointSolution:
        diagnostics.method = "penalty"
        diagnostics.residual = _max(residual)
        diagnostics.refinement_steps = steps
        diagnostics.beta = tuple(beta.tolist())
        diagnostics.n_active = active.n_active
        diagnostics.n_weak = active.n_weak
        if self.max_refinement > 0:
            check_residual(residual, self.max_residual, "penalty backward")
        return AdjointSolution(u, w_ineq * active.used, w_eq, active, residual)


class _DenseSolve:
    """Batched Cholesky of :math:`H = P + C^\\top D C` with the stacked constraint rows
    :math:`C = [G_J; A]` (rows off :math:`J` zeroed) and weights :math:`D = [W; W_E]`, and the
    refinement loop against the exact adjoint system :math:`[[P, C^\\top], [C, 0]]`."""

    name = "cholesky"

    def __init__(self, data: AdjointInput, active: ActiveSet, W: Tensor, W_E: Tensor) -> None:
        problem = data.problem
        S, n = data.x.shape[0], problem.n
        self.index, self.mask = compress_rows(active.used)
        mask = self.mask.to(torch.float64)
        blocks: list[Tensor] = []
        weights: list[Tensor] = []
        if problem.G is not None:
            blocks.append(gather_rows(problem.G, self.index) * mask[..., None])
            weights.append(W.gather(1, self.index) * mask)
        if problem.A is not None:
            blocks.append(problem.A if problem.A.ndim == 3 else problem.A.expand(S, -1, -1))
            weights.append(W_E)
        self.C = torch.cat(blocks, 1) if blocks else torch.zeros(S, 0, n, dtype=torch.float64)
        self.D = torch.cat(weights, 1) if weights else torch.zeros(S, 0, dtype=torch.float64)
        self.P = problem.P if problem.P.ndim == 3 else problem.P.expand(S, n, n)
        # Cholesky reads only the lower triangle, so no explicit symmetrisation is needed
        H = torch.baddbmm(self.P, self.C.transpose(-1, -2), self.D[..., None] * self.C)
        if not bool(data.ok.all()):
            H = torch.where(data.ok[:, None, None], H, torch.eye(n, dtype=torch.float64))
        L, info = torch.linalg.cholesky_ex(H)
        self.jitter = 0.0
        if bool((info != 0).any()):
            scale = H.diagonal(dim1=-2, dim2=-1).abs().amax(-1).clamp_min(1.0)
            for tau in (1e-12, 1e-10, 1e-8):
                shift = (tau * scale)[:, None, None] * torch.eye(n, dtype=torch.float64)
                L, info = torch.linalg.cholesky_ex(H + shift)
                self.jitter = tau * float(scale.max())
                if not bool((info != 0).any()):
                    self.name = "cholesky+jitter"
                    break
            else:
                bad = torch.nonzero(info != 0).flatten().tolist()
                raise QPBackwardError(
                    f"penalty backward: H = P + G_J'WG_J + A'W_EA is not positive definite at "
                    f"batch indices {bad} even with jitter; P is singular on the null space of "
                    "the active rows. Regularise P or check the problem."
                )
        self.L = L

    def refine(
        self, grad_x: Tensor, rhs2: Tensor, ok: Tensor, max_steps: int, tol: float
    ) -> tuple[Tensor, Tensor, Tensor, int]:
        """Solve :math:`[[P, C^\\top], [C, 0]][u; w] = [\\bar x; r]` by refinement."""
        return refine_schur(self.P, self.C, self.D, self.L, grad_x, rhs2, ok, max_steps, tol)


def _max(t: Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0
