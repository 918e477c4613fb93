"""The public entry point :func:`solve`: validate -> plan -> run.

The options are checked once (:class:`dxopt.qp.problem.options.QPOptions`), the box bounds
become rows of ``G`` (:mod:`dxopt.qp.api.bounds`), the router picks the route
(:func:`dxopt.qp.api.route.plan`) and the route's runner solves: the lean ones
(:mod:`dxopt.qp.api.lean`), the device one (:mod:`dxopt.qp.api.device`), the general one
(:mod:`dxopt.qp.api.general`) or an ``executor=``. ``QPInfo.route`` records which.
:class:`dxopt.qp.QPLayer` lives in :mod:`dxopt.qp.api.layer`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from dxopt._core import handle_failure, positional_refused
from dxopt.qp.api.bounds import append_bounds
from dxopt.qp.api.compiled import compiled_solve, compiles, set_eager_solve
from dxopt.qp.api.general import backward_method, run_general
from dxopt.qp.api.lean import declined, run_lean_batch, run_lean_single
from dxopt.qp.api.relax import solve_relaxed
from dxopt.qp.api.route import Route, plan
from dxopt.qp.certify.certificates import unsolved_message
from dxopt.qp.problem.canonical import canonical_problem
from dxopt.qp.problem.contracts import BackwardMethod
from dxopt.qp.problem.executor import QPData
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPSolution

if TYPE_CHECKING:
    from dxopt.qp.problem.executor import QPExecutor

__all__ = ["ORDER_NOTE", "solve", "warm_duals", "warm_point"]

ORDER_NOTE = (
    "qpsolvers and qpth take (P, q, G, h, A, b) while dxopt's old positional order was (P, q, "
    "A, b, G, h), so a positional solve(P, q, G, h) would solve G x = h as equalities: write "
    "solve(P, q, G=G, h=h, A=A, b=b)."
)


@torch.compiler.disable
def _solve_eagerly(*args: Any, **kwargs: Any) -> QPSolution:
    """:func:`solve` outside Dynamo: under :func:`torch.compile` the call to this function is
    the graph break (``solve`` checks :func:`torch.compiler.is_compiling` first instead of
    carrying the decorator itself, whose wrapper costs every eager call about 2 us)."""
    if "options" in kwargs:  # from QPLayer: checked options
        return solve_with(*args, **kwargs)
    return solve(*args, **kwargs)


def warm_point(warm_start: object, options: QPOptions) -> Tensor | None:
    """The primal point of a previous :class:`QPSolution` given as ``warm_start`` (detached:
    a warm start carries no gradient). daqp, on the lean paths and in the fallback chain,
    takes its initial working set from the constraints active at that point on the general
    route; a warm start that fails is retried cold
    (:meth:`dxopt.qp.solvers.chain.FallbackChain.point`), and the answer is certified as a
    cold one. ``None`` for a batched solution with ``solver="auto"`` or
    ``"dual_active_set"``: the compiled batch solver takes no primal point; it starts from the
    solution's working set instead (:func:`warm_duals`), as daqp does on the lean routes."""
    if isinstance(warm_start, QPSolution):
        if warm_start.x.ndim > 1 and options.solver in ("auto", "dual_active_set"):
            return None
        return warm_start.x.detach()
    raise TypeError(
        f"warm_start: expected a tensor (n,) or (B, n) or a previous dxopt.qp.QPSolution, got "
        f"{type(warm_start).__name__}. Pass sol.x or the solution itself."
    )


def warm_duals(warm_start: QPSolution) -> Tensor | None:
    """A previous solution's multipliers of the inequality rows in the order the bounds are
    appended to ``G`` (:func:`dxopt.qp.api.bounds.append_bounds`: ``G``'s rows, then the finite
    ``lb`` and ``ub`` entries), detached; their positive entries are the working set the lean
    routes' active-set solvers start from (daqp's ``dual_start``, the compiled solver's warm
    rows; :func:`dxopt.qp.lean.small_batch.warm_rows`). ``None`` without inequality rows. A
    solution of another problem's shape gives multipliers of another length, which the lean
    routes do not use (a cold start)."""
    parts = [t for t in (warm_start.ineq_duals, warm_start.lb_duals, warm_start.ub_duals)
             if t is not None]  # fmt: skip
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0].detach()
    if len({t.shape[:-1] for t in parts}) > 1:
        return None
    return torch.cat([t.detach() for t in parts], -1)


def _refuse_vectors(A: object, G: object) -> None:
    """``ValueError`` for an ``A`` or ``G`` given as a vector (a matrix was meant)."""
    for mat_name, mat in (("A", A), ("G", G)):
        if mat is not None and isinstance(mat, Tensor) and mat.ndim < 2:
            shape = "(p, n)" if mat_name == "A" else "(m, n)"
            raise ValueError(
                f"{mat_name}: expected a matrix of shape {shape} or (B, *{shape}), got a "
                f"{mat.ndim}-D tensor of shape {tuple(mat.shape)}. For a single row use "
                f"{mat_name}.reshape(1, -1)."
            )


@positional_refused("A", "b", "G", "h", leading=2, note=ORDER_NOTE)
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
    warm_start: Tensor | QPSolution | None = None,
    max_workers: int | None = None,
    solver_options: dict[str, Any] | None = None,
    check_psd: bool = True,
    executor: QPExecutor | None = None,
    fallback: bool = True,
    polish: bool = True,
    infeasible: str = "fail",
) -> QPSolution:
    """Solve :math:`\\min_x \\tfrac12 x^\\top Px + q^\\top x` s.t. :math:`Ax = b`, :math:`Gx \\le h`
    and make the solution and the multipliers differentiable.

    The forward solve goes through :func:`qpsolvers.solve_problem` (CPU, float64, one solve per
    sample; daqp through its own Python API, :mod:`dxopt.qp.solvers.daqp`; one small unbatched dense
    problem, ``n <= 64``, with daqp, piqp or proxqp and the default solver options takes the
    lean path of :mod:`dxopt.qp.lean.small`, same results at a fraction of the fixed cost). The
    derivative is the implicit one of the KKT conditions
    :math:`Px + q + A^\\top\\mu + G^\\top\\nu = 0`, :math:`Ax = b`,
    :math:`\\nu \\circ (Gx - h) = 0` on the active set, computed either by the dXPP penalty
    system (:class:`PenaltyBackward`, Linghu et al., arXiv 2602.14154) or by the exact reduced
    KKT system (:class:`KKTBackward`; Amos & Kolter, arXiv 1703.00443).

    Every argument after ``q`` is keyword-only: ``solve(P, q, G=G, h=h)``. qpsolvers and qpth
    take ``(P, q, G, h, A, b)`` while dxopt's positional order was ``(P, q, A, b, G, h)``, so a
    positional ``solve(P, q, G, h)`` silently solved :math:`Gx = h` as equalities. After one
    release of ``DeprecationWarning``, positional arguments after ``q`` raise a ``TypeError``
    that says to pass them by keyword (``G=, h=, A=, b=``).

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
            with n > 64 with the default options (a warm start from a previous solution
            included: its working set), the compiled dual
            active-set solver of :mod:`dxopt.qp.solvers.dual_active_set` (``info.solver ==
            "dual_active_set"``; daqp for any sample it does not solve, named in
            ``info.sample_solvers``; its backward reuses the solver's factors). Fastest in our
            measurements (see :func:`dxopt.qp.solvers.forward.default_solver`).
            ``"dual_active_set"``
            names that compiled solver for any dense CPU problem or batch with the default
            options (one problem with n <= 64 runs as a batch of one: some
            0.23 ms fwd+bwd at n = 10 against 0.1 ms on ``"auto"``'s daqp lean path, which is
            why ``"auto"`` keeps daqp there); daqp, the same method, solves
            what it does not take (a primal guess as warm start, ``solver_options``, sparse
            or non-CPU inputs,
            ``max_workers``) and ``info.solver`` then says ``"daqp"``. Any other name is
            refused with the list of installed backends.
        eps_abs, eps_rel: solver tolerances, mapped to each backend's own settings (daqp is an
            active-set method solving to machine precision and ignores them).
        on_failure: ``"raise"`` raises :class:`QPSolveError` naming the failed batch indices;
            ``"nan"`` returns NaN ``x`` and duals for those samples, keeps the others, and
            gives zero gradient contributions from the failed samples; ``"warn"`` does the
            same and issues one :class:`dxopt.DxoptWarning` naming the failed samples;
            ``"ignore"`` is ``"nan"`` (the shared vocabulary's names; ``sol.status`` says
            which samples failed).
        warm_start: initial primal guess ``(n,)`` or ``(B, n)`` (backends that support it), or
            a previous :class:`QPSolution` of a problem of the same shape (its ``x``,
            detached; :func:`warm_point`). On the lean routes daqp and the compiled dual
            active-set solver start from that solution's working set (its rows of positive
            multiplier, :func:`warm_duals`), on the general route daqp from the rows active
            at its point; a failed warm start is retried cold, and the certificate is the
            cold one's, so a bad warm start costs time, never accuracy. ``info.iterations``
            and ``info.warm_started`` say what it saved on the lean routes.
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
        infeasible: ``"fail"`` (default): a sample certified infeasible is a failure, handled
            by ``on_failure``. ``"relax"``: such a sample is solved as its closest feasible
            problem instead, the constraints shifted by the least-squares smallest violation
            :math:`s^\\star` (Bambade et al., QPLayer, 2023), and differentiated through
            :math:`s^\\star` too; its status is ``RELAXED`` and ``info.relax_shift`` holds
            :math:`\\|s^\\star\\|_2` (:mod:`dxopt.qp.api.relax`). The other samples are
            bit-for-bit those of ``"fail"``.

    Returns:
        :class:`QPSolution` with ``x``, ``eq_duals``, ``ineq_duals`` (differentiable),
        per-sample ``status`` and ``info``. Outputs are batched if any input is; gradients of
        unbatched inputs are summed over the batch.

    Under :func:`torch.compile` (``fullgraph=True`` included) the solve is the opaque custom op
    of :mod:`dxopt.qp.api.compiled`, with the eager outputs and gradients; ``status`` is then
    ``()``, ``info.route == "compiled"`` and ``lb_duals``/``ub_duals`` have ``n`` entries (zero
    where the bound is infinite). With a configured backward object, ``infeasible="relax"``,
    ``solver_options``, ``max_workers`` or ``executor`` the call stays a graph break
    (``torch.compiler.disable``).

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
        TypeError: positional arguments after ``q``.
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
    if torch.compiler.is_compiling():  # the custom op (or a graph break)
        options = QPOptions.of(
            backward, solver, eps_abs, eps_rel, on_failure, max_workers, solver_options,
            check_psd, executor, fallback, polish, infeasible,
        )  # fmt: skip
        if compiles(options):
            return solve_with(P, q, A, b, G, h, lb, ub, warm_start, options)
        return _solve_eagerly(
            P, q, A=A, b=b, G=G, h=h, lb=lb, ub=ub, backward=backward, solver=solver,
            eps_abs=eps_abs, eps_rel=eps_rel, on_failure=on_failure, warm_start=warm_start,
            max_workers=max_workers, solver_options=solver_options, check_psd=check_psd,
            executor=executor, fallback=fallback, polish=polish, infeasible=infeasible,
        )  # fmt: skip
    options = QPOptions.of(
        backward, solver, eps_abs, eps_rel, on_failure, max_workers, solver_options, check_psd,
        executor, fallback, polish, infeasible,
    )  # fmt: skip
    return solve_with(P, q, A, b, G, h, lb, ub, warm_start, options)


def solve_with(
    P: Tensor,
    q: Tensor,
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    lb: Tensor | None,
    ub: Tensor | None,
    warm_start: Tensor | QPSolution | None,
    options: QPOptions,
    *,
    route: str | None = None,
) -> QPSolution:
    """:func:`solve` with checked ``options``: validate the inputs, plan, run. ``route=
    "general"`` forces the general route (the reference the other routes are tested
    against)."""
    if options.on_failure in ("warn", "ignore") and not torch.compiler.is_compiling():
        sol = solve_with(
            P, q, A, b, G, h, lb, ub, warm_start,
            dataclasses.replace(options, on_failure="nan"), route=route,
        )  # fmt: skip
        if options.on_failure == "warn" and not all(s.ok for s in sol.status):
            handle_failure("warn", unsolved_message(sol.info.solver, sol.status), stacklevel=3)
        return sol
    duals = None
    if warm_start is not None and not isinstance(warm_start, Tensor):
        if isinstance(warm_start, QPSolution):
            duals = warm_duals(warm_start)
        warm_start = warm_point(warm_start, options)
    if torch.compiler.is_compiling():  # the custom op, else a graph break
        if route is None and compiles(options):
            return compiled_solve(P, q, A, b, G, h, lb, ub, warm_start, options)
        return _solve_eagerly(P, q, A, b, G, h, lb, ub, warm_start, options=options, route=route)
    if options.infeasible == "relax":  # the infeasible samples as closest feasible problems
        return solve_relaxed(P, q, A, b, G, h, lb, ub, warm_start, options, solve_with)
    if (isinstance(A, Tensor) and A.ndim < 2) or (isinstance(G, Tensor) and G.ndim < 2):
        _refuse_vectors(A, G)
    method = backward_method(options.backward)
    if options.executor is not None:  # the bounds travel as they came
        plan((P, q, A, b, G, h, lb, ub), options, method, warm_start=warm_start)
        return options.executor.solve(
            QPData(P, q, A, b, G, h, lb, ub, warm_start),
            options=dataclasses.replace(options, executor=None),
        )
    m_user = None if G is None else G.shape[-2]
    k_lb = k_ub = 0
    if lb is not None or ub is not None:
        if not isinstance(q, Tensor):
            raise TypeError("q: expected a torch.Tensor (needed to interpret lb/ub).")
        others = (P, A) if G is None else (G,)  # match G's layout, else the problem's
        sparse = any(isinstance(t, Tensor) and t.layout != torch.strided for t in others)
        G, h, k_lb, k_ub = append_bounds(q, G, h, lb, ub, sparse=sparse)
    data = (P, q, A, b, G, h)
    layout = (m_user, lb, ub, k_lb, k_ub)
    planned = plan(data, options, method, warm_start=warm_start, warm_set=duals is not None)
    if route == "general" and planned.name != "general":
        planned = declined(planned, options, data)
    name = planned.name
    if name == "lean_single":
        return run_lean_single(planned, data, warm_start, options, method, layout, duals)
    if name == "lean_batch":
        return run_lean_batch(planned, data, warm_start, options, method, layout, duals)
    if name == "device":
        return _run_device(planned, data, options, layout)
    return run_general(planned, data, warm_start, options, method, layout)


set_eager_solve(solve_with)


def _run_device(
    route: Route, data: tuple[Any, ...], options: QPOptions, layout: tuple[Any, ...]
) -> QPSolution:
    """The torch interior point on the inputs' device (:mod:`dxopt.qp.api.device`)."""
    from dxopt.qp.api.device import solve_torch

    m_user, lb, ub, k_lb, k_ub = layout
    bounds = None if lb is None and ub is None else (k_lb, k_ub, lb is not None, ub is not None)
    validate = None
    if route.problem is None:  # under torch.func: the Function validates the plain inputs
        validate = functools.partial(
            canonical_problem, check_psd=options.check_psd, keep_device=True
        )
    extra: dict[str, Any] = {} if validate is None else {"validate": validate}
    sol = solve_torch(
        route.problem, data, options, m_user=m_user, bounds=bounds, cpu_solve=solve, **extra
    )
    info = dataclasses.replace(sol.info, route="device")
    return dataclasses.replace(sol, info=info)
