"""One collector for the degenerate-problem warnings of one backward (or tangent) call.

In decision-focused learning degeneracy is the normal case (issue 30): a backward that tries
several degenerate attempts (:meth:`dxopt.qp.BackwardBase.solve_adjoint`) must not warn once
per attempt, nor once per batch. So every message goes to the collector of the call
(:func:`collect_warnings`, opened by the outermost backward or tangent solve); an attempt that
may still be rejected collects into a trial (:func:`trial_warnings`) whose messages reach the
call's collector only when it is accepted. When the call ends, each distinct message is
issued once as a :class:`~dxopt.qp.QPDegenerateWarning` attributed to the first frame outside
dxopt and torch (the user's ``backward()``/``solve``/``jvp`` line): with stable texts,
Python's default filter then shows it once per call site, however many batches or epochs
run through it. Silence it with ``warnings.filterwarnings("ignore",
category=dxopt.qp.QPDegenerateWarning)``; the per-sample facts are in ``sol.info.backward``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from dxopt.qp.problem.types import QPDegenerateWarning

__all__ = ["DegenerateWarnings", "collect_warnings", "note_degenerate", "trial_warnings"]

# frames not the user's: torch, the dxopt package (src/dxopt/, three levels above this file)
# and contextlib (the collector is issued from a ``with`` block's exit)
_INTERNAL = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
    os.path.abspath(contextlib.__file__),
)


class DegenerateWarnings:
    """The distinct messages of one call, in the order they were first noted."""

    def __init__(self, parent: DegenerateWarnings | None = None) -> None:
        self.messages: list[str] = []
        self.parent = parent

    def add(self, message: str) -> None:
        if message not in self.messages:
            self.messages.append(message)

    def commit(self) -> None:
        """Hand a trial's messages to the collector it was opened under (or issue them)."""
        if self.parent is None:
            self.issue()
            return
        for message in self.messages:
            self.parent.add(message)
        self.messages = []

    def issue(self) -> None:
        """Issue each message once, attributed to the user's line (module docstring)."""
        messages, self.messages = self.messages, []
        if not messages:
            return
        frame = sys._getframe(0)
        level = 1  # warnings.warn's stacklevel of ``frame`` (1: this method)
        while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
            frame = frame.f_back  # type: ignore[assignment]
            level += 1
        for message in messages:
            warnings.warn(message, QPDegenerateWarning, stacklevel=level)


_ACTIVE: ContextVar[DegenerateWarnings | None] = ContextVar("dxopt_qp_degenerate", default=None)


@contextmanager
def collect_warnings() -> Iterator[DegenerateWarnings]:
    """The collector of the current call: the one already open (a nested solve joins its
    caller's), else a new one whose messages are issued when the block ends (also when it
    raises: what was noted before the error is still true)."""
    outer = _ACTIVE.get()
    if outer is not None:
        yield outer
        return
    collector = DegenerateWarnings()
    token = _ACTIVE.set(collector)
    try:
        yield collector
    finally:
        _ACTIVE.reset(token)
        collector.issue()


@contextmanager
def trial_warnings() -> Iterator[DegenerateWarnings]:
    """A scope whose messages are kept apart: call ``commit()`` on it once the attempt is
    accepted; a rejected attempt's messages are dropped."""
    trial = DegenerateWarnings(parent=_ACTIVE.get())
    token = _ACTIVE.set(trial)
    try:
        yield trial
    finally:
        _ACTIVE.reset(token)


def note_degenerate(message: str) -> None:
    """Note ``message`` (a stable text) in the current call's collector; outside any, issue
    it at once."""
    collector = _ACTIVE.get()
    if collector is None:
        standalone = DegenerateWarnings()
        standalone.add(message)
        standalone.issue()
        return
    collector.add(message)
