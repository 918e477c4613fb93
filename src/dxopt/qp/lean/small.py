"""One small dense QP without the batch machinery: the lean path of :func:`dxopt.qp.solve`.

A single (unbatched) dense CPU problem with ``n <= SMALL_MAX_N``, solved by a backend whose
entry in :mod:`dxopt.qp.solvers.backends` says ``lean`` (daqp, piqp, proxqp, clarabel, osqp)
with the default solver options and differentiated by a method
``lean_method`` accepts (all three in :mod:`dxopt.qp.lean.lean_check`), is the call
decision-focused models and controllers make thousands of times per epoch. Through the general
path (canonical problem, fallback chain, batch certificate, batched active set and backward) it
costs about 0.6 ms with daqp, some 60 raw solves; as straight-line numpy on the one sample,
about 0.15 ms, most of it the dispatch of some hundred small array operations. This module
and :mod:`dxopt.qp.lean.small_backward` run the same steps in three compiled kernels
(:mod:`dxopt.qp.solvers.kernels`, numba; in the forward each fused with its neighbour's work
by :mod:`dxopt.qp.lean.fused`: the copy reads the tensors where they lie, daqp's certificate
carries the first test of the multiplier selection) around the backend call:

- **forward** (:func:`small_forward`): the cheap checks (finite entries, symmetry of ``P``, no
  zero row of ``G``) while copying the data into daqp's layout; then either one
  :func:`daqp.solve` with ``eps_prox = 0`` (its Cholesky of ``P`` certifies it positive
  definite, :mod:`dxopt.qp.solvers.daqp`; the active set is its working set), or, for piqp/proxqp,
  one LAPACK Cholesky of ``P``, the backend through qpsolvers and the general path's own
  :func:`dxopt.qp.certify.polish.polish` (the active set is the polished one, settled); then the
  certificate of :func:`dxopt.qp.certify.polish.batch_accept_exact` for the one point (same tests,
  same tolerances);
- **backward** (:func:`dxopt.qp.lean.small_backward.small_backward`): the forward's active set
  is taken only when it is unambiguous with a margin of ten times every threshold in play: with
  :math:`b = \\max(10^3\\varepsilon, 10^{-9})` the classification threshold of
  :func:`dxopt.qp.certify.active.identify_active` (:math:`\\varepsilon` the point's accuracy), every
  row in it has a multiplier above :math:`\\max(10\\,b,\\ 10^4 s)` times the dual scale
  (:math:`s` the stationarity residual :math:`\\|Px + q + C^\\top\\lambda\\|_\\infty` over the
  dual scale: a multiplier that small could be the residual's doing) and every other row a
  relative slack above :math:`10\\,b`. So ``identify_active`` would return the same set (no
  weak row, strict complementarity), and the general path would compute the same gradient.
  Then the reduced KKT
  system is solved by block elimination of ``P`` (:mod:`dxopt.linalg.small`; a row
  dependent on the others, read off its pivots, leaves the lean path), refined against
  :math:`K` as :func:`dxopt.qp.backward.kkt.schur_refine` does, with the requested method's
  own step limit, tolerance and residual bound, and turned into the gradients of
  :mod:`dxopt.qp.backward.grads`.

The autograd Function around both is :mod:`dxopt.qp.lean.small_function`.

Anything else (another solver, an option the lean path does not take, batched or sparse or
non-CPU inputs, a point the backend did not solve or that does not certify or settle, an
ambiguous or dependent active set, a refinement that does not reach the residual bound) leaves
the lean path: the forward returns ``None`` and :func:`~dxopt.qp.solve` takes the general path
(with its fallback chain), and the backward rebuilds the general state from its saved copy of
the data (one more solve, same point) and runs the requested backward method with its
degenerate policy. The results, diagnostics included, are those of the general path
(``tests/qp/lean/test_small.py`` compares them, and checks the gradients against finite
differences).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
from torch import Tensor

from dxopt.qp.autograd.function import eager_gradients
from dxopt.qp.autograd.state import rebuilt_state
from dxopt.qp.certify.multipliers import note_not_selected, select_multipliers
from dxopt.qp.certify.tolerances import RELATIVE_FLOOR, ROUNDOFF
from dxopt.qp.lean.fused import certify_exact, copy_in
from dxopt.qp.lean.lean_check import SYMMETRY_TOL
from dxopt.qp.lean.records import SmallPoint
from dxopt.qp.lean.small_backward import small_backward
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import BackwardDiagnostics
from dxopt.qp.solvers.backends import backend, backend_kwargs, polish_attempt, qpsolvers_attempt
from dxopt.qp.solvers.kernels.batch import prepare
from dxopt.qp.solvers.kernels.certify import certify_point, may_be_dependent

__all__ = ["daqp_bounds", "daqp_module", "point_gradients", "small_forward"]

_BOUNDS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (m, p) -> (lower, sense)
_ABSENT: dict[tuple[int, Any], tuple[np.ndarray, np.ndarray]] = {}  # (n, dtype) -> (M, v)


def _array(t: Tensor | None) -> Any:
    """A float64 C-contiguous copy of ``t`` (``None`` stays ``None``)."""
    if t is None:
        return None
    a = (t.detach() if t.requires_grad else t).numpy()
    return np.array(a, dtype=np.float64, order="C")


_NO_ROWS = np.zeros(0, dtype=bool)

_DAQP: list[Any] = []  # the daqp module, once imported


def daqp_module() -> Any:
    """The daqp module (imported on first use)."""
    if not _DAQP:
        import daqp

        _DAQP.append(daqp)
    return _DAQP[0]


def _absent(n: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """The ``(0, n)`` matrix and ``(0,)`` vector that stand for absent constraints in the
    kernels (cached; nothing writes them)."""
    key = (n, dtype)
    if key not in _ABSENT:
        _ABSENT[key] = (np.zeros((0, n), dtype=dtype), np.zeros(0, dtype=dtype))
    return _ABSENT[key]


def daqp_bounds(m: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """daqp's lower bounds and senses for ``m`` inequality and ``p`` equality rows (as
    :class:`dxopt.qp.solvers.daqp.DaqpBatch`; cached, daqp does not write them)."""
    key = (m, p)
    if key not in _BOUNDS:
        sense = np.zeros(m + p, dtype=np.intc)
        sense[m:] = 5
        _BOUNDS[key] = (np.full(m + p, -1e30), sense)
    return _BOUNDS[key]


def _copy_views(
    data: tuple[Any, ...],
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(status, Pn, qn, C, upper, g_inf)`` of :func:`~dxopt.qp.solvers.kernels.batch.prepare`
    through numpy views of the inputs (:func:`dxopt.qp.lean.fused.copy_in`'s result for the
    inputs it does not read); ``None`` where an input has no numpy view (the general path)."""
    P, q, A, b, G, h = data
    # numpy views (force: detached, and a conjugate or negative-bit view resolved: copied,
    # as below); absent constraints, and those given without rows, as arrays without rows
    try:
        Pv, qv = P.numpy(force=True), q.numpy(force=True)
        n = qv.shape[0]
        no_rows = _absent(n, qv.dtype)
        Av, bv = (
            no_rows if A is None or not A.shape[0] else (A.numpy(force=True), b.numpy(force=True))
        )
        Gv, hv = (
            no_rows if G is None or not G.shape[0] else (G.numpy(force=True), h.numpy(force=True))
        )
    except (RuntimeError, TypeError):  # no numpy view: the general path
        return None
    m, p = Gv.shape[0], Av.shape[0]
    Pn, qn, C, upper = np.empty((n, n)), np.empty(n), np.empty((m + p, n)), np.empty(m + p)
    g_inf = np.zeros(m)
    status = prepare(Pv, qv, Av, bv, Gv, hv, SYMMETRY_TOL[q.dtype], Pn, qn, C, upper, g_inf)
    return status, Pn, qn, C, upper, g_inf


def small_forward(
    data: tuple[Tensor | None, ...],
    options: QPOptions,
    *,
    solver: str = "daqp",
    warm_start: Tensor | None = None,
    warm_duals: Tensor | None = None,
) -> SmallPoint | None:
    """Solve and certify one small QP ``data = (P, q, A, b, G, h)`` (:func:`small_inputs`
    holds) with ``solver`` (a lean backend of :mod:`dxopt.qp.solvers.backends`; ``"auto"``
    already resolved) at ``options``' tolerances and polish, started from ``warm_start`` (an
    ``(n,)`` CPU tensor; anything else: the general path validates it) or, for daqp, from the
    working set of a previous solve's multipliers ``warm_duals`` of the rows of ``G``
    (``(m,)``; daqp's ``dual_start``, the rows of positive multiplier; another shape: unused);
    a failed warm daqp solve is solved again cold. ``None`` for the
    general path (module docstring). ``options`` also travel in the point, for the general
    path's state where the lean backward declines."""
    q = data[1]
    assert q is not None
    start_x = None
    if warm_start is not None:
        if not (type(warm_start) is Tensor and warm_start.shape == q.shape and warm_start.is_cpu):
            return None
        if not warm_start.is_floating_point():
            return None
        start_x = _array(warm_start)
    dtype = q.dtype
    tensors: tuple[Any, ...] = data  # (small_inputs holds: A, b and G, h in pairs)
    P, _, A, b, G, h = tensors
    copied = copy_in(P, q, A, b, G, h, SYMMETRY_TOL[dtype]) or _copy_views(tensors)
    if copied is None or copied[0]:
        return None  # NaN/Inf, asymmetric P, a zero row of G: the general path's rules, errors
    _, Pn, qn, C, upper, g_inf = copied
    n, m = qn.shape[0], g_inf.shape[0]
    p = C.shape[0] - m
    given = (data[2] is not None, data[4] is not None)
    eps_abs, eps_rel = options.eps_abs, options.eps_rel
    entry = backend(solver)
    start = time.perf_counter()
    polished = False
    iterations, warm_used = 0, False
    if entry.call == "daqp":
        dual_start = None
        if warm_duals is not None and warm_duals.shape == (m,) and m:
            lam = _array(warm_duals)
            lam = np.where(lam > 0.0, lam, 0.0)  # the rows of positive multiplier (NaN: none)
            dual_start = np.concatenate((lam, np.zeros(p))) if p else lam
        solved = _daqp_point(Pn, qn, C, upper, m, start_x, dual_start, eps_abs)
        if solved is None:
            return None
        x, duals, iterations, warm_used = solved
        working = _NO_ROWS  # daqp: the working set is read off the multipliers (nu > 0)
    else:
        # own arrays for the backend, as the general path's (views of C change the rounding
        # of some backends, proxqp's at 1e-16)
        An, bn = (C[m:], upper[m:]) if p else (None, None)
        Gn, hn = (C[:m], upper[:m]) if m else (None, None)
        arrays = tuple(None if a is None else a.copy() for a in (Pn, qn, An, bn, Gn, hn))
        polished_point = _polished_point(
            arrays, solver, start_x, g_inf, eps_abs, eps_rel, options.polish
        )
        if polished_point is None:
            return None
        x, nu_p, mu_p, working, polished = polished_point
        duals = np.concatenate((nu_p, mu_p))
    rel = max(eps_rel, RELATIVE_FLOOR)
    outputs = (np.empty(n), np.empty(p), np.empty(m))  # copies of (x, mu, nu) for the caller
    exact = entry.exact_working_set
    if exact:  # the certificate and _select's first test in one call
        ok, primal, dual, dependent = certify_exact(
            Pn, qn, C, upper, m, x, duals, working, g_inf, eps_abs, rel, ROUNDOFF, *outputs
        )
        select = dependent
    else:
        ok, primal, dual = certify_point(
            Pn, qn, C, upper, m, x, duals, working, g_inf, eps_abs, rel, ROUNDOFF, *outputs
        )
        select = bool(m or p)
    if not ok:
        return None
    if select:  # one multiplier selection at degenerate points (qp.certify.multipliers)
        working = _select(Pn, qn, C, upper, m, outputs, duals, working, g_inf, eps_abs, eps_rel,
                          exact=exact, tested=exact)  # fmt: skip
    return SmallPoint(Pn, qn, C, upper, x, duals, working, g_inf, dtype, options, solver, given,
                      start_x, polished, BackwardDiagnostics(), time.perf_counter() - start,
                      primal, dual, outputs, iterations, warm_used)  # fmt: skip


def _select(
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    duals: np.ndarray,
    working: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    eps_rel: float,
    *,
    exact: bool,
    tested: bool = False,
) -> np.ndarray:
    """:func:`dxopt.qp.certify.multipliers.select_multipliers` at the certified point: the
    caller's copies ``outputs = (x, mu, nu)`` and the saved ``duals = [nu; mu]`` take the
    minimum-norm multipliers where the active rows are dependent; returns the working set
    (with the rows that got a positive multiplier). ``tested``: the caller's
    :func:`~dxopt.qp.lean.fused.certify_exact` found that the active rows may be dependent
    (the test ``exact`` runs first otherwise)."""
    x, mu, nu = outputs
    rel = max(eps_rel, RELATIVE_FLOOR)
    if exact and not tested and not may_be_dependent(C, upper, m, x, duals, eps_abs, rel):
        return working  # daqp's working set, and no active row outside it (one kernel pass)
    p = C.shape[0] - m
    sel = select_multipliers(
        Pn, qn, C[m:] if p else None, C[:m] if m else None, upper[:m] if m else None, x, mu,
        nu, eps_abs=eps_abs, eps_rel=eps_rel, g_inf=g_inf, exact_working_set=exact,
    )  # fmt: skip
    if sel is None:
        return working
    if not sel.checked:
        note_too_big_rows(C, m, [(0, sel.rows)])
        return working
    if sel.rows is not None:  # a general dependency: the backward's vertex
        sel = vertex_selected(Pn, qn, C, upper, m, x, sel)
        if sel is None:
            return working
    if not sel.feasible:
        note_not_selected([0])
        return working
    mu[:], nu[:] = sel.mu, sel.nu
    duals[:m], duals[m:] = sel.nu, sel.mu
    return working | (sel.nu > 0) if working.size else working


def vertex_selected(
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    x: np.ndarray,
    sel: Any,
) -> Any:
    """The selection ``sel`` of a general dependency (``sel.rows``) replaced by the backward's
    vertex (:func:`dxopt.qp.backward.vertex_select.vertex_selection_dense`); ``feasible=False``
    where it is infeasible, ``None`` where it is not kept for another reason (the backend's
    multipliers stay)."""
    from dataclasses import replace

    from dxopt.qp.backward.vertex_select import vertex_selection_dense

    mu, nu = sel.mu.copy(), sel.nu.copy()
    A = C[m:] if C.shape[0] > m else None
    kept = vertex_selection_dense(Pn, qn, A, C[:m], upper[:m], x, mu, nu, sel.rows)
    if kept and np.array_equal(mu, sel.mu) and np.array_equal(nu, sel.nu):
        return None
    return replace(sel, mu=mu, nu=nu, feasible=kept, rows=None)


def note_too_big_rows(C: np.ndarray, m: int, samples: list[tuple[int, Any]]) -> None:
    """Warn (:func:`dxopt.qp.certify.multipliers.note_too_big`) for the ``samples``
    ``(index, zero-slack rows)`` too big for the selection whose active rows of
    ``C = [G; A]`` (one (k, n) or a batch) are dependent."""
    from dxopt.qp.certify.multipliers import dependent_sparse, note_too_big

    Cs = C if C.ndim == 3 else C[None]
    A = Cs[:, m:] if Cs.shape[1] > m else None
    G = Cs[:, :m] if m else None
    found = [i for i, rows in samples if dependent_sparse(A, G, i, rows)]
    if found:
        note_too_big(found)


def _daqp_point(
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    start_x: Any,
    dual_start: Any,
    eps_abs: float,
) -> tuple[np.ndarray, np.ndarray, int, bool] | None:
    """daqp's point ``(x, multipliers of [G; A], iterations, warm)`` with ``eps_prox = 0``
    (its Cholesky certifies ``P``), started from ``dual_start``'s working set (the rows of
    positive multiplier), else from ``start_x``; a warm solve that fails is solved again cold
    (``warm`` False; ``iterations``: both attempts'). ``None`` unless it solved."""
    lower, sense = daqp_bounds(m, C.shape[0] - m)
    solve = daqp_module().solve
    if dual_start is not None:
        start_x = None
    warm = start_x is not None or dual_start is not None
    x, _, flag, info = solve(
        Pn, qn, C, upper, lower, sense, primal_start=start_x, dual_start=dual_start,
        primal_tol=eps_abs, eps_prox=0.0,
    )  # fmt: skip
    iterations = int(info["iterations"])
    if warm and flag != 1 and flag != 2:  # the warm start failed: cold
        warm = False
        x, _, flag, info = solve(
            Pn, qn, C, upper, lower, sense, primal_tol=eps_abs, eps_prox=0.0
        )  # fmt: skip
        iterations += int(info["iterations"])
    if flag != 1 and flag != 2:  # not solved, or P not positive definite: the general path
        return None
    return x, info["lam"], iterations, warm


def _polished_point(
    arrays: tuple[Any, ...],
    solver: str,
    start_x: Any,
    g_inf: np.ndarray,
    eps_abs: float,
    eps_rel: float,
    polish: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """``(x, nu, mu, working, polished)``: the general path's first attempt for a backend other
    than daqp, for one sample: ``P`` positive definite (one LAPACK Cholesky; a semidefinite or
    indefinite ``P`` goes to the general path's check), the arrays in the backend's format
    (:class:`dxopt.qp.solvers.backends.Backend`), the general path's attempt
    (:func:`dxopt.qp.solvers.backends.qpsolvers_attempt`, with the tolerances of
    :func:`~dxopt.qp.solvers.backends.backend_kwargs`) and its polish
    (:func:`~dxopt.qp.solvers.backends.polish_attempt`); ``None`` unless the result certifies
    and is settled."""
    from scipy.linalg import lapack

    from dxopt.qp.certify.polish import row_inf

    Pn, qn, An, bn, Gn, hn = arrays
    if lapack.dpotrf(Pn, lower=1)[1] != 0:
        return None
    a_inf = row_inf(An) if An is not None else None
    entry = backend(solver)  # the general path's arguments (scipy CSC for CSC-only backends)
    args = {"P": entry.matrix(Pn), "q": qn, "A": entry.matrix(An), "b": bn, "G": entry.matrix(Gn),
            "h": hn}  # fmt: skip
    kw = backend_kwargs(solver, eps_abs, eps_rel, None)
    try:
        pt = qpsolvers_attempt(solver, args, kwargs=kw, init=start_x, record_warnings=False)
    except Exception:  # a backend crash: the general path walks its fallback chain
        return None
    x, y, z = pt.x, pt.y, pt.z
    if x is None or not np.all(np.isfinite(x)):
        return None
    if y is None or z is None or not (np.isfinite(y).all() and np.isfinite(z).all()):
        return None  # missing or non-finite multipliers: the general path recovers them
    m, p = z.size, y.size
    pol = polish_attempt(
        args, x, y, z, eps_abs=eps_abs, eps_rel=eps_rel, enabled=polish, force=False,
        exact_working_set=False, g_inf=g_inf if m else None, a_inf=a_inf if p else None,
    )  # fmt: skip
    cert = pol.certificate
    if cert.zero_row_infeasible or not cert.ok or not cert.settled:
        return None
    nu = np.maximum(pol.nu, 0.0) if m else np.zeros(0)
    working = np.asarray(pol.active, dtype=bool) if m else np.zeros(0, dtype=bool)
    mu = pol.mu if p else np.zeros(0)
    return np.asarray(pol.x, dtype=np.float64), nu, mu, working, bool(pol.polished)


def point_gradients(
    point: SmallPoint,
    method: Any,
    grad_x: Tensor | None,
    grad_eq: Tensor | None,
    grad_ineq: Tensor | None,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """The gradients for ``(P, q, A, b, G, h)``: :func:`small_backward`, or where it
    declines the general path's (its state rebuilt from the saved data, same point)."""
    grads = small_backward(point, method, grad_x, grad_eq, grad_ineq, needs)
    if grads is None:
        arrays = (point.P, point.q, point.A, point.b, point.G, point.h, point.warm_start)
        rebuilt = rebuilt_state(arrays, point.dtype, method=method, solver=point.solver,
                                options=point.options)  # fmt: skip
        state = replace(rebuilt, diagnostics=point.diagnostics)
        grads = eager_gradients(state, grad_x, grad_eq, grad_ineq, needs)
    return grads
