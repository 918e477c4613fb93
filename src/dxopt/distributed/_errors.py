"""The errors of :mod:`dxopt.distributed`, on the library's bases (:mod:`dxopt._core`).

:class:`DistributedValueError` and :class:`DistributedTypeError` are input errors: they
subclass :class:`dxopt.DxoptError` and the built-in ``ValueError`` / ``TypeError``, so
``except ValueError`` keeps working. :class:`DistributedError` is a run-time failure of the
executor (no room for the actors, a re-solve that does not reproduce the forward): a
:class:`dxopt.DxoptError`, hence a ``RuntimeError``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from dxopt._core import DxoptError, input_errors

__all__ = [
    "DistributedError",
    "DistributedTypeError",
    "DistributedValueError",
    "distributed_input_errors",
]


class DistributedError(DxoptError):
    """The executor could not run or reproduce a solve (a ``RuntimeError``)."""


class DistributedValueError(DxoptError, ValueError):
    """An executor option has a bad value."""


class DistributedTypeError(DxoptError, TypeError):
    """An executor option or input has the wrong type."""


def distributed_input_errors() -> AbstractContextManager[None]:
    """The shared validators' errors, raised as :class:`DistributedValueError` /
    :class:`DistributedTypeError` (same message)."""
    return input_errors(DistributedValueError, DistributedTypeError)
