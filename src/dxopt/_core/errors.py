"""The error and warning bases of dxopt.

Every exception dxopt raises on purpose (other than ``ValueError`` / ``TypeError`` for bad
input) subclasses :class:`DxoptError`, which subclasses :class:`RuntimeError` so that code
written as ``except RuntimeError`` keeps working.
"""

from __future__ import annotations

__all__ = ["DxoptError", "DxoptWarning", "NotConvergedError"]


class DxoptError(RuntimeError):
    """Base class of every dxopt error (a solve failed, a budget ran out, ...).

    Attributes:
        status: the :class:`~dxopt._core.Status` that caused it, when there is one.
    """

    def __init__(self, message: str = "", *, status: object | None = None) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self):  # picklable across processes (keyword-only status)
        return (_rebuild, (type(self), str(self), self.status))


def _rebuild(cls: type[DxoptError], message: str, status: object | None) -> DxoptError:
    err = cls.__new__(cls)
    DxoptError.__init__(err, message, status=status)
    return err


class NotConvergedError(DxoptError):
    """An iterative solver stopped before meeting its tolerance and ``on_failure="raise"``."""


class DxoptWarning(RuntimeWarning):
    """Warning emitted under ``on_failure="warn"`` (a subclass of :class:`RuntimeWarning`)."""
