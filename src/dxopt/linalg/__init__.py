"""Linear solves shared across dxopt, each reporting how it went.

- :func:`spd_solve`: Cholesky solve of (batched) symmetric positive (semi)definite systems,
  with a jitter escalation and an eigendecomposition fallback whose use is reported.
- :func:`conjugate_gradient`: preconditioned CG on a matrix-free operator, returning its
  status, iteration and product counts and residual norm; :mod:`dxopt.bilevel` and the
  implicit layer use it (with ``check_residual=False`` so no uncounted product is made).
"""

from dxopt.linalg.dense import SPDSolveInfo as SPDSolveInfo
from dxopt.linalg.dense import spd_solve as spd_solve
from dxopt.linalg.krylov import KrylovResult as KrylovResult
from dxopt.linalg.krylov import conjugate_gradient as conjugate_gradient

__all__ = ["KrylovResult", "SPDSolveInfo", "conjugate_gradient", "spd_solve"]
