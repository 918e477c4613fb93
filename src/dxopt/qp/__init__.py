"""Differentiable convex quadratic programs.

Solve :math:`\\min_x \\tfrac12 x^\\top P x + q^\\top x` s.t. :math:`Ax = b`, :math:`Gx \\le h`
with any :mod:`qpsolvers` backend and differentiate the solution and the multipliers, batched,
dense or sparse, float32 or float64, with either

- :class:`PenaltyBackward` (default): the dXPP smoothed-penalty system
  :math:`(P + G_J^\\top W G_J + A^\\top W_E A)v = \\bar x` (Linghu, Liu & Deng,
  arXiv 2602.14154) with per-row weights, β derived from the achieved accuracy and iterative
  refinement against the exact KKT adjoint, or
- :class:`KKTBackward`: exact implicit differentiation of the reduced KKT system on the active
  set (Amos & Kolter, arXiv 1703.00443), the accuracy reference, or
- :class:`Smoothed` (opt-in): the exact derivative of the log-barrier (central-path) solution
  at a small ``mu``, continuous where the active set switches.

When the active constraint rows are linearly dependent (LICQ fails) both methods return the
same minimum-norm multiplier adjoint (exact :math:`\\partial L/\\partial q`,
:math:`\\partial L/\\partial P`), record it in :class:`BackwardDiagnostics` and warn with
:class:`QPDegenerateWarning`.

This package owns the QP layers: validation and problem layout, the backends and their
fallback chain, the certificate and polish, the backward methods and degenerate rules, the
autograd Functions, the torch device path and the executor protocol
(:class:`dxopt.qp.problem.executor.QPExecutor`, implemented by :mod:`dxopt.distributed`). It may
import :mod:`dxopt._core` and :mod:`dxopt.linalg` only (never :mod:`dxopt.distributed`,
:mod:`dxopt.dfl` or the benchmarks); inside it each module imports only the layers below it
(``docs/architecture.md``; ``tests/test_import_graph.py`` fails on any circle).
"""

from typing import TYPE_CHECKING

from dxopt.qp.api.layer import QPLayer as QPLayer
from dxopt.qp.api.solve import solve as solve
from dxopt.qp.api.warmup import WarmupReport as WarmupReport
from dxopt.qp.api.warmup import warmup as warmup
from dxopt.qp.backward.base import BackwardBase as BackwardBase
from dxopt.qp.backward.kkt import KKTBackward as KKTBackward
from dxopt.qp.backward.penalty import PenaltyBackward as PenaltyBackward
from dxopt.qp.backward.smoothed import Smoothed as Smoothed
from dxopt.qp.problem.contracts import BackwardMethod as BackwardMethod
from dxopt.qp.problem.types import BackwardDiagnostics as BackwardDiagnostics
from dxopt.qp.problem.types import QPBackwardError as QPBackwardError
from dxopt.qp.problem.types import QPDegenerateWarning as QPDegenerateWarning
from dxopt.qp.problem.types import QPInfo as QPInfo
from dxopt.qp.problem.types import QPSolution as QPSolution
from dxopt.qp.problem.types import QPSolveError as QPSolveError
from dxopt.qp.problem.types import QPStatus as QPStatus

if TYPE_CHECKING:
    from dxopt.qp.frontend import CvxpyQPLayer as CvxpyQPLayer
    from dxopt.qp.frontend import CvxpyQPSolution as CvxpyQPSolution
    from dxopt.qp.frontend import from_cvxpy as from_cvxpy

_FRONTEND = ("CvxpyQPLayer", "CvxpyQPSolution", "from_cvxpy")  # CVXPY front end: lazy (cvxpy extra)


def __getattr__(name: str) -> object:
    if name in _FRONTEND:
        from dxopt.qp import frontend

        return getattr(frontend, name)
    raise AttributeError(f"module 'dxopt.qp' has no attribute {name!r}")


__all__ = [
    "BackwardBase",
    "BackwardDiagnostics",
    "BackwardMethod",
    "CvxpyQPLayer",
    "CvxpyQPSolution",
    "KKTBackward",
    "PenaltyBackward",
    "QPBackwardError",
    "QPDegenerateWarning",
    "QPInfo",
    "QPLayer",
    "QPSolution",
    "QPSolveError",
    "QPStatus",
    "Smoothed",
    "WarmupReport",
    "from_cvxpy",
    "solve",
    "warmup",
]
