"""One backend-independent multiplier selection at degenerate points (LICQ fails).

Where the rows active at a certified point, :math:`C = [A; G_T]` with
:math:`T = \\{i : g_i \\ne 0,\\ h_i - g_i^\\top x \\le t_p\\}` (zero slack within the
certificate's complementarity tolerance :math:`t_p = \\varepsilon_{abs} + r\\max(\\|Gx\\|_\\infty,
\\|h\\|_\\infty)`), are linearly dependent, the multipliers on them are not unique: every
:math:`y = y_0 + k` with :math:`C^\\top k = 0` gives the same stationarity residual. Backends
pick different elements (an active-set solver a vertex, :math:`[\\nu, 0]` on two copies of a
row; an interior point the analytic centre, :math:`[\\nu/2, \\nu/2]`). :func:`select_multipliers`
replaces them by the **minimum-norm element** of that set,

.. math:: y^\\star = U_r U_r^\\top y_0, \\qquad C = U\\Sigma V^\\top,

the orthogonal projection of :math:`y_0` onto :math:`\\operatorname{range} C` (:math:`U_r` the
left singular vectors of the :math:`r = k - d` nonzero singular values, :math:`d` the number of
dependent rows by the Gram test of :func:`dxopt.qp.certify.dependence.count_dependent_dense`,
the backward's own). :math:`C^\\top y^\\star = C^\\top y_0` to round-off, so the certificate is
unchanged, and :math:`y^\\star = -(C^\\top)^+(Px + q)` for an exact point: one selection,
whatever the backend. It is the selection whose derivative the backward returns (the
minimum-norm multiplier adjoint of :mod:`dxopt.qp.certify.dependence` is
:math:`\\partial y^\\star`, the adjoint on the range of :math:`C`).

The minimum-norm selection is made where the backward's default rule differentiates the
minimum-norm multipliers: dependencies among the rows of ``A`` and parallel copies of rows of
``G`` (duplicated or opposite rows). A dependency that involves a row of ``G`` otherwise (rows
:math:`e_1, e_2, e_1 + e_2`) is reduced by the backward to the vertex of the multiplier set
:math:`\\Lambda = \\{y: C^\\top y = C^\\top y_0,\\ y_T \\ge 0\\}` that minimises the l1 norm
of the row-normalised multipliers, ties broken by row order
(:func:`dxopt.qp.backward.vertex.vertex_rows`, a function of :math:`\\Lambda` alone); there the
returned multipliers are **that vertex's**
(:func:`dxopt.qp.backward.vertex_select.vertex_selection`, the backward's own rule
and multipliers, :func:`~dxopt.qp.backward.degenerate_rule.rule_multipliers`), so they do not
depend on the backend and the backward's multiplier derivative (the derivative of the QP
restricted to the vertex's independent rows) is the derivative of what is returned wherever
that vertex is locally the rule's choice. The backward checks that the rule it runs gives the
returned numbers and warns where it does not (a tie, another active-set tolerance). The
selection is kept only when it is dual feasible:
:math:`\\nu^\\star_i\\|g_i\\|_\\infty \\ge -\\text{ROUNDOFF}\\max(\\sigma^d, \\|\\nu^\\star \\circ
g_\\infty\\|_\\infty)` on every row of :math:`T` (the polish's own round-off test; entries within
it are clipped to 0); otherwise (opposite rows, whose minimum-norm multipliers have opposite
signs) the backend's multipliers stay, the sample is reported ``feasible=False`` and the caller
warns (:func:`note_not_selected`).

Points with independent active rows are returned untouched (bitwise). On an exact working set
(daqp's, whose working set satisfies LICQ) the test runs only when some row of :math:`T` or of
``A`` has a zero multiplier (a weakly active row may then be a copy of a working row).
Samples whose dense :math:`C` would exceed ``DENSE_SELECTION`` entries are left as the
backend gave them: ``Selection(..., checked=False)``, and :func:`select_forward` warns
(:func:`note_too_big`) where their active rows are dependent by the sparse Gram test
(:func:`dxopt.qp.certify.dependence.count_dependent_sparse`), since the backward's multiplier
derivative there is not the derivative of the returned numbers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from dxopt.qp.certify.tolerances import (
    DENSE_SELECTION,
    DEPENDENT_TOL,
    ROUNDOFF,
    relative_tolerance,
)
from dxopt.qp.problem.types import QPDegenerateWarning

__all__ = [
    "Selection",
    "count_dependent_dense",
    "dense_array",
    "dependent_sparse",
    "inf_norm",
    "note_not_selected",
    "note_too_big",
    "sample_of",
    "select_multipliers",
    "zero_slack_rows",
]


@dataclass(frozen=True)
class Selection:
    """The selected ``mu`` (p,) and ``nu`` (m,), the number of dependent active rows, and
    whether the minimum-norm selection was dual feasible (``False``: ``mu, nu`` are the
    backend's). ``rows``: the zero-slack rows :math:`T` (m,) where the dependency is a general
    one (``mu, nu`` are then the backend's, to be replaced by the backward's vertex:
    :func:`dxopt.qp.backward.vertex_select.vertex_selection`), else ``None``.
    ``checked=False``: the sample was too big for the dense test (``mu, nu`` the
    backend's, ``dependent`` -1: not counted)."""

    mu: np.ndarray
    nu: np.ndarray
    dependent: int
    feasible: bool
    rows: np.ndarray | None = None
    checked: bool = True


def dense_array(M: Any) -> np.ndarray:
    return M.toarray() if sp.issparse(M) else np.asarray(M)


def inf_norm(v: np.ndarray) -> float:
    return float(np.abs(v).max()) if v.size else 0.0


def zero_slack_rows(
    G: Any, h: np.ndarray, x: np.ndarray, g_inf: np.ndarray, eps_abs: float, eps_rel: float
) -> np.ndarray:
    """The rows :math:`T` of the module docstring: nonzero rows of ``G`` whose slack is within
    :math:`t_p` (``G`` dense or scipy sparse, one sample)."""
    gx = G @ x
    t_p = eps_abs + relative_tolerance(eps_rel) * max(inf_norm(gx), inf_norm(h))
    return (h - gx <= t_p) & (g_inf > 0)


def select_multipliers(
    P: Any,
    q: np.ndarray,
    A: Any,
    G: Any,
    h: np.ndarray | None,
    x: np.ndarray,
    mu: np.ndarray,
    nu: np.ndarray,
    *,
    eps_abs: float,
    eps_rel: float,
    g_inf: np.ndarray | None = None,
    exact_working_set: bool = False,
) -> Selection | None:
    """The minimum-norm multipliers of one certified sample (module docstring), or ``None``
    where the active rows are independent (the multipliers are unique and stay as they are)
    (see :class:`Selection` for a general dependency and a sample too big for the dense test).
    ``P, A, G`` dense or scipy sparse (``A``, ``G`` may be ``None``); ``g_inf`` the row
    max-norms of ``G``."""
    p = 0 if A is None else A.shape[0]
    m = 0 if G is None else G.shape[0]
    n = x.shape[0]
    if exact_working_set and not (p and not mu.all()):  # the cheap test first (lean path)
        free = nu <= 0
        if not (m and free.any()):
            return None  # every row in daqp's working set, which satisfies LICQ
        assert h is not None
        gx = G @ x
        t_p = eps_abs + relative_tolerance(eps_rel) * max(np.abs(gx).max(), np.abs(h).max())
        if not ((h - gx)[free] <= t_p).any():
            return None  # no active row outside the working set
    if m:
        assert h is not None
        if g_inf is None:
            g_inf = np.abs(dense_array(G)).max(axis=1)
        T = zero_slack_rows(G, h, x, g_inf, eps_abs, eps_rel)
    else:
        T = np.zeros(0, dtype=bool)
    k = p + int(T.sum())
    if k == 0:
        return None
    if exact_working_set and bool(np.all(mu != 0)) and bool(np.all(nu[T] > 0)):
        return None  # daqp's working set satisfies LICQ and no row outside it is active
    if k * n > DENSE_SELECTION:
        return Selection(mu, nu, -1, True, T if m else None, checked=False)
    blocks = []
    if p:
        blocks.append(dense_array(A))
    if T.any():
        blocks.append(dense_array(G[np.flatnonzero(T)]))
    C = np.concatenate(blocks, 0) if len(blocks) > 1 else blocks[0]
    dependent = count_dependent_dense(C)
    if dependent == 0:
        return None
    if _general(C, p, dependent):
        return Selection(mu, nu, dependent, True, T)
    y0 = np.concatenate([mu, nu[T]])
    U, _, _ = np.linalg.svd(C, full_matrices=False)
    rank = (np.linalg.norm(C, axis=1) > 0).sum() - dependent
    Ur = U[:, :rank]
    y = Ur @ (Ur.T @ y0)
    nu_T = y[p:]
    if m:
        assert g_inf is not None
        dual_scale = max(inf_norm(P @ x), inf_norm(q))
        nu_g = nu_T * g_inf[T]
        floor = -ROUNDOFF * max(dual_scale, inf_norm(nu_g), 1e-300)
        if bool((nu_g < floor).any()):
            return Selection(mu, nu, dependent, False)
    nu_new = nu.copy()
    nu_new[T] = np.maximum(nu_T, 0.0)
    return Selection(y[:p].copy(), nu_new, dependent, True)


def count_dependent_dense(C: np.ndarray) -> int:
    """The rule of :func:`~dxopt.qp.certify.dependence.count_dependent_dense` for one dense
    ``C`` in numpy (the torch call costs small problems a tenth of a millisecond): rows whose
    Cholesky pivot of the row-normalised Gram matrix is below ``DEPENDENT_TOL`` (zero rows not
    counted), the SVD rank where the factorization fails."""
    norms = np.linalg.norm(C, axis=1)
    nonzero = norms > 0
    Cn = C / np.where(nonzero, norms, 1.0)[:, None]
    gram = Cn @ Cn.T
    gram[np.diag_indices_from(gram)] += (~nonzero).astype(np.float64) + 1e-14
    try:
        pivots = np.diag(np.linalg.cholesky(gram)) ** 2
    except np.linalg.LinAlgError:
        return int(nonzero.sum()) - int(np.linalg.matrix_rank(Cn, rtol=1e-8))
    return int(((pivots < DEPENDENT_TOL) & nonzero).sum())


def _general(C: np.ndarray, p: int, dependent: int) -> bool:
    """True when a dependency of the rows ``C = [A; G_T]`` involves a row of ``G`` other than
    through a parallel copy (a duplicated or opposite row): the rows of ``A`` with one
    representative of each class of parallel rows of ``G_T`` are still dependent beyond the
    rows of ``A`` alone. The backward's default rule then differentiates a vertex of the
    multiplier set (:func:`dxopt.qp.backward.vertex.vertex_rows`), not the minimum-norm
    multipliers, so the backend's multipliers stay (the backward warns where their cotangent
    is nonzero)."""
    rows = C[p:]
    if rows.shape[0] == 0:
        return False  # among the rows of A alone
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    cos = np.abs(unit @ unit.T)
    copy = np.triu(1.0 - cos**2 < DEPENDENT_TOL, 1).any(0)  # parallel to an earlier row
    left = dependent - int(copy.sum())  # each copy is one dependent row of its own
    alone = count_dependent_dense(C[:p]) if p else 0
    return left > alone


def note_not_selected(samples: list[int]) -> None:
    """Warn that the selection of ``samples`` (the minimum-norm multipliers, or the vertex of
    :func:`dxopt.qp.backward.vertex_select.vertex_selection`) failed its tests (dual
    feasibility; for the vertex also the
    stationarity residual), so their returned multipliers are the backend's and only some
    derivatives are exact."""
    warnings.warn(
        "the active constraint rows are linearly dependent (LICQ fails) and the backend-"
        "independent multiplier selection (minimum-norm multipliers, or the backward's vertex) "
        "is not dual feasible or does not keep the stationarity residual, so the returned "
        "multipliers of the dependent rows are the "
        "backend's own choice; the backward's derivative of those entries is that of the "
        "rule's selection, not of the returned numbers. Exact: the derivatives of x "
        f"(every dL/dx-only loss) and of the multipliers of rows in no dependency (batch "
        f"indices {samples[:10]}).",
        QPDegenerateWarning,
        stacklevel=3,
    )


def sample_of(M: Any, i: int) -> Any:
    return M if sp.issparse(M) or M.ndim == 2 else M[i]


def select_forward(
    problem: Any, result: Any, *, eps_abs: float, eps_rel: float, exact_working_set: bool
) -> Any:
    """:func:`select_multipliers` on every solved sample of a
    :class:`~dxopt.qp.problem.contracts.ForwardResult` of ``problem`` (a
    :class:`~dxopt.qp.problem.canonical.QPProblem`); the result itself when nothing changes.
    The rows that get a positive multiplier join ``active``."""
    from dataclasses import replace

    from dxopt.qp.certify.polish import numpy_matrix, row_inf

    if not (problem.p or problem.m):
        return result
    X, MU, NU = result.x.numpy(), result.eq_duals.numpy(), result.ineq_duals.numpy()
    solved = np.array([s.ok for s in result.status], dtype=bool)
    P, q = numpy_matrix(problem, "P"), problem.q.numpy()
    A = numpy_matrix(problem, "A") if problem.p else None
    G = numpy_matrix(problem, "G") if problem.m else None
    h = problem.h.numpy() if problem.m else None
    shared_g = G is not None and (sp.issparse(G) or G.ndim == 2)
    g_shared = row_inf(G) if shared_g else None
    mu_out: Any = None
    nu_out: Any = None
    active: Any = None
    refused: list[int] = []
    general: list[tuple[int, np.ndarray]] = []
    big: list[tuple[int, np.ndarray | None]] = []
    for i in np.flatnonzero(solved).tolist():
        Gi = None if G is None else sample_of(G, i)
        hi = None if h is None else (h if h.ndim == 1 else h[i])
        gi = g_shared if g_shared is not None or Gi is None else row_inf(Gi)
        sel = select_multipliers(
            sample_of(P, i), q if q.ndim == 1 else q[i], None if A is None else sample_of(A, i),
            Gi, hi, X[i], MU[i], NU[i], eps_abs=eps_abs, eps_rel=eps_rel, g_inf=gi,
            exact_working_set=exact_working_set,
        )  # fmt: skip
        if sel is None:
            continue
        if not sel.checked:
            if sel.rows is not None or A is not None:
                big.append((i, sel.rows))
            continue
        if not sel.feasible:
            refused.append(i)
            continue
        if sel.rows is not None:
            general.append((i, sel.rows))
            continue
        if mu_out is None:
            mu_out, nu_out = MU.copy(), NU.copy()
            active = None if result.active is None else result.active.numpy().copy()
        mu_out[i], nu_out[i] = sel.mu, sel.nu
        if active is not None:
            active[i] |= sel.nu > 0
    if general and mu_out is None:
        mu_out, nu_out = MU.copy(), NU.copy()
        active = None if result.active is None else result.active.numpy().copy()
    if refused:
        note_not_selected(sorted(refused))
    dependent_big = [i for i, rows in big if dependent_sparse(A, G, i, rows)]
    if dependent_big:
        note_too_big(dependent_big)
    if mu_out is None:
        return result
    return replace(
        result,
        eq_duals=torch.from_numpy(mu_out),
        ineq_duals=torch.from_numpy(nu_out),
        active=None if active is None else torch.from_numpy(active),
        vertex_pending=tuple(general),
    )


def note_too_big(samples: list[int]) -> None:
    """Warn that ``samples`` (too big for the dense selection, ``DENSE_SELECTION`` entries)
    have dependent active rows and keep the backend's multipliers."""
    warnings.warn(
        "the active constraint rows are linearly dependent (LICQ fails), and the samples are "
        f"too big for the multiplier selection (over {DENSE_SELECTION} entries in the dense "
        "active rows), so the returned multipliers of the dependent rows are the backend's own "
        "choice and the backward's derivative of those entries is that of its rule's "
        "selection, not of the returned numbers. Exact: the derivatives of x (every "
        f"dL/dx-only loss) and of the multipliers of rows in no dependency (batch indices "
        f"{samples[:10]}).",
        QPDegenerateWarning,
        stacklevel=3,
    )


def dependent_sparse(A: Any, G: Any, i: int, rows: np.ndarray | None) -> bool:
    """True where the active rows ``[A; G_T]`` of sample ``i`` (``A``, ``G`` dense shared,
    dense batched or scipy sparse; ``rows`` the mask :math:`T`) are dependent by the sparse
    Gram test of the backward (:func:`~dxopt.qp.certify.dependence.count_dependent_sparse`)."""
    from dxopt.qp.certify.dependence import count_dependent_sparse

    blocks = []
    if A is not None:
        blocks.append(sp.csr_matrix(sample_of(A, i)))
    if G is not None and rows is not None and rows.any():
        blocks.append(sp.csr_matrix(sample_of(G, i))[np.flatnonzero(rows)])
    if not blocks:
        return False
    return count_dependent_sparse(sp.vstack(blocks, format="csr")) > 0
