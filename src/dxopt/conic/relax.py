"""Infeasible samples that still train: ``infeasible="relax"`` of :func:`dxopt.conic.solve`.

A sample certified ``INFEASIBLE`` (a checked Farkas certificate, :mod:`dxopt.conic.certify`;
never a residual threshold) is replaced by its *closest feasible problem*, the constraints
shifted by the smallest violation in the least-squares sense (the definition of QPLayer:
Bambade, Schramm, Taylor, Carpentier, "QPLayer: efficient differentiation of convex quadratic
optimization", 2023, carried over to cones):

.. math::

    d^\\star = \\arg\\min_{x,\\, d}\\ \\tfrac12 \\Vert d\\Vert_2^2 \\quad\\text{s.t.}\\quad
    Ax + s = b + d,\\ s \\in K,

a cone program of its own in :math:`(x, d)` (``P = diag(0, I)``, rows ``[A, -I]``), always
feasible and bounded below, whose ``d`` part is unique: :math:`b + d^\\star` is the point of the
convex set :math:`\\{Ax + s : s \\in K\\}` nearest to :math:`b` (attained where that set is
closed, always for polyhedral ``K``; otherwise the first solve may end uncertified, and the
sample keeps that status), then

.. math::

    x^\\star(\\theta) = \\arg\\min_x \\tfrac12 x^\\top Px + q^\\top x \\quad\\text{s.t.}\\quad
    Ax + s = b + d^\\star(\\theta),\\ s \\in K .

Both are solved by :func:`dxopt.conic.solve` itself with the caller's options and certified like
any cone program. The shifted feasible set has no interior point (it is the set of
least-violation points), so an interior-point backend meets it as a degenerate program: its
residuals are certified to ``atol``/``rtol`` as always, while the point itself may be accurate
to only about :math:`\\sqrt{\\mathrm{atol}}` where that set is a single point of a curved cone
(a ball touching a half-space: ``tests/conic/test_relax.py``). The relaxed sample's status is
``RELAXED`` (``ok``) and ``info.relax_shift`` holds :math:`\\Vert d^\\star\\Vert_2` (0.0 for
the other samples). A relaxed sample whose shifted problem is not certified (e.g. unbounded
below along the least-violation set) keeps that problem's status, a failure for ``on_failure``.

**The derivative** is the exact derivative of :math:`\\theta = (P, q, A, b) \\mapsto
(x, y, s)^\\star(\\theta)` above, the dependence of :math:`d^\\star` on :math:`(A, b)` included:
the chain rule through the two differentiable solves (autograd composes them). The first
problem's ``x`` part need not be unique and the shifted problem's feasible set has no interior
point, so either Jacobian may be singular: the backward then takes the minimum-norm adjoint and
says so (a :class:`~dxopt.conic.types.ConicDegenerateWarning`, :mod:`dxopt.conic.backward`);
where :math:`d^\\star` and :math:`x^\\star` are differentiable the cotangent lies in the range
of the transposed Jacobian and that adjoint is the exact one (``tests/conic/test_relax.py``
checks it against finite differences of the relaxed map).

The feasible samples of a batch come from the same solve as with ``infeasible="fail"`` (and
``on_failure="nan"``): their outputs and gradients are bit for bit those of the mode off. The
relaxed samples are solved apart (cold) and written into the batch's outputs; their ``y`` is
the shifted problem's multiplier, not unique where its active rows are dependent (they
often are). Dense ``A``
only. With :class:`~dxopt.conic.ExpDualCone` rows the shift is that of the equivalent primal
exponential rows (:func:`dxopt.conic.api.solve_with`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from dxopt._core import Status
from dxopt.conic.cones.base import Cone
from dxopt.conic.types import ConicOptions, ConicSolution

__all__ = ["solve_relaxed"]

Plain = Callable[..., ConicSolution]
"""``plain(P, q, A, b, cones, options, warm) -> ConicSolution``: one solve, no failure
handling (the caller's :func:`dxopt.conic.api._plain`)."""


def _pick(t: Tensor | None, ix: Tensor, batched_ndim: int) -> Tensor | None:
    """The samples ``ix`` of a batched input; a shared input as it is."""
    if t is None or t.ndim < batched_ndim:
        return t
    return t[ix]


def solve_relaxed(
    P: Tensor | None,
    q: Tensor,
    A: Tensor,
    b: Tensor,
    cones: tuple[Cone, ...],
    options: ConicOptions,
    plain: Plain,
    warm: object = None,
) -> ConicSolution:
    """The solve of ``infeasible="relax"`` (module doc); failures are left to the caller."""
    if A.layout != torch.strided:
        raise TypeError(
            f"A: infeasible='relax' needs a dense A, got layout {A.layout}; pass A.to_dense()"
        )
    inner = dataclasses.replace(options, infeasible="fail", on_failure="nan")
    sol = plain(P, q, A, b, cones, inner, warm)
    B = len(sol.status)
    idx = [i for i, st in enumerate(sol.status) if st is Status.INFEASIBLE]
    if not idx:
        return dataclasses.replace(sol, info=dataclasses.replace(sol.info, relax_shift=(0.0,) * B))
    batched = sol.x.ndim == 2
    ix = torch.as_tensor(idx, dtype=torch.long, device=q.device)
    Ps, qs, As, bs = _pick(P, ix, 3), _pick(q, ix, 2), _pick(A, ix, 3), _pick(b, ix, 2)
    assert qs is not None and As is not None and bs is not None
    n, m = q.shape[-1], b.shape[-1]
    eye = torch.eye(m, dtype=q.dtype, device=q.device)
    Ar = torch.cat([As, -eye.expand(*As.shape[:-2], m, m)], dim=-1)
    Pr = torch.block_diag(q.new_zeros(n, n), eye)
    qr = q.new_zeros((*bs.shape[:-1], n + m))
    first = plain(Pr, qr, Ar, bs, cones, inner, None)
    d = first.x[..., n:]
    second = plain(Ps, qs, As, bs + d, cones, inner, None)
    status = list(sol.status)
    shift = [0.0] * B
    norms = torch.linalg.vector_norm(d.detach(), dim=-1).reshape(-1).tolist()
    for j, i in enumerate(idx):
        st1, st2 = first.status[j], second.status[j]
        status[i] = Status.RELAXED if st1.ok and st2.ok else (st2 if st1.ok else st1)
        shift[i] = float(norms[j])
    if batched:
        x = sol.x.index_put((ix,), second.x)
        y = sol.y.index_put((ix,), second.y)
        s = sol.s.index_put((ix,), second.s)
    else:
        x, y, s = second.x, second.y, second.s
    info = dataclasses.replace(sol.info, relax_shift=tuple(shift))
    return ConicSolution(x=x, y=y, s=s, status=tuple(status), info=info)
