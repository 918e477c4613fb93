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
gives on such a batch. A batch whose identified active set already shows dependent rows (weak
rows that joined it because they lie in the span of the others) skips that first attempt, which
could only fail (QPTL with row gradients: every sample); the rule below still solves its
regular samples on the same ladder.

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
2. Otherwise (or if that is still singular) the adjoint becomes the Moore-Penrose one,

.. math:: [u; w] = K^+ [\\bar x; \\bar\\nu_J; \\bar\\mu]
    = \\lim_{\\varepsilon\\to 0}(K^2 + \\varepsilon I)^{-1}K[\\bar x; \\bar\\nu_J; \\bar\\mu],

solved on the equilibrated matrix (dense: SVD; sparse: LSMR,
:func:`~dxopt.qp.backward.fallbacks.moore_penrose_saddle`) and returned only where it solves
the adjoint system to ``max_residual`` (equilibrated): where the active rows are dependent
and :math:`x` is unique (then :math:`\\bar q, \\bar P` are exact), or where :math:`x` is not
unique but the loss is constant on the face of solutions. Otherwise no derivative exists and
:class:`~dxopt.qp.QPBackwardError` names the cause; an adjoint whose residual is not at
round-off is never returned. The samples are flagged in ``BackwardDiagnostics.pseudo_inverse``
and a :class:`~dxopt.qp.QPDegenerateWarning` names the cause; ``degenerate="raise"`` keeps the
strict behaviour (:class:`~dxopt.qp.QPBackwardError`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from dxopt.linalg.threads import small_work
from dxopt.qp.backward.degenerate_rule import (
    DegenerateRule,
    RuleFactor,
    dependent_flags_factor,
    independent_rows_dense,
    project_multiplier_rhs,
    returned_vertex,
    rule_multipliers,
    stacked_rows,
    weak_rows_with_factor,
)
from dxopt.qp.backward.fallbacks import (
    dependent_counts,
    dual_rhs,
    independent_equalities,
    pseudo_inverse_adjoint,
    with_rule_multipliers,
    with_zero_equalities,
    without_zero_equalities,
)
from dxopt.qp.backward.notices import collect_warnings, note_degenerate, trial_warnings
from dxopt.qp.backward.regular import RegularAdjoint, RegularBudget, regular_adjoint
from dxopt.qp.backward.vertex import vertex_rows
from dxopt.qp.certify.active import WEAK_POLICIES, identify_active
from dxopt.qp.certify.dependence import dependent_weak_rows
from dxopt.qp.problem.canonical import QPProblem
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput, AdjointSolution
from dxopt.qp.problem.types import BackwardDiagnostics, QPBackwardError

__all__ = [
    "DEGENERATE_POLICIES",
    "BackwardBase",
    "DegenerateAttempt",
    "pseudo_inverse_adjoint",
]

DEGENERATE_POLICIES = ("auto", "min_norm", "vertex", "raise")
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

    def regular_budget(self) -> RegularBudget | None:
        """The refinement budget of this method on the regular-adjoint ladder
        (:func:`dxopt.qp.backward.regular.regular_adjoint`); ``None`` skips the ladder."""
        return None

    def exact_fallback(self) -> BackwardBase | None:
        """The exact method that arbitrates where this method's own solve fails its residual
        check (an iterative refinement can stall on a nonsingular :math:`K`), or ``None``
        (the method is exact itself)."""
        return None

    def _record_regular(
        self,
        data: AdjointInput,
        active: ActiveSet,
        solved: RegularAdjoint,
        diagnostics: BackwardDiagnostics,
    ) -> None:
        """The method's own diagnostics of a batch the ladder solved."""

    def _adjoint_or_exact(
        self, data: AdjointInput, active: ActiveSet, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """:meth:`_adjoint`, or where it fails its residual check the exact solve of
        :meth:`exact_fallback` on the same rows (``diagnostics.method`` then names it). The
        method's own error is raised if both fail."""
        try:
            return self._adjoint(data, active, diagnostics)
        except QPBackwardError as err:
            exact = self.exact_fallback()
            if exact is None:
                raise
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
        active rows, positive definite ``P``) by the shared ladder
        (:func:`dxopt.qp.backward.regular.regular_adjoint`), or ``None`` (then the general
        path runs)."""
        budget = self.regular_budget()
        if budget is None:
            return None
        solved = regular_adjoint(data, active, budget)
        if solved is None:
            return None
        residual = solved.residual
        diagnostics.method = self.name
        diagnostics.linear_solver = solved.solver
        diagnostics.dependent_rows = (0,) * residual.shape[0]
        diagnostics.licq = True
        diagnostics.residual = float(residual.numpy().max()) if residual.numel() else 0.0
        diagnostics.n_active = active.n_active
        diagnostics.n_weak = active.n_weak
        self._record_regular(data, active, solved, diagnostics)
        return AdjointSolution(solved.u, solved.w_ineq, solved.w_eq, active, residual)

    def solve_adjoint(
        self, data: AdjointInput, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        """Identify the active set, solve the adjoint, apply the degenerate policy (on one
        intra-op thread when each sample is small, :func:`dxopt.linalg.small_work`: batched
        small factorizations gain nothing from intra-op threads and lose badly to
        oversubscription on a loaded machine). Its warnings are gathered and issued once at
        the end (:mod:`dxopt.qp.backward.notices`). All-zero equality rows are left out
        (:func:`~dxopt.qp.backward.fallbacks.without_zero_equalities`)."""
        reduced = without_zero_equalities(data)
        if reduced is not None:  # all-zero rows of A: left out, as zero rows of G are
            sub, keep = reduced
            out = self.solve_adjoint(sub, diagnostics)
            return with_zero_equalities(out, keep, data.problem.p)
        problem = data.problem
        per_sample = problem.n * problem.n * (problem.n + problem.m + problem.p)
        with collect_warnings(), small_work(float(per_sample), limit=_SMALL_SAMPLE):
            return self._solve_adjoint(data, diagnostics)

    def degenerate_attempts(self) -> tuple[DegenerateAttempt, ...]:
        """The degenerate policy as the attempts tried in order once the regular ladder
        declines (module docstring): the degenerate rule, then (not with
        ``degenerate="raise"``) the weakly active rows kept and the pseudo-inverse."""
        if self.degenerate == "raise":
            return (RULE_ATTEMPT,)
        return (RULE_ATTEMPT, WEAK_KEPT_ATTEMPT, PSEUDO_INVERSE_ATTEMPT)

    def _solve_adjoint(
        self, data: AdjointInput, diagnostics: BackwardDiagnostics
    ) -> AdjointSolution:
        active, factor = self._identify_factored(data)
        diagnostics.pseudo_inverse = (False,) * data.x.shape[0]
        diagnostics.weak_kept = False
        diagnostics.vertex_dropped = (0,) * data.x.shape[0]
        diagnostics.dropped_rows = ((),) * data.x.shape[0]
        diagnostics.dependent_rows, diagnostics.licq = (0,) * data.x.shape[0], True
        if data.settled is not None and (~data.settled.numpy() & data.ok.numpy()).any():
            diagnostics.unsettled = tuple(bool(not v) for v in data.settled)
            note_degenerate(
                f"{self.name} backward: some solutions were certified only by their duality gap "
                "(the polish failed; some rows have slack and multiplier both small), so the "
                "active set is a guess and the gradient is one of the one-sided derivatives at "
                "best. Tighten eps_abs or check the problem. Per sample: "
                "sol.info.backward.unsettled."
            )
        # the common dense case (LICQ holds, P positive definite, the refined solve converges):
        # the regular ladder; anything else takes the degenerate attempts below
        q_only_weak = self._q_only(data, active) and bool((active.weak & ~active.used).any())
        if not (self.use_sparse(data.problem) or q_only_weak or _known_dependent(data, active)):
            regular = self._regular_adjoint(data, active, diagnostics)
            if regular is not None:
                return regular
        cause: QPBackwardError | None = None
        for attempt in self.degenerate_attempts():
            with trial_warnings() as trial:  # a failed attempt's warnings are dropped
                try:
                    out = attempt.run(self, data, active, diagnostics, cause, factor)
                except QPBackwardError as err:
                    cause = err
                    continue
            if out is not None:
                trial.commit()
                return out
        assert cause is not None  # the rule attempt always answers or raises
        raise cause

    def _identify(self, data: AdjointInput) -> ActiveSet:
        """The active set of the backward: the forward's (polished) rows, with the weakly
        active rows in the span of the active ones joining them (so that LICQ detection and
        the degenerate rule do not depend on which copy of a duplicated row the backend put
        the multiplier on); ``data.rule_fixed``: the rows in ``data.active`` as they are."""
        return self._identify_factored(data)[0]

    def _identify_factored(self, data: AdjointInput) -> tuple[ActiveSet, RuleFactor | None]:
        """:meth:`_identify` and, where weak rows joined a dense problem's active set, the
        factor of the new rows that found them, extended to those rows (the vertex rule's
        start, :func:`~dxopt.qp.backward.degenerate_rule.weak_rows_with_factor`), else
        ``None``."""
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
            return replace(active, used=data.active & data.ok[:, None]), None
        factor = None
        if self.weak_policy == "inactive" and (active.weak.numpy() & ~active.used.numpy()).any():
            if self._q_only(data, active) and not data.problem.any_sparse:
                return active, None  # degenerate_rule counts them with its one factorization
            if data.problem.any_sparse:
                adopt = dependent_weak_rows(data.problem, active.used, active.weak & ~active.used)
            else:
                adopt, factor = weak_rows_with_factor(
                    data.problem, active.used, active.weak & ~active.used
                )
            if bool(adopt.any()):  # duplicated/dependent weak rows join the active set
                active = replace(active, used=active.used | adopt, adopted=adopt)
        return active, factor

    def _q_only(self, data: AdjointInput, active: ActiveSet) -> bool:
        """Only dL/dq and dL/dP are wanted (no row gradients, zero multiplier cotangents): the
        degenerate rule's choice of rows cannot change them (same row space, same u). The
        cotangents count on the weakly active rows too: such a row may join the active set (a
        copy the backend gave multiplier 0), and its cotangent was dropped when it did not, so
        the backward was not linear in its cotangent (issue 35 item 2)."""
        rows = active.used | active.weak
        return not (data.needs_rows or data.rule_fixed or bool(dual_rhs(data, rows).any()))

    def degenerate_rule(
        self,
        data: AdjointInput,
        active: ActiveSet | None = None,
        *,
        factor: RuleFactor | None = None,
    ) -> DegenerateRule:
        """The rows and multipliers of the degenerate rule (:mod:`.degenerate_rule`)
        for the active set ``active`` (``None``: identified from ``data``). It depends on the
        point, the problem and the rows only, never on the cotangents, so the vjp and the jvp
        (:mod:`dxopt.qp.autograd.tangent`) use the same linear map. ``factor``: the Gram
        factor of ``active.used`` from the identification (:meth:`_identify_factored`), if
        the caller has it."""
        if active is None:
            active, factor = self._identify_factored(data)
        problem, ok = data.problem, data.ok
        S = data.x.shape[0]
        zero = torch.zeros(S, dtype=torch.int64)
        used, dropped = active.used, zero
        q_only = self._q_only(data, active)
        left: Tensor | None = None
        vertex = self.degenerate in ("auto", "vertex") and not (q_only or data.rule_fixed)
        if q_only and not problem.any_sparse:
            # only dL/dq, dL/dP: every rule gives the same u; drop dependent rows cheaply (one
            # batched Cholesky gives the counts, the rows and the weak rows in their span)
            weak = active.weak & ~active.used if self.weak_policy == "inactive" else None
            counts, used, left, adopt = independent_rows_dense(problem, active.used, ok, weak)
            if bool(adopt.any()):
                active = replace(active, used=active.used | adopt, adopted=adopt)
        elif vertex and not problem.any_sparse and problem.G is not None:
            # one factorization of [A; G_used] counts the dependent rows and starts the rule
            if factor is None:
                factor = RuleFactor(*dependent_flags_factor(stacked_rows(problem, active.used)))
            counts = factor[0].sum(-1) * ok
        else:
            counts = dependent_counts(data, active.used)
        known = torch.full_like(counts, -1)  # dependent rows left, where the rule knows them
        if vertex and bool((counts > 0).any()):
            used, dropped, known = vertex_rows(
                problem, active.used, data.ineq_duals, data.eq_duals, (counts == 0) | ~ok,
                keep_parallel=self.degenerate == "auto", counted=True, factor=factor,
            )  # fmt: skip
        if left is None:
            changed = (used != active.used).any(-1)
            left = counts.clone()
            left[changed & (known >= 0)] = known[changed & (known >= 0)]
            count = changed & (known < 0)
            if bool(count.any()):
                left[count] = dependent_counts(data, used, count)[count]
        nu, mu = data.ineq_duals, data.eq_duals
        if data.needs_rows and data.needs_matrices:  # they enter only the A and G gradients
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
        factor: RuleFactor | None = None,
    ) -> AdjointSolution:
        """The adjoint on the rows of :meth:`degenerate_rule` (``factor``: as there): the
        vertex's independent rows, or (minimum-norm samples) the dependent rows with the
        multiplier right-hand side projected onto their range. Should the vertex's solve fail
        (round-off), the full rows' minimum-norm adjoint is used."""
        rule = self.degenerate_rule(data, active, factor=factor)
        if not bool((rule.counts > 0).any()):
            if not self.use_sparse(data.problem):
                regular = self._regular_adjoint(data, rule.active, diagnostics)
                if regular is not None:
                    return regular
            return self._adjoint_or_exact(data, rule.active, diagnostics)
        rhs_on_rows = dual_rhs(data, rule.active.used)
        reduced = None
        if not (data.needs_rows or bool(rhs_on_rows.any())) and bool((rule.left > 0).any()):
            reduced = independent_equalities(data)
        try:
            if reduced is not None:  # dL/dq, dL/dP only: the dependent equality rows go too
                sub, keep = reduced
                zero = torch.zeros_like(rule.left)
                out = self._solve_projected(sub, rule.active, zero, rhs_on_rows, diagnostics)
                w_eq = torch.zeros_like(data.grad_eq)
                w_eq[:, keep] = out.w_eq
                out = replace(out, w_eq=w_eq)
            else:
                out = self._solve_projected(data, rule.active, rule.left, rhs_on_rows, diagnostics)
            dropped = rule.dropped
        except QPBackwardError:
            if not bool((rule.active.used != rule.full).any()):
                raise
            full = replace(rule.active, used=rule.full)
            out = self._solve_projected(
                data, full, rule.counts, dual_rhs(data, rule.full), diagnostics
            )
            dropped = torch.zeros_like(rule.dropped)
        self.record_rule(replace(rule, dropped=dropped), diagnostics, warn=warn)
        cotangent = (data.grad_ineq != 0).any(-1) | (data.grad_eq != 0).any(-1)
        reached = (dropped > 0) & cotangent & data.ok
        if (
            warn
            and bool(reached.any())
            and bool((reached & ~returned_vertex(data, rule.active.used, reached)).any())
        ):
            # the forward returns this vertex's multipliers (dxopt.qp.certify.multipliers);
            # where it did not (a tie, another active-set tolerance, a sample too big for the
            # dense selection) their derivative is the vertex's, not theirs
            note_degenerate(
                f"{self.name} backward: the multipliers of linearly dependent active rows got "
                "a cotangent, and the rows were reduced to a vertex of the multiplier set "
                "other than the returned multipliers, so the derivative of those entries is "
                "that of the vertex's multipliers, not of the returned numbers (the "
                "derivatives through x, and through the multipliers of rows in no "
                "dependency, are exact). Per sample: sol.info.backward.dropped_rows."
            )
        if not data.needs_rows:
            return out
        return replace(out, ineq_duals=rule.ineq_duals, eq_duals=rule.eq_duals)

    def _solve_projected(
        self,
        data: AdjointInput,
        active: ActiveSet,
        left: Tensor,
        rhs_on_rows: Tensor,
        diagnostics: BackwardDiagnostics,
    ) -> AdjointSolution:
        project = (left > 0) & rhs_on_rows & data.ok
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
        diagnostics.dependent_rows = tuple(rule.counts.tolist())
        diagnostics.licq = False
        dropped = rule.dropped.tolist()
        diagnostics.vertex_dropped = tuple(dropped)
        sample, row = np.nonzero((rule.full & ~rule.active.used).numpy())
        rows = np.split(row, np.cumsum(np.bincount(sample, minlength=len(dropped)))[:-1])
        diagnostics.dropped_rows = tuple(
            tuple(r.tolist()) if c else () for r, c in zip(rows, dropped, strict=True)
        )
        if not warn:
            return
        if rule.q_only:
            note_degenerate(
                f"{self.name} backward: the active constraint rows are linearly dependent "
                "(LICQ fails); only dL/dq and dL/dP are requested, and these do not depend on "
                "the choice of multipliers (exact). Per-sample counts: "
                "sol.info.backward.dependent_rows."
            )
            return
        self._warn_rule(rule.dropped, rule.counts - rule.dropped)

    def _warn_rule(self, dropped: Tensor, left: Tensor) -> None:
        if bool((dropped > 0).any()):
            note_degenerate(
                f"{self.name} backward: the active constraint rows are linearly dependent "
                f"(LICQ fails); dependent inequality rows were dropped to a vertex of the "
                f"multiplier set (degenerate={self.degenerate!r}), so the gradient is the "
                "derivative of one affine piece (a B-subdifferential element). Per sample: "
                "sol.info.backward.dependent_rows, .vertex_dropped and .dropped_rows (the "
                "rows of G dropped)."
            )
        if bool((left > 0).any()):
            note_degenerate(
                f"{self.name} backward: the active constraint rows are linearly dependent "
                "(LICQ fails); the multiplier adjoint is not unique and the minimum-norm one "
                "is used (dL/dq and dL/dP are exact; the b/h/A/G gradients are the "
                "minimum-norm choice with the minimum-norm multipliers, the equal split on "
                "duplicated rows; for general dependent rows degenerate='vertex' returns a "
                "B-subdifferential element). Per-sample counts: "
                "sol.info.backward.dependent_rows."
            )


def _known_dependent(data: AdjointInput, active: ActiveSet) -> bool:
    """True when the active set already shows dependent rows in a solved sample: weakly
    active rows joined it because they lie in the span of the others
    (:meth:`BackwardBase._identify`, squared distance below ``DEPENDENT_TOL``). The regular
    ladder, which needs every sample regular, would then only fail (decision-focused QPs such
    as QPTL with row gradients: every sample), so the degenerate rule runs at once; it
    routes the regular samples of the batch to the same regular solve on their rows."""
    adopted = active.adopted
    return adopted is not None and bool((adopted & data.ok[:, None]).any())


AttemptRun = Callable[
    [
        BackwardBase, AdjointInput, ActiveSet, BackwardDiagnostics, "QPBackwardError | None",
        "RuleFactor | None",
    ],
    "AdjointSolution | None",
]  # fmt: skip


@dataclass(frozen=True)
class DegenerateAttempt:
    """One step of the degenerate policy (:meth:`BackwardBase.degenerate_attempts`):
    ``run(method, data, active, diagnostics, cause, factor)`` returns the adjoint, ``None``
    where it does not apply, or raises :class:`~dxopt.qp.QPBackwardError` (``cause``: the
    error of the attempt before, to chain; ``factor``: the Gram factor of ``active.used`` from
    the identification, or ``None``)."""

    name: str
    run: AttemptRun


def _rule_attempt(
    method: BackwardBase,
    data: AdjointInput,
    active: ActiveSet,
    diagnostics: BackwardDiagnostics,
    cause: QPBackwardError | None,
    factor: RuleFactor | None = None,
) -> AdjointSolution:
    """The degenerate rule's rows and multipliers (:meth:`BackwardBase.degenerate_rule`)."""
    return method._degenerate_adjoint(data, active, diagnostics, factor=factor)


def _weak_kept_attempt(
    method: BackwardBase,
    data: AdjointInput,
    active: ActiveSet,
    diagnostics: BackwardDiagnostics,
    cause: QPBackwardError | None,
    factor: RuleFactor | None = None,
) -> AdjointSolution | None:
    """Dropping the weakly active rows left :math:`x` undetermined: keep them as equalities
    (the derivative on the face); only with ``weak_policy="inactive"`` and such rows."""
    if method.weak_policy != "inactive" or not bool((active.weak & ~active.used).any()):
        return None
    kept = replace(active, used=active.used | active.weak)
    out = method._degenerate_adjoint(data, kept, diagnostics, warn=False)
    diagnostics.weak_kept = True
    note_degenerate(
        f"{method.name} backward: P is singular on the null space of the strongly active "
        "rows, so the weakly active rows (zero slack, zero multiplier) are kept as "
        "equalities to determine the derivative (see BackwardDiagnostics.weak_kept)."
    )
    return with_rule_multipliers(data, out)


def _pseudo_inverse_attempt(
    method: BackwardBase,
    data: AdjointInput,
    active: ActiveSet,
    diagnostics: BackwardDiagnostics,
    cause: QPBackwardError | None,
    factor: RuleFactor | None = None,
) -> AdjointSolution:
    """The Moore-Penrose adjoint :math:`K^+ r` (:func:`pseudo_inverse_adjoint`)."""
    out = pseudo_inverse_adjoint(
        data, active, diagnostics, method.name, cause, max_residual=method.max_residual
    )
    return with_rule_multipliers(data, out)


RULE_ATTEMPT = DegenerateAttempt("rule", _rule_attempt)
WEAK_KEPT_ATTEMPT = DegenerateAttempt("weak_kept", _weak_kept_attempt)
PSEUDO_INVERSE_ATTEMPT = DegenerateAttempt("pseudo_inverse", _pseudo_inverse_attempt)
