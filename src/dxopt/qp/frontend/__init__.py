"""CVXPY front end of :mod:`dxopt.qp`: write the problem, not the matrices.

:class:`CvxpyQPLayer` (and its function form :func:`from_cvxpy`) compiles a DPP-compliant
CVXPY problem whose canonical form is a QP into a sparse affine map from the parameters to the
data of :func:`dxopt.qp.solve` (CVXPY's own canonicalisation; Agrawal et al., NeurIPS 2019)
and calls it with cvxpylayers' convention. cvxpy is an optional extra:
``pip install 'dxopt[cvxpy]'``.

Its modules are private (``_affine``, ``_compile``, ``_eliminate``, ``_layer``), as in
:mod:`dxopt.frontend`; the public names are re-exported here. May import: every other layer
of :mod:`dxopt.qp` (``api`` and below), :mod:`dxopt._core`.
"""

from dxopt.qp.frontend._layer import CvxpyQPLayer as CvxpyQPLayer
from dxopt.qp.frontend._layer import CvxpyQPSolution as CvxpyQPSolution
from dxopt.qp.frontend._layer import from_cvxpy as from_cvxpy

__all__ = ["CvxpyQPLayer", "CvxpyQPSolution", "from_cvxpy"]
