"""One small dense QP without the batch machinery: the lean path of :func:`dxopt.qp.solve`.

A single (unbatched) dense CPU problem with ``n <= SMALL_MAX_N``, solved by daqp, piqp or
proxqp (:data:`LEAN_BACKENDS`) with the default solver options and differentiated by a method
:func:`lean_method` accepts, is the call decision-focused models and controllers make
thousands of times per epoch. Through the general path (canonical problem, fallback chain,
batch certificate, batched active set and backward) it costs about 0.6 ms with daqp, some 60
raw solves; as straight-line numpy on the one sample, about 0.15 ms, most of it the dispatch of
some hundred small array operations. This module runs the same steps in three compiled kernels
(:mod:`dxopt.qp.solvers.kernels`, numba) around the backend call:

- **forward** (:func:`small_forward`): the cheap checks (finite entries, symmetry of ``P``, no
  zero row of ``G``) while copying the data into daqp's layout; then either one
  :func:`daqp.solve` with ``eps_prox = 0`` (its Cholesky of ``P`` certifies it positive
  definite, :mod:`dxopt.qp.solvers.daqp`; the active set is its working set), or, for piqp/proxqp,
  one LAPACK Cholesky of ``P``, the backend through qpsolvers and the general path's own
  :func:`dxopt.qp.certify.polish.polish` (the active set is the polished one, settled); then the
  certificate of :func:`dxopt.qp.certify.polish.batch_accept_exact` for the one point (same tests,
  same tolerances);
- **backward** (:func:`small_backward`): the forward's active set is taken only when it is
  unambiguous with a margin of ten times every threshold in play: with
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

Anything else (another solver, an option the lean path does not take, batched or sparse or
non-CPU inputs, a point the backend did not solve or that does not certify or settle, an
ambiguous or dependent active set, a refinement that does not reach the residual bound) leaves
the lean path: the forward returns ``None`` and :func:`~dxopt.qp.solve` takes the general path
(with its fallback chain), and the backward rebuilds the general state from its saved copy of
the data (one more solve, same point) and runs the requested backward method with its
degenerate policy. The results, diagnostics included, are those of the general path
(``tests/qp/test_small.py`` compares them, and checks the gradients against finite
differences).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from dxopt._core.torch_compat import SingleLevelFunction, functorch_unwrap_if_dead
from dxopt.qp.autograd.function import (
    eager_gradients,
    is_legacy_batched,
    refuse_batched_cotangents,
    refuse_second_order,
)
from dxopt.qp.backward.kkt import _KKT_STEPS, _KKT_TOL, KKTBackward
from dxopt.qp.backward.penalty import PenaltyBackward
from dxopt.qp.certify.tolerances import DEPENDENT_TOL, LEAN_MARGIN_FLOOR, RELATIVE_FLOOR, ROUNDOFF
from dxopt.qp.problem.types import BackwardDiagnostics
from dxopt.qp.solvers.kernels.adjoint import lean_adjoint
from dxopt.qp.solvers.kernels.batch import prepare
from dxopt.qp.solvers.kernels.certify import certify_point

__all__ = [
    "SMALL_MAX_N",
    "SmallPoint",
    "SmallQPFunction",
    "lean_method",
    "small_forward",
    "small_inputs",
]

SMALL_MAX_N = 64
"""Largest ``n`` of the lean path: up to here a problem's arithmetic is cheaper than the
general path's dispatches."""

_MARGIN = LEAN_MARGIN_FLOOR  # the active set's margin floor (module docstring)
_DTYPES = (torch.float64, torch.float32)
_BOUNDS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (m, p) -> (lower, sense)
_SYM_TOL = {t: 100 * float(torch.finfo(t).eps) for t in _DTYPES}  # P's asymmetry, relative
_ABSENT: dict[tuple[int, Any], tuple[np.ndarray, np.ndarray]] = {}  # (n, dtype) -> (M, v)


def small_inputs(P: object, q: object, A: object, b: object, G: object, h: object) -> bool:
    """Whether ``(P, q, A, b, G, h)`` is one small dense CPU problem the lean path takes:
    plain CPU tensors (no subclass), one float dtype (float64 or float32), unbatched,
    consistent shapes with ``1 <= n <= SMALL_MAX_N``, ``A, b`` and ``G, h`` in pairs, and no
    forward-mode AD level open (its dual tensors need the general path's ``jvp``). Anything
    else, bad input included, is left to the general path and its error messages. (The
    layout is not read here: a sparse or mkldnn tensor has no numpy view, and
    :func:`small_forward` hands such a problem to the general path.)"""
    if type(q) is not Tensor or type(P) is not Tensor:
        return False
    dtype = q.dtype
    if dtype not in _DTYPES or P.dtype is not dtype or q.ndim != 1 or not (q.is_cpu and P.is_cpu):
        return False
    n = q.shape[0]
    if not (0 < n <= SMALL_MAX_N and P.shape == (n, n)):
        return False
    if not (_pair(A, b, n, dtype) and _pair(G, h, n, dtype)):
        return False
    level = getattr(torch.autograd.forward_ad, "_current_level", None)
    return level is not None and level < 0  # an open dual level (or unknown): the general path


def _pair(M: object, v: object, n: int, dtype: torch.dtype) -> bool:
    """``M, v`` both absent, or plain CPU tensors of ``dtype`` shaped ``(k, n)`` and ``(k,)``."""
    if M is None:
        return v is None
    return (
        type(M) is Tensor and type(v) is Tensor and M.dtype is dtype and v.dtype is dtype
        and M.ndim == 2 and v.ndim == 1 and M.shape[1] == n and v.shape[0] == M.shape[0]
        and M.is_cpu and v.is_cpu
    )  # fmt: skip


@dataclass(slots=True)
class SmallPoint:
    """The certified solution of one small QP and what its backward needs: float64 copies of
    the data (the inputs may change in place after the call) in daqp's layout (``C = [G; A]``,
    ``upper = [h; b]``, the first ``m = len(g_inf)`` rows inequalities; ``G, h, A, b`` are
    views of them, ``None`` without rows), the point ``x`` with the multipliers
    ``duals = [nu; mu]`` and the active set ``working`` (no entries: daqp's working set, read
    off the multipliers), and the certificate's residuals; ``given``: whether ``A`` and ``G``
    were given (their gradients, empty without rows, or ``None``); ``general(point)`` rebuilds
    the general path's state."""

    P: np.ndarray
    q: np.ndarray
    C: np.ndarray
    upper: np.ndarray
    x: np.ndarray
    duals: np.ndarray
    working: np.ndarray
    g_inf: np.ndarray
    dtype: torch.dtype
    general: Callable[..., Any]
    given: tuple[bool, bool] = (False, False)  # A, G given (perhaps without rows): gradients
    warm_start: Any = None  # the backend's primal start (float64), for the general path
    polished: bool = False
    diagnostics: BackwardDiagnostics = field(default_factory=BackwardDiagnostics)
    solve_time: float = 0.0
    primal: float = 0.0
    dual: float = 0.0
    outputs: Any = None  # copies of (x, mu, nu) for the caller (theirs to change)

    @property
    def G(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.C[:m] if m else None

    @property
    def h(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.upper[:m] if m else None

    @property
    def A(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.C[m:] if self.C.shape[0] > m else None

    @property
    def b(self) -> np.ndarray | None:
        m = self.g_inf.shape[0]
        return self.upper[m:] if self.C.shape[0] > m else None

    def gradients(
        self,
        method: Any,
        grad_x: Tensor | None,
        grad_eq: Tensor | None,
        grad_ineq: Tensor | None,
        needs: tuple[bool, ...],
    ) -> tuple[Tensor | None, ...]:
        """The gradients for ``(P, q, A, b, G, h)``: :func:`small_backward`, or where it
        declines the general path's (its state rebuilt from the saved data, same point)."""
        grads = small_backward(self, method, grad_x, grad_eq, grad_ineq, needs)
        if grads is None:
            state = replace(self.general(self), diagnostics=self.diagnostics)
            grads = eager_gradients(state, grad_x, grad_eq, grad_ineq, needs)
        return grads


def _array(t: Tensor | None) -> Any:
    """A float64 C-contiguous copy of ``t`` (``None`` stays ``None``)."""
    if t is None:
        return None
    a = (t.detach() if t.requires_grad else t).numpy()
    return np.array(a, dtype=np.float64, order="C")


_NO_ROWS = np.zeros(0, dtype=bool)
_NEEDS: dict[tuple[bool, ...], np.ndarray] = {}  # needs_input_grad -> the kernel's flags
_ZEROS: dict[Any, np.ndarray] = {}  # shape -> zeros (a missing cotangent; nothing writes it)
_ZEROS_KEPT = 4096  # entries up to which such zeros are kept for the next call


_DAQP: list[Any] = []  # the daqp module, once imported


def _daqp() -> Any:
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


def _bounds(m: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """daqp's lower bounds and senses for ``m`` inequality and ``p`` equality rows (as
    :class:`dxopt.qp.solvers.daqp.DaqpBatch`; cached, daqp does not write them)."""
    key = (m, p)
    if key not in _BOUNDS:
        sense = np.zeros(m + p, dtype=np.intc)
        sense[m:] = 5
        _BOUNDS[key] = (np.full(m + p, -1e30), sense)
    return _BOUNDS[key]


LEAN_BACKENDS = ("daqp", "piqp", "proxqp", "clarabel", "osqp")
"""Backends of the lean path: daqp (its exact working set) and the interior-point and ADMM
backends whose point the polish of :mod:`dxopt.qp.certify.polish` settles (clarabel and osqp take
scipy CSC matrices, as on the general path)."""


def small_forward(
    data: tuple[Tensor | None, ...],
    *,
    solver: str = "daqp",
    eps_abs: float,
    eps_rel: float,
    polish: bool = True,
    general: Callable[..., Any],
    warm_start: Tensor | None = None,
) -> SmallPoint | None:
    """Solve and certify one small QP ``data = (P, q, A, b, G, h)`` (:func:`small_inputs`
    holds) with ``solver`` (one of :data:`LEAN_BACKENDS`), started from ``warm_start`` (an
    ``(n,)`` CPU tensor; anything else: the general path validates it), or ``None`` for the
    general path (module docstring)."""
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
    if prepare(Pv, qv, Av, bv, Gv, hv, _SYM_TOL[dtype], Pn, qn, C, upper, g_inf):
        return None  # NaN/Inf, asymmetric P, a zero row of G: the general path's rules, errors
    given = (data[2] is not None, data[4] is not None)
    start = time.perf_counter()
    polished = False
    if solver == "daqp":
        solved = _daqp_point(Pn, qn, C, upper, m, start_x, eps_abs)
        if solved is None:
            return None
        x, duals = solved
        working = _NO_ROWS  # daqp: the working set is read off the multipliers (nu > 0)
    else:
        # own arrays for the backend, as the general path's (views of C change the rounding
        # of some backends, proxqp's at 1e-16)
        An, bn = (C[m:], upper[m:]) if p else (None, None)
        Gn, hn = (C[:m], upper[:m]) if m else (None, None)
        arrays = tuple(None if a is None else a.copy() for a in (Pn, qn, An, bn, Gn, hn))
        polished_point = _polished_point(arrays, solver, start_x, g_inf, eps_abs, eps_rel, polish)
        if polished_point is None:
            return None
        x, nu_p, mu_p, working, polished = polished_point
        duals = np.concatenate((nu_p, mu_p))
    rel = max(eps_rel, RELATIVE_FLOOR)
    outputs = (np.empty(n), np.empty(p), np.empty(m))  # copies of (x, mu, nu) for the caller
    ok, primal, dual = certify_point(
        Pn, qn, C, upper, m, x, duals, working, g_inf, eps_abs, rel, ROUNDOFF, *outputs
    )
    if not ok:
        return None
    return SmallPoint(Pn, qn, C, upper, x, duals, working, g_inf, dtype, general, given, start_x,
                      polished, BackwardDiagnostics(), time.perf_counter() - start, primal, dual,
                      outputs)  # fmt: skip


def _daqp_point(
    Pn: np.ndarray,
    qn: np.ndarray,
    C: np.ndarray,
    upper: np.ndarray,
    m: int,
    start_x: Any,
    eps_abs: float,
) -> tuple[np.ndarray, np.ndarray] | None:
    """daqp's point ``(x, multipliers of [G; A])`` with ``eps_prox = 0`` (its Cholesky
    certifies ``P``); ``None`` unless it solved."""
    lower, sense = _bounds(m, C.shape[0] - m)
    x, _, flag, info = _daqp().solve(
        Pn, qn, C, upper, lower, sense, primal_start=start_x, primal_tol=eps_abs, eps_prox=0.0
    )
    if flag != 1 and flag != 2:  # not solved, or P not positive definite: the general path
        return None
    return x, info["lam"]


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
    than daqp, for one sample: ``P``
    positive definite (one LAPACK Cholesky; a semidefinite or indefinite ``P`` goes to the
    general path's check), the backend through :func:`qpsolvers.solve_problem` with the
    tolerances of :func:`dxopt.qp.solvers.forward.backend_kwargs`, then
    :func:`dxopt.qp.certify.polish.polish` (the same call as ``solve_forward``'s); ``None`` unless
    the
    result certifies and is settled."""
    import qpsolvers
    from scipy.linalg import lapack

    from dxopt.qp.certify.polish import polish as polish_point
    from dxopt.qp.certify.polish import row_inf
    from dxopt.qp.solvers.forward import SPARSE_ONLY, backend_kwargs

    Pn, qn, An, bn, Gn, hn = arrays
    if lapack.dpotrf(Pn, lower=1)[1] != 0:
        return None
    a_inf = row_inf(An) if An is not None else None
    if solver in SPARSE_ONLY:  # CSC-only backends: the general path's arguments (scipy CSC)
        import scipy.sparse as sp

        Pn, An, Gn = (None if M is None else sp.csc_matrix(M) for M in (Pn, An, Gn))
    kw = backend_kwargs(solver, eps_abs, eps_rel, None)
    try:
        problem = qpsolvers.Problem(Pn, qn, Gn, hn, An, bn)
        sol = qpsolvers.solve_problem(problem, solver=solver, initvals=start_x, **kw)
    except Exception:  # a backend crash: the general path walks its fallback chain
        return None
    m = 0 if Gn is None else Gn.shape[0]
    p = 0 if An is None else An.shape[0]
    if sol.x is None or not np.all(np.isfinite(sol.x)):
        return None
    y = np.zeros(0) if sol.y is None else np.asarray(sol.y, dtype=np.float64).reshape(-1)
    z = np.zeros(0) if sol.z is None else np.asarray(sol.z, dtype=np.float64).reshape(-1)
    if y.size != p or z.size != m or not (np.isfinite(y).all() and np.isfinite(z).all()):
        return None  # missing or non-finite multipliers: the general path recovers them
    pol = polish_point(
        Pn, qn, An, bn, Gn, hn, np.asarray(sol.x, dtype=np.float64), y, z,
        eps_abs=eps_abs, eps_rel=eps_rel, enabled=polish, force=False,
        exact_working_set=False, g_inf=g_inf if m else None, a_inf=a_inf if p else None,
    )  # fmt: skip
    cert = pol.certificate
    if cert.zero_row_infeasible or not cert.ok or not cert.settled:
        return None
    nu = np.maximum(pol.nu, 0.0) if m else np.zeros(0)
    working = np.asarray(pol.active, dtype=bool) if m else np.zeros(0, dtype=bool)
    mu = pol.mu if p else np.zeros(0)
    return np.asarray(pol.x, dtype=np.float64), nu, mu, working, bool(pol.polished)


def lean_method(method: object) -> bool:
    """Whether the lean backward computes what ``method`` would on a regular problem: a
    :class:`~dxopt.qp.PenaltyBackward` (refined) or :class:`~dxopt.qp.KKTBackward` itself (no
    subclass), dense linear algebra, the forward's active set (``active_tol=None``). The
    degenerate and weak-row policies only act where the lean path declines (the general path
    then runs this same method)."""
    if type(method) is KKTBackward:
        return method.active_tol is None and method.linear_solver != "sparse"
    if type(method) is PenaltyBackward:
        return (
            method.active_tol is None
            and method.linear_solver != "sparse"
            and method.max_refinement > 0
        )
    return False


class _Regular(NamedTuple):
    """What a method's regular dense path uses: refinement limits, the residual bound, and for
    the penalty method its fixed :math:`\\beta` (or ``None``) and :math:`\\beta_{min}`; the
    same numbers as the lean kernel's ``settings`` array."""

    steps: int
    tol: float
    max_residual: float
    penalty: bool
    beta: float | None
    beta_min: float
    settings: np.ndarray  # (steps, tol, max_residual, DEPENDENT_TOL, _MARGIN): the kernel's


_REGULAR: dict[int, tuple[Any, _Regular]] = {}  # id(method) -> (method, settings)


def _regular(method: Any) -> _Regular:
    """The :class:`_Regular` settings of a method :func:`lean_method` accepts (cached per method
    object: a frozen dataclass's hash would hash every field on each call)."""
    cached = _REGULAR.get(id(method))
    if cached is not None and cached[0] is method:
        return cached[1]
    if isinstance(method, PenaltyBackward):
        steps, tol, beta, beta_min = (
            method.max_refinement,
            method.refine_tol,
            method.beta,
            method.beta_min,
        )
        penalty = True
    else:
        steps, tol, beta, beta_min, penalty = _KKT_STEPS, _KKT_TOL, None, 0.0, False
    settings = np.array([steps, tol, method.max_residual, DEPENDENT_TOL, _MARGIN], dtype=np.float64)
    regular = _Regular(steps, tol, method.max_residual, penalty, beta, beta_min, settings)
    if len(_REGULAR) > 256:
        _REGULAR.clear()
    _REGULAR[id(method)] = (method, regular)  # keeps method alive: its id is not reused
    return regular


def _cotangent(t: Tensor | None, shape: int | tuple[int, ...]) -> np.ndarray:
    """A cotangent as contiguous float64 numpy of ``shape`` (zeros for ``None``, the same
    array on every call for small shapes: the kernels only read it). One problem's and a
    batch's backward take theirs here."""
    if t is None:
        zeros = _ZEROS.get(shape)
        if zeros is None:
            zeros = np.zeros(shape)
            if zeros.size <= _ZEROS_KEPT and len(_ZEROS) < 256:
                _ZEROS[shape] = zeros
        return zeros
    return np.ascontiguousarray((t.detach() if t.requires_grad else t).numpy(), dtype=np.float64)


_E1, _E2 = np.zeros(0), np.zeros((0, 0))  # for gradients not asked for (nothing writes them)


def small_backward(
    point: SmallPoint,
    method: Any,
    grad_x: Tensor | None,
    grad_eq: Tensor | None,
    grad_ineq: Tensor | None,
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...] | None:
    """The gradients for ``(P, q, A, b, G, h)`` by the lean backward (module docstring;
    :func:`dxopt.qp.solvers.kernels.adjoint.lean_adjoint`, which writes the arrays allocated
    here for the gradients ``needs`` asks for), or ``None`` where the general path must decide."""
    regular = _regular(method)
    C, m, x = point.C, point.g_inf.shape[0], point.x
    n, p = x.shape[0], C.shape[0] - m
    needed = _NEEDS.get(needs)
    if needed is None:
        needed = _NEEDS[needs] = np.array(needs)
    empty = np.empty
    gP = empty((n, n)) if needs[0] else _E2
    gq = empty(n) if needs[1] else _E1
    gA = empty((p, n)) if needs[2] else _E2
    gb = empty(p) if needs[3] else _E1
    gG = empty((m, n)) if needs[4] else _E2
    gh = empty(m) if needs[5] else _E1
    status, residual, steps, k, accuracy = lean_adjoint(
        point.P, point.q, C, point.upper, m, x, point.duals, point.working, point.g_inf,
        _cotangent(grad_x, n), _cotangent(grad_ineq, m), _cotangent(grad_eq, p), regular.settings,
        needed, gP, gq, gA, gb, gG, gh,
    )  # fmt: skip
    if status:
        return None
    _record(point.diagnostics, method, residual, steps, (k,), (accuracy,), regular)
    # absent constraints get None; constraints given without rows get empty gradients
    eq, ineq = point.given
    out = (gP if needs[0] else None, gq if needs[1] else None,
           gA if needs[2] and eq else None, gb if needs[3] and eq else None,
           gG if needs[4] and ineq else None, gh if needs[5] and ineq else None)  # fmt: skip
    from_numpy = torch.from_numpy
    if point.dtype is torch.float64:
        return tuple([None if a is None else from_numpy(a) for a in out])
    return tuple([None if a is None else from_numpy(a).to(point.dtype) for a in out])


def _record(
    diagnostics: BackwardDiagnostics,
    method: Any,
    residual: float,
    steps: int,
    k: tuple[int, ...],
    accuracy: tuple[float, ...],
    regular: _Regular,
) -> None:
    """The diagnostics the general path's regular dense route records for a batch of
    ``len(k)`` samples (the largest residual and step count; per sample the active rows and
    the penalty method's :math:`\\beta`)."""
    size = len(k)
    diagnostics.method = method.name
    diagnostics.linear_solver = "schur"
    diagnostics.dependent_rows = (0,) * size
    diagnostics.licq = True
    diagnostics.residual = residual
    diagnostics.n_active = k
    diagnostics.n_weak = (0,) * size
    diagnostics.pseudo_inverse = (False,) * size
    diagnostics.vertex_dropped = (0,) * size
    diagnostics.dropped_rows = ((),) * size
    diagnostics.weak_kept = False
    if regular.penalty:  # its fixed beta, or max(10 eps, beta_min) (PenaltyBackward._beta)
        diagnostics.jitter = 0.0
        diagnostics.refinement_steps = steps
        beta, beta_min = regular.beta, regular.beta_min
        diagnostics.beta = (
            tuple([max(10.0 * a, beta_min) for a in accuracy]) if beta is None else (beta,) * size
        )


class SmallQPFunction(torch.autograd.Function):
    """``(P, q, A, b, G, h, solved, method) -> (x, eq_duals, ineq_duals)`` of a problem the lean
    paths solved (a :class:`SmallPoint`, or a batch
    :class:`~dxopt.qp.api.small_batch.SmallBatch`): the forward hands out ``solved.outputs``, the
    backward is ``solved.gradients(...)`` (the lean backward, and the general path's where that
    declines). Plain autograd only: :func:`small_inputs` and
    :func:`~dxopt.qp.api.small_batch.small_batch_inputs` send torch.func and forward-mode AD to
    :class:`dxopt.qp.autograd.function.QPFunction`."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> tuple[Tensor, Tensor, Tensor]:
        solved, method = args[6], args[7]  # after the six data tensors (P, q, A, b, G, h)
        ctx.solved, ctx.method = solved, method
        ctx.set_materialize_grads(False)  # unused outputs: None, not zeros
        x, mu, nu = solved.outputs  # the kernel's copies
        outs = (torch.from_numpy(x), torch.from_numpy(mu), torch.from_numpy(nu))
        if solved.dtype is not torch.float64:
            dtype = solved.dtype
            return outs[0].to(dtype), outs[1].to(dtype), outs[2].to(dtype)
        return outs

    @staticmethod
    def backward(
        ctx: Any, grad_x: Tensor | None, grad_eq: Tensor | None, grad_ineq: Tensor | None
    ) -> Any:
        needs = ctx.needs_input_grad[:6]
        cotangents = (grad_x, grad_eq, grad_ineq)
        for g in cotangents:  # (a loop: any() of a generator costs a frame per call)
            if g is not None and (g.requires_grad or is_legacy_batched(g)):
                refuse_batched_cotangents(cotangents)
                grads = ctx.solved.gradients(ctx.method, grad_x, grad_eq, grad_ineq, needs)
                return (*refuse_second_order(grads, cotangents), None, None)
        # plain cotangents: no graph to extend, the second-order guard has nothing to tie
        return (*ctx.solved.gradients(ctx.method, grad_x, grad_eq, grad_ineq, needs), None, None)


def _plain_apply() -> Callable[..., Any]:
    """:class:`SmallQPFunction`'s apply without the Python wrapper of
    :meth:`torch.autograd.Function.apply`, whose work (binding ``setup_context``'s arguments,
    the torch.func dispatch) the lean paths do not need: they run only outside torch.func
    transforms, for a Function without ``setup_context`` (2 of the tiny path's 90 us). Dead
    torch.func wrappers are unwrapped as there. Falls back to ``SmallQPFunction.apply`` where
    torch's internals differ."""
    if SingleLevelFunction is None or functorch_unwrap_if_dead is None:  # pragma: no cover
        return SmallQPFunction.apply  # other torch versions
    base = super(SingleLevelFunction, SmallQPFunction).apply
    unwrap = functorch_unwrap_if_dead
    if SmallQPFunction.setup_context is not torch.autograd.Function.setup_context:
        return SmallQPFunction.apply  # pragma: no cover - never: forward takes ctx

    def apply(
        P: Tensor, q: Tensor, A: Any, b: Any, G: Any, h: Any, solved: Any, method: Any
    ) -> Any:
        """(what torch's ``unwrap_dead_wrappers`` does, one tensor at a time)"""
        return base(
            unwrap(P), unwrap(q),
            None if A is None else unwrap(A), None if b is None else unwrap(b),
            None if G is None else unwrap(G), None if h is None else unwrap(h),
            solved, method,
        )  # fmt: skip

    return apply


apply_small = _plain_apply()
"""``SmallQPFunction.apply`` for calls outside torch.func transforms (:func:`_plain_apply`)."""
