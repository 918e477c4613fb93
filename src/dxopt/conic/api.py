"""The public entry points: :func:`solve` and :class:`ConicLayer`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dxopt._core import Status, handle_failure
from dxopt.conic.compiled import compiled_solve, set_eager_solve
from dxopt.conic.cones.base import Cone
from dxopt.conic.cones.exp import DUAL_TO_PRIMAL, ExpCone, ExpDualCone
from dxopt.conic.function import ConicCall, ConicFunction
from dxopt.conic.problem import conic_problem
from dxopt.conic.relax import solve_relaxed
from dxopt.conic.smoothed import check_barriers
from dxopt.conic.sparse import densify
from dxopt.conic.sparse_problem import sparse_route_wanted
from dxopt.conic.sparse_route import solve_sparse
from dxopt.conic.types import ConicOptions, ConicSolution, ConicSolveError, Smoothed
from dxopt.conic.warm import WarmStart, warm_points

__all__ = ["ConicLayer", "solve", "solve_with"]


def solve(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    *,
    cones: Sequence[Cone],
    atol: float = 1e-8,
    rtol: float = 1e-8,
    infeas_tol: float = 1e-8,
    max_iter: int = 200,
    solver: str = "clarabel",
    fallback: bool = True,
    on_failure: str = "raise",
    kink_tol: float = 1e-7,
    polish: bool = True,
    check_psd: bool = True,
    infeasible: str = "fail",
    backward: str | Smoothed = "kkt",
    route: str = "auto",
    warm_start: WarmStart = None,
) -> ConicSolution:
    """Solve :math:`\\min_x \\tfrac12 x^\\top Px + q^\\top x` s.t. :math:`Ax + s = b`,
    :math:`s \\in K = K_1 \\times \\dots \\times K_r` and make ``x``, ``y``, ``s``
    differentiable in ``P, q, A, b``.

    Args:
        P: ``(n, n)`` or ``(B, n, n)`` symmetric PSD, or ``None`` (a linear objective).
        q: ``(n,)`` or ``(B, n)``.
        A: ``(m, n)`` or ``(B, m, n)``. ``P`` and ``A`` may be sparse COO/CSR ``(n, n)`` /
            ``(m, n)`` matrices shared by the batch: their gradients are sparse tensors of the
            same layout and pattern (:mod:`dxopt.conic.sparse`); from
            :math:`n + m \\ge` :data:`~dxopt.conic.sparse_problem.SPARSE_MIN` (or with
            ``route="sparse"``) they are never densified (:mod:`dxopt.conic.sparse_route`).
        b: ``(m,)`` or ``(B, m)``.
        cones: the cones :math:`K_i` in row order (``ZeroCone``, ``NonnegCone``,
            ``SecondOrderCone``, ``PSDCone``, ...); their dimensions add up to ``m``.
        atol, rtol, infeas_tol, max_iter, solver, fallback, on_failure, kink_tol, polish,
            check_psd, infeasible, backward, route: see :class:`~dxopt.conic.types.ConicOptions`.
        warm_start: ``None``, a previous :class:`ConicSolution` or a tuple ``(x, y, s)`` of
            its shapes: tried first by dxopt's own polish and certificate, the backends skipped
            where it certifies (:mod:`dxopt.conic.warm`).

    Returns:
        :class:`~dxopt.conic.types.ConicSolution` with ``x``, ``y`` (in :math:`K^*`), ``s``
        (in :math:`K`), per-sample ``status`` and ``info``. Float32 inputs give float32 outputs
        (the solve and the derivative run in float64).

    Raises:
        TypeError, ValueError: bad inputs, each naming the argument.
        ConicSolveError: with ``on_failure="raise"``, samples without a certified solution
            (infeasible and unbounded ones included), naming their indices and statuses.

    Example:
        >>> import torch, dxopt.conic as dc
        >>> c = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
        >>> # the point of the unit ball nearest to c: min 1/2|x|^2 - c'x, (1, x) in SOC(3)
        >>> A = torch.cat([torch.zeros(1, 2), -torch.eye(2)]).double()
        >>> b = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
        >>> sol = dc.solve(torch.eye(2, dtype=torch.float64), -c, A, b,
        ...                cones=[dc.SecondOrderCone(3)])
        >>> [round(v, 6) for v in sol.x.tolist()]
        [0.6, 0.8]
    """
    options = ConicOptions(
        atol=atol,
        rtol=rtol,
        infeas_tol=infeas_tol,
        max_iter=max_iter,
        solver=solver,
        fallback=fallback,
        on_failure=on_failure,
        kink_tol=kink_tol,
        polish=polish,
        check_psd=check_psd,
        infeasible=infeasible,
        backward=backward,
        route=route,
    )
    return solve_with(P, q, A, b, cones=cones, options=options, warm_start=warm_start)


def solve_with(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    *,
    cones: Sequence[Cone],
    options: ConicOptions,
    warm_start: WarmStart = None,
) -> ConicSolution:
    """:func:`solve` with one :class:`~dxopt.conic.types.ConicOptions` record."""
    if not isinstance(options, ConicOptions):
        raise TypeError(f"options: expected a ConicOptions, got {type(options).__name__}")
    cones = tuple(cones)
    if not torch.compiler.is_compiling() and sparse_route_wanted(P, q, A, cones, options):
        return _finish(solve_sparse(P, q, A, b, cones, options, warm_start), options)
    P, A = densify("P", P), densify("A", A)
    if torch.compiler.is_compiling():  # one opaque custom op (dxopt.conic.compiled)
        return compiled_solve(P, q, A, b, cones, options, warm_start)
    if any(isinstance(cone, ExpDualCone) for cone in cones):
        return _dual_exp_via_primal(P, q, A, b, cones, options, warm_start)
    if options.infeasible == "relax":
        sol = solve_relaxed(P, q, A, b, cones, options, _plain, warm_start)
    else:
        sol = _plain(P, q, A, b, cones, options, warm_start)
    return _finish(sol, options)


def _plain(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    cones: tuple[Cone, ...],
    options: ConicOptions,
    warm_start: WarmStart,
) -> ConicSolution:
    """One certified, differentiable solve; failed samples are NaN (no failure handling)."""
    prob = conic_problem(P, q, A, b, cones, check_psd=options.check_psd)
    if isinstance(options.backward, Smoothed):
        check_barriers(prob.cones)
    call = ConicCall(prob, options, warm=warm_points(prob, warm_start))
    P_in = P if P is not None else q.new_zeros(0)
    x, y, s = ConicFunction.apply(P_in, q, A, b, call)
    state = call.state
    assert state is not None
    info = state.info
    if call.warm is not None:
        info = dataclasses.replace(info, warm=tuple(sv == "warm" for sv in info.solvers))
    return ConicSolution(x=x, y=y, s=s, status=tuple(state.status), info=info)


def _finish(sol: ConicSolution, options: ConicOptions) -> ConicSolution:
    """``on_failure`` for the samples without a certified solution."""
    status = sol.status
    failed = tuple(i for i, st in enumerate(status) if not st.ok)
    if failed:
        listed = ", ".join(f"{i}: {status[i].value}" for i in failed[:10])
        why = "; ".join(sol.info.failures[failed[0]][-2:])
        message = (
            f"dxopt.conic.solve: {len(failed)} of {len(status)} samples have no certified "
            f"solution ({listed}{', ...' if len(failed) > 10 else ''})"
            + (f"; sample {failed[0]}: {why}" if why else "")
            + ". Infeasible/unbounded samples carry a checked certificate; for the others "
            "raise max_iter or loosen atol/rtol. Pass on_failure='nan' to keep the rest"
            + (
                ", or infeasible='relax' to train on the closest feasible problem."
                if Status.INFEASIBLE in status and options.infeasible == "fail"
                else "."
            )
        )
        if options.on_failure == "raise":
            raise ConicSolveError(message, failed, status)
        handle_failure(options.on_failure, message, status=None)
    return sol


def _dual_exp_via_primal(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    cones: tuple[Cone, ...],
    options: ConicOptions,
    warm_start: WarmStart,
) -> ConicSolution:
    """Rows in the dual exponential cone, solved as primal exponential rows.

    With :math:`T` = :data:`~dxopt.conic.cones.exp.DUAL_TO_PRIMAL` (:math:`u \\in K_{exp}^*
    \\Leftrightarrow Tu \\in K_{exp}`) on those rows and the identity elsewhere (:math:`M`), the
    program with :math:`MA, Mb` and :math:`ExpCone` has the same :math:`x`, the slack
    :math:`s' = Ms` and the dual :math:`y'` with :math:`y = M^\\top y'` (stationarity
    :math:`Px + q + (MA)^\\top y' = 0`). The map is linear and applied in torch, so gradients
    flow through it."""
    if A.layout != torch.strided or b.layout != torch.strided:
        raise TypeError("A, b: ExpDualCone rows need dense A and b; pass A.to_dense()")
    m = sum(cone.dim for cone in cones)
    if A.shape[-2] != m:
        raise ValueError(
            f"A: expected {m} rows (the sum of the cones' dimensions), got {A.shape[-2]}"
        )
    M = torch.eye(m, dtype=A.dtype, device=A.device)
    T = torch.tensor(DUAL_TO_PRIMAL, dtype=A.dtype, device=A.device)
    primal: list[Cone] = []
    start = 0
    for cone in cones:
        if isinstance(cone, ExpDualCone):
            M[start : start + 3, start : start + 3] = T
            primal.append(ExpCone())
        else:
            primal.append(cone)
        start += cone.dim
    Minv = torch.linalg.inv(M)
    warm = warm_start
    if isinstance(warm_start, ConicSolution):
        warm_start = (warm_start.x, warm_start.y, warm_start.s)
    if isinstance(warm_start, tuple) and len(warm_start) == 3:
        wx, wy, ws = warm_start
        warm = (wx, wy @ Minv, ws @ M.T)  # y = M'y', s' = M s
    sol = solve_with(P, q, M @ A, b @ M.T, cones=primal, options=options, warm_start=warm)
    s = sol.s @ Minv.T
    return ConicSolution(x=sol.x, y=sol.y @ M, s=s, status=sol.status, info=sol.info)


set_eager_solve(solve_with)


class ConicLayer(nn.Module):
    """A cone program as a layer: ``layer(P, q, A, b) -> ConicSolution`` with fixed ``cones``
    and options (keyword-only, as :func:`solve`)."""

    def __init__(self, *, cones: Sequence[Cone], **options: object) -> None:
        super().__init__()
        self.cones = tuple(cones)
        self.options = ConicOptions(**options)  # type: ignore[arg-type]

    def forward(
        self, P: Tensor | None, q: Tensor, A: Tensor, b: Tensor, *, warm_start: WarmStart = None
    ) -> ConicSolution:
        return solve_with(P, q, A, b, cones=self.cones, options=self.options, warm_start=warm_start)

    def extra_repr(self) -> str:
        return f"cones={list(self.cones)}"
