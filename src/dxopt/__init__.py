"""dxopt: differentiable optimization and gradient estimation for PyTorch.

Subpackages
-----------
- :mod:`dxopt.qp`: differentiable quadratic-program layers (penalty/dXPP and exact KKT backward).
- :mod:`dxopt.natgrad`: subsampled natural gradient (SNG), SPRING and ENGD for least squares.
- :mod:`dxopt.estimators`: backprop, checkpointed backprop, forward-mode and zeroth-order
  gradients behind one interface, with cost accounting.
- :mod:`dxopt.bilevel`: hypergradient methods, hard instances, oracle-call accounting and an
  implicit-differentiation layer for ``nn.Module`` inner problems.
- :mod:`dxopt.rl`: multi-attempt policy gradients (vanilla GRPO, naive and calibrated
  attempt-level weights) for Verification@K, with an exactly solvable tabular policy.
- :mod:`dxopt.linearize`: linearized (tangent-space) fine-tuning, task vectors, and distilling a
  curvature-regularised linearized teacher into an ordinary student (DELTA).
- :mod:`dxopt.dfl`: decision-focused learning for linear and combinatorial problems (SPO+, DBB,
  perturbed optimizers, NCE, learning to rank, QPTL; batched oracles, PyEPO's data and metrics).
- :mod:`dxopt.linalg`: the linear solves they share (checked Cholesky, CG).

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

_SUBPACKAGES = ("qp", "natgrad", "estimators", "bilevel", "rl", "linearize", "linalg", "dfl")
_CORE = ("Cost", "DxoptError", "DxoptWarning", "Status", "release_host_buffers")

__all__ = [
    "Cost",
    "DxoptError",
    "DxoptWarning",
    "Status",
    "__version__",
    "bilevel",
    "dfl",
    "estimators",
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
