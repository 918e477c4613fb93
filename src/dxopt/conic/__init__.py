"""Differentiable cone programs (zero, nonnegative, second-order, exponential, power, PSD).

Solve a batch of

.. math::

    \\min_x \\tfrac12 x^\\top P x + q^\\top x \\quad\\text{s.t.}\\quad Ax + s = b,\\ s \\in K,

with :math:`K` a product of cones (one file each in :mod:`dxopt.conic.cones`), and
differentiate the primal ``x``, the dual ``y`` and the slack ``s`` with respect to
``P, q, A, b``:

- **forward** (:mod:`dxopt.conic.forward`): Clarabel, then (with ``fallback``) Clarabel
  tighter and SCS where importable; every point is cleaned, polished and **certified by
  dxopt** (:mod:`dxopt.conic.certify`); ``INFEASIBLE``/``UNBOUNDED`` only with a checked
  certificate; a per-sample :class:`dxopt.Status`; ``solver="torch"`` runs a batched
  interior point in torch first (:mod:`dxopt.conic.ipm`; zero, nonnegative and second-order
  cones), its points certified the same way;
- **backward** (:mod:`dxopt.conic.backward`): implicit differentiation of
  :math:`F(x, w) = 0`, :math:`w = y - s` (:mod:`dxopt.conic.kkt`), a batched float64 LU with
  refinement checked to round-off; kinks and singular Jacobians are flagged
  (``DEGENERATE``, :class:`ConicDegenerateWarning`) with a documented one-sided rule;
  forward mode through the same system.

Public API (stable; the CVXPY front end builds on it):

- :func:`solve` ``(P, q, A, b, *, cones, atol, rtol, infeas_tol, max_iter, solver, fallback,
  on_failure, kink_tol, polish, check_psd, infeasible, backward, warm_start) ->
  ConicSolution``; :func:`solve_with` takes one :class:`ConicOptions`; :class:`ConicLayer` (an
  ``nn.Module``);
- opt-in: ``infeasible="relax"`` (certified infeasible samples solved as their closest
  feasible problem, :mod:`dxopt.conic.relax`), ``warm_start=`` a previous solution
  (:mod:`dxopt.conic.warm`), ``backward=`` :class:`Smoothed` ``(mu)`` (the derivative of the
  barrier solution, :mod:`dxopt.conic.smoothed`); under :func:`torch.compile` the solve is one
  custom op (:mod:`dxopt.conic.compiled`);
- results :class:`ConicSolution` (``x, y, s, status, info``), :class:`ConicInfo`,
  :class:`ConicBackwardInfo`; errors :class:`ConicSolveError`, :class:`ConicBackwardError`,
  :class:`ConicDegenerateWarning`;
- cones :class:`ZeroCone` ``(n)``, :class:`NonnegCone` ``(n)``, :class:`SecondOrderCone`
  ``(n)`` (``t`` first), :class:`ExpCone` / :class:`ExpDualCone` (``(x, y, z)`` with
  :math:`y e^{x/y} \\le z`), :class:`PowerCone` ``(alpha)``, :class:`PSDCone` ``(k)``
  (scaled upper triangle, column-wise: Clarabel's order; :func:`svec`/:func:`smat`
  convert), and the :class:`Cone` protocol.

This package may import :mod:`dxopt._core` and :mod:`dxopt.linalg` only (and third-party
code); nothing in dxopt below it imports it.
"""

from dxopt.conic.api import ConicLayer as ConicLayer
from dxopt.conic.api import solve as solve
from dxopt.conic.api import solve_with as solve_with
from dxopt.conic.cones.base import Cone as Cone
from dxopt.conic.cones.exp import ExpCone as ExpCone
from dxopt.conic.cones.exp import ExpDualCone as ExpDualCone
from dxopt.conic.cones.nonneg import NonnegCone as NonnegCone
from dxopt.conic.cones.power import PowerCone as PowerCone
from dxopt.conic.cones.psd import PSDCone as PSDCone
from dxopt.conic.cones.psd import smat as smat
from dxopt.conic.cones.psd import svec as svec
from dxopt.conic.cones.soc import SecondOrderCone as SecondOrderCone
from dxopt.conic.cones.zero import ZeroCone as ZeroCone
from dxopt.conic.types import ConicBackwardError as ConicBackwardError
from dxopt.conic.types import ConicBackwardInfo as ConicBackwardInfo
from dxopt.conic.types import ConicDegenerateWarning as ConicDegenerateWarning
from dxopt.conic.types import ConicInfo as ConicInfo
from dxopt.conic.types import ConicOptions as ConicOptions
from dxopt.conic.types import ConicSolution as ConicSolution
from dxopt.conic.types import ConicSolveError as ConicSolveError
from dxopt.conic.types import Smoothed as Smoothed

__all__ = [
    "Cone",
    "ConicBackwardError",
    "ConicBackwardInfo",
    "ConicDegenerateWarning",
    "ConicInfo",
    "ConicLayer",
    "ConicOptions",
    "ConicSolution",
    "ConicSolveError",
    "ExpCone",
    "ExpDualCone",
    "NonnegCone",
    "PSDCone",
    "PowerCone",
    "SecondOrderCone",
    "Smoothed",
    "ZeroCone",
    "smat",
    "solve",
    "solve_with",
    "svec",
]
