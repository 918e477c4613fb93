"""Linear solves shared across dxopt, each reporting how it went.

- :func:`spd_solve`: Cholesky solve of (batched) symmetric positive (semi)definite systems,
  with a jitter escalation and an eigendecomposition fallback whose use is reported.
- :func:`conjugate_gradient`: preconditioned CG on a matrix-free operator, returning its
  status, iteration and product counts and residual norm; :mod:`dxopt.bilevel` and the
  implicit layer use it (with ``check_residual=False`` so no uncounted product is made).
- :func:`saddle_solve`: (possibly singular) saddle-point systems :math:`[[P, C^\\top], [C, 0]]`
  by a quasi-definite regularised factorization plus refinement, dense or scipy sparse, with the
  residual reported; :func:`lstsq_saddle` the Moore-Penrose fallback; :func:`splu` the one
  SuperLU wrapper (errors mapped to :class:`FactorizationError`).
- :func:`shifted_splu`, :func:`refine`, :func:`inverse_norm_1`: a sparse LU of a general
  square matrix (slightly shifted), iterative refinement against the exact operator with the
  relative residual reported, and a 1-norm estimate of the inverse (condition numbers).
- :func:`schur_factor`: batched block elimination of a positive definite :math:`P` in
  :math:`[[P, C^\\top], [C, 0]]` (Cholesky of :math:`P` and of the Schur complement
  :math:`CP^{-1}C^\\top`), with the linear dependence of the rows of :math:`C` read off it;
  :func:`small_schur` the same for one small system through the compiled kernels of
  :mod:`dxopt.linalg.small` (numba: Cholesky, triangular solves, block elimination; no
  torch or LAPACK dispatch).
- :func:`augmented_solve`: one large saddle-point system by float64 flexible GMRES
  preconditioned with the float32 Cholesky factor of the augmented matrix
  :math:`P + C^\\top WC`; :func:`certify_independent_rows` certifies the linear independence
  of rows (a float64 Gram Cholesky with rigorous round-off margins).
- :func:`small_work`: one intra-op thread for small arithmetic (no oversubscription);
  :func:`blas_threads` the thread limit of numpy's and scipy's BLAS, the other pool.
"""

from dxopt.linalg.augmented import AugmentedSolution as AugmentedSolution
from dxopt.linalg.augmented import augmented_solve as augmented_solve
from dxopt.linalg.augmented import certify_independent_rows as certify_independent_rows
from dxopt.linalg.dense import SPDSolveInfo as SPDSolveInfo
from dxopt.linalg.dense import spd_solve as spd_solve
from dxopt.linalg.krylov import KrylovResult as KrylovResult
from dxopt.linalg.krylov import conjugate_gradient as conjugate_gradient
from dxopt.linalg.schur import SchurFactor as SchurFactor
from dxopt.linalg.schur import SmallSchur as SmallSchur
from dxopt.linalg.schur import schur_factor as schur_factor
from dxopt.linalg.schur import small_schur as small_schur
from dxopt.linalg.sparse import FactorizationError as FactorizationError
from dxopt.linalg.sparse import SaddleSolveInfo as SaddleSolveInfo
from dxopt.linalg.sparse import lstsq_saddle as lstsq_saddle
from dxopt.linalg.sparse import saddle_solve as saddle_solve
from dxopt.linalg.sparse import splu as splu
from dxopt.linalg.sparse_lu import RefinedSolve as RefinedSolve
from dxopt.linalg.sparse_lu import inverse_norm_1 as inverse_norm_1
from dxopt.linalg.sparse_lu import refine as refine
from dxopt.linalg.sparse_lu import shifted_splu as shifted_splu
from dxopt.linalg.threads import blas_threads as blas_threads
from dxopt.linalg.threads import small_work as small_work

__all__ = [
    "AugmentedSolution",
    "FactorizationError",
    "KrylovResult",
    "RefinedSolve",
    "SPDSolveInfo",
    "SaddleSolveInfo",
    "SchurFactor",
    "SmallSchur",
    "augmented_solve",
    "blas_threads",
    "certify_independent_rows",
    "conjugate_gradient",
    "inverse_norm_1",
    "lstsq_saddle",
    "refine",
    "saddle_solve",
    "schur_factor",
    "shifted_splu",
    "small_schur",
    "small_work",
    "spd_solve",
    "splu",
]
