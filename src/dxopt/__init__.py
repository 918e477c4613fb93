r"""dxopt: differentiable optimization and gradient estimation for PyTorch.

Subpackages
-----------
- :mod:`dxopt.qp`: Differentiable convex quadratic programs.
- :mod:`dxopt.conic`: Differentiable cone programs (zero, nonnegative, second-order,
  exponential, power, PSD).
- :mod:`dxopt.frontend`: One CVXPY front end for dxopt.qp and dxopt.conic: any DPP (or DGP)
  problem as a layer.
- :mod:`dxopt.natgrad`: Natural-gradient optimizers for least-squares losses
  :math:`\tfrac12\|r(\theta)\|^2`.
- :mod:`dxopt.estimators`: Gradient estimators behind one interface, with honest costs.
- :mod:`dxopt.bilevel`: Bilevel optimization: hypergradient methods, hard instances and exact
  oracle accounting.
- :mod:`dxopt.rl`: Multi-attempt policy gradients: vanilla GRPO, naive attempt weighting and
  calibrated (CAL).
- :mod:`dxopt.linearize`: Linearized fine-tuning, task arithmetic, and distilling a linearized
  teacher.
- :mod:`dxopt.dfl`: Decision-focused learning (DFL) for linear and combinatorial problems.
- :mod:`dxopt.distributed`: Scale-out executors for :func:`dxopt.qp.solve` and
  :class:`dxopt.qp.QPLayer`.
- :mod:`dxopt.linalg`: Linear solves shared across dxopt, each reporting how it went.

The list above is the first line of each subpackage's docstring, written here (and into the
README's module table) by ``python docs/build_readme.py``.

Shared by all of them (from :mod:`dxopt._core`): :class:`Status` (why a solver stopped, with a
message), :class:`Cost` (what it cost), :class:`DxoptError` (the base of every dxopt error) and
:class:`DxoptWarning`, one option vocabulary (``max_iter``, ``tol``, ``lr``,
``on_failure``) described in :mod:`dxopt._core`, and :func:`release_host_buffers`, which drops
the large host buffers dxopt keeps for reuse (:mod:`dxopt._core.memory`; at most 256 MiB).

Everything is imported lazily, so ``import dxopt`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dxopt._core import Cost, DxoptError, DxoptWarning, Status, release_host_buffers

__version__ = "0.2.0"

_SUBPACKAGES = (
    "qp",
    "conic",
    "frontend",
    "natgrad",
    "estimators",
    "bilevel",
    "rl",
    "linearize",
    "dfl",
    "distributed",
    "linalg",
)
_CORE = ("Cost", "DxoptError", "DxoptWarning", "Status", "release_host_buffers")

__all__ = [
    "Cost",
    "DxoptError",
    "DxoptWarning",
    "Status",
    "__version__",
    "bilevel",
    "conic",
    "dfl",
    "distributed",
    "estimators",
    "frontend",
    "linalg",
    "linearize",
    "natgrad",
    "qp",
    "release_host_buffers",
    "rl",
]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"dxopt.{name}")
    if name in _CORE:
        return getattr(importlib.import_module("dxopt._core"), name)
    raise AttributeError(f"module 'dxopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
