"""One CVXPY front end for dxopt.qp and dxopt.conic: any DPP (or DGP) problem as a layer.

:class:`CvxpyLayer` takes cvxpylayers' calling convention (``CvxpyLayer(problem,
parameters=[...], variables=[...])``, then ``layer(*values, solver_args={...})``); problems
whose canonical form is a QP go to :class:`dxopt.qp.CvxpyQPLayer`, all others are compiled
once, by CVXPY's own reduction chain, into a sparse affine map to the data of
:func:`dxopt.conic.solve` (:mod:`dxopt.frontend._compile`). cvxpy is an optional extra:
``pip install 'dxopt[cvxpy]'``.

This package may import :mod:`dxopt._core`, :mod:`dxopt.qp` and :mod:`dxopt.conic`.
"""

from dxopt.frontend._layer import CvxpyLayer as CvxpyLayer
from dxopt.frontend._layer import CvxpyLayerSolution as CvxpyLayerSolution

__all__ = ["CvxpyLayer", "CvxpyLayerSolution"]
