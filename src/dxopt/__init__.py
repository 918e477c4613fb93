"""dxopt: differentiable optimization and gradient estimation for PyTorch.

Subpackages
-----------
- :mod:`dxopt.qp`: differentiable quadratic-program layers (penalty/dXPP and exact KKT backward).
- :mod:`dxopt.natgrad`: subsampled natural gradient (SNG), SPRING and ENGD for least squares.
- :mod:`dxopt.estimators`: backprop, checkpointed backprop, forward-mode and zeroth-order
  gradients behind one interface, with cost accounting.
- :mod:`dxopt.bilevel`: hypergradient methods, hard instances and oracle-call accounting.
- :mod:`dxopt.linearize`: linearized (tangent-space) fine-tuning, task vectors, and distilling a
  curvature-regularised linearized teacher into an ordinary student (DELTA).
- :mod:`dxopt.linalg`: the linear solves they share (checked Cholesky, CG).

Subpackages are imported lazily, so ``import dxopt`` stays cheap.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__version__ = "0.1.0"

_SUBPACKAGES = ("qp", "natgrad", "estimators", "bilevel", "linalg", "linearize")

__all__ = ["__version__", "bilevel", "estimators", "linalg", "linearize", "natgrad", "qp"]


def __getattr__(name: str) -> ModuleType:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"dxopt.{name}")
    raise AttributeError(f"module 'dxopt' has no attribute {name!r}")
