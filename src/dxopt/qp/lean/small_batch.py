"""A batch of dense QPs solved without the batch machinery: the lean path of
:func:`dxopt.qp.solve` for batches (:mod:`dxopt.qp.lean.small` does one small problem).

A batch of ``B`` dense CPU problems (every input batched along its first axis or shared by all
samples) with the default options (no thread pool) and a method
:func:`~dxopt.qp.lean.lean_check.lean_method` accepts: with ``solver="daqp"`` (warm starts allowed)
``n <= SMALL_MAX_N``; with ``"auto"`` and no warm start, or one from a previous solution (its
working set), any ``n`` whose buffers fit the pool,
and one problem with ``n > SMALL_MAX_N`` as a batch of one, solved by the compiled dual
active-set solver of :mod:`dxopt.qp.solvers.dual_active_set` (daqp for the samples it does not
solve or whose point does not certify; the backward reuses its factors). It runs as one
compiled kernel over the batch
(:func:`dxopt.qp.solvers.kernels.batch.prepare_batch`: the checks and daqp's layout), the solver
(one kernel, or one :func:`daqp.solve` per sample with ``eps_prox = 0``: either's Cholesky
certifies ``P``), one kernel for
the certificate of every point (:func:`~dxopt.qp.solvers.kernels.batch.certify_batch`; the compiled
solver's checks, solve and certificate run sample by sample in one kernel,
:func:`~dxopt.qp.solvers.kernels.batch.forward_batch`) and, in the
backward, one kernel for every sample's lean adjoint and gradients
(:func:`~dxopt.qp.solvers.kernels.batch.lean_adjoint_batch`): the steps of
:mod:`dxopt.qp.lean.small` for each sample, with no per-sample Python beyond the daqp call.
Gradients of shared inputs are summed over the batch.

The forward is all or nothing: a sample that fails any check, that daqp does not solve or
that does not certify sends the whole batch to the general path, which gives each sample its
own status and fallback chain. In the backward, the samples the lean path declines (an
ambiguous active set, a dependent row, a residual above the bound) go to the general path's
backward on their own, with its degenerate policy: its state is built at the lean forward's
certified points (the state its own forward returns for the same data, without a second
solve), and their gradients and diagnostics are merged in. The results are the general path's
(``tests/qp/lean/test_small_batch.py`` compares them).
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dxopt._core.memory import MAX_SET_BYTES, host_array, host_buffers
from dxopt.linalg.small import lapack_kernels
from dxopt.linalg.threads import blas_threads
from dxopt.qp.autograd.function import eager_gradients
from dxopt.qp.autograd.state import residuals
from dxopt.qp.certify.tolerances import LEAN_MARGIN_FLOOR, RELATIVE_FLOOR, ROUNDOFF
from dxopt.qp.lean.lean_check import SMALL_MAX_N, SYMMETRY_TOL
from dxopt.qp.lean.records import SmallBatch
from dxopt.qp.lean.small import daqp_bounds, daqp_module
from dxopt.qp.lean.small_backward import cotangent_array, record_diagnostics, regular_settings
from dxopt.qp.lean.warm import NO_FACTORS, cached_factors, dual_start, keep_factors, warm_rows
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.contracts import BackwardMethod, ForwardFactors, ForwardResult, QPState
from dxopt.qp.problem.options import COMPILED_SOLVER
from dxopt.qp.problem.types import BackwardDiagnostics, QPStatus
from dxopt.qp.solvers.kernels.batch import (
    certify_batch,
    forward_batch,
    lean_adjoint_batch,
    prepare_batch,
)
from dxopt.qp.solvers.kernels.certify import may_be_dependent_batch

__all__ = [
    "COMPILED_MAX_ENTRIES",
    "small_batch_backward",
    "small_batch_forward",
    "small_batch_inputs",
]

_MAX_ITER_PER_ROW = 5  # its working-set changes: at most this many per row, plus 20
COMPILED_MAX_ENTRIES = 1 << 25  # the compiled route's factors: at most this many float64s

_BASE = (2, 1, 2, 1, 2, 1)  # unbatched ndim of P, q, A, b, G, h


def small_batch_inputs(
    P: object,
    q: object,
    A: object,
    b: object,
    G: object,
    h: object,
    *,
    max_n: int | None = SMALL_MAX_N,
    min_batch: int = 2,
) -> int:
    """The batch size ``B >= min_batch`` when ``(P, q, A, b, G, h)`` is a batch the lean
    batch path takes (plain strided CPU tensors of one float dtype, each batched along a first
    axis of ``B`` or shared, consistent shapes with ``1 <= n <= max_n``, ``A, b`` and ``G, h``
    in pairs, no forward-mode AD level open), else 0 (the general path decides, bad input
    included). ``max_n=None`` (the compiled solver's route): any ``n``, as long as its
    workspace fits the buffer pool (a batch: fresh buffers of hundreds of MB cost more in
    page faults than the solver saves; measured at 1024 x n=100) or, for one problem,
    :data:`COMPILED_MAX_ENTRIES` numbers."""
    if type(q) is not Tensor or type(P) is not Tensor or q.dtype not in SYMMETRY_TOL:
        return 0
    data = (P, q, A, b, G, h)
    batch = 0
    for t, base in zip(data, _BASE):
        if t is None:
            continue
        if type(t) is not Tensor or t.layout is not torch.strided or not t.is_cpu:
            return 0
        if t.dtype is not q.dtype or not base <= t.ndim <= base + 1:
            return 0
        if t.ndim > base:
            if batch and t.shape[0] != batch:
                return 0
            batch = t.shape[0]
    if batch < min_batch:
        return 0
    n = q.shape[-1]
    if not 0 < n <= (max_n or n) or P.shape[-2:] != (n, n):
        return 0
    if max_n is None:  # the workspace: copies of P and C, L, the rows L^-1 c, the set's factor
        rows = sum(M.shape[-2] for M in (A, G) if isinstance(M, Tensor) and M.ndim >= 2)
        entries = batch * (2 * n * (n + rows) + (min(n, rows) + 1) ** 2)
        if entries > (COMPILED_MAX_ENTRIES if batch == 1 else MAX_SET_BYTES // 8):
            return 0
    for M, v in ((A, b), (G, h)):
        if (M is None) != (v is None):
            return 0
        if (isinstance(M, Tensor) and isinstance(v, Tensor)
                and (M.shape[-1] != n or v.shape[-1] != M.shape[-2])):  # fmt: skip
            return 0
    level = getattr(torch.autograd.forward_ad, "_current_level", None)
    return batch if level is not None and level < 0 else 0


def small_batch_forward(
    data: tuple[Tensor | None, ...],
    batch: int,
    *,
    eps_abs: float,
    eps_rel: float,
    warm_start: Tensor | None = None,
    warm_duals: Tensor | None = None,
    compiled: bool = False,
    for_backward: bool = False,
) -> SmallBatch | None:
    """Solve and certify the batch ``data = (P, q, A, b, G, h)`` (:func:`small_batch_inputs`
    is ``batch``) with daqp, each sample started from its row of ``warm_start`` (a CPU
    tensor ``(B, n)``, or ``(n,)`` for all; anything else: the general path validates it),
    or ``None`` for the general path (module docstring). ``warm_duals``: a previous solve's
    multipliers of the rows of ``G`` (``(B, m)`` or ``(m,)``; :func:`warm_rows`), whose
    positive entries are each sample's warm working set, for the compiled solver and daqp
    (``dual_start``); a warm start that fails is solved again cold. ``compiled``: the compiled
    dual active-set solver of :mod:`dxopt.qp.solvers.dual_active_set` first (warm only from
    ``warm_duals``: it takes no primal point; a warm sample whose ``P`` and rows have the bits of
    the last warm start's takes that one's factors, :func:`dxopt.qp.lean.warm.keep_factors`),
    daqp for the samples it does not solve; the backward reuses its factors and, with
    ``for_backward`` (a backward is likely: some input requires grad), the accuracies of their
    active sets, which the certificate finds from its own residuals at little cost."""
    q = data[1]
    assert q is not None
    n = q.shape[-1]
    starts = _starts(warm_start, batch, n)
    if starts is False:
        return None
    try:
        views: list[Any] = [
            None if t is None else (t.detach() if t.requires_grad else t).numpy() for t in data
        ]
    except RuntimeError:  # no numpy view (e.g. a negative-bit view): the general path
        return None
    shared = tuple(v is not None and v.ndim == base for v, base in zip(views, _BASE))
    for i, base in enumerate(_BASE):
        v = views[i]
        if v is None:  # absent constraints: arrays without rows
            shape = (batch, 0, n) if base == 2 else (batch, 0)
            views[i] = np.zeros(shape, dtype=views[1].dtype)
        elif v.ndim == base:
            views[i] = np.broadcast_to(v, (batch, *v.shape))
    m, p = views[4].shape[1], views[2].shape[1]
    rows = warm_rows(warm_duals, batch, m)
    use_compiled = compiled and (starts is None or rows is not None)
    Pn, qn, C, upper, g_inf, L_given, Y_given, order, LW = _workspace(batch, n, m, p, use_compiled)
    empty = (data[2] is not None and not p, data[4] is not None and not m)  # given, no rows
    X, duals = np.empty((batch, n)), np.empty((batch, m + p))
    # the caller's (x, mu, nu) and the residuals
    Xo, MU, NU = np.empty((batch, n)), np.empty((batch, p)), np.empty((batch, m))
    primal, dual = np.zeros(batch), np.zeros(batch)
    rel = max(eps_rel, RELATIVE_FLOOR)
    start = time.perf_counter()
    sym_tol = SYMMETRY_TOL[q.dtype]
    accuracy = np.empty(batch if use_compiled and for_backward else 0)
    iterations = np.zeros(batch, np.int64)
    warm_used = np.zeros(batch, np.bool_)
    if use_compiled:  # checks, solve and certificate sample by sample (one kernel)
        # warm: the last warm start's factors, reused where P and C have the same bits
        factors = cached_factors() if rows is not None else NO_FACTORS
        reused = np.zeros(batch, np.bool_)
        with blas_threads(1):  # (one thread: the factors' bits do not depend on the call)
            status, solved, ok = forward_batch(
                *views, sym_tol, Pn, qn, C, upper, g_inf, eps_abs,
                _MAX_ITER_PER_ROW * (m + p) + 20, lapack_kernels(), X, duals, L_given, Y_given,
                order, LW, eps_abs, rel, ROUNDOFF, Xo, MU, NU, primal, dual, accuracy,
                LEAN_MARGIN_FLOOR, np.zeros((batch, 0), np.int64) if rows is None else rows[1],
                iterations, warm_used, factors.arrays(), reused,
            )  # fmt: skip
        if status or not ok:  # a failed check (NaN/Inf, asymmetric P, a zero row of G: the
            return None  # general path's rules and errors), or a point that does not certify
        given = solved == 0
        if rows is not None and not reused[0] and given[0]:  # for the next warm start
            keep_factors(Pn[0], C[0], L_given[0], Y_given[0])
    else:
        if prepare_batch(*views, sym_tol, Pn, qn, C, upper, g_inf):
            return None  # NaN/Inf, asymmetric P, a zero row of G: the general path's
        given = np.zeros(batch, np.bool_)
    rest = np.flatnonzero(~given)  # daqp, then the certificate
    lower, sense = daqp_bounds(m, p)
    solve = daqp_module().solve
    for i in rest.tolist():
        init = None
        if starts is not None and rows is None:  # our copy: daqp takes a writable one
            init = np.array(starts if starts.ndim == 1 else starts[i])
        start_duals = None if rows is None else dual_start(rows[0], i, p)
        x, _, flag, info = solve(
            Pn[i], qn[i], C[i], upper[i], lower, sense, primal_start=init, dual_start=start_duals,
            primal_tol=eps_abs, eps_prox=0.0,
        )  # fmt: skip
        used = init is not None or start_duals is not None
        if used and flag != 1 and flag != 2:  # the warm start failed: cold
            iterations[i] += info["iterations"]
            x, _, flag, info = solve(
                Pn[i], qn[i], C[i], upper[i], lower, sense, primal_tol=eps_abs, eps_prox=0.0
            )  # fmt: skip
            used = False
        if flag != 1 and flag != 2:  # not solved, or P not positive definite
            return None
        X[i], duals[i] = x, info["lam"]
        iterations[i] += info["iterations"]
        warm_used[i] = used
    if rest.size and not certify_batch(
        Pn, qn, C, upper, m, X, duals, g_inf, eps_abs, rel, ROUNDOFF, rest, Xo, MU, NU, primal,
        dual,
    ):  # fmt: skip
        return None
    solvers = tuple(COMPILED_SOLVER if g else "daqp" for g in given.tolist())
    if m or p:  # one multiplier selection at degenerate points (qp.certify.multipliers)
        _select_batch(Pn, qn, C, upper, m, X, duals, g_inf, (Xo, MU, NU), given, eps_abs, eps_rel)
    out = SmallBatch(Pn, qn, C, upper, m, X, duals, g_inf, shared, empty, q.dtype, eps_abs)
    out.primal, out.dual, out.outputs = tuple(primal.tolist()), tuple(dual.tolist()), (Xo, MU, NU)
    out.solvers = solvers
    out.L_given, out.Y_given, out.given = L_given, Y_given, given
    out.order_given, out.LW_given, out.accuracy_given = order, LW, accuracy
    out.iterations, out.warm_used = tuple(iterations.tolist()), tuple(warm_used.tolist())
    out.solve_time = time.perf_counter() - start
    return out


def _select_batch(
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    X: np.ndarray,
    duals: np.ndarray,
    g_inf: np.ndarray,
    outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    given: np.ndarray,
    eps_abs: float,
    eps_rel: float,
) -> None:
    """:func:`dxopt.qp.certify.multipliers.select_multipliers` on the samples whose exact
    working set may miss an active row (a zero multiplier on a row of ``A`` or on a zero-slack
    row of ``G``; one compiled pass, :func:`may_be_dependent_batch`): the caller's
    ``outputs = (X, MU, NU)`` and the saved ``duals = [nu; mu]`` take the minimum-norm
    multipliers in place, and a changed sample's compiled factors are not reused (``given``
    False: its backward factors its own rows)."""
    from dxopt.qp.certify.multipliers import note_not_selected, select_multipliers
    from dxopt.qp.lean.small import note_too_big_rows, vertex_selected

    _, MU, NU = outputs
    p = C.shape[1] - m
    maybe = may_be_dependent_batch(C, upper, m, X, duals, eps_abs, max(eps_rel, RELATIVE_FLOOR))
    refused = []
    big: list[tuple[int, Any]] = []
    for i in np.flatnonzero(maybe).tolist():
        Ci = C[i]
        sel = select_multipliers(
            Pn[i], qn[i], Ci[m:] if p else None, Ci[:m] if m else None,
            upper[i, :m] if m else None, X[i], MU[i], NU[i], eps_abs=eps_abs, eps_rel=eps_rel,
            g_inf=g_inf[i] if g_inf.ndim == 2 else g_inf, exact_working_set=True,
        )  # fmt: skip
        if sel is None:
            continue
        if not sel.checked:
            big.append((i, sel.rows))
            continue
        if sel.rows is not None:  # a general dependency: the backward's vertex
            sel = vertex_selected(Pn[i], qn[i], Ci, upper[i], m, X[i], sel)
            if sel is None:
                continue
        if not sel.feasible:
            refused.append(i)
            continue
        MU[i], NU[i] = sel.mu, sel.nu
        duals[i, :m], duals[i, m:] = sel.nu, sel.mu
        given[i] = False
    if refused:
        note_not_selected(refused)
    if big:
        note_too_big_rows(C, m, big)


def _workspace(batch: int, n: int, m: int, p: int, factors: bool) -> tuple[np.ndarray, ...]:
    """``(P, q, C, upper, g_inf, L, Yt, order, LW)``: buffers for a batch (the compiled
    solver's ``L`` (B, n, n), ``Yt`` (B, rows, n), ``order`` (B, w) and ``LW`` (B, w, w),
    ``w = min(n, rows) + 1``, only with ``factors``) from :func:`dxopt._core.memory.host_buffers`:
    those of a batch that is gone, else new. Fresh multi-megabyte arrays on every call
    page-fault on first touch (a few ms per call at 128 x n=50, varying with the heap's state);
    reused ones do not. A batch in use keeps its own buffers (its :class:`SmallBatch` holds
    them)."""
    rows = m + p
    w = min(n, rows) + 1
    shapes = [(batch, n, n), (batch, n), (batch, rows, n), (batch, rows), (batch, m)]
    shapes += [(batch, n, n), (batch, rows, n), (batch, w), (batch, w, w)] if factors else [
        (0, 0, 0), (0, 0, 0), (0, 0), (0, 0, 0)]  # fmt: skip
    return host_buffers([(s, np.int64 if i == 7 else np.float64) for i, s in enumerate(shapes)])


def _starts(warm_start: Tensor | None, batch: int, n: int) -> Any:
    """The float64 primal starts (``(B, n)``, or ``(n,)`` for every sample; a view where they
    are float64 already), ``None`` without a warm start, or
    ``False`` for one the general path must validate (not a CPU float tensor of shape
    ``(n,)`` or ``(B, n)``)."""
    if warm_start is None:
        return None
    if not (type(warm_start) is Tensor and warm_start.is_cpu and warm_start.is_floating_point()):
        return False
    if warm_start.shape not in ((n,), (batch, n)):
        return False
    return warm_start.detach().to(torch.float64).numpy()  # (copied per sample where used)


def small_batch_backward(
    sb: SmallBatch,
    method: Any,
    grad_x: Tensor | None,
    grad_eq: Tensor | None,
    grad_ineq: Tensor | None,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """The gradients for ``(P, q, A, b, G, h)``: the lean backward of every sample it decides,
    and the general path's (its state for those samples only, same points) for the others;
    the diagnostics merged per sample."""
    regular = regular_settings(method)
    B, n = sb.X.shape
    m, p = sb.m, sb.C.shape[1] - sb.m
    rows = (n, n, p, p, m, m)
    grads = [host_array((B, rows[i] if needs[i] else 0, n) if i in (0, 2, 4) else
                        (B, rows[i] if needs[i] else 0)) for i in range(6)]  # fmt: skip
    status, residual, steps, k, accuracy = lean_adjoint_batch(
        sb.P, sb.q, sb.C, sb.upper, m, sb.X, sb.duals, sb.g_inf, cotangent_array(grad_x, (B, n)),
        cotangent_array(grad_ineq, (B, m)), cotangent_array(grad_eq, (B, p)), regular.settings,
        np.array(needs), sb.L_given, sb.Y_given,
        sb.order_given, sb.LW_given, sb.given, sb.accuracy_given, lapack_kernels(), tuple(grads),
    )  # fmt: skip
    record_diagnostics(
        sb.diagnostics, method, float(residual.max()), int(steps.max()), tuple(k.tolist()),
        tuple(accuracy.tolist()), regular,
    )  # fmt: skip
    present = (True, True, p > 0, p > 0, m > 0, m > 0)
    out: list[Any] = [None] * 6
    for i in range(6):
        if needs[i] and present[i]:
            out[i] = grads[i]
    declined = np.flatnonzero(status)
    if declined.size:  # the general path for those samples (the kernel did not write them)
        if declined.size < B:  # zero rows for them (every sample: the general path's arrays)
            for a in out:
                if a is not None:
                    a[declined] = 0.0
        _general_samples(sb, method, declined, out, (grad_x, grad_eq, grad_ineq), needs)
        for i in range(6):  # (uninitialized memory must never come out as a gradient)
            if declined.size == B and out[i] is not None and out[i] is grads[i]:
                out[i][...] = 0.0
    for i in range(6):
        if out[i] is not None and sb.shared[i]:
            out[i] = out[i].sum(0)
    for i, given in ((2, sb.empty[0]), (4, sb.empty[1])):
        if given and needs[i]:
            out[i] = np.zeros((0, n) if sb.shared[i] else (B, 0, n))
            out[i + 1] = np.zeros(0 if sb.shared[i + 1] else (B, 0))
    if sb.dtype is torch.float64:
        return tuple(None if a is None else torch.from_numpy(a) for a in out)
    return tuple(None if a is None else torch.from_numpy(a).to(sb.dtype) for a in out)


def _general_samples(
    sb: SmallBatch,
    method: BackwardMethod,
    samples: np.ndarray,
    out: list[Any],
    cotangents: tuple[Tensor | None, ...],
    needs: tuple[bool, ...],
) -> None:
    """Run the general path's backward (its state for ``samples``, at the same points) and
    write its gradients into the per-sample arrays
    ``out`` (a shared input's gradient goes to the first of those samples' rows, to be summed
    with the rest), or, when ``samples`` are the whole batch, put its arrays in ``out`` as they
    are (at n = 2000 the copy alone touched some 100 MB of fresh pages); merge its
    diagnostics into ``sb.diagnostics`` sample by sample."""
    index = torch.from_numpy(samples)
    state = _general_state(sb, samples, method)
    gx, geq, gin = (None if g is None else g[index] for g in cotangents)
    sub = eager_gradients(state, gx, geq, gin, needs)
    whole = samples.size == sb.X.shape[0]  # every sample: its arrays as they are, no copy
    for i, g in enumerate(sub):
        if g is None or out[i] is None:
            continue
        a = g.detach().to(torch.float64).numpy()
        if whole:  # (a shared input's gradient comes summed; the caller sums over axis 0)
            a = np.ascontiguousarray(a)  # (a copy only for a broadcast view)
            out[i] = a[None] if sb.shared[i] else a
        elif sb.shared[i]:
            out[i][samples[0]] += a
        else:
            out[i][samples] = a
    _merge(sb.diagnostics, state.diagnostics, samples)


def _sample_factors(sb: SmallBatch, samples: np.ndarray) -> ForwardFactors | None:
    """The compiled solver's factors of ``samples`` when it solved all of them (views when
    they are the whole batch), else ``None``."""
    if not sb.given[samples].all():
        return None
    factors = ForwardFactors(sb.L_given, sb.Y_given, sb.order_given, sb.LW_given)
    if samples.size == sb.given.size:  # every sample, in order
        return factors
    return factors.take(samples)


def _general_state(sb: SmallBatch, samples: np.ndarray, method: BackwardMethod) -> QPState:
    """The general route's state for ``samples`` at the lean forward's certified points: what
    its forward returns on the same data when every daqp point certifies (daqp is
    deterministic; the active set is the working set, nu > 0), without solving again (for the
    compiled solver's points: the same state at its certified point)."""
    P, q, A, b, G, h = (
        None if a is None else torch.from_numpy(a).to(sb.dtype) for a in sb.arrays(samples)
    )
    assert P is not None and q is not None
    # validated by the lean forward (finite, symmetric as the general route demands, P
    # certified positive definite by the solver's Cholesky): no second symmetry pass
    problem = canonical_problem(P, q, A, b, G, h, check_psd=False)
    X, duals = sb.X[samples], sb.duals[samples]
    NU = np.maximum(duals[:, : sb.m], 0.0)
    size = samples.size
    solvers = tuple(sb.solvers[i] for i in samples.tolist())
    result = ForwardResult(
        x=torch.from_numpy(X),
        eq_duals=torch.from_numpy(np.ascontiguousarray(duals[:, sb.m :])),
        ineq_duals=torch.from_numpy(NU),
        status=(QPStatus.SOLVED,) * size,
        solver=solvers[0],
        solve_time=0.0,
        active=torch.from_numpy(NU > 0),
        sample_solvers=solvers,
        sample_eps=(sb.eps_abs,) * size,
        polished=(False,) * size,
        settled=(True,) * size,
        residuals=(np.array(sb.primal)[samples], np.array(sb.dual)[samples]),
        factors=_sample_factors(sb, samples),
    )
    return QPState(
        problem, result, method, BackwardDiagnostics(), solvers[0], residuals(problem, result)
    )


def _merge(lean: BackwardDiagnostics, general: BackwardDiagnostics, samples: np.ndarray) -> None:
    """``lean`` (every sample) with the general path's diagnostics of ``samples`` put in:
    per-sample tuples at their places, the largest residual, step count and jitter, LICQ and
    the weak rows over both, and the general path's linear solver."""
    positions = samples.tolist()
    for f in fields(BackwardDiagnostics):
        value = getattr(general, f.name)
        if not (isinstance(value, tuple) and len(value) == len(positions)):
            continue
        mine = getattr(lean, f.name)
        size = len(lean.n_active)
        # a field only the general path fills (e.g. unsettled) starts as False, 0 or 0.0
        merged = list(mine) if len(mine) == size else [type(value[0])()] * size
        for j, v in zip(positions, value):
            merged[j] = v
        setattr(lean, f.name, tuple(merged))
    lean.residual = max(lean.residual, general.residual)
    lean.refinement_steps = max(lean.refinement_steps, general.refinement_steps)
    lean.jitter = max(lean.jitter, general.jitter)
    lean.licq = lean.licq and general.licq
    lean.weak_kept = lean.weak_kept or general.weak_kept
    lean.linear_solver = general.linear_solver
    lean.method = general.method
