"""The errors of :mod:`dxopt.rl`, kept in one place.

Both are input errors: they subclass :class:`dxopt.DxoptError` (the library's error base) and
the built-in :class:`ValueError` / :class:`TypeError`, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from dxopt._core import DxoptError, input_errors


class RLValueError(DxoptError, ValueError):
    """A rollout, weight or log-probability argument has a bad value or shape."""


class RLTypeError(DxoptError, TypeError):
    """An argument of :mod:`dxopt.rl` has the wrong type or dtype."""


def rl_input_errors() -> AbstractContextManager[None]:
    """The shared validators' errors, raised as :class:`RLValueError` / :class:`RLTypeError`."""
    return input_errors(RLValueError, RLTypeError)
