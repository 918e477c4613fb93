"""The errors of :mod:`dxopt.rl`, kept in one place.

They subclass the built-in :class:`ValueError` and :class:`TypeError`, so ``except ValueError``
keeps working when they are rebased on the library's common error base.
"""

from __future__ import annotations


class RLValueError(ValueError):
    """A rollout, weight or log-probability argument has a bad value or shape."""


class RLTypeError(TypeError):
    """An argument of :mod:`dxopt.rl` has the wrong type or dtype."""
