"""Infeasible samples that still train: ``infeasible="relax"`` of :func:`dxopt.qp.solve`.

A sample certified infeasible (a checked Farkas certificate,
:mod:`dxopt.qp.certify.certificates`; never a residual threshold) is replaced by its
*closest feasible problem*, as QPLayer defines it (Bambade, Schramm, Taylor, Carpentier,
"QPLayer: efficient differentiation of convex quadratic optimization", 2023): the constraints
shifted by the smallest violation in the least-squares sense,

.. math::

    s^\\star = (s_A^\\star, s_G^\\star) = \\arg\\min_{x,\\, s_A,\\, s_G}\\ \\tfrac12\\|s_A\\|^2
    + \\tfrac12\\|s_G\\|^2 \\quad \\text{s.t.}\\quad Ax - s_A = b,\\ Gx - s_G \\le h,

then

.. math::

    x^\\star(\\theta) = \\arg\\min_x\\ \\tfrac12 x^\\top P x + q^\\top x \\quad\\text{s.t.}\\quad
    Ax = b + s_A^\\star(\\theta),\\ Gx \\le h + s_G^\\star(\\theta).

The shift is measured in the units of the rows as given (a row scaled up weighs its violation
more), as in QPLayer; through :class:`~dxopt.qp.CvxpyQPLayer` it is that of the QP the solver
sees (CVXPY's rows, after the elimination).
Box bounds count as rows of ``G`` (``-x \\le -lb``, ``x \\le ub``: ``lb`` moves down by its
shift, ``ub`` up). The first problem is a QP of its own in :math:`(x, s)`, always feasible and
bounded below, whose ``s`` part is unique (:math:`s^\\star` is the Euclidean projection of 0 onto
the polyhedron :math:`\\{(Ax - b, Gx - h + w) : w \\ge 0\\}`) while its ``x`` part need not be. Both
problems are solved by :func:`dxopt.qp.solve` itself, with the caller's options, and certified
like any QP; by construction the shifted problem is feasible (its feasible set is the set of
least-violation points), so the relaxed sample's status is ``RELAXED`` (``ok``) and
``info.relax_shift`` holds :math:`\\|s^\\star\\|_2`. A shifted problem that is unbounded below
(an LP whose objective decreases along the pinned set) keeps its certified ``UNBOUNDED``
status, a failure for ``on_failure``, with its shift norm still in ``info.relax_shift``.

**The derivative** is the exact derivative of the function
:math:`\\theta = (P, q, A, b, G, h, lb, ub) \\mapsto x^\\star(\\theta)` above, *including* the
dependence of :math:`s^\\star` on :math:`(A, b, G, h, lb, ub)`: the chain rule through the two
solves, each differentiated by its implicit KKT derivative (the ``backward=`` method). With
:math:`s^\\star` held fixed the map would not be defined on a neighbourhood (moving ``h`` by a
small amount makes the fixed-shift problem infeasible again), so the fixed-shift derivative is
not offered. The derivative exists where the active sets of both problems are stable (a
projection onto a polyhedron is differentiable where its face does not change); at a change of
active set it is one of the one-sided slopes, as for any QP of dxopt. The shifted problem's rows
with a positive shift are always linearly dependent when active (stationarity of the first
problem gives :math:`A^\\top s_A^\\star + G^\\top s_G^\\star = 0`), so its backward takes the
degenerate rule of the ``backward=`` method (:mod:`dxopt.qp.backward.degenerate_rule`; with
``degenerate="raise"`` the backward of a relaxed sample raises) and issues a
:class:`~dxopt.qp.QPDegenerateWarning`. Those rows pin the shifted feasible set whatever the sign
of their multipliers, so the shifted problem is differentiated with ``weak_policy="active"``
(:func:`_pinned_rows_active`); a zero-shift row that is weakly active there is a kink, and its
slope is the one-sided one of the piece where the row stays active.
``tests/qp/api/test_relax.py`` checks the derivative of every input against one-sided finite
differences of the relaxed map, for the minimum-norm and the vertex multiplier rules alike.

The feasible samples of a batch come from the same solve as with ``infeasible="fail"`` (and
``on_failure="nan"``): their ``x``, multipliers and gradients are bit for bit those of the mode
off. The relaxed samples are solved apart, cold (no warm start), and written into the batch's
outputs; their multipliers are the solver's for the shifted problem (not unique: its rows are
dependent). :math:`s^\\star` and the point are certified to ``eps_abs``/``eps_rel`` like any
QP's. Dense ``P``, ``A``, ``G`` only; reverse mode (``backward()``) only: under the
``torch.func`` transforms or forward-mode AD ``infeasible="relax"`` raises ``ValueError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from dxopt._core import Status
from dxopt.qp.api.general import backward_method
from dxopt.qp.backward.base import BackwardBase
from dxopt.qp.certify.certificates import unsolved_message
from dxopt.qp.problem.functorch import forward_ad_dual, functorch_active
from dxopt.qp.problem.options import QPOptions
from dxopt.qp.problem.types import QPSolution, QPSolveError

__all__ = ["relaxation", "solve_relaxed"]

SolveFn = Callable[..., QPSolution]
_NDIM = (2, 1, 2, 1, 2, 1, 1, 1)  # unbatched ndim of P, q, A, b, G, h, lb, ub


def _check_dense(P: object, A: object, G: object) -> None:
    """``ValueError`` for a sparse matrix: the relaxation is built with dense blocks."""
    for name, mat in (("P", P), ("A", A), ("G", G)):
        if isinstance(mat, Tensor) and mat.layout != torch.strided:
            raise ValueError(
                f"{name}: infeasible='relax' takes dense matrices, got {mat.layout}. Pass "
                f"{name}.to_dense(), or infeasible='fail'."
            )


def _rows(t: Tensor | None, base_ndim: int, index: Tensor | None) -> Tensor | None:
    """The rows ``index`` of a batched ``t``, a shared ``t`` expanded to them (``index`` None:
    an unbatched call, ``t`` as it is)."""
    if t is None or index is None:
        return t
    if t.ndim > base_ndim:
        return t.index_select(0, index)
    return t.expand(index.numel(), *t.shape)


def _bound_columns(bound: Tensor | None) -> Tensor | None:
    """The columns with a finite bound (the pattern is shared by a batch, as ``solve``
    checked)."""
    if bound is None:
        return None
    finite = torch.isfinite(bound.detach()).reshape(-1, bound.shape[-1])[0]
    return finite.nonzero().flatten()


def relaxation(
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    lb: Tensor | None,
    ub: Tensor | None,
    *,
    n: int,
    like: Tensor,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """The least-violation QP in :math:`z = (x, s_A, s_G, s_{lb}, s_{ub})` (module docstring):
    ``(P_r, q_r, A_r, b_r, G_r, h_r)`` with :math:`P_r = \\mathrm{diag}(0_n, I)`,
    :math:`A_r = [A, -I, 0]`, :math:`G_r = [\\bar G, 0, -I]` where :math:`\\bar G` stacks ``G``
    and the finite bound rows (``-e_i`` for ``lb``, ``e_i`` for ``ub``). Inputs already have
    the batch's leading shape (or none); differentiable in all of them."""
    lead = like.shape[:-1]
    kw: dict[str, Any] = {"dtype": like.dtype, "device": like.device}
    eye = torch.eye(n, **kw)
    blocks, rhs = [], []
    if G is not None and h is not None:
        blocks.append(G)
        rhs.append(h)
    for bound, sign in ((lb, -1.0), (ub, 1.0)):
        cols = _bound_columns(bound)
        if bound is None or cols is None or cols.numel() == 0:
            continue
        blocks.append((sign * eye[cols]).expand(*lead, cols.numel(), n))
        rhs.append(sign * bound[..., cols])
    p = 0 if A is None else A.shape[-2]
    mm = sum(t.shape[-2] for t in blocks)
    r = p + mm
    P_r = torch.zeros(n + r, n + r, **kw)
    P_r[n:, n:] = torch.eye(r, **kw)
    q_r = torch.zeros(n + r, **kw)
    A_r = b_r = G_r = h_r = None
    if A is not None and b is not None and p > 0:
        minus = (-torch.eye(p, **kw)).expand(*lead, p, p)
        A_r = torch.cat([A, minus, A.new_zeros((*lead, p, mm))], dim=-1)
        b_r = b
    if mm > 0:
        G_all = torch.cat(blocks, dim=-2)
        minus = (-torch.eye(mm, **kw)).expand(*lead, mm, mm)
        G_r = torch.cat([G_all, G_all.new_zeros((*lead, mm, p)), minus], dim=-1)
        h_r = torch.cat(rhs, dim=-1)
    return P_r, q_r, A_r, b_r, G_r, h_r


def _shifted_bound(bound: Tensor | None, shift: Tensor, sign: float, n: int) -> Tensor | None:
    """``bound + sign * shift`` on the finite entries (``lb`` moves down, ``ub`` up)."""
    cols = _bound_columns(bound)
    if bound is None or cols is None or cols.numel() == 0:
        return bound
    full = shift.new_zeros((*shift.shape[:-1], n)).index_copy(-1, cols, shift)
    return bound + sign * full


def _pinned_rows_active(options: QPOptions) -> QPOptions:
    """The options of the shifted solve: its backward keeps weakly active rows active
    (``weak_policy="active"``). A row with a positive shift pins the shifted feasible set
    whatever the sign of its multiplier, so a zero multiplier there is no kink of the relaxed
    map; treating it as inactive would drop the row's derivative (x <= 0, x >= 0 with the
    unconstrained minimum at 0: dx/dh = 0 instead of (1/2, -1/2))."""
    method = backward_method(options.backward)
    if isinstance(method, BackwardBase) and method.weak_policy != "active":
        return dataclasses.replace(
            options, backward=dataclasses.replace(method, weak_policy="active")
        )
    return options


def _merge(base: Sequence[Any], index: list[int], part: Sequence[Any]) -> tuple[Any, ...]:
    """``base`` with its entries ``index`` replaced by ``part`` (kept whole if the lengths do
    not match: a route that does not fill the field)."""
    if len(part) != len(index) or not base:
        return tuple(base)
    out = list(base)
    for j, i in enumerate(index):
        out[i] = part[j]
    return tuple(out)


def _put(base: Tensor | None, index: Tensor | None, part: Tensor | None) -> Tensor | None:
    """``base`` with rows ``index`` taken from ``part`` (the whole of ``part`` when
    unbatched); feasible rows stay the very values of ``base``."""
    if base is None or part is None:
        return base
    if index is None:
        return part
    return base.index_copy(0, index, part.to(base.dtype))


def _dual_inputs(*inputs: object) -> bool:
    """Whether an input is a forward-mode dual tensor (looked at only inside an open
    ``dual_level``: ``unpack_dual`` costs about 1 us a tensor)."""
    level = getattr(torch.autograd.forward_ad, "_current_level", None)
    if level is not None and level < 0:
        return False
    return any(forward_ad_dual(t) for t in inputs)


_INNER: dict[int, tuple[QPOptions, QPOptions]] = {}


def _inner_options(options: QPOptions) -> QPOptions:
    """``options`` with ``infeasible="fail"``, ``on_failure="nan"``: the options of the solves
    inside, kept per options object (``QPOptions.of`` shares one per option set; building
    one re-runs :meth:`QPOptions.check`, some 15 us of a 70 us small solve)."""
    hit = _INNER.get(id(options))
    if hit is not None and hit[0] is options:
        return hit[1]
    inner = dataclasses.replace(options, infeasible="fail", on_failure="nan")
    if len(_INNER) >= 64:
        _INNER.clear()
    _INNER[id(options)] = (options, inner)
    return inner


def solve_relaxed(
    P: Tensor,
    q: Tensor,
    A: Tensor | None,
    b: Tensor | None,
    G: Tensor | None,
    h: Tensor | None,
    lb: Tensor | None,
    ub: Tensor | None,
    warm_start: Any,
    options: QPOptions,
    solve_fn: SolveFn,
) -> QPSolution:
    """``solve`` with ``infeasible="relax"`` (module docstring); ``solve_fn`` is
    :func:`dxopt.qp.api.solve.solve_with`. ``options.on_failure`` is ``"raise"`` or ``"nan"``
    here (``"warn"``/``"ignore"`` arrive as ``"nan"``)."""
    _check_dense(P, A, G)
    if functorch_active() or _dual_inputs(P, q, A, b, G, h, lb, ub):
        raise ValueError(
            "infeasible: 'relax' is reverse mode only (backward()); it picks the infeasible "
            "samples by their status, which torch.func transforms and forward-mode AD do not "
            "allow. Use infeasible='fail' there."
        )
    inner = _inner_options(options)
    sol = solve_fn(P, q, A, b, G, h, lb, ub, warm_start, inner)
    if Status.INFEASIBLE in sol.status:
        infeasible = [i for i, s in enumerate(sol.status) if s is Status.INFEASIBLE]
        sol = _relax_samples(sol, infeasible, (P, q, A, b, G, h, lb, ub), inner, solve_fn)
    status = sol.status
    if options.on_failure == "raise" and not all(s.ok for s in status):
        failed = tuple(i for i, s in enumerate(status) if not s.ok)
        raise QPSolveError(unsolved_message(sol.info.solver, status), failed, status)
    return sol


def _relax_samples(
    sol: QPSolution,
    infeasible: list[int],
    data: tuple[Any, ...],
    options: QPOptions,
    solve_fn: SolveFn,
) -> QPSolution:
    """Solve the samples ``infeasible`` of ``sol`` as their closest feasible problems and
    write them into ``sol``'s outputs, status and info."""
    q = data[1]
    n = q.shape[-1]
    batched = sol.x.ndim > 1
    index = torch.tensor(infeasible, device=sol.x.device) if batched else None
    P, q, A, b, G, h, lb, ub = (_rows(t, d, index) for t, d in zip(data, _NDIM))
    assert P is not None and q is not None
    like = q if index is None else q.expand(index.numel(), n)
    relax = solve_fn(*relaxation(A, b, G, h, lb, ub, n=n, like=like), None, None, None, options)
    s = relax.x[..., n:]
    if not all(r.ok for r in relax.status):  # (not seen: the problem is feasible, bounded)
        solved = torch.tensor([r.ok for r in relax.status], device=s.device)
        s = torch.where(solved.reshape(*s.shape[:-1], 1), s, torch.zeros_like(s))
    p = 0 if A is None else A.shape[-2]
    m = 0 if G is None else G.shape[-2]
    k_lb = 0 if lb is None else int(_bound_columns(lb).numel())  # type: ignore[union-attr]
    b_s = None if b is None else b + s[..., :p]
    h_s = None if h is None else h + s[..., p : p + m]
    lb_s = _shifted_bound(lb, s[..., p + m : p + m + k_lb], -1.0, n)
    ub_s = _shifted_bound(ub, s[..., p + m + k_lb :], 1.0, n)
    shifted = solve_fn(P, q, A, b_s, G, h_s, lb_s, ub_s, None, _pinned_rows_active(options))
    part_status = tuple(
        Status.RELAXED if r.ok and t.ok else (t if not t.ok else r)
        for r, t in zip(relax.status, shifted.status)
    )
    norms = torch.linalg.vector_norm(s.detach(), dim=-1).reshape(-1).tolist()
    B = len(sol.status)
    shift = [0.0] * B
    for j, i in enumerate(infeasible):
        shift[i] = norms[j] if relax.status[j].ok else float("nan")
    info, part = sol.info, shifted.info
    info = dataclasses.replace(
        info,
        primal_residual=_merge(info.primal_residual, infeasible, part.primal_residual),
        dual_residual=_merge(info.dual_residual, infeasible, part.dual_residual),
        sample_solvers=_merge(info.sample_solvers, infeasible, part.sample_solvers),
        sample_tolerances=_merge(info.sample_tolerances, infeasible, part.sample_tolerances),
        polished=_merge(info.polished, infeasible, part.polished),
        relax_shift=tuple(shift),
    )
    return QPSolution(
        x=_put(sol.x, index, shifted.x),  # type: ignore[arg-type]
        eq_duals=_put(sol.eq_duals, index, shifted.eq_duals),
        ineq_duals=_put(sol.ineq_duals, index, shifted.ineq_duals),
        status=_merge(sol.status, infeasible, part_status),
        info=info,
        lb_duals=_put(sol.lb_duals, index, shifted.lb_duals),
        ub_duals=_put(sol.ub_duals, index, shifted.ub_duals),
    )
