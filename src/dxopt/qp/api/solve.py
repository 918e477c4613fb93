"""Public entry points: :func:`solve` and :class:`QPLayer`."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from dxopt._core import positional_deprecated
from dxopt._core.torch_compat import register_pytree_node
from dxopt.qp.api.bounds import append_bounds
from dxopt.qp.api.small import (
    LEAN_BACKENDS,
    SMALL_MAX_N,
    SmallPoint,
    apply_small,
    lean_method,
    small_forward,
    small_inputs,
)
from dxopt.qp.api.small_batch import COMPILED_SOLVER, SmallBatch, small_batch_forward
from dxopt.qp.api.small_batch import small_batch_inputs as small_batch_inputs
from dxopt.qp.autograd.function import QPCall, QPFunction
from dxopt.qp.backward.kkt import KKTBackward
from dxopt.qp.backward.penalty import PenaltyBackward
from dxopt.qp.certify.certificates import unsolved_message
from dxopt.qp.problem.canonical import QPProblem, canonical_problem
from dxopt.qp.problem.canonical import check_psd as check_psd_of
from dxopt.qp.problem.contracts import BackwardMethod, ForwardResult, QPState
from dxopt.qp.problem.functorch import BASES, forward_ad_dual, functorch_active, sparse_under_func
from dxopt.qp.problem.types import BackwardDiagnostics, QPInfo, QPSolution, QPSolveError, QPStatus
from dxopt.qp.solvers.forward import (
    daqp_certifies_psd,
    default_solver,
    routes_lp_to_piqp,
    solve_forward,
    trivial_forward,
)

if TYPE_CHECKING:
    from dxopt.qp.problem.executor import QPExecutor

__all__ = ["QPLayer", "solve"]

_DEFAULT_METHODS: dict[str, BackwardMethod] = {}  # frozen, stateless: built once


def _backward_method(backward: object) -> BackwardMethod:
    if isinstance(backward, str):
        if backward in ("penalty", "kkt") and backward not in _DEFAULT_METHODS:
            method = PenaltyBackward() if backward == "penalty" else KKTBackward()
            _DEFAULT_METHODS[backward] = method
        if backward in _DEFAULT_METHODS:
            return _DEFAULT_METHODS[backward]
    elif isinstance(backward, BackwardMethod):  # the protocol: any object with the methods
        return backward
    raise ValueError(
        f"backward: expected 'penalty', 'kkt' or a backward method (an object with a `name` and "
        f"a `solve_adjoint(data, diagnostics)` method, e.g. PenaltyBackward(), KKTBackward() "
        f"or a subclass of dxopt.qp.BackwardBase), got {backward!r}."
    )


def _residuals(problem: QPProblem, r: ForwardResult) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-sample primal and dual residuals of :class:`QPInfo` (NaN for unsolved samples):
    the forward's own when its certificate computed them, else one numpy pass."""
    if r.residuals is not None:
        primal, dual = r.residuals
    else:
        x = np.nan_to_num(r.x.numpy())
        primal = np.zeros(problem.size)
        dual = problem.np_mv("P", x) + problem.np_vec("q")
        if problem.A is not None and problem.p:
            eq = np.abs(problem.np_mv("A", x) - problem.np_vec("b")).max(-1)
            primal = np.maximum(primal, eq)
            dual = dual + problem.np_rmv("A", np.nan_to_num(r.eq_duals.numpy()))
        if problem.G is not None and problem.m:
            viol = np.maximum(problem.np_mv("G", x) - problem.np_vec("h"), 0.0).max(-1)
            primal = np.maximum(primal, viol)
            dual = dual + problem.np_rmv("G", np.nan_to_num(r.ineq_duals.numpy()))
        dual = np.abs(dual).max(-1) if problem.n else np.zeros(problem.size)
    if not all(s.ok for s in r.status):
        ok = np.fromiter((s.ok for s in r.status), dtype=bool, count=len(r.status))
        primal = np.where(ok, primal, np.nan)
        dual = np.where(ok, dual, np.nan)
    return tuple(primal.tolist()), tuple(dual.tolist())


def _check_warm_start(warm_start: object, n: int) -> None:
    if warm_start is not None and (not isinstance(warm_start, Tensor) or warm_start.shape[-1] != n):
        got = tuple(warm_start.shape) if isinstance(warm_start, Tensor) else type(warm_start)
        raise ValueError(
            f"warm_start: expected a tensor (n,) or (B, n) with n = {n}, got {got}. Pass the "
            "previous solution's x, or None."
        )


def _forward_state(
    P: Tensor,
    q: Tensor,
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    warm_start: Tensor | None,
    *,
    method: BackwardMethod,
    solver: str,
    check_psd: bool,
    **options: Any,
) -> QPState:
    """Validate and solve (plain tensors; called by ``QPFunction.forward``)."""
    problem = canonical_problem(P, q, A, b, G, h, check_psd=check_psd, defer_psd=True)
    _check_warm_start(warm_start, problem.n)
    # "dual_active_set" where its route does not apply (options, warm starts, sparse or
    # non-CPU inputs, a point that did not certify): daqp, the same method
    name = default_solver(problem) if solver == "auto" else solver
    if name == COMPILED_SOLVER:
        name = "daqp"
    solvable = bool(problem.size and problem.n)
    # the PSD check of P: daqp's own Cholesky certifies it for free, else one Cholesky here
    psd_pending = (
        check_psd and solvable and daqp_certifies_psd(problem, name, options.get("solver_options"))
    )
    if check_psd and solvable and not psd_pending:
        check_psd_of(problem)
    if solvable:
        result = solve_forward(
            problem, solver=name, warm_start=warm_start, psd_pending=psd_pending, **options
        )
    else:
        result = trivial_forward(problem, options["eps_abs"], name)
    residuals = _residuals(problem, result)
    return QPState(problem, result, method, BackwardDiagnostics(), name, residuals)


def _rebuilt_state(
    arrays: tuple[Any, ...], dtype: torch.dtype, *, method: BackwardMethod, solver: str,
    eps_abs: float, eps_rel: float, fallback: bool, polish: bool,
) -> QPState:  # fmt: skip
    """The general path's state for the lean paths' saved copies ``arrays = (P, q, A, b, G, h,
    warm_start)`` (numpy or ``None``) in the inputs' ``dtype``: one more solve, at the same
    points, where the lean backward declines."""
    P, q, A, b, G, h, warm = (None if a is None else torch.from_numpy(a).to(dtype) for a in arrays)
    assert P is not None and q is not None
    return _forward_state(
        P, q, A, b, G, h, warm, method=method, solver=solver, check_psd=True, eps_abs=eps_abs,
        eps_rel=eps_rel, max_workers=None, solver_options=None, fallback=fallback, polish=polish,
    )  # fmt: skip


def _small_solve(
    data: tuple[Tensor | None, ...],
    *,
    solver: str,
    warm_start: Tensor | None,
    method: BackwardMethod,
    eps_abs: float,
    eps_rel: float,
    fallback: bool,
    polish: bool,
) -> tuple[Tensor, Tensor, Tensor, tuple[QPStatus, ...], QPInfo] | None:
    """``(x, eq_duals, ineq_duals, status, info)`` of one small dense QP through
    :mod:`dxopt.qp.api.small` (certified point), or ``None`` when the general path must
    run."""

    def general(point: SmallPoint) -> QPState:
        arrays = (point.P, point.q, point.A, point.b, point.G, point.h, point.warm_start)
        return _rebuilt_state(
            arrays, point.dtype, method=method, solver=solver, eps_abs=eps_abs, eps_rel=eps_rel,
            fallback=fallback, polish=polish,
        )  # fmt: skip

    point = small_forward(
        data,
        solver=solver,
        eps_abs=eps_abs,
        eps_rel=eps_rel,
        polish=polish,
        general=general,
        warm_start=warm_start,
    )
    if point is None:
        return None
    residuals = ((point.primal,), (point.dual,), (point.polished,))
    return _lean_result(data, point, method, solver, 1, eps_abs, *residuals)


def _lean_result(
    data: tuple[Tensor | None, ...],
    solved: SmallPoint | SmallBatch,
    method: BackwardMethod,
    solver: str,
    size: int,
    eps_abs: float,
    primal: tuple[float, ...],
    dual: tuple[float, ...],
    polished: tuple[bool, ...],
    sample_solvers: tuple[str, ...] = (),
) -> tuple[Tensor, Tensor, Tensor, tuple[QPStatus, ...], QPInfo]:
    """``(x, eq_duals, ineq_duals, status, info)`` of ``size`` problems solved by a lean path
    (every one certified; ``sample_solvers``: each one's solver, ``solver`` for all when
    empty): the outputs through :class:`SmallQPFunction`."""
    x, mu, nu = apply_small(*data, solved, method)  # outside torch.func (callers check)
    info = QPInfo._every_field(
        solver, solved.solve_time, primal, dual, solved.diagnostics,
        sample_solvers or (solver,) * size, (eps_abs,) * size, polished,
    )  # fmt: skip
    return x, mu, nu, (QPStatus.SOLVED,) * size, info


def _sample_factors(sb: SmallBatch, samples: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """The compiled solver's factors of ``samples`` when it solved all of them (views when
    they are the whole batch), else ``None``."""
    if not sb.given[samples].all():
        return None
    factors = (sb.L_given, sb.Y_given, sb.order_given, sb.LW_given)
    if samples.size == sb.given.size:  # every sample, in order
        return factors
    return tuple(a[samples] for a in factors)


def _small_batch_solve(
    data: tuple[Tensor | None, ...],
    batch: int,
    *,
    method: BackwardMethod,
    eps_abs: float,
    eps_rel: float,
    warm_start: Tensor | None,
    compiled: bool,
) -> tuple[Tensor, Tensor, Tensor, tuple[QPStatus, ...], QPInfo] | None:
    """``(x, eq_duals, ineq_duals, status, info)`` of a batch of small dense QPs through
    :mod:`dxopt.qp.api.small_batch` (every point certified; ``compiled``: its compiled solver
    first), or ``None`` when the general path must run."""

    def general(sb: SmallBatch, samples: np.ndarray) -> QPState:
        """The general path's state for ``samples`` at the lean forward's certified points: what
        its forward returns on the same data when every daqp point certifies (daqp is
        deterministic; the active set is the working set, nu > 0), without solving again (for
        the compiled solver's points: the same state at its certified point)."""
        P, q, A, b, G, h = (
            None if a is None else torch.from_numpy(a).to(sb.dtype) for a in sb.arrays(samples)
        )
        assert P is not None and q is not None
        # validated by the lean forward (finite, symmetric as the general path demands, P
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
            sample_eps=(eps_abs,) * size,
            polished=(False,) * size,
            settled=(True,) * size,
            residuals=(np.array(sb.primal)[samples], np.array(sb.dual)[samples]),
            factors=_sample_factors(sb, samples),
        )
        return QPState(problem, result, method, BackwardDiagnostics(), solvers[0],
                       _residuals(problem, result))  # fmt: skip

    for_backward = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in data)
    sb = small_batch_forward(
        data, batch, eps_abs=eps_abs, eps_rel=eps_rel, general=general, warm_start=warm_start,
        compiled=compiled, for_backward=for_backward,
    )  # fmt: skip
    if sb is None:
        return None
    solver = COMPILED_SOLVER if sb.given.any() else "daqp"
    return _lean_result(data, sb, method, solver, batch, eps_abs, sb.primal, sb.dual,
                        (False,) * batch, sb.solvers)  # fmt: skip


def _solution(
    x: Tensor,
    mu: Tensor,
    nu: Tensor,
    status: tuple[QPStatus, ...],
    info: QPInfo,
    has_eq: bool,
    m_user: int | None,
    lb: Tensor | None,
    ub: Tensor | None,
    k_lb: int,
    k_ub: int,
) -> QPSolution:
    """The :class:`QPSolution`: the bound rows' multipliers split off the inequality ones
    (``m_user`` rows of the user's ``G``, then ``k_lb`` and ``k_ub`` bound rows)."""
    lb_duals = ub_duals = None
    if lb is not None or ub is not None:
        m0 = m_user or 0
        lb_duals = nu[..., m0 : m0 + k_lb] if lb is not None else None
        ub_duals = nu[..., m0 + k_lb : m0 + k_lb + k_ub] if ub is not None else None
        nu = nu[..., :m0]
    return QPSolution._every_field(
        x, mu if has_eq else None, nu if m_user is not None else None, status, info, lb_duals,
        ub_duals,
    )  # fmt: skip


@functools.lru_cache(maxsize=1)
def _solver_names() -> frozenset[str]:
    """The names ``solve`` takes besides ``"auto"``: ``"torch"``, ``"dual_active_set"`` and the
    installed qpsolvers backends."""
    import qpsolvers

    return frozenset(("torch", COMPILED_SOLVER, *qpsolvers.available_solvers))


def _check_options(
    solver: object, check_psd: object, fallback: object, polish: object, solver_options: object
) -> None:
    """Raise the error for the first option of :func:`solve` (and :class:`QPLayer`) that is
    not one it takes: ``solver`` a name (a typo used to fall through the fallback chain to
    another backend without a word), the flags booleans (``check_psd="no"`` is truthy),
    ``solver_options`` a dict."""
    if solver != "auto" and solver not in _solver_names():
        import qpsolvers

        known = ("auto", "torch", COMPILED_SOLVER, *sorted(qpsolvers.available_solvers))
        names = ", ".join(repr(n) for n in known)
        if not isinstance(solver, str):
            raise TypeError(f"solver: expected a str, one of {names}; got {type(solver).__name__}.")
        raise ValueError(
            f"solver: expected one of {names} (dxopt's solvers, then the installed qpsolvers "
            f"backends); got {solver!r}. Check the spelling, or install the backend (e.g. pip "
            f"install 'qpsolvers[{solver}]')."
        )
    for flag_name, flag in (("check_psd", check_psd), ("fallback", fallback), ("polish", polish)):
        if not isinstance(flag, bool):
            raise TypeError(
                f"{flag_name}: expected True or False, got {flag!r} ({type(flag).__name__})."
            )
    if solver_options is not None and not isinstance(solver_options, dict):
        raise TypeError(
            f"solver_options: expected a dict of the backend's settings (e.g. "
            f"{{'max_iter': 200}}) or None, got {type(solver_options).__name__}."
        )


@torch.compiler.disable
def _solve_eagerly(*args: Any, **kwargs: Any) -> QPSolution:
    """:func:`solve` outside Dynamo: under :func:`torch.compile` the call to this function is
    the graph break (``solve`` checks :func:`torch.compiler.is_compiling` first instead of
    carrying the decorator itself, whose wrapper costs every eager call about 2 us)."""
    return solve(*args, **kwargs)


def _torch_route(solver: str, backward: object, *inputs: object) -> bool:
    """Whether ``solve`` may take the device path of :mod:`dxopt.qp.api.device`: dense
    tensors, a named backward, and the torch solver requested or picked by ``"auto"`` (inputs
    off the CPU: :func:`dxopt.qp.solvers.forward.default_solver`)."""
    if solver != "auto" and solver != "torch":  # a named CPU backend: the common case, decided
        return False
    q = inputs[1]
    if not isinstance(q, Tensor) or not isinstance(backward, str):
        return False
    if not all(t is None or (isinstance(t, Tensor) and t.layout == torch.strided) for t in inputs):
        return False
    if solver != "auto":
        return solver == "torch"
    return q.device.type != "cpu"


_ORDER_NOTE = (
    "qpsolvers and qpth take (P, q, G, h, A, b) while dxopt's positional order was (P, q, A, "
    "b, G, h): solve(P, q, G, h) solved G x = h as equalities."
)


@positional_deprecated("A", "b", "G", "h", leading=2, note=_ORDER_NOTE)
def solve(
    P: Tensor,
    q: Tensor,
    *,
    A: Tensor | None = None,
    b: Tensor | None = None,
    G: Tensor | None = None,
    h: Tensor | None = None,
    lb: Tensor | None = None,
    ub: Tensor | None = None,
    backward: str | BackwardMethod = "penalty",
    solver: str = "auto",
    eps_abs: float = 1e-9,
    eps_rel: float = 0.0,
    on_failure: str = "raise",
    warm_start: Tensor | None = None,
    max_workers: int | None = None,
    solver_options: dict[str, Any] | None = None,
    check_psd: bool = True,
    executor: QPExecutor | None = None,
    fallback: bool = True,
    polish: bool = True,
) -> QPSolution:
    """Solve :math:`\\min_x \\tfrac12 x^\\top Px + q^\\top x` s.t. :math:`Ax = b`, :math:`Gx \\le h`
    and make the solution and the multipliers differentiable.

    The forward solve goes through :func:`qpsolvers.solve_problem` (CPU, float64, one solve per
    sample; daqp through its own Python API, :mod:`dxopt.qp.solvers.daqp`; one small unbatched dense
    problem, ``n <= 64``, with daqp, piqp or proxqp and the default solver options takes the
    lean path of :mod:`dxopt.qp.api.small`, same results at a fraction of the fixed cost). The
    derivative is the implicit one of the KKT conditions
    :math:`Px + q + A^\\top\\mu + G^\\top\\nu = 0`, :math:`Ax = b`,
    :math:`\\nu \\circ (Gx - h) = 0` on the active set, computed either by the dXPP penalty
    system (:class:`PenaltyBackward`, Linghu et al., arXiv 2602.14154) or by the exact reduced
    KKT system (:class:`KKTBackward`; Amos & Kolter, arXiv 1703.00443).

    Every argument after ``q`` is keyword-only: ``solve(P, q, G=G, h=h)``. qpsolvers and qpth
    take ``(P, q, G, h, A, b)`` while dxopt's positional order was ``(P, q, A, b, G, h)``, so a
    positional ``solve(P, q, G, h)`` silently solved :math:`Gx = h` as equalities. Positional
    ``A, b, G, h`` still work for one release and warn with a ``DeprecationWarning`` that names
    the arguments they were bound to.

    Args:
        P: ``(n, n)`` or ``(B, n, n)`` symmetric PSD; dense, or torch sparse COO/CSR ``(n, n)``.
        q: ``(n,)`` or ``(B, n)``.
        A, b: equality constraints ``(p, n)``/``(B, p, n)`` (dense or sparse) and ``(p,)``/
            ``(B, p)``; both or neither.
        G, h: inequality constraints ``(m, n)``/``(B, m, n)`` and ``(m,)``/``(B, m)``.
        lb, ub: optional box bounds ``(n,)``/``(B, n)``; ``+-inf`` entries mean no bound (the
            finite pattern must be shared by the batch). They become extra rows of ``G`` and
            their multipliers are returned as ``lb_duals``/``ub_duals`` (finite entries only).
        backward: ``"penalty"`` (default), ``"kkt"`` or a configured :class:`PenaltyBackward`
            / :class:`KKTBackward`.
        solver: a qpsolvers backend name, ``"torch"`` (the batched torch interior point of
            :mod:`dxopt.qp.solvers.torch_ipm`: dense inputs stay on their device and dtype, and
            its own backward reuses the forward's factorization; :mod:`dxopt.qp.api.device`),
            or ``"auto"``: ``"torch"`` for dense inputs off the CPU, ``"piqp"`` when a matrix
            is sparse or for a pure LP (``P = 0``) with ``n >= 65`` (measured faster than
            daqp's proximal iterations there, :func:`dxopt.qp.solvers.forward.routes_lp_to_piqp`),
            and on the CPU ``"daqp"`` for one dense problem with n <= 64 (or with
            options the lean paths do not take), else, for a dense batch or one dense problem
            with n > 64 with the default options and no warm start, the compiled dual
            active-set solver of :mod:`dxopt.qp.solvers.dual_active_set` (``info.solver ==
            "dual_active_set"``; daqp for any sample it does not solve, named in
            ``info.sample_solvers``; its backward reuses the solver's factors). Fastest in our
            measurements (see :func:`dxopt.qp.solvers.forward.default_solver`).
            ``"dual_active_set"``
            names that compiled solver for any dense CPU problem or batch with the default
            options and no warm start (one problem with n <= 64 runs as a batch of one: some
            0.23 ms fwd+bwd at n = 10 against 0.1 ms on ``"auto"``'s daqp lean path, which is
            why ``"auto"`` keeps daqp there); daqp, the same method, solves
            what it does not take (warm starts, ``solver_options``, sparse or non-CPU inputs,
            ``max_workers``) and ``info.solver`` then says ``"daqp"``. Any other name is
            refused with the list of installed backends.
        eps_abs, eps_rel: solver tolerances, mapped to each backend's own settings (daqp is an
            active-set method solving to machine precision and ignores them).
        on_failure: ``"raise"`` raises :class:`QPSolveError` naming the failed batch indices;
            ``"nan"`` returns NaN ``x`` and duals for those samples, keeps the others, and
            gives zero gradient contributions from the failed samples.
        warm_start: initial primal guess ``(n,)`` or ``(B, n)`` (backends that support it).
        max_workers: threads over the batch (``None``: serial loop, the measured winner on
            small problems).
        solver_options: extra keyword arguments for the backend.
        check_psd: check that dense ``P`` is PSD (one Cholesky; with daqp, daqp's own
            Cholesky of ``P`` is the certificate and only samples where it fails get the
            check); sparse ``P``: a Gershgorin pass, then the inertia of a sparse LDLᵀ of
            :math:`P + \\delta I` (:func:`dxopt.qp.problem.canonical.check_psd_sparse`; 0.26 s at
            most on the Maros-Meszaros set). Either way an indefinite ``P`` raises
            ``NotPSDError`` (a ``ValueError``).
        executor: ``None`` (default) solves in this process; an executor such as
            :class:`dxopt.distributed.RayExecutor` spreads the batch over workers in chunks and
            returns the same solution, status and gradients.
        fallback: walk the documented fallback chain (other backends, then a looser stopping
            tolerance followed by polishing; :func:`dxopt.qp.solvers.forward.fallback_chain`) when
            the requested backend fails or its point does not certify. ``False``: only the
            requested backend runs.
        polish: polish every backend's point on its active set (an equality-constrained QP
            solve, repeated until the multiplier signs and the feasibility are right). The
            certificate of :mod:`dxopt.qp.certify.polish` runs either way: a sample is ``SOLVED``
            only
            if its point meets ``eps_abs``/``eps_rel`` componentwise.

    Returns:
        :class:`QPSolution` with ``x``, ``eq_duals``, ``ineq_duals`` (differentiable),
        per-sample ``status`` and ``info``. Outputs are batched if any input is; gradients of
        unbatched inputs are summed over the batch.

    Under :func:`torch.compile` the call is a graph break (``torch.compiler.disable``): the
    backends are numpy/C code that Dynamo cannot trace; the rest of the model compiles.

    **torch.func.** ``grad``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd``, ``vmap`` and their
    first-order compositions (``vmap(grad(f))``, ``vmap(jacrev(f))``, ...) work on dense inputs,
    as does forward-mode AD (``torch.autograd.forward_ad``). The tangent solves the backward
    method's own adjoint system (:mod:`dxopt.qp.autograd.tangent`), so the jvp is the transpose of
    the
    vjp. ``vmap`` folds the vmapped dimension into the batch: one batched solve of ``V * B``
    samples, never a loop. ``status`` and ``info`` then describe that folded solve, one entry
    per sample, the vmapped index outermost (entry ``v * B + b``; nested vmaps: the outermost
    one slowest), and the function may return the whole :class:`QPSolution` (a pytree whose
    context is ``status`` and ``info``). Second derivatives (Hessians, ``jacrev(jacrev(f))``)
    raise ``RuntimeError``; a sparse ``P``/``A``/``G`` may be a constant of the transformed
    function but is not differentiated by torch.func (``TypeError``; plain ``backward()``
    gives sparse gradients). A vmapped ``lb``/``ub`` gets one row per entry (an infinite bound
    an exactly inactive zero row, :mod:`dxopt.qp.api.bounds`), so its ``lb_duals``/``ub_duals``
    have ``n`` entries, zero where the bound is infinite. ``solver="torch"`` (and ``"auto"``
    where it picks the torch solver, e.g. on a GPU) stays on the inputs' device and dtype
    under the transforms (:mod:`dxopt.qp.autograd.torch_function`). ``executor=`` raises
    ``ValueError`` under a transform or forward-mode AD (reverse mode only).

    Raises:
        ValueError: bad shapes, dtypes, devices, NaN/Inf, non-symmetric or non-PSD ``P``,
            inconsistent batch sizes, bad options.
        QPSolveError: infeasible, unbounded or failed samples with ``on_failure="raise"``.

    Example:
        >>> import torch, dxopt.qp as dqp
        >>> P = torch.eye(2, dtype=torch.float64)
        >>> q = torch.tensor([-1.0, -1.0], dtype=torch.float64, requires_grad=True)
        >>> G, h = torch.ones(1, 2, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
        >>> sol = dqp.solve(P, q, G=G, h=h)
        >>> sol.x.detach()
        tensor([0.5000, 0.5000], dtype=torch.float64)
    """
    if torch.compiler.is_compiling():  # a graph break: the solve runs eagerly (numpy/C)
        return _solve_eagerly(
            P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, backward=backward, solver=solver,
            eps_abs=eps_abs, eps_rel=eps_rel, on_failure=on_failure, warm_start=warm_start,
            max_workers=max_workers, solver_options=solver_options, check_psd=check_psd,
            executor=executor, fallback=fallback, polish=polish,
        )  # fmt: skip
    if on_failure not in ("raise", "nan"):
        raise ValueError(f"on_failure: expected 'raise' or 'nan', got {on_failure!r}.")
    if not (
        (solver == "auto" or solver in _solver_names())
        and check_psd.__class__ is bool
        and fallback.__class__ is bool
        and polish.__class__ is bool
        and (solver_options is None or solver_options.__class__ is dict)
    ):
        _check_options(solver, check_psd, fallback, polish, solver_options)
    if solver == "auto" and routes_lp_to_piqp(P, q):  # a larger pure LP: piqp is faster
        solver = "piqp"
    method = _backward_method(backward)
    if not (type(eps_abs) is float and type(eps_rel) is float and 0.0 <= eps_abs < math.inf
            and 0.0 <= eps_rel < math.inf):  # fmt: skip
        for tol_name, tol in (("eps_abs", eps_abs), ("eps_rel", eps_rel)):
            if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
                raise ValueError(
                    f"{tol_name}: expected a finite float >= 0, got {tol!r}. Use e.g. "
                    "eps_abs=1e-9, eps_rel=0.0."
                )
    for mat_name, mat in (("A", A), ("G", G)):
        if mat is not None and isinstance(mat, Tensor) and mat.ndim < 2:
            shape = "(p, n)" if mat_name == "A" else "(m, n)"
            raise ValueError(
                f"{mat_name}: expected a matrix of shape {shape} or (B, *{shape}), got a "
                f"{mat.ndim}-D tensor of shape {tuple(mat.shape)}. For a single row use "
                f"{mat_name}.reshape(1, -1)."
            )
    if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 1):
        raise ValueError(f"max_workers: expected a positive int or None, got {max_workers!r}.")
    if executor is not None:
        if not callable(getattr(executor, "solve", None)):
            raise TypeError(
                f"executor: expected None or an executor such as "
                f"dxopt.distributed.RayExecutor, got {type(executor).__name__}."
            )
        # [func] the chunks' graphs live on the workers: no torch.func, no forward mode
        if functorch_active() or any(forward_ad_dual(t) for t in (P, q, A, b, G, h, lb, ub)):
            raise ValueError(
                f"executor: expected None inside torch.func transforms (grad, vjp, jvp, jacrev, "
                f"jacfwd, vmap) and forward-mode AD, got {type(executor).__name__}: the "
                "distributed path has reverse-mode autograd only. Call solve without executor= "
                "there (one local batched solve), or differentiate the executor call with "
                "plain autograd (loss.backward(), torch.autograd.grad)."
            )
        options = {
            "backward": backward,
            "solver": solver,
            "eps_abs": eps_abs,
            "eps_rel": eps_rel,
            "on_failure": on_failure,
            "max_workers": max_workers,
            "solver_options": solver_options,
            "check_psd": check_psd,
            "fallback": fallback,
            "polish": polish,
        }
        return executor.solve(
            P, q, A, b, G, h, lb=lb, ub=ub, warm_start=warm_start, options=options
        )
    m_user = None if G is None else G.shape[-2]
    k_lb = k_ub = 0
    if lb is not None or ub is not None:
        if not isinstance(q, Tensor):
            raise TypeError("q: expected a torch.Tensor (needed to interpret lb/ub).")
        others = (P, A) if G is None else (G,)  # match G's layout, else the problem's
        sparse = any(isinstance(t, Tensor) and t.layout != torch.strided for t in others)
        G, h, k_lb, k_ub = append_bounds(q, G, h, lb, ub, sparse=sparse)
    if (  # one small dense problem with the default options: the lean path (dxopt.qp.api.small)
        not solver_options
        and check_psd
        and (solver == "auto" or solver in LEAN_BACKENDS)
        and lean_method(method)
        and not functorch_active()
        and small_inputs(P, q, A, b, G, h)
    ):
        small = _small_solve(
            (P, q, A, b, G, h), solver="daqp" if solver == "auto" else solver,
            warm_start=warm_start, method=method, eps_abs=eps_abs,
            eps_rel=eps_rel, fallback=fallback, polish=polish,
        )  # fmt: skip
        if small is not None:
            return _solution(*small, A is not None, m_user, lb, ub, k_lb, k_ub)
    elif (  # dense CPU problems, daqp or "auto", default options: the lean batch path
        not solver_options
        and check_psd
        and max_workers is None
        and (solver == "auto" or solver == "daqp" or solver == COMPILED_SOLVER)
        and lean_method(method)
        and not functorch_active()
    ):
        # "auto" or "dual_active_set" without a warm start: the compiled solver, for batches
        # of any n and for one problem ("auto": only one too large for the single lean path)
        # as a batch of one
        compiled = solver != "daqp" and warm_start is None
        data: tuple[Any, ...] = (P, q, A, b, G, h)
        batch = small_batch_inputs(*data, max_n=None if compiled else SMALL_MAX_N)
        single = (
            not batch
            and compiled
            and type(q) is Tensor
            and q.ndim == 1
            and (q.shape[0] > SMALL_MAX_N or solver == COMPILED_SOLVER)
            and all(type(t) is Tensor and t.layout is torch.strided for t in data if t is not None)
        )
        if single:
            data = tuple(None if t is None else t.unsqueeze(0) for t in data)
            batch = small_batch_inputs(*data, max_n=None, min_batch=1)
        if batch:
            small = _small_batch_solve(
                data, batch, method=method, eps_abs=eps_abs, eps_rel=eps_rel,
                warm_start=warm_start, compiled=compiled,
            )  # fmt: skip
            if small is not None:
                if single:
                    small = (small[0][0], small[1][0], small[2][0], *small[3:])
                return _solution(*small, A is not None, m_user, lb, ub, k_lb, k_ub)
    # solver="torch" (and "auto" on a GPU or for large batches of tiny problems) keeps dense
    # inputs on their device and dtype (dxopt.qp.api.device)
    bounds = None if lb is None and ub is None else (k_lb, k_ub, lb is not None, ub is not None)
    under_func = functorch_active()
    if under_func and _torch_route(solver, backward, P, q, A, G):  # [func] torch.func:
        _check_warm_start(warm_start, q.shape[-1])  # the Function validates the plain inputs
        shapes = [t.shape[0] for t, k in zip((P, q, A, b, G, h), BASES)
                  if t is not None and t.ndim > k]  # fmt: skip
        if q.shape[-1] and all(shapes):
            from dxopt.qp.api.device import solve_torch

            validate = functools.partial(canonical_problem, check_psd=check_psd, keep_device=True)
            return solve_torch(
                None, (P, q, A, b, G, h), eps_abs=eps_abs, eps_rel=eps_rel,
                on_failure=on_failure, solver_options=solver_options, polish=polish,
                m_user=m_user, bounds=bounds, validate=validate, backward=backward,
                fallback=fallback, cpu_solve=solve,
            )  # fmt: skip
    if not under_func and _torch_route(solver, backward, P, q, A, G):
        problem = canonical_problem(P, q, A, b, G, h, check_psd=check_psd, keep_device=True)
        _check_warm_start(warm_start, problem.n)
        name = default_solver(problem) if solver == "auto" else solver
        if name == "torch" and problem.size and problem.n:
            from dxopt.qp.api.device import solve_torch  # the device path

            return solve_torch(
                problem, (P, q, A, b, G, h), eps_abs=eps_abs, eps_rel=eps_rel,
                on_failure=on_failure, solver_options=solver_options, polish=polish,
                m_user=m_user, bounds=bounds, backward=backward, fallback=fallback,
                cpu_solve=solve,
            )  # fmt: skip
    if under_func:
        for mat_name, mat in (("P", P), ("A", A), ("G", G)):
            if isinstance(mat, Tensor) and mat.layout != torch.strided and mat.requires_grad:
                raise sparse_under_func(mat_name, mat.layout)
    run = functools.partial(
        _forward_state,
        method=method,
        solver=solver,
        eps_abs=eps_abs,
        eps_rel=eps_rel,
        max_workers=max_workers,
        solver_options=solver_options,
        check_psd=check_psd,
        fallback=fallback,
        polish=polish,
    )
    call = QPCall(run)
    x, mu, nu, _ = QPFunction.apply(P, q, A, b, G, h, warm_start, call)
    state = call.state
    assert state is not None
    problem, result, name = state.problem, state.result, state.solver
    if on_failure == "raise" and not all(s.ok for s in result.status):
        failed = tuple(i for i, s in enumerate(result.status) if not s.ok)
        message = unsolved_message(name, result.status, result.reasons)
        raise QPSolveError(message, failed, result.status)
    diagnostics = state.diagnostics
    primal, dual = state.residuals
    info = QPInfo(
        solver=name,
        solve_time=result.solve_time,
        primal_residual=primal,
        dual_residual=dual,
        backward=diagnostics,
        sample_solvers=result.sample_solvers,
        sample_tolerances=result.sample_eps,
        polished=result.polished,
    )
    return _solution(x, mu, nu, result.status, info, A is not None, m_user, lb, ub, k_lb, k_ub)


_SOLUTION_TENSORS = ("x", "eq_duals", "ineq_duals", "lb_duals", "ub_duals")


def _flatten_solution(sol: QPSolution) -> tuple[list[Tensor], Any]:
    present = tuple(getattr(sol, k) is not None for k in _SOLUTION_TENSORS)
    leaves = [getattr(sol, k) for k, p in zip(_SOLUTION_TENSORS, present) if p]
    return leaves, (present, sol.status, sol.info)


def _unflatten_solution(values: Any, context: Any) -> QPSolution:
    present, status, info = context
    it = iter(values)
    x, mu, nu, lb_duals, ub_duals = (next(it) if p else None for p in present)
    return QPSolution(x, mu, nu, status, info, lb_duals=lb_duals, ub_duals=ub_duals)  # type: ignore[arg-type]


# a pytree (tensors as leaves, status and info as context): torch.func.vmap, jacrev(has_aux)
# and friends can return a whole QPSolution
register_pytree_node(
    QPSolution,
    _flatten_solution,
    _unflatten_solution,
    serialized_type_name="dxopt.qp.QPSolution",
)


class QPLayer(nn.Module):
    """A differentiable QP layer: ``layer(P, q, A=A, b=b, G=G, h=h) -> QPSolution``.

    Every argument after ``q`` is keyword-only (as in :func:`solve`; positional use still
    works for one release, with a ``DeprecationWarning`` naming the arguments it bound).

    Holds only its configuration (keyword options of :func:`solve`), so it is picklable and
    safe under ``DistributedDataParallel``.
    """

    def __init__(
        self,
        *,
        backward: str | BackwardMethod = "penalty",
        solver: str = "auto",
        eps_abs: float = 1e-9,
        eps_rel: float = 0.0,
        on_failure: str = "raise",
        max_workers: int | None = None,
        solver_options: dict[str, Any] | None = None,
        check_psd: bool = True,
        executor: QPExecutor | None = None,
        fallback: bool = True,
        polish: bool = True,
    ) -> None:
        super().__init__()
        _backward_method(backward)
        if on_failure not in ("raise", "nan"):
            raise ValueError(f"on_failure: expected 'raise' or 'nan', got {on_failure!r}.")
        _check_options(solver, check_psd, fallback, polish, solver_options)
        self.options: dict[str, Any] = {
            "backward": backward,
            "solver": solver,
            "eps_abs": eps_abs,
            "eps_rel": eps_rel,
            "on_failure": on_failure,
            "max_workers": max_workers,
            "solver_options": solver_options,
            "check_psd": check_psd,
            "executor": executor,
            "fallback": fallback,
            "polish": polish,
        }

    # the warning points at the caller of ``layer(...)``, past nn.Module's call machinery
    @positional_deprecated("A", "b", "G", "h", leading=3, note=_ORDER_NOTE, stacklevel=4)
    def forward(
        self,
        P: Tensor,
        q: Tensor,
        *,
        A: Tensor | None = None,
        b: Tensor | None = None,
        G: Tensor | None = None,
        h: Tensor | None = None,
        lb: Tensor | None = None,
        ub: Tensor | None = None,
        warm_start: Tensor | None = None,
    ) -> QPSolution:
        return solve(P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, warm_start=warm_start, **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v is not None)
