"""Compiled checks before the solve and the batch loops of the lean path (numba).

:func:`prepare` checks one problem (NaN/Inf, asymmetric ``P``, zero rows of ``G``) and copies it
into daqp's layout (``C = [G; A]``, ``upper = [h; b]``; :mod:`dxopt.qp.solvers.kernels.certify`);
:func:`prepare_batch`, :func:`certify_batch`, :func:`forward_batch` and
:func:`lean_adjoint_batch` run the checks, the compiled solver
(:func:`dxopt.qp.solvers.dual_active_set.solve_one`), the certificate
(:mod:`~dxopt.qp.solvers.kernels.certify`) and the lean backward
(:mod:`~dxopt.qp.solvers.kernels.adjoint`) over a batch, sample by sample in one loop.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from dxopt.qp.solvers.dual_active_set import NOT_CERTIFIED, solve_one
from dxopt.qp.solvers.kernels.adjoint import gradients_into, lean_adjoint, reused_solve
from dxopt.qp.solvers.kernels.certify import (
    active_accuracy,
    certified_point,
    clear_of_residual,
    kernel_jit,
    point_accuracy,
    split_point,
)

__all__ = [
    "certify_batch",
    "forward_batch",
    "lean_adjoint_batch",
    "prepare",
    "prepare_batch",
    "same_bits",
]


@kernel_jit
def prepare_batch(
    P: np.ndarray,
    q: np.ndarray,
    A: np.ndarray,
    b: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    sym_tol: float,
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    g_inf: np.ndarray,
) -> int:
    """:func:`prepare` for a batch (a leading axis of ``B`` samples on every argument; shared
    data as broadcast views), into the given float64 arrays ``Pn`` (B, n, n), ``qn`` (B, n),
    ``C`` (B, m + p, n), ``upper`` (B, m + p), ``g_inf`` (B, m); returns the first failing
    sample's status (0: all ready)."""
    B = q.shape[0]
    g_inf[:] = 0.0
    for i in range(B):
        status = prepare(
            P[i], q[i], A[i], b[i], G[i], h[i], sym_tol, Pn[i], qn[i], C[i], upper[i], g_inf[i]
        )
        if status:
            return status
    return 0


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def prepare(
    P: np.ndarray,
    q: np.ndarray,
    A: np.ndarray,
    b: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    sym_tol: float,
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    g_inf: np.ndarray,
) -> int:
    """``status``, with float64 copies of the data in daqp's layout and the row max-norms
    :math:`\\|g_i\\|_\\infty` of ``G`` written into the caller's ``Pn`` (n, n), ``qn`` (n,),
    ``C = [G; A]`` (m + p, n), ``upper = [h; b]`` (m + p,) and ``g_inf`` (m,), zero on entry
    (absent constraints: arrays with no rows). ``status``: 0 ready; 1 a NaN or Inf entry; 2
    ``P`` asymmetric beyond ``sym_tol * max(max|P|, 1)``; 3 a zero row of ``G``. (The checks
    of :func:`dxopt.qp.lean.small.small_forward`; each failure is the general path's to report.)
    Compiled with reassociation allowed: it only changes the order of the sum whose finiteness
    is the NaN/Inf test (a NaN or Inf entry makes any order of it non-finite) and of
    maxima."""
    n, m, p = P.shape[0], G.shape[0], A.shape[0]
    total = 0.0
    for i in range(n):
        qn[i] = q[i]
        total += qn[i]
        for j in range(n):
            Pn[i, j] = P[i, j]
            total += Pn[i, j]
    for i in range(m):
        upper[i] = h[i]
        total += upper[i]
        for j in range(n):
            C[i, j] = G[i, j]
            total += C[i, j]
    for i in range(p):
        upper[m + i] = b[i]
        total += upper[m + i]
        for j in range(n):
            C[m + i, j] = A[i, j]
            total += C[m + i, j]
    if not math.isfinite(total):  # a NaN or Inf entry (or finite entries summing past it)
        for vector in (Pn.ravel(), qn, C.ravel(), upper):
            if not np.isfinite(vector).all():
                return 1
    big = asym = 0.0
    for i in range(n):
        for j in range(i + 1):
            big = max(big, abs(Pn[i, j]))
            asym = max(asym, abs(Pn[i, j] - Pn[j, i]))
    if asym > sym_tol * max(big, 1.0):  # big: the largest |P_ij| (P symmetric within asym)
        return 2
    for i in range(m):
        r = 0.0
        for j in range(n):
            r = max(r, abs(C[i, j]))
        if r == 0.0:
            return 3
        g_inf[i] = r
    return 0


@kernel_jit
def certify_batch(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    samples: np.ndarray,
    Xo: np.ndarray,
    MU: np.ndarray,
    NU: np.ndarray,
    primal: np.ndarray,
    dual: np.ndarray,
) -> bool:
    """:func:`certify_point` for the ``samples`` of a batch of daqp points (``X`` (B, n),
    ``duals`` (B, m + p); the working sets read off the multipliers): whether they all
    certify, with their primal and dual residuals and copies of their ``(x, mu, nu)`` written
    into the caller's ``primal``, ``dual`` (B,) and ``Xo`` (B, n), ``MU`` (B, p), ``NU``
    (B, m); it stops at the first sample that does not certify."""
    none, no_accuracy = np.zeros(0, np.bool_), np.zeros(0)
    for i in samples:
        if not _certify_into(P, q, C, upper, m, X, duals, g_inf, eps_abs, rel, roundoff, i,
                             none, Xo, MU, NU, primal, dual, no_accuracy, 0.0):  # fmt: skip
            return False
    return True


@kernel_jit
def _certify_into(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    g_inf: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    i: int,
    none: np.ndarray,
    Xo: np.ndarray,
    MU: np.ndarray,
    NU: np.ndarray,
    primal: np.ndarray,
    dual: np.ndarray,
    accuracy: np.ndarray,
    margin_min: float,
) -> bool:
    """Sample ``i`` of :func:`certify_batch`: :func:`certify_point` on its rows; with entries
    in ``accuracy`` (B,), also the lean backward's accuracy of its active set
    (:func:`point_accuracy`) from the certificate's own slacks and stationarity residual,
    written to ``accuracy[i]``, so that the backward does not form them again."""
    ok, primal[i], dual[i], x, working, slack, nu_inf, eq_residual = certified_point(
        P[i], q[i], C[i], upper[i], m, X[i], duals[i], none, g_inf[i], eps_abs, rel, roundoff,
        Xo[i], MU[i], NU[i],
    )  # fmt: skip
    if ok and accuracy.shape[0]:
        eps, smallest, dual_scale = active_accuracy(
            P[i], q[i], C[i], upper[i], m, x, working, slack, nu_inf, g_inf[i], eq_residual,
            margin_min,
        )  # fmt: skip
        # dual[i]: the certificate's ||P x + q + C' [nu; mu]||_inf, point_accuracy's residual
        accuracy[i] = clear_of_residual(eps, smallest, dual_scale, dual[i])
    return ok


@kernel_jit
def forward_batch(
    P: np.ndarray,
    q: np.ndarray,
    A: np.ndarray,
    b: np.ndarray,
    G: np.ndarray,
    h: np.ndarray,
    sym_tol: float,
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    g_inf: np.ndarray,
    primal_tol: float,
    max_iter: int,
    lapack: Any,
    X: np.ndarray,
    duals: np.ndarray,
    L: np.ndarray,
    Yt: np.ndarray,
    order: np.ndarray,
    LW: np.ndarray,
    eps_abs: float,
    rel: float,
    roundoff: float,
    Xo: np.ndarray,
    MU: np.ndarray,
    NU: np.ndarray,
    primal: np.ndarray,
    dual: np.ndarray,
    accuracy: np.ndarray,
    margin_min: float,
    warm: np.ndarray,
    iterations: np.ndarray,
    warm_used: np.ndarray,
    factors: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    reused: np.ndarray,
) -> tuple[int, np.ndarray, bool]:
    """:func:`prepare_batch`, the compiled solver's :func:`~.dual_active_set.solve_batch`
    and :func:`certify_batch` of its points, sample by sample in one loop (each sample's data
    read while it is still in cache: a third of a millisecond of 7 at 128 x n=50 against the
    three passes over the batch). Returns ``(status, solved, ok)``: ``status`` the first
    failing sample's check (:func:`prepare`; 0: all ready), ``solved`` the solver's status per
    sample (:data:`~dxopt.qp.solvers.dual_active_set.SOLVE_STATUS`, ``NOT_CERTIFIED`` for a
    point that does not certify, e.g. on an ill-conditioned ``P`` at a tight ``eps_abs``; the
    caller solves and certifies the others with daqp, so one such sample does not send the
    whole batch to the general path), ``ok`` True (kept for the callers). Arguments as for
    those three (``m = G.shape[1]``); with entries in ``accuracy`` (B,), each solved sample's
    active-set accuracy for the lean backward (:func:`_certify_into`, ``margin_min`` as in
    :func:`lean_adjoint`'s settings). ``warm`` (B, k) int64: each sample's warm working set
    (``(B, 0)``: cold starts); a warm solve that fails or whose point does not certify is
    solved again cold, so a warm start changes the iterations, never the answer's
    certificate. Written per sample: ``iterations`` (B,), the solver's working-set changes
    (the warm and the cold attempt's together), and ``warm_used`` (B,), whether the answer is
    the warm attempt's. ``factors = (P0, C0, L0, Y0)``: a previous solve's ``Pn``, ``C`` and
    their factors ``L``, ``Yt`` (empty arrays: none; the caller passes them on warm calls), a
    sample whose ``Pn`` and ``C`` are bitwise those (:func:`same_bits`; its warm set perhaps
    empty) takes copies of ``L0``, ``Y0`` instead of factoring
    (``reused`` (B,) says which; the factors are what it would compute: the same bits, LAPACK
    on one thread), and a warm attempt's factors serve its cold retry."""
    B, m = q.shape[0], G.shape[1]
    P0, C0, L0, Y0 = factors
    solved = np.zeros(B, np.int64)
    none = np.zeros(0, np.bool_)
    g_inf[:] = 0.0
    for i in range(B):
        status = prepare(
            P[i], q[i], A[i], b[i], G[i], h[i], sym_tol, Pn[i], qn[i], C[i], upper[i], g_inf[i]
        )
        if status:
            return status, solved, False
        start = warm[i]
        iterations[i] = 0
        factored = reused[i] = False
        if same_bits(Pn[i], P0) and same_bits(C[i], C0):  # the kept P and C (warm calls only)
            L[i] = L0
            Yt[i] = Y0
            factored = reused[i] = True
        if start.shape[0] and start[0] >= 0:  # warm, then cold where it fails
            solved[i], iterations[i] = solve_one(
                Pn[i], qn[i], C[i], upper[i], m, primal_tol, max_iter, lapack, X[i], duals[i],
                L[i], Yt[i], order[i], LW[i], start, factored,
            )  # fmt: skip
            warm_used[i] = solved[i] == 0 and _certify_into(
                Pn, qn, C, upper, m, X, duals, g_inf, eps_abs, rel, roundoff, i, none, Xo, MU,
                NU, primal, dual, accuracy, margin_min,
            )  # fmt: skip
            if warm_used[i]:
                continue
            factored = solved[i] != 1  # L and Yt of this P and C (1: P not positive definite)
        warm_used[i] = False
        solved[i], cold_iterations = solve_one(
            Pn[i], qn[i], C[i], upper[i], m, primal_tol, max_iter, lapack, X[i], duals[i], L[i],
            Yt[i], order[i], LW[i], start[:0], factored,
        )  # fmt: skip
        iterations[i] += cold_iterations
        if solved[i] == 0 and not _certify_into(
            Pn, qn, C, upper, m, X, duals, g_inf, eps_abs, rel, roundoff, i, none, Xo, MU, NU,
            primal, dual, accuracy, margin_min,
        ):  # fmt: skip
            solved[i] = NOT_CERTIFIED  # the caller solves it otherwise (daqp)
    return 0, solved, True


@kernel_jit
def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the C-contiguous float64 arrays ``a`` and ``b`` have one shape and the same bits
    in every entry (no tolerance: ``-0.0`` is not ``0.0``)."""
    if a.shape != b.shape:
        return False
    x, y = a.ravel().view(np.int64), b.ravel().view(np.int64)
    for k in range(x.shape[0]):  # noqa: SIM110 (compiled: a loop that stops at a difference)
        if x[k] != y[k]:
            return False
    return True


@kernel_jit
def lean_adjoint_batch(
    P: np.ndarray,
    q: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    g_inf: np.ndarray,
    g: np.ndarray,
    r_ineq: np.ndarray,
    r_eq: np.ndarray,
    settings: np.ndarray,
    needs: np.ndarray,
    L_given: np.ndarray,
    Y_given: np.ndarray,
    order_given: np.ndarray,
    LW_given: np.ndarray,
    given: np.ndarray,
    accuracy_given: np.ndarray,
    lapack: Any,
    grads: tuple[np.ndarray, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lean_adjoint` for a batch of daqp points: ``(status, residual, steps, k,
    accuracy)``, each with a leading ``B`` axis, and the gradients written into the caller's
    ``grads = (gP, gq, gA, gb, gG, gh)``: (B, n, n), (B, n), (B, p, n), (B, p), (B, m, n),
    (B, m) (no rows, or no entries, where not needed); a sample with ``status != 0`` is not
    written (the caller hands it to the general path); ``settings`` as there. ``L_given``
    (B, n, n), ``Y_given`` (B, m + p, n), ``order_given``, ``LW_given``: the forward's
    Cholesky factors of ``P``, rows :math:`L^{-1}c_r`, working sets and factors of their Schur
    complements (:mod:`dxopt.qp.solvers.dual_active_set`) of the samples with ``given[i]`` (no
    entries when none has them), from which the block elimination of the working rows is
    taken (:func:`reused_solve`, the rows read in place; ``lapack``: a
    :class:`dxopt.linalg.small.LapackKernels`) instead of factoring again; ``accuracy_given``
    (B,), or no entries: their active sets' accuracies, as the forward's certificate found them
    (:func:`forward_batch`), instead of :func:`point_accuracy` here."""
    B = X.shape[0]
    rows = C.shape[1]
    p = rows - m
    steps_max, tol, max_residual = int(settings[0]), settings[1], settings[2]
    dependent_tol, margin_min = settings[3], settings[4]
    gP, gq, gA, gb, gG, gh = grads
    status = np.zeros(B, np.int64)
    residual, accuracy = np.zeros(B), np.zeros(B)
    steps, k = np.zeros(B, np.int64), np.zeros(B, np.int64)
    none = np.zeros(0, np.bool_)
    for i in range(B):
        if given[i]:  # the forward's factors, every row read in place
            x, mu, nu, working = split_point(X[i], duals[i], none, m)
            if accuracy_given.shape[0]:
                accuracy_i = accuracy_given[i]
            else:
                accuracy_i = point_accuracy(
                    P[i], q[i], C[i], upper[i], m, x, nu, mu, working, g_inf[i], margin_min
                )
            if accuracy_i < 0.0:
                status[i] = 1  # ambiguous: the general path (nothing gathered in vain)
                continue
            J = np.flatnonzero(working)
            rows_sel = np.empty(J.shape[0] + p, np.int64)
            rows_sel[: J.shape[0]] = J
            rows_sel[J.shape[0] :] = np.arange(m, m + p)
            r2 = np.empty(rows_sel.shape[0])
            for a in range(J.shape[0]):
                r2[a] = r_ineq[i, J[a]]
            r2[J.shape[0] :] = r_eq[i]
            Ci = C[i]
            status[i], u, w, rel, done = reused_solve(
                P[i], Ci[:m], Ci[m:], m, rows_sel, g[i], r2, L_given[i], Y_given[i],
                order_given[i], LW_given[i], lapack, steps_max, tol, dependent_tol,
            )  # fmt: skip
            if status[i] == 0 and not rel <= max_residual:
                status[i] = 4
            if status[i]:
                continue
            residual[i], steps[i], k[i], accuracy[i] = rel, done, J.shape[0], accuracy_i
            gradients_into(
                x, mu, nu, working, J, u, w, m, p, needs, gP[i], gq[i], gA[i], gb[i], gG[i],
                gh[i],
            )  # fmt: skip
            continue
        status[i], residual[i], steps[i], k[i], accuracy[i] = lean_adjoint(
            P[i], q[i], C[i], upper[i], m, X[i], duals[i], none, g_inf[i], g[i], r_ineq[i],
            r_eq[i], settings, needs, gP[i], gq[i], gA[i], gb[i], gG[i], gh[i],
        )  # fmt: skip
        if status[i]:
            residual[i] = 0.0
    return status, residual, steps, k, accuracy
