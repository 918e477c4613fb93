"""The shared base of the backward methods and the degenerate-problem fallback.

A backward method turns the saved solution and the output cotangents into the adjoint
:math:`(u, w_J, w_E)` of the reduced KKT system (:mod:`dxopt.qp.backward.adjoint`). Anything with a
``name`` and a ``solve_adjoint(data, diagnostics)`` method is one (the
:class:`~dxopt.qp.problem.contracts.BackwardMethod` protocol); :class:`BackwardBase` is the
convenient
way to write one: it validates the common options, identifies the active set and hands the
problem to ``_adjoint``, and it owns the policy for degenerate problems. Weakly active rows that
lie in the span of the active rows (a duplicated row whose multiplier the backend put on the
other copy) join the active set first (:func:`dxopt.qp.certify.dependence.dependent_weak_rows`), so
LICQ detection does not depend on the backend. A dense batch in which every solved sample is
regular (independent active rows, positive definite :math:`P`, refined residual within
``max_residual``) is solved by the method's ``_regular_adjoint`` (one batched block
elimination) before any of the policy below applies; the result is the one the general path
gives on such a batch.

**Degenerate problems** (``degenerate="auto"``, the default). Where the regular path declines,
:meth:`BackwardBase.degenerate_rule` fixes the rows and multipliers from the point and the
active set alone (never from the backend's multipliers or the cotangents;
:mod:`dxopt.qp.backward.degenerate_rule`): dependent active rows (LICQ fails) are reduced to the
minimum-cost vertex of the multiplier set (:func:`dxopt.qp.backward.vertex.vertex_rows`: the
derivative of one affine piece, an element of the B-subdifferential), except where the only
dependencies are parallel copies of rows (duplicated or opposite rows), which keep the
minimum-norm multiplier adjoint (the equal split between the copies, inside Clarke's hull).
``degenerate="min_norm"`` uses the minimum-norm adjoint for every dependency; for general
dependent rows it can lie outside the hull of the one-sided derivatives (rows
:math:`e_1, e_2, e_1 + e_2`). The gradient formulas for ``G`` and ``A`` use the rule's
minimum-norm multipliers on the final rows (the vertex's own multipliers, the equal split on
copies), and on minimum-norm samples the multiplier cotangents are projected onto the range of
the rows (the adjoint is then :math:`K^+` applied to them, exactly the transpose of the
tangent solve). When only :math:`\bar q, \bar P` are wanted, any basis of the row space gives
the same adjoint: the dependent rows are dropped in one batched factorization (the
decision-focused QPs of ``benchmarks/qp_speed/qptl.py``). Samples too big for a dense null space
get the minimum-cost vertex by linear programming, completed to a basis of the active rows
(:func:`dxopt.qp.backward.vertex.lp_vertex`). A vertex keeps the row space of the active rows, so
it determines :math:`x` wherever the full active set does; should its solve fail nonetheless,
the full set's minimum-norm adjoint is used. One :class:`~dxopt.qp.QPDegenerateWarning` with a
stable text per rule that ran, attributed to the user's line (once per call site under
Python's default filter); the counts are in ``BackwardDiagnostics.dependent_rows`` /
``vertex_dropped``.
A method whose own solve is an iterative refinement (the penalty backward) can stall on a
nonsingular :math:`K` (dependent rows of very different norms, long ill-conditioned chains of
rows as on Maros-Meszaros STADAT2/3); its failure is then arbitrated by the exact reduced-KKT
solve of :class:`~dxopt.qp.KKTBackward` on the same rows before any fallback
(``BackwardDiagnostics.method`` says ``"kkt"``).
When the reduced KKT matrix :math:`K = [[P, C^\\top], [C, 0]]` is singular for another reason,
i.e. :math:`P` is singular on :math:`\\ker C`, the method's exact solve fails its residual
check. Two cases:

1. With ``weak_policy="inactive"`` the weakly active rows (zero slack, zero multiplier) were
   left out; on LP-like problems those rows are what pins :math:`x` (a degenerate vertex). They
   are then kept as equalities (the derivative on the face, an element of the
   B-subdifferential), ``BackwardDiagnostics.weak_kept`` is set and a warning is issued.
2. Otherwise (or if that is still singular) the solution is not unique and no derivative of
   "the" solution exists; the adjoint becomes the Moore-Penrose one,

.. math:: [u; w] = K^+ [\\bar x; \\bar\\nu_J; \\bar\\mu]
    = \\lim_{\\varepsilon\\to 0}(K^2 + \\varepsilon I)^{-1}K[\\bar x; \\bar\\nu_J; \\bar\\mu],

the minimum-norm least-squares solution of the adjoint system (dense: SVD; sparse: LSMR), the
same for the dense and the sparse path. On a nonsingular :math:`K` it is the exact adjoint.
The samples are flagged in ``BackwardDiagnostics.pseudo_inverse`` and a
:class:`~dxopt.qp.QPDegenerateWarning` is issued; ``degenerate="raise"`` keeps the strict
behaviour (:class:`~dxopt.qp.QPBackwardError`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from dxopt.linalg.sparse import lstsq_saddle
from dxopt.linalg.threads import small_work
from dxopt.qp.backward.adjoint import kkt_residual
from dxopt.qp.backward.degenerate_rule import (
    DegenerateRule,
    dependent_flags_dense,
    dependent_weak_rows_dense,
    independent_rows_dense,
    project_multiplier_rhs,
    rule_multipliers,
    warn_degenerate,
)
from dxopt.qp.backward.rows import (
    active_rows_sparse,
    dense_rows,
    dependent_rows_sparse,
    scipy_matrix,
)
from dxopt.qp.backward.vertex import vertex_rows
from dxopt.qp.certify.active import WEAK_POLICIES, ActiveSet, identify_active
from dxopt.qp.certify.dependence import count_dependent_dense, dependent_weak_rows
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import AdjointInput, AdjointSolution
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = ["DEGENERATE_POLICIES", "BackwardBase", "pseudo_inverse_adjoint"]

DEGENERATE_POLICIES = ("auto", "min_norm", "vertex", "raise")
_NORMAL_LIMIT = 1e-9  # relative residual of the normal equations accepted for K^+ r
_SMALL_SAMPLE = 2e7  # n^2 (n + m + p) per sample below which the backward runs on one thread


@dataclass(frozen=True, kw_only=True)
class BackwardBase:
    """Options shared by every backward method.

    Args:
        linear_solver: ``"auto"`` (dense for dense problems, sparse when a matrix is sparse),
            ``"dense"`` or ``"sparse"``.
        active_tol: slack threshold (row-normalised) of the active set; ``None`` uses the
            forward's certified (polished) active set.
        weak_policy: ``"inactive"`` (default), ``"active"`` or ``"raise"`` for rows with zero
            slack and zero multiplier (see :mod:`dxopt.qp.certify.active`).
        max_residual: largest accepted relative residual of the adjoint system; beyond it the
            degenerate policy applies.
        degenerate: ``"auto"`` (default: ``"vertex"`` except where the only dependencies are
            duplicated/opposite rows, which keep ``"min_norm"``; module docstring),
            ``"vertex"`` (dependent active inequality rows are dropped down to a vertex of the
            multiplier set, :func:`dxopt.qp.backward.vertex.vertex_rows`: an element of the
            B-subdifferential), ``"min_norm"`` (the minimum-norm multiplier adjoint for every
            dependency) or ``"raise"``.
    """

    linear_solver: str = "auto"
    active_tol: float | None = None
    weak_policy: str = "inactive"
    max_residual: float = 1e-8
    degenerate: str = "auto"

    _exact_method: ClassVar[type[BackwardBase] | None] = None
    """The exact reduced-KKT method of :meth:`_adjoint_or_exact`, registered by the subclass
    that declares itself with ``class KKTBackward(BackwardBase, exact_fallback=True)`` (this
    module sits below the methods and never imports one)."""

    def __init_subclass__(cls, *, exact_fallback: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if exact_fallback:
            BackwardBase._exact_method = cls

    def __post_init__(self) -> None:
        if self.linear_solver not in ("auto", "dense", "sparse"):
            raise ValueError(
                f"linear_solver: expected 'auto', 'dense' or 'sparse', got {self.linear_solver!r}."
            )
        if self.weak_policy not in WEAK_POLICIES:
            raise ValueError(
                f"weak_policy: expected one of {WEAK_POLICIES}, got {self.weak_policy!r}."
            )
        if self.degenerate not in DEGENERATE_POLICIES:
            raise ValueError(
                f"degenerate: expected one of {DEGENERATE_POLICIES}, got {self.degenerate!r}."
            )
        if self.active_tol is not None and not self.active_tol >= 0:
            raise ValueError(f"active_tol: expected a float >= 0 or None, got {self.active_tol}.")
        if not self.max_residual > 0:
            raise ValueError(f"max_residual: expected > 0, got {self.max_residual!r}.")

    @property
    def name(self) -> str:
        raise NotImplementedError

    def use_sparse(self, problem: QPProblem) -> bool:
        return self.linear_solver == "sparse" or (
            self.linear_solver == "auto" and problem.any_sparse
        )

    def _adjoint(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        raise NotImplementedError

    def _adjoint_or_exact(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """:meth:`_adjoint`, or where it fails its residual check the exact reduced-KKT solve
        of :class:`~dxopt.qp.KKTBackward` on the same rows (an iterative refinement can stall
        on a nonsingular :math:`K`; ``diagnostics.method`` then says ``"kkt"``). The method's
        own error is raised if both fail."""
        try:
            return self._adjoint(data, active, diagnostics)
        except QPBackwardError as err:
            exact_method = BackwardBase._exact_method
            if self.name == "kkt" or exact_method is None:
                raise
            exact = exact_method(linear_solver=self.linear_solver, max_residual=self.max_residual)
            try:
                out = exact._adjoint(data, active, diagnostics)
            except QPBackwardError:
                raise err from None
            diagnostics.refinement_steps = 0
            return out

    def _regular_adjoint(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution | None:
        """The adjoint of a dense batch in which every solved sample is regular (independent
        active rows, positive definite ``P``), or ``None`` (then the general path runs)."""
        return None

    def solve_adjoint(
        self, data: AdjointInput, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """Identify the active set, solve the adjoint, apply the degenerate policy (on one
        intra-op thread when each sample is small, :func:`dxopt.linalg.small_work`: batched
        small factorizations gain nothing from intra-op threads and lose badly to
        oversubscription on a loaded machine)."""
        problem = data.problem
        per_sample = problem.n * problem.n * (problem.n + problem.m + problem.p)
        with small_work(float(per_sample), limit=_SMALL_SAMPLE):
            return self._solve_adjoint(data, diagnostics)

    def _solve_adjoint(
        self, data: AdjointInput, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        active = self._identify(data)
        diagnostics.pseudo_inverse = (False,) * data.x.shape[0]
        diagnostics.weak_kept = False
        diagnostics.vertex_dropped = (0,) * data.x.shape[0]
        diagnostics.dropped_rows = ((),) * data.x.shape[0]
        diagnostics.dependent_rows, diagnostics.licq = (0,) * data.x.shape[0], True
        if data.settled is not None and (~data.settled.numpy() & data.ok.numpy()).any():
            diagnostics.unsettled = tuple(bool(not v) for v in data.settled)
            warn_degenerate(
                f"{self.name} backward: some solutions were certified only by their duality gap "
                "(the polish failed; some rows have slack and multiplier both small), so the "
                "active set is a guess and the gradient is one of the one-sided derivatives at "
                "best. Tighten eps_abs or check the problem. Per sample: "
                "sol.info.backward.unsettled."
            )
        # the common dense case (LICQ holds, P positive definite, the refined solve converges):
        # batched Schur solves (up to three groups of similar active counts); anything else
        # takes the general path below
        q_only_weak = self._q_only(data, active) and bool((active.weak & ~active.used).any())
        if not (self.use_sparse(data.problem) or q_only_weak):
            regular = self._regular_adjoint(data, active, diagnostics)
            if regular is not None:
                return regular
        try:
            return self._degenerate_adjoint(data, active, diagnostics)
        except QPBackwardError as err:
            if self.degenerate == "raise":
                raise
            cause = err
        if self.weak_policy == "inactive" and bool((active.weak & ~active.used).any()):
            # dropping the weak rows left x undetermined: keep them (the face derivative)
            kept = replace(active, used=active.used | active.weak)
            try:
                out = self._degenerate_adjoint(data, kept, diagnostics, warn=False)
                diagnostics.weak_kept = True
                warn_degenerate(
                    f"{self.name} backward: P is singular on the null space of the strongly "
                    "active rows, so the weakly active rows (zero slack, zero multiplier) are "
                    "kept as equalities to determine the derivative (see BackwardDiagnostics."
                    "weak_kept)."
                )
                return _rule_multipliers(data, out)
            except QPBackwardError as err:
                cause = err
        out = pseudo_inverse_adjoint(data, active, diagnostics, self.name, cause)
        return _rule_multipliers(data, out)

    def _identify(self, data: AdjointInput) -> ActiveSet:
        """The active set of the backward: the forward's (polished) rows, with the weakly
        active rows in the span of the active ones joining them (so that LICQ detection and
        the degenerate rule do not depend on which copy of a duplicated row the backend put
        the multiplier on); ``data.rule_fixed``: the rows in ``data.active`` as they are."""
        active = identify_active(
            data.problem,
            data.x,
            data.eq_duals,
            data.ineq_duals,
            active_tol=None if data.rule_fixed else self.active_tol,
            weak_policy=self.weak_policy,
            forward_active=data.active,
        )
        if data.rule_fixed and data.active is not None:
            return replace(active, used=data.active & data.ok[:, None])
        if self.weak_policy == "inactive" and (active.weak.numpy() & ~active.used.numpy()).any():
            if self._q_only(data, active) and not data.problem.any_sparse:
                return active  # degenerate_rule counts them with its one factorization
            if data.problem.any_sparse:
                adopt = dependent_weak_rows(data.problem, active.used, active.weak & ~active.used)
            else:
                adopt = dependent_weak_rows_dense(
                    data.problem, active.used, active.weak & ~active.used
                )
            if bool(adopt.any()):  # duplicated/dependent weak rows join the active set
                active = replace(active, used=active.used | adopt, adopted=adopt)
        return active

    def _q_only(self, data: AdjointInput, active: ActiveSet) -> bool:
        """Only dL/dq and dL/dP are wanted (no row gradients, zero multiplier cotangents): the
        degenerate rule's choice of rows cannot change them (same row space, same u)."""
        return not (data.needs_rows or data.rule_fixed or bool(_dual_rhs(data, active.used).any()))

    def degenerate_rule(
        self, data: AdjointInput, active: ActiveSet | None = None
    ) -> DegenerateRule:
        """The rows and multipliers of the degenerate rule (:mod:`.degenerate_rule`)
        for the active set ``active`` (``None``: identified from ``data``). It depends on the
        point, the problem and the rows only, never on the cotangents, so the vjp and the jvp
        (:mod:`dxopt.qp.autograd.tangent`) use the same linear map."""
        if active is None:
            active = self._identify(data)
        problem, ok = data.problem, data.ok
        S = data.x.shape[0]
        zero = torch.zeros(S, dtype=torch.int64)
        used, dropped = active.used, zero
        q_only = self._q_only(data, active)
        left: Tensor | None = None
        if q_only and not problem.any_sparse:
            # only dL/dq, dL/dP: every rule gives the same u; drop dependent rows cheaply (one
            # batched Cholesky gives the counts, the rows and the weak rows in their span)
            weak = active.weak & ~active.used if self.weak_policy == "inactive" else None
            counts, used, left, adopt = independent_rows_dense(problem, active.used, ok, weak)
            if bool(adopt.any()):
                active = replace(active, used=active.used | adopt, adopted=adopt)
        else:
            counts = _dependent_counts(data, active.used)
        vertex = self.degenerate in ("auto", "vertex") and not (q_only or data.rule_fixed)
        if vertex and bool((counts > 0).any()):
            used, dropped = vertex_rows(
                problem, active.used, data.ineq_duals, data.eq_duals, (counts == 0) | ~ok,
                keep_parallel=self.degenerate == "auto",
            )  # fmt: skip
        if left is None:
            changed = (used != active.used).any(-1)
            left = counts.clone()
            if bool(changed.any()):
                left[changed] = _dependent_counts(data, used, changed)[changed]
        nu, mu = data.ineq_duals, data.eq_duals
        if data.needs_rows:
            nu, mu = rule_multipliers(problem, data.x, used, (counts > 0) & ok, nu, mu)
        return DegenerateRule(
            replace(active, used=used), active.used, counts, dropped, left, nu, mu, q_only
        )

    def _degenerate_adjoint(
        self,
        data: AdjointInput,
        active: ActiveSet,
        diagnostics: BackwardDiagnostics,
        *,
        warn: bool = True,
    ) -> AdjointSolution:
        """The adjoint on the rows of :meth:`degenerate_rule`: the vertex's independent rows,
        or (minimum-norm samples) the dependent rows with the multiplier right-hand side
        projected onto their range. Should the vertex's solve fail (round-off), the full
        rows' minimum-norm adjoint is used."""
        rule = self.degenerate_rule(data, active)
        if not bool((rule.counts > 0).any()):
            if not self.use_sparse(data.problem):
                regular = self._regular_adjoint(data, rule.active, diagnostics)
                if regular is not None:
                    return regular
            return self._adjoint_or_exact(data, rule.active, diagnostics)
        dual_rhs = _dual_rhs(data, rule.active.used)
        reduced = None
        if not (data.needs_rows or bool(dual_rhs.any())) and bool((rule.left > 0).any()):
            reduced = _independent_equalities(data)
        try:
            if reduced is not None:  # dL/dq, dL/dP only: the dependent equality rows go too
                sub, keep = reduced
                zero = torch.zeros_like(rule.left)
                out = self._solve_projected(sub, rule.active, zero, dual_rhs, diagnostics)
                w_eq = torch.zeros_like(data.grad_eq)
                w_eq[:, keep] = out.w_eq
                out = replace(out, w_eq=w_eq)
            else:
                out = self._solve_projected(data, rule.active, rule.left, dual_rhs, diagnostics)
            dropped = rule.dropped
        except QPBackwardError:
            if not bool((rule.active.used != rule.full).any()):
                raise
            full = replace(rule.active, used=rule.full)
            out = self._solve_projected(data, full, rule.counts, _dual_rhs(data, rule.full),
                                        diagnostics)  # fmt: skip
            dropped = torch.zeros_like(rule.dropped)
        self.record_rule(replace(rule, dropped=dropped), diagnostics, warn=warn)
        if not data.needs_rows:
            return out
        return replace(out, ineq_duals=rule.ineq_duals, eq_duals=rule.eq_duals)

    def _solve_projected(
        self,
        data: AdjointInput,
        active: ActiveSet,
        left: Tensor,
        dual_rhs: Tensor,
        diagnostics: BackwardDiagnostics,
    ) -> AdjointSolution:
        project = (left > 0) & dual_rhs & data.ok
        if bool(project.any()):
            gi, ge = project_multiplier_rhs(
                data.problem, active.used, data.grad_ineq, data.grad_eq, project
            )
            data = replace(data, grad_ineq=gi, grad_eq=ge)
        if not bool((left > 0).any()) and not self.use_sparse(data.problem):
            regular = self._regular_adjoint(data, active, diagnostics)  # independent rows
            if regular is not None:
                return regular
        return self._adjoint_or_exact(data, active, diagnostics)

    def record_rule(
        self, rule: DegenerateRule, diagnostics: BackwardDiagnostics, *, warn: bool = True
    ) -> None:
        """Put the rule's per-sample counts in ``diagnostics`` and issue its warning (one
        stable message per rule that ran: Python's filter shows it once per call site)."""
        if not bool((rule.counts > 0).any()):
            return
        diagnostics.dependent_rows = tuple(int(c) for c in rule.counts)
        diagnostics.licq = False
        diagnostics.vertex_dropped = tuple(int(c) for c in rule.dropped)
        gone = (rule.full & ~rule.active.used).numpy()
        diagnostics.dropped_rows = tuple(
            tuple(int(j) for j in np.flatnonzero(row)) if c else ()
            for row, c in zip(gone, rule.dropped.tolist())
        )
        if not warn:
            return
        if rule.q_only:
            warn_degenerate(
                f"{self.name} backward: the active constraint rows are linearly dependent "
                "(LICQ fails); only dL/dq and dL/dP are requested, and these do not depend on "
                "the choice of multipliers (exact). Per-sample counts: "
                "sol.info.backward.dependent_rows."
            )
            return
        self._warn_rule(rule.dropped, rule.counts - rule.dropped)

    def _warn_rule(self, dropped: Tensor, left: Tensor) -> None:
        if bool((dropped > 0).any()):
            warn_degenerate(
                f"{self.name} backward: the active constraint rows are linearly dependent "
                f"(LICQ fails); dependent inequality rows were dropped to a vertex of the "
                f"multiplier set (degenerate={self.degenerate!r}), so the gradient is the "
                "derivative of one affine piece (a B-subdifferential element). Per sample: "
                "sol.info.backward.dependent_rows, .vertex_dropped and .dropped_rows (the "
                "rows of G dropped)."
            )
        if bool((left > 0).any()):
            warn_degenerate(
                f"{self.name} backward: the active constraint rows are linearly dependent "
                "(LICQ fails); the multiplier adjoint is not unique and the minimum-norm one "
                "is used (dL/dq and dL/dP are exact; the b/h/A/G gradients are the "
                "minimum-norm choice with the minimum-norm multipliers, the equal split on "
                "duplicated rows; for general dependent rows degenerate='vertex' returns a "
                "B-subdifferential element). Per-sample counts: "
                "sol.info.backward.dependent_rows."
            )


def _independent_equalities(data: AdjointInput) -> tuple[AdjointInput, Tensor] | None:
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


def _rule_multipliers(data: AdjointInput, out: AdjointSolution) -> AdjointSolution:
    """``out`` with the rule's multipliers (minimum-norm on its rows) where those rows are
    dependent and none were chosen yet (the fallbacks: weak rows kept, pseudo-inverse)."""
    if not data.needs_rows or out.ineq_duals is not None:
        return out
    counts = _dependent_counts(data, out.active.used)
    if not bool((counts > 0).any()):
        return out
    nu, mu = rule_multipliers(
        data.problem, data.x, out.active.used, (counts > 0) & data.ok, data.ineq_duals,
        data.eq_duals,
    )  # fmt: skip
    return replace(out, ineq_duals=nu, eq_duals=mu)


def _dual_rhs(data: AdjointInput, used: Tensor) -> Tensor:
    """Per sample, True where the multiplier cotangents on the rows ``used`` are nonzero."""
    out = (data.grad_eq != 0).any(-1)
    if data.grad_ineq.shape[1]:
        out = out | ((data.grad_ineq != 0) & used).any(-1)
    return out


def _dependent_counts(data: AdjointInput, used: Tensor, samples: Tensor | None = None) -> Tensor:
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
) -> AdjointSolution:
    """The Moore-Penrose adjoint :math:`K^+ r` of every solved sample (module docstring)."""
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
        z, normal = lstsq_saddle(P, C, rhs)
        if not normal <= _NORMAL_LIMIT:
            raise QPBackwardError(
                f"{method} backward: the reduced KKT matrix is singular at batch index {i} and "
                f"even its least-squares (pseudo-inverse) adjoint is inaccurate (normal-equation "
                f"residual {normal:.3g}). Regularise P or check the problem."
            ) from cause
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
    warn_degenerate(
        f"{method} backward: the reduced KKT matrix is singular (P is singular on the null "
        "space of the active rows, so the solution is not unique); the Moore-Penrose "
        "(minimum-norm least-squares) adjoint is used. Per-sample flags: "
        "sol.info.backward.pseudo_inverse. Pass degenerate='raise' to refuse instead."
    )
    return AdjointSolution(u, w_ineq, w_eq, active, residual)
