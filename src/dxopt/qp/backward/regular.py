"""The regular-adjoint ladder shared by every backward method.

When every solved sample of a dense batch is regular (independent active rows, :math:`P`
positive definite, refined residual within ``max_residual``), the exact adjoint of the
reduced KKT system :math:`K[u; w_J; w_E] = [\\bar x; \\bar\\nu_J; \\bar\\mu]`,
:math:`K = [[P, C^\\top], [C, 0]]`, :math:`C = [G_J; A]` (Amos & Kolter, OptNet,
arXiv 1703.00443), is the same whatever method asked for it: the penalty method's refinement
converges to it whatever its preconditioner (:mod:`dxopt.qp.backward.penalty`). So both
methods climb the same ladder, :func:`regular_adjoint`, and differ only in the refinement
budget (:class:`RegularBudget`: the KKT method's fixed few steps, the penalty method's
``max_refinement``/``refine_tol``). The rungs, first success wins:

1. ``"forward_factors"``: the compiled solver's own factors
   (:class:`~dxopt.qp.problem.contracts.ForwardFactors`), a few triangular solves
   (:func:`dxopt.qp.backward.dense_large.reused_dense_adjoint`);
2. ``"augmented"``: one large system (:math:`n \\ge 256`, at most four samples) with
   certified independent rows, float64 GMRES preconditioned by the float32 augmented matrix
   (:func:`dxopt.qp.backward.dense_large.large_dense_adjoint`);
3. ``"schur"``: batched block elimination of :math:`P` (:func:`dxopt.linalg.schur_factor`:
   Cholesky of :math:`P` and of the Schur complement :math:`CP^{-1}C^\\top`, the
   dependence of the rows read off its pivots) with iterative refinement against :math:`K`,
   in up to three groups of similar active counts (:func:`active_groups`).

Any rung that declines passes to the next; when all decline, ``None`` sends the batch to the
method's general path with its degenerate policy (:mod:`dxopt.qp.backward.base`). The
exact fallback of an iterative method that fails its residual check is the other half of the
ladder (:meth:`dxopt.qp.BackwardBase.exact_fallback`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dxopt.linalg.schur import SchurFactor, schur_factor
from dxopt.qp.backward.dense_large import large_dense_adjoint, reused_dense_adjoint
from dxopt.qp.backward.rows import DenseRows, dense_rows
from dxopt.qp.certify.dependence import DEPENDENT_TOL
from dxopt.qp.certify.tolerances import EVALUATION_ROUNDOFF, REFINE_ROUNDOFF
from dxopt.qp.problem.contracts import ActiveSet, AdjointInput
from dxopt.qp.problem.types import QPBackwardError

__all__ = [
    "RegularAdjoint",
    "RegularBudget",
    "active_groups",
    "check_residual",
    "equilibration",
    "regular_adjoint",
    "regular_dense_adjoint",
    "schur_refine",
]


@dataclass(frozen=True)
class RegularBudget:
    """What differs between the methods on the ladder: the refinement's stopping tolerance
    ``tol`` (relative residual) and its most steps ``max_steps``; ``max_residual`` is the
    largest relative residual a rung may return."""

    tol: float
    max_steps: int
    max_residual: float


@dataclass(frozen=True)
class RegularAdjoint:
    """The adjoint of a regular batch: ``u`` (S, n), ``w_ineq`` (S, m) zero off the used
    rows, ``w_eq`` (S, p), the relative residual (S,), the refinement steps (or GMRES
    iterations) and the rung that solved it (``BackwardDiagnostics.linear_solver``)."""

    u: Tensor
    w_ineq: Tensor
    w_eq: Tensor
    residual: Tensor
    steps: int
    solver: str


def regular_adjoint(
    data: AdjointInput, active: ActiveSet, budget: RegularBudget
) -> RegularAdjoint | None:
    """The first rung of the ladder (module docstring) that solves every sample of the dense
    batch ``data`` on the rows ``active.used``, or ``None`` when every rung declines."""
    solver = "forward_factors"
    solved = reused_dense_adjoint(
        data, active, tol=budget.tol, max_residual=budget.max_residual,
        max_steps=budget.max_steps,
    )  # fmt: skip
    if solved is None:
        solver = "augmented"
        solved = large_dense_adjoint(data, active, tol=budget.tol, max_residual=budget.max_residual)
    if solved is None:
        solver = "schur"
        solved = regular_dense_adjoint(
            data, active, max_steps=budget.max_steps, tol=budget.tol,
            max_residual=budget.max_residual,
        )  # fmt: skip
    if solved is None:
        return None
    u, w_ineq, w_eq, residual, steps = solved
    return RegularAdjoint(u, w_ineq, w_eq, residual, steps, solver)


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


def regular_dense_adjoint(
    data: AdjointInput, active: ActiveSet, *, max_steps: int, tol: float, max_residual: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, int] | None:
    """The exact adjoint of a dense batch by batched block elimination of :math:`P`
    (:func:`dxopt.linalg.schur_factor`) and refinement against :math:`K`, when every solved
    sample is regular: :math:`P` positive definite, no dependent active row (read off the
    Schur complement's pivots) and the refined relative residual within ``max_residual``.
    The samples are solved in up to three groups of similar active counts
    (:func:`active_groups`), each padded only to its own largest count.
    Returns ``(u, w_J, w_E, relative residual, refinement steps)``, or ``None`` when some
    sample is not regular (the caller's general path, with its degenerate policy, decides)."""
    problem = data.problem
    counts = active.used.numpy().sum(-1) * data.ok.numpy() if problem.m else None
    groups = active_groups(counts, problem.n, problem.p) if counts is not None else [None]
    parts = []
    for samples in groups:
        ok, grad_x = data.ok, data.grad_x
        if samples is not None:
            ok = torch.from_numpy(ok.numpy()[samples])
            grad_x = torch.from_numpy(grad_x.numpy()[samples])
        rows = dense_rows(data, active.used, samples=samples)
        factor = schur_factor(rows.P, rows.C)
        if factor is None:
            return None
        pivots, info = factor.pivots.numpy(), factor.info.numpy()
        if bool((((pivots < DEPENDENT_TOL).sum(-1) + (info != 0)) * ok.numpy()).any()):
            return None
        u, w, residual, steps = schur_refine(rows, factor, grad_x, ok, max_steps, tol)
        if not bool((residual.numpy() <= max_residual).all()):
            return None
        parts.append((samples, u, rows.scatter(w, problem.m), w[:, rows.k :], residual, steps))
    if len(parts) == 1:
        return parts[0][1:]
    S = data.x.shape[0]
    out = [
        np.zeros((S, problem.n)),
        np.zeros((S, problem.m)),
        np.zeros((S, problem.p)),
        np.zeros(S),
    ]
    for samples, *arrays, _ in parts:
        for dest, a in zip(out, arrays):
            dest[samples] = a.numpy()
    u, w_ineq, w_eq, residual = (torch.from_numpy(a) for a in out)
    return u, w_ineq, w_eq, residual, max(part[-1] for part in parts)


_GROUP_COST = 1e6  # fixed cost of one more group (dispatches, copies), in flops (see below)


def active_groups(counts: np.ndarray, n: int, p: int) -> list[np.ndarray | None]:
    """Split the samples into at most three groups by active count (``counts``, (S,)) when
    that lowers the estimated cost of the padded batched block elimination; ``[None]`` keeps
    the whole batch. A group padded to :math:`k` rows (plus the ``p`` equalities) costs
    about :math:`n^2k + 2nk^2 + k^3/3` flops per sample (triangular solve, full Gram product,
    Cholesky of the Schur complement; the Cholesky of :math:`P` is the same in any split)
    plus ``_GROUP_COST`` per group: about the dispatch and copy overhead of a group, measured
    0.15-0.3 ms against roughly 5 Gflop/s for these kernels on one thread."""
    S = counts.shape[0]
    if S < 2:
        return [None]

    def flops(k: np.ndarray) -> np.ndarray:
        return n * n * k + 2.0 * n * k * k + k**3 / 3.0

    low, high = flops(np.array([counts.min(), counts.max()], dtype=np.float64) + p)
    if S * (high - low) <= _GROUP_COST:  # no split can save more than it costs
        return [None]
    hist = np.bincount(counts)
    values = np.flatnonzero(hist)  # the distinct counts, ascending
    if values.size < 2:
        return [None]
    ends = np.cumsum(hist)[values]  # sorted position after the last sample of each value
    f = flops(values.astype(np.float64) + p)  # per sample, padded to each value
    e = ends.astype(np.float64)
    whole = S * f[-1] + _GROUP_COST
    # two groups: the first ends after value i (i < d - 1)
    two = e[:-1] * f[:-1] + (S - e[:-1]) * f[-1] + 2 * _GROUP_COST
    # three groups: after value i and after value j (i < j < d - 1)
    three = (
        e[:-1, None] * f[:-1, None]
        + (e[None, :-1] - e[:-1, None]) * f[None, :-1]
        + (S - e[None, :-1]) * f[-1]
        + 3 * _GROUP_COST
    )
    three = np.where(np.triu(np.ones_like(three, dtype=bool), 1), three, np.inf)
    best = min(whole, float(two.min()), float(three.min()))
    if best >= whole:
        return [None]
    if best == float(two.min()):
        cuts = [int(ends[int(two.argmin())])]
    else:
        i, j = np.unravel_index(int(three.argmin()), three.shape)
        cuts = [int(ends[i]), int(ends[j])]
    order = np.argsort(counts, kind="stable")
    return [np.sort(g) for g in np.split(order, cuts)]


def equilibration(P: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The symmetric diagonal scaling :math:`D = \\mathrm{diag}(d_x, d_c)` that equilibrates
    :math:`K = [[P, C^\\top], [C, 0]]`: :math:`d_{x,i} = P_{ii}^{-1/2}` (1 where
    :math:`P_{ii} \\le 0`) and :math:`d_{c,j} = 1/\\|C_{j:}\\,\\mathrm{diag}(d_x)\\|` (1 on zero
    rows), so :math:`DKD` has a unit diagonal in its first block and unit rows in :math:`C`
    (one step of Ruiz's scaling, Ruiz 2001, RAL-TR-2001-034, with the diagonal of :math:`P`
    as Bunch's symmetric choice). The relative residual of :math:`DKD z' = Dr` is
    :math:`\\|D(r - Kz)\\|/\\|Dr\\|`: invariant under any scaling of the objective and
    of each row, unlike :math:`\\|r - Kz\\|/\\|r\\|`, which a backward-stable solve of an
    objective scaled by 1e-6 and rows by 1e6 cannot bring below 1e-6. ``P`` is (n, n) or
    (S, n, n), ``C`` (S, k, n); returns ``d_x`` (S or 1, n) and ``d_c`` (S, k)."""
    diag = np.diagonal(P, axis1=-2, axis2=-1)
    diag = diag[None] if diag.ndim == 1 else diag
    d_x = np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 1.0)
    norms = np.sqrt(((C * d_x[:, None, :]) ** 2).sum(-1))
    d_c = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 1.0)
    return d_x, d_c


def schur_refine(
    rows: DenseRows,
    factor: SchurFactor,
    grad_x: Tensor,
    ok: Tensor,
    max_steps: int,
    tol: float,
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Solve :math:`[[P, C^\\top], [C, 0]][u; w] = [\\bar x; r_2]` with the Schur factor and
    iterative refinement against the exact matrix, keeping per sample the iterate with the
    smallest residual (round-off makes the last one no better near the limit). The residual
    that judges (returned, and compared with ``max_residual`` by the callers) is that of the
    equilibrated system (:func:`equilibration`), invariant under the scaling of the
    objective and of each row; the refinement stops once it or the plain relative residual
    is within ``tol`` (so a well-scaled batch takes the steps the compiled rungs, which
    measure the plain one, take), at ``max_steps``, once round-off stalls both, or once every
    sample is within ``tol`` or at the round-off of its residual's evaluation (the compiled
    rungs' rule: :data:`~dxopt.qp.certify.tolerances.REFINE_ROUNDOFF`). Returns
    ``(u, w, equilibrated relative residual, steps)`` (the residuals in numpy: a few small
    products)."""
    P, C, rhs2 = rows.P.numpy(), rows.C.numpy(), rows.rhs2.numpy()
    g, okn = grad_x.numpy(), ok.numpy()
    d_x, d_c = equilibration(P, C)
    sg, s2 = g * d_x, rhs2 * d_c
    norm = np.maximum(np.sqrt((sg * sg).sum(-1) + (s2 * s2).sum(-1)), 1e-300)
    plain_norm = np.maximum(np.sqrt((g * g).sum(-1) + (rhs2 * rhs2).sum(-1)), 1e-300)

    def residual(u: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, ...]:
        Pu = u @ P if P.ndim == 2 else np.matmul(P, u[:, :, None])[:, :, 0]
        r1 = g - Pu - np.matmul(w[:, None, :], C)[:, 0]
        r2 = rhs2 - np.matmul(C, u[:, :, None])[:, :, 0]
        q1, q2 = r1 * d_x, r2 * d_c  # the residual of the equilibrated system
        rel = np.sqrt((q1 * q1).sum(-1) + (q2 * q2).sum(-1)) / norm
        plain = np.sqrt((r1 * r1).sum(-1) + (r2 * r2).sum(-1)) / plain_norm
        return r1, r2, np.where(okn, rel, 0.0), np.where(okn, plain, 0.0)

    def stalled(worst: float, best: float) -> bool:
        return worst > 0.5 * best and worst < 1e-12

    def settled(
        u: np.ndarray, w: np.ndarray, r1: np.ndarray, r2: np.ndarray, rel: np.ndarray,
        plain: np.ndarray,
    ) -> bool:  # fmt: skip
        # every sample within tol or at round-off: |r| <= c (|b| + |K||z|) componentwise
        done = (rel <= tol) | (plain <= tol) | ~okn
        if bool(done.all()):
            return True
        absP = np.abs(P)
        au, aC = np.abs(u), np.abs(C)
        Pu = au @ absP if absP.ndim == 2 else np.matmul(absP, au[:, :, None])[:, :, 0]
        t1 = np.abs(g) + Pu + np.matmul(np.abs(w)[:, None, :], aC)[:, 0]
        t2 = np.abs(rhs2) + np.matmul(aC, au[:, :, None])[:, :, 0]
        bound = REFINE_ROUNDOFF * EVALUATION_ROUNDOFF
        at = (np.abs(r1) <= bound * t1).all(-1) & (np.abs(r2) <= bound * t2).all(-1)
        return bool((done | at).all())

    u_t, w_t = factor.solve(grad_x, rows.rhs2)
    u, w = u_t.numpy(), w_t.numpy()
    r1, r2, rel, plain = residual(u, w)
    steps, best, best_plain = 0, float("inf"), float("inf")
    while True:
        worst = float(rel.max()) if rel.size else 0.0
        worst_plain = float(plain.max()) if plain.size else 0.0
        # stop at the tolerance, at the step limit, or once round-off stalls the refinement
        if (
            steps >= max_steps
            or worst <= tol
            or worst_plain <= tol
            or (stalled(worst, best) and stalled(worst_plain, best_plain))
            or (steps and settled(u, w, r1, r2, rel, plain))
        ):
            return torch.from_numpy(u), torch.from_numpy(w), torch.from_numpy(rel), steps
        best, best_plain = min(best, worst), min(best_plain, worst_plain)
        du, dw = factor.solve(torch.from_numpy(r1), torch.from_numpy(r2))
        new_u, new_w = u + du.numpy(), w + dw.numpy()
        new_r1, new_r2, new_rel, new_plain = residual(new_u, new_w)
        steps += 1
        better = new_rel < rel  # per sample, the best iterate so far (round-off can stall)
        if better.all():
            u, w, r1, r2, rel, plain = new_u, new_w, new_r1, new_r2, new_rel, new_plain
        else:
            col = better[:, None]
            u, w = np.where(col, new_u, u), np.where(col, new_w, w)
            r1, r2 = np.where(col, new_r1, r1), np.where(col, new_r2, r2)
            rel, plain = np.minimum(new_rel, rel), np.where(better, new_plain, plain)
