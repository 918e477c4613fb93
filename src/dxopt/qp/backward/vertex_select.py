"""The backward's vertex as the returned multipliers where active rows have a general
dependency (issue 35 item 2).

Where the active rows :math:`C = [A; G_T]` of a certified point are dependent in a way other
than equality rows and copies of a row (for example :math:`e_1, e_2, e_1 + e_2`),
:func:`dxopt.qp.certify.multipliers.select_multipliers` marks the sample (``rows``) and the
forward leaves its multipliers as the backend gave them (``ForwardResult.vertex_pending``).
:func:`finish_selection` then replaces them by the vertex of the multiplier set
:math:`\\Lambda = \\{y: C^\\top y = C^\\top y_0,\\ y_T \\ge 0\\}` that the backward's default
rule differentiates (:func:`dxopt.qp.backward.vertex.vertex_rows`, a function of
:math:`\\Lambda` alone, and :func:`dxopt.qp.backward.degenerate_rule.rule_multipliers`), so
the returned numbers do not depend on the backend and their derivative is the backward's. The
step lives in the backward layer because it runs the backward's rule; the forward's callers
above this layer (:func:`dxopt.qp.autograd.state.forward_state`, the lean routes) call it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from dxopt.qp.backward.degenerate_rule import rule_multipliers
from dxopt.qp.backward.vertex import vertex_rows
from dxopt.qp.certify.multipliers import (
    count_dependent_dense,
    dense_array,
    inf_norm,
    note_not_selected,
    sample_of,
)
from dxopt.qp.certify.polish import numpy_matrix, row_inf
from dxopt.qp.certify.tolerances import ROUNDOFF, STRONG_MULTIPLIER
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.contracts import ForwardResult

__all__ = ["finish_selection", "vertex_selection", "vertex_selection_dense"]


def finish_selection(problem: Any, result: ForwardResult) -> ForwardResult:
    """``result`` with the multipliers of its ``vertex_pending`` samples replaced by the
    backward's vertex where it passes the tests of :func:`vertex_selection` (the rows with a
    positive multiplier join ``active``); a notice names the samples where it failed them."""
    if not result.vertex_pending:
        return result
    X = result.x.numpy()
    MU, NU = result.eq_duals.numpy().copy(), result.ineq_duals.numpy().copy()
    kept, infeasible = vertex_selection(problem, X, MU, NU, list(result.vertex_pending))
    if infeasible:
        note_not_selected(sorted(infeasible))
    active = None if result.active is None else result.active.numpy().copy()
    if active is not None:
        for i in kept:
            active[i] |= NU[i] > 0
    return replace(
        result,
        eq_duals=torch.from_numpy(MU),
        ineq_duals=torch.from_numpy(NU),
        active=None if active is None else torch.from_numpy(active),
        vertex_pending=(),
    )


def vertex_selection(
    problem: Any,
    X: np.ndarray,
    MU: np.ndarray,
    NU: np.ndarray,
    samples: list[tuple[int, np.ndarray]],
) -> tuple[list[int], list[int]]:
    """Replace, in place, the multipliers ``MU`` (S, p), ``NU`` (S, m) of the ``samples``
    (``(index, zero-slack rows T)``, a general dependency) by the backward's vertex: the rows
    of :func:`~dxopt.qp.backward.vertex.vertex_rows` (``keep_parallel=True``, the default
    rule's) from the rows ``T``, and their multipliers
    :func:`~dxopt.qp.backward.degenerate_rule.rule_multipliers` (the minimum-norm solution of
    :math:`[G_B; A]^\\top\\lambda = -(Px + q)` on the vertex's rows :math:`B`, unique where
    they are independent). Kept where it is dual feasible by the test of
    :func:`~dxopt.qp.certify.multipliers.select_multipliers` and its stationarity residual
    :math:`\\|C^\\top\\lambda + Px + q\\|_\\infty` is no larger than the backend's (or at
    round-off. Returns ``(kept, infeasible)``: the samples that took the vertex, and those
    where it failed these tests (they keep the backend's multipliers). Where the rule keeps the
    rows or the vertex's strongly active rows span less than the rows ``T``
    (:func:`_narrower`), the backend's multipliers stay too, without a notice here: the
    backward warns where a multiplier cotangent reaches them."""
    S, m = NU.shape
    used = torch.zeros(S, m, dtype=torch.bool)
    skip = torch.ones(S, dtype=torch.bool)
    for i, rows in samples:
        used[i] = torch.from_numpy(rows)
        skip[i] = False
    nu0, mu0 = torch.from_numpy(NU.copy()), torch.from_numpy(MU.copy())
    new_used, dropped = vertex_rows(problem, used, nu0, mu0, skip, keep_parallel=True)
    chosen = ~skip & (dropped > 0)
    x = torch.from_numpy(X)
    nu_v, mu_v = rule_multipliers(problem, x, new_used, chosen, nu0, mu0)
    G = numpy_matrix(problem, "G")
    A = numpy_matrix(problem, "A") if problem.p else None
    r = -(problem.mv("P", x) + problem.dense_vec("q").expand_as(x)).numpy()
    P_abs = (problem.mv("P", x.abs()) + problem.dense_vec("q").abs().expand_as(x)).numpy()
    kept, failed = [], []
    for i, rows in samples:
        if not bool(chosen[i]):
            continue  # the rule keeps these rows (the backward warns where that matters)
        Gi = sample_of(G, i)
        g_inf = row_inf(Gi)
        nu, mu = nu_v[i].numpy(), mu_v[i].numpy()
        scale = max(inf_norm(r[i]), inf_norm(nu * g_inf), 1e-300)
        after = inf_norm(Gi.T @ nu + (0.0 if A is None else sample_of(A, i).T @ mu) - r[i])
        before = inf_norm(Gi.T @ NU[i] + (0.0 if A is None else sample_of(A, i).T @ MU[i]) - r[i])
        if bool((nu * g_inf < -ROUNDOFF * scale).any()) or after > max(before, ROUNDOFF * scale):
            failed.append(i)
            continue
        if _narrower(Gi, None if A is None else sample_of(A, i), rows, nu, g_inf, r[i], P_abs[i]):
            continue  # the backend's stay (the backward warns where a cotangent reaches them)
        NU[i] = np.maximum(nu, 0.0)
        if A is not None:
            MU[i] = mu
        kept.append(i)
    return kept, failed


def _narrower(
    G: Any,
    A: Any,
    rows: np.ndarray,
    nu: np.ndarray,
    g_inf: np.ndarray,
    r: np.ndarray,
    p_abs: np.ndarray,
) -> bool:
    """True where the vertex's strongly active rows (equality rows, and rows of ``T`` whose
    :math:`\\nu_i\\|g_i\\|_\\infty` exceeds ``STRONG_MULTIPLIER`` times the dual scale of
    :func:`dxopt.qp.certify.active.identify_active`) span less than all the rows ``[A; G_T]``.
    The backward identifies its rows from the returned multipliers (the zero-multiplier rows
    rejoin only where they lie in the span of the others), so returning such a vertex would
    change the rows, and so the derivative of ``x``: two rows that together pin a variable
    without curvature, each outside the span of the rest (Maros-Meszaros STADAT)."""
    dual_scale = max(inf_norm(p_abs), inf_norm(nu * g_inf), 1e-300)
    strong = rows & (nu * g_inf > STRONG_MULTIPLIER * dual_scale)
    blocks = [] if A is None else [dense_array(A)]
    full = [*blocks, dense_array(G[np.flatnonzero(rows)])]
    kept = [*blocks, dense_array(G[np.flatnonzero(strong)])]
    return _rank(np.concatenate(kept, 0)) < _rank(np.concatenate(full, 0))


def _rank(C: np.ndarray) -> int:
    """The rank of ``C`` by the Gram test of :func:`count_dependent_dense`."""
    if C.shape[0] == 0:
        return 0
    return int((np.linalg.norm(C, axis=1) > 0).sum()) - count_dependent_dense(C)


def vertex_selection_dense(
    P: np.ndarray,
    q: np.ndarray,
    A: np.ndarray | None,
    G: np.ndarray,
    h: np.ndarray,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    rows: np.ndarray,
) -> bool:
    """:func:`vertex_selection` for one dense sample given as arrays (the lean path): ``mu``,
    ``nu`` are replaced in place; returns False where the vertex is infeasible (``mu, nu``
    unchanged, as where the vertex is not kept for the other reasons)."""
    t = torch.from_numpy
    b = None if A is None else t(A @ x)  # b enters neither the rule nor its multipliers
    problem = canonical_problem(
        t(P), t(q), None if A is None else t(A), b, t(G), t(h), check_psd=False
    )
    MU, NU = mu[None].copy(), nu[None].copy()
    _, infeasible = vertex_selection(problem, x[None], MU, NU, [(0, rows)])
    if infeasible:
        return False
    mu[:], nu[:] = MU[0], NU[0]  # unchanged where the vertex was not kept
    return True
